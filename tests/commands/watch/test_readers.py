"""Each log reader on a small hand-written sample of its format, read as `klguard watch` reads it (format told
from the content, names mapped to the guard's)."""

from __future__ import annotations

import json
import math
import os

import pytest

from klguard.integrations.logs import open_log

ESC = "\x1b"


def read(path, **kwargs):
    log = open_log(path, **kwargs)
    return log, log.poll(final=True)


def test_verl_console_2024_with_colour_codes_prefix_and_validation_lines(tmp_path):
    prefix = f"{ESC}[2m{ESC}[36m(main_task pid=4242){ESC}[0m "
    lines = [f"{prefix}\"Initial validation metrics: {{'test_score/lab/arith': 0.125}}\"",
             f"{prefix}step:0 - critic/kl:0.000 - critic/kl_coeff:0.001 - actor/entropy_loss:0.700 - "
             "actor/lr(1e-4):0.020 - actor/pg_loss:-0.013 - critic/score/mean:0.250",
             f"{prefix}step:1 - critic/kl:0.004 - critic/kl_coeff:0.001 - actor/entropy_loss:0.650 - "
             "actor/lr(1e-4):0.020 - actor/pg_loss:0.021 - critic/score/mean:0.300",
             f"{prefix}step:1 - test_score/lab/arith:0.375",
             f"{prefix}some other console text: epoch=3"]
    (tmp_path / "console.txt").write_text("\n".join(lines) + "\n")
    log, steps = read(tmp_path / "console.txt")
    assert (log.format, log.trainer) == ("verl-console", "verl")
    assert [s for s, _ in steps] == [0, 1]
    first, second = steps[0][1], steps[1][1]
    assert first["val-core/lab/arith/acc/mean@1"] == 0.125  # the Initial validation line is step 0
    assert second["actor/reward_kl_penalty"] == 0.004 and second["actor/reward_kl_penalty_coeff"] == 0.001
    assert second["actor/entropy"] == 0.65 and second["actor/pg_loss"] == 0.021
    assert second["actor/lr"] == pytest.approx(2e-6)  # logged in units of 1e-4
    assert second["val-core/lab/arith/acc/mean@1"] == 0.375  # its validation line, merged into the step


def test_verl_console_2025_after_a_config_dump_with_numpy_values_and_validation_in_the_step(tmp_path):
    prefix = f"{ESC}[36m(TaskRunner pid=77){ESC}[0m "
    lines = ["{'actor_rollout_ref': {'actor': {'ppo_mini_batch_size': 256}}, 'data': {'train_batch_size': 64}}",
             f"{prefix}step:40 - actor/entropy:np.float64(0.31) - actor/kl_loss:np.float64(0.0025) - "
             "actor/kl_coef:0.001 - actor/grad_norm:np.float64(nan) - val-core/lab/sums/reward/mean@1:0.75",
             f"{prefix}step:47 - actor/entropy:np.float64(0.3) - actor/kl_loss:np.float64(0.003) - actor/kl_coef:0.001"]
    (tmp_path / "run.log").write_text("\n".join(lines))  # no newline at the end: the last line is read at the end
    _, steps = read(tmp_path / "run.log")
    assert [s for s, _ in steps] == [40, 47]  # read, never counted
    at40 = steps[0][1]
    assert at40["actor/kl_loss"] == 0.0025 and at40["actor/entropy"] == 0.31 and math.isnan(at40["actor/grad_norm"])
    assert at40["val-core/lab/sums/acc/mean@1"] == 0.75  # a rule reward's mean is the accuracy where none is logged


def test_trl_console_dicts_behind_progress_bar_debris(tmp_path):
    bar = "\r  3%|▎         | 3/100 [00:09<04:51,  3.00s/it]"
    lines = ["{'loss': 0.01, 'grad_norm': 2.5, 'learning_rate': 1e-06, 'rewards/fmt/mean': 0.25, "
             "'rewards/answer/mean': 0.5, 'completions/mean_length': 40.5, 'kl': 0.001, 'entropy': 0.9, 'epoch': 0.01}",
             f"{bar}\r                              \r   {{'loss': -0.0, 'grad_norm': nan, 'reward': 0.7, 'kl': 0.002, "
             "'completion_length': 38.0, 'epoch': 0.02}",
             "{'eval_loss': 0.3, 'eval_runtime': 2.0}",
             "{'train_runtime': 120.0, 'train_loss': 0.01, 'epoch': 1.0}"]
    (tmp_path / "trl.out").write_text("\n".join(lines) + "\n")
    log, steps = read(tmp_path / "trl.out")
    assert (log.format, log.trainer) == ("trl-console", "trl")
    assert [s for s, _ in steps] == [1, 3]  # the first dict numbered by its entry, the second by tqdm's counter
    one, two = steps[0][1], steps[1][1]
    assert one["critic/score/mean"] == 0.75  # no `reward`: the sum of the reward functions' means
    assert (one["actor/kl_loss"], one["actor/entropy"], one["response_length/mean"]) == (0.001, 0.9, 40.5)
    assert math.isnan(two["actor/grad_norm"]) and two["critic/score/mean"] == 0.7 and two["response_length/mean"] == 38
    assert log.counted


def test_trainer_state_under_any_file_name(tmp_path):
    history = [{"step": 5, "loss": 0.0, "kl": 0.01, "reward": 0.5, "completion_length": 90.0},
               {"step": 5, "eval_loss": 0.2}, {"step": 10, "loss": 0.1, "kl": 0.02, "reward": 0.6},
               {"step": 10, "train_runtime": 3.0}]
    (tmp_path / "run-a.json").write_text(json.dumps({"global_step": 10, "log_history": history}, indent=2))
    log, steps = read(tmp_path / "run-a.json")
    assert log.format == "trl" and [s for s, _ in steps] == [5, 10]
    assert steps[0][1]["actor/kl_loss"] == 0.01 and steps[0][1]["response_length/mean"] == 90.0


def test_flat_json_lines_with_gaps_a_legend_and_evaluation_lines(tmp_path):
    rows = ['"mean|std"', json.dumps({"step": 1, "train_reward": 0.5, "kl": 0.0, "completion_tokens": 30}),
            json.dumps({"step": 4, "train_reward": 0.6, "kl": 0.01, "resp_len": "31.5|4.0"}),
            json.dumps({"step": 4, "eval_score": 0.9}), json.dumps({"step": 9, "reward/mean": 0.7, "kl": "0.02"})]
    (tmp_path / "metrics.log").write_text("\n".join(rows) + "\n")
    log, steps = read(tmp_path / "metrics.log")
    assert (log.format, log.trainer) == ("jsonl", "plain")
    assert [s for s, _ in steps] == [1, 4, 9]
    assert steps[0][1]["critic/score/mean"] == 0.5 and steps[0][1]["response_length/mean"] == 30
    assert steps[1][1]["resp_len/mean"] == 31.5  # the legend
    assert steps[1][1]["val-core/eval_score/acc/mean@1"] == 0.9  # the evaluation line, merged, read by meaning
    assert steps[2][1]["critic/score/mean"] == 0.7 and steps[2][1]["actor/kl_loss"] == 0.02


def test_one_line_per_step_key_value_output(tmp_path):
    lines = ["Starting training with lr=1e-06",
             "Step 3/200 | loss: 0.41 | kl: 0.012 | reward: 0.50 | entropy: 1.1",
             "[iter] step=7 kl=0.02, reward=0.61 grad_norm=3.5",
             "2026-01-01 12:00:00 INFO step: 12 - kl: nan - reward: 0.7"]
    (tmp_path / "train.log").write_text("\n".join(lines) + "\n")
    log, steps = read(tmp_path / "train.log")
    assert log.format == "kv-lines" and [s for s, _ in steps] == [3, 7, 12]
    assert steps[0][1]["actor/kl_loss"] == 0.012 and steps[0][1]["actor/entropy"] == 1.1
    assert steps[1][1]["actor/grad_norm"] == 3.5 and math.isnan(steps[2][1]["actor/kl_loss"])


def test_csv_export_with_a_step_column(tmp_path):
    (tmp_path / "export.csv").write_text("Step,run7 - train/kl,run7 - train/kl__MIN,run7 - train/reward\n"
                                         "2,0.01,0.0,0.5\n5,0.02,0.01,\n")
    log, steps = read(tmp_path / "export.csv")
    assert log.format == "csv" and steps == [(2, {"actor/kl_loss": 0.01, "critic/score/mean": 0.5}),
                                            (5, {"actor/kl_loss": 0.02})]


def test_mlflow_file_store(tmp_path):
    run = tmp_path / "mlruns" / "1" / "0a1b"
    (run / "metrics" / "train").mkdir(parents=True)
    (run / "meta.yaml").write_text("run_id: 0a1b\n")
    (run / "metrics" / "train" / "kl").write_text("1700000000 0.01 1\n1700000060 0.03 2\n")
    (run / "metrics" / "grad_norm").write_text("1700000000 1.5 1\n1700000060 2.5 2\n")
    log, steps = read(tmp_path / "mlruns")
    assert log.format == "mlflow"
    assert steps == [(1, {"actor/grad_norm": 1.5, "actor/kl_loss": 0.01}), (2, {"actor/grad_norm": 2.5,
                                                                               "actor/kl_loss": 0.03})]


def test_wandb_offline_run(tmp_path, monkeypatch):
    if os.environ.get("CI") != "true":
        pytest.importorskip("wandb")
    import wandb

    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(mode="offline", dir=str(tmp_path), project="watch-test")
    for step in (1, 2, 6):
        run.log({"train/kl": 0.01 * step, "train/reward": 0.1 * step, "train/grad_norm": math.nan}, step=step)
    run.finish()
    wandb.teardown()  # finish() can return before wandb's service has written the records out (seen on a loaded CI)
    log, steps = read(tmp_path / "wandb")
    assert log.format == "wandb" and [s for s, _ in steps] == [1, 2, 6]
    assert steps[2][1]["actor/kl_loss"] == pytest.approx(0.06) and math.isnan(steps[0][1]["actor/grad_norm"])


def test_the_name_map_reaches_the_guard(tmp_path):
    (tmp_path / "log.jsonl").write_text(json.dumps({"step": 1, "my_kl": 0.3, "score": 1.0}) + "\n")
    _, steps = read(tmp_path / "log.jsonl", user_map={"my_kl": "actor/kl_loss", "score": "critic/score/mean"})
    assert steps == [(1, {"actor/kl_loss": 0.3, "critic/score/mean": 1.0})]


def test_a_perplexity_every_10_steps_is_read_as_the_reference_nll(tmp_path):
    rows = [{"step": 0, "eval_perplexity": 4.47}]
    for s in range(1, 21):
        rows.append({"step": s, "train_reward": 0.5, "kl": 0.01})
        if s % 10 == 0:
            rows.append({"step": s, "eval_reward": 0.9, "eval_perplexity": 4.0 + s, "eval_distinct_2": 1.0})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    log, steps = read(tmp_path / "metrics.jsonl")
    assert log.trainer == "plain"
    nll = {s: m["hacking/ref_nll"] for s, m in steps if "hacking/ref_nll" in m}
    assert nll == {0: math.log(4.47), 10: math.log(14.0), 20: math.log(24.0)}
    assert all("eval_perplexity" not in m for _, m in steps)


def test_a_csv_perplexity_column_and_a_mapped_one(tmp_path):
    (tmp_path / "export.csv").write_text("step,train/reward,eval_perplexity,ppl_ref\n0,,4.5,2.0\n10,0.5,0,\n")
    _, steps = read(tmp_path / "export.csv")
    assert steps == [(0, {"hacking/ref_nll": math.log(4.5), "ppl_ref": 2.0}), (10, {"critic/score/mean": 0.5})]
    _, steps = read(tmp_path / "export.csv", user_map={"ppl_ref": "hacking/ref_nll:log", "eval_perplexity": "x"})
    assert steps == [(0, {"hacking/ref_nll": math.log(2.0), "x": 4.5}), (10, {"critic/score/mean": 0.5, "x": 0.0})]


UNSLOTH_TABLE = """My GRPO run, the loss stays at zero. The progress table:

Step | Training Loss | reward | reward_std | completion_length | kl | rewards / match_format_exactly
-- | -- | -- | -- | -- | -- | --
1 | 0.000000 | -17.250000 | 1.500000 | 445.500000 | 0.000000 | 0.000000
2 | -0.000000 | -10.500000 | 1.732051 | 389.250000 | 0.000000 | 0.000000
4 | 0.000100 | 0.000000 | 0.000000 | 452.000000 | 0.000010 | 1.000000

Any idea?
"""


def test_a_pipe_table_pasted_in_an_issue(tmp_path):
    (tmp_path / "issue.md").write_text(UNSLOTH_TABLE)
    log, steps = read(tmp_path / "issue.md")
    assert log.format == "table" and [s for s, _ in steps] == [1, 2, 4]
    last = steps[-1][1]
    assert (last["critic/score/mean"], last["critic/score/std"], last["response_length/mean"]) == (0.0, 0.0, 452.0)
    fmt = last["critic/score/match_format_exactly/mean"]  # a per-function reward under the guard's name
    assert (last["actor/kl_loss"], last["actor/pg_loss"], fmt) == (1e-5, 1e-4, 1.0)


def test_a_markdown_table_with_outer_pipes_and_a_separator_row(tmp_path):
    (tmp_path / "t.md").write_text("| step | reward | kl |\n|---:|:---|---|\n| 10 | 0.5 | 0.01 |\n"
                                   "| 20 | 0.6 | 0.02 |\n")
    _, steps = read(tmp_path / "t.md")
    assert steps == [(10, {"critic/score/mean": 0.5, "actor/kl_loss": 0.01}),
                     (20, {"critic/score/mean": 0.6, "actor/kl_loss": 0.02})]


@pytest.mark.parametrize("sep", ["\t", "   "])
def test_a_whitespace_table_with_a_two_word_header_and_a_no_log_cell(tmp_path, sep):
    header = sep.join(["Step", "Training Loss", "Validation Loss", "reward", "kl"])
    rows = [sep.join(["5", "0.2", "No log", "0.4", "0.001"]), sep.join(["10", "0.1", "0.3", "0.5", "0.002"])]
    (tmp_path / "progress.txt").write_text("\n".join([header, *rows]) + "\n")
    log, steps = read(tmp_path / "progress.txt")
    assert log.format == "table" and [s for s, _ in steps] == [5, 10]
    assert steps[0][1] == {"actor/pg_loss": 0.2, "critic/score/mean": 0.4, "actor/kl_loss": 0.001}
    assert steps[1][1]["Validation Loss"] == 0.3


def test_a_single_space_table_splits_its_header_by_the_rows(tmp_path):
    (tmp_path / "t.txt").write_text("Step Training Loss reward rewards / fmt completion_length\n"
                                    "1 0.5 0.25 1.0 120\n2 0.4 0.5 1.0 110\n")
    _, steps = read(tmp_path / "t.txt")
    assert steps[1] == (2, {"actor/pg_loss": 0.4, "critic/score/mean": 0.5, "critic/score/fmt/mean": 1.0,
                            "response_length/mean": 110.0})  # a per-function reward under the guard's name


def test_a_header_without_a_row_under_it_is_prose(tmp_path):
    (tmp_path / "t.txt").write_text("the step we took was good\nthen\n1 2 3 4 5 6\n")
    with pytest.raises(Exception, match="no metrics in its first 3 lines"):
        read(tmp_path / "t.txt")
