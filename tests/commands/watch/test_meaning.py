"""Guard inputs found by what a name means (klguard.integrations.logs.meaning), on names from real trainers' logs
that no built-in map knows, and the priority where several names could mean one input."""

from __future__ import annotations

import json

import pytest

from klguard.commands.cli import main
from klguard.integrations.logs import open_log
from klguard.integrations.logs.meaning import infer, meaning_of, words


@pytest.mark.parametrize(("name", "target"), [
    ("reward_avg", "critic/score/mean"),
    ("env/all/reward/total", "critic/score/mean"),  # Tinker
    ("trainReward", "critic/score/mean"),
    ("entropy_avg", "actor/entropy"),
    ("optim/entropy", "actor/entropy"),
    ("avg_response_len", "response_length/mean"),
    ("env/all/ac_tokens_per_turn", "response_length/mean"),
    ("ppo_response_length/mean", "response_length/mean"),
    ("kl_loss", "actor/kl_loss"),
    ("reward_kl_penalty", "actor/reward_kl_penalty"),
    ("optim/kl_sample_train_v2", "actor/ppo_kl"),  # the sampler's policy against the trained one: a policy step
    ("approx_kl", "actor/ppo_kl"),
    ("eval_acc", "val-core/*/acc/*"),
    ("test/env/all/reward/total", "val-core/*/acc/*"),
    ("policy_grad_norm", "actor/grad_norm"),
    ("Training Loss", "actor/pg_loss"),
    ("clipfrac", "actor/pg_clipfrac"),
    ("policy.learningRate", "actor/lr"),
])
def test_names_by_meaning_whatever_the_separator_prefix_or_suffix(name, target):
    meaning = meaning_of(name)
    assert meaning is not None and meaning.target == target, (name, words(name))


@pytest.mark.parametrize("name", [
    "reward_std", "train_reward_min", "reward/max", "frac_reward_zero_std",  # statistics are not the mean
    "critic/grad_norm", "critic/vf_loss", "critic/lr",  # a critic's, not the policy's
    "kl_coef", "entropy_coeff",  # a coefficient is not the quantity
    "eval_completion_tokens", "eval_loss", "eval_perplexity",  # evaluation, and not a score
    "prompt_length/mean", "num_tokens", "env/all/total_ac_tokens",  # not the responses' mean length
    "time/total", "timing_s/gen", "progress/done_frac", "epoch",
])
def test_names_that_mean_no_input(name):
    assert meaning_of(name) is None


def test_priority_actor_before_critic_and_kl_loss_before_ppo_kl():
    found = infer({"critic/grad_norm", "policy/grad_norm", "kl_loss", "ppo_kl"}, present=set())
    assert found.renames == {"policy/grad_norm": "actor/grad_norm", "kl_loss": "actor/kl_loss",
                             "ppo_kl": "actor/ppo_kl"}  # ppo_kl is the policy-step KL: its own input
    assert "critic/grad_norm" in found.unmapped and not found.ambiguous
    only_ppo = infer({"ppo_kl"}, present=set())
    assert only_ppo.renames == {"ppo_kl": "actor/ppo_kl"}  # never read as the KL to the reference


def test_priority_reward_kl_penalty_and_kl_loss_are_the_reference_kl():
    found = infer({"kl_penalty", "kl_loss", "kl_sample_train_v1", "kl_sample_train_v2"}, present=set())
    assert found.renames == {"kl_penalty": "actor/reward_kl_penalty", "kl_loss": "actor/kl_loss",
                             "kl_sample_train_v2": "actor/ppo_kl"}  # the later estimator
    assert not found.ambiguous


def test_priority_a_mean_before_its_statistics_and_train_before_eval():
    found = infer({"reward_mean", "reward_std", "reward_min", "reward_max", "eval_reward", "val/accuracy"},
                  present=set())
    assert found.renames == {"reward_mean": "critic/score/mean", "val/accuracy": "val-core/val/accuracy/acc/mean@1"}
    assert {"reward_std", "reward_min", "reward_max", "eval_reward"} <= set(found.unmapped)  # accuracy before reward


def test_an_input_the_log_has_is_never_inferred():
    found = infer({"reward_avg", "entropy_avg"}, present={"critic/score/mean"})
    assert found.renames == {"entropy_avg": "actor/entropy"} and found.unmapped == ["reward_avg"]


def test_per_function_rewards_are_the_score_only_where_one_and_no_overall_reward():
    assert infer({"format_reward", "correctness_reward"}, present=set()).renames == {}
    assert infer({"format_reward", "correctness_reward"}, present=set()).per_function == [
        "correctness_reward", "format_reward"]
    assert infer({"accuracy_reward"}, present=set()).renames == {"accuracy_reward": "critic/score/mean"}
    assert infer({"reward/f", "reward/g", "reward/total"}, present=set()).renames == {
        "reward/total": "critic/score/mean"}


def test_an_ambiguous_match_says_so_and_picks_deterministically():
    found = infer({"score_avg", "reward_avg"}, present=set())
    assert found.renames == {"score_avg": "critic/score/mean"}  # the shorter name, then alphabetical
    assert found.ambiguous == ["score_avg and reward_avg are equally good readings of critic/score/mean: read "
                               "score_avg; --map reward_avg=critic/score/mean reads reward_avg instead"]
    assert infer({"reward_avg", "score_avg"}, present=set()).renames == found.renames  # order does not matter


def tinker_log(path, steps: int = 12) -> str:
    """Tinker cookbook's names (no built-in map knows them) and step (`progress/batch`), every step; a test reward
    every 5 steps."""
    rows = []
    for s in range(steps):
        row = {"progress/batch": s, "env/all/reward/total": 0.2 + 0.01 * s, "optim/kl_sample_train_v1": 0.001,
               "optim/kl_sample_train_v2": 0.002, "optim/entropy": 1.5, "env/all/ac_tokens_per_turn": 120.0,
               "time/total": 30.0}
        if s % 5 == 0:
            row["test/env/all/reward/total"] = 0.3
        rows.append(json.dumps(row))
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def test_a_tinker_log_is_read_by_meaning_and_said_before_the_first_decision(tmp_path, capsys):
    path = tinker_log(tmp_path / "metrics.jsonl")
    log = open_log(path)
    first = log.poll(final=True)[0][1]
    assert first["critic/score/mean"] == 0.2 and first["actor/ppo_kl"] == 0.002 and first["actor/entropy"] == 1.5
    assert first["response_length/mean"] == 120 and first["val-core/test/env/all/reward/total/acc/mean@1"] == 0.3
    assert main(["watch", path]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "5 by meaning)" in out[1]
    assert "read by meaning: test/env/all/reward/total -> val-core/test/env/all/reward/total/acc/mean@1, " \
           "optim/kl_sample_train_v2 -> actor/ppo_kl, optim/entropy -> actor/entropy, env/all/ac_tokens_per_turn " \
           "-> response_length/mean, env/all/reward/total -> critic/score/mean;" in out[2]
    assert out[2].endswith("left unmapped: optim/kl_sample_train_v1, time/total")
    assert out[3].startswith("klguard watch: rules: ")  # before any decision


def test_map_overrides_the_meaning_and_an_ambiguity_names_the_map_that_resolves_it(tmp_path, capsys):
    rows = [{"step": s, "score_avg": 0.5, "reward_avg": 0.1 * s, "kl_loss": 0.01} for s in range(12)]
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["watch", str(path)]) == 0
    out = capsys.readouterr().out
    assert "klguard watch: ambiguous: score_avg and reward_avg are equally good readings of critic/score/mean: " \
           "read score_avg; --map reward_avg=critic/score/mean reads reward_avg instead" in out
    log = open_log(path, user_map={"reward_avg": "critic/score/mean"})
    steps = log.poll(final=True)
    assert steps[3][1]["critic/score/mean"] == pytest.approx(0.3) and steps[3][1]["score_avg"] == 0.5  # --map wins
    assert log.inference.renames == {"kl_loss": "actor/kl_loss"} and not log.inference.ambiguous


def test_a_from_scratch_loops_step_lines_are_read_by_meaning(tmp_path, capsys):
    """`[Step N/500] k=v` lines of a textbook's GRPO loop, none of whose names a map knows; an eval line every 5."""
    lines = []
    for s in range(1, 31):
        length = 300.0 if s < 26 else 20.0  # answers collapse to a few tokens from step 26, after the start-up
        lines.append(f"[Step {s}/500] reward_avg={0.4 + 0.01 * s:.3f} kl_loss=0.0100 entropy_avg=0.250 "
                     f"avg_response_len={length:.1f} reward_std=0.100")
        if s % 5 == 0:
            lines.append(f"[Step {s}/500] eval_acc=0.57")
    (tmp_path / "train.log").write_text("\n".join(lines) + "\n")
    assert main(["watch", str(tmp_path / "train.log")]) == 3
    out = capsys.readouterr().out
    assert "read by meaning: eval_acc -> val-core/eval_acc/acc/mean@1, kl_loss -> actor/kl_loss, entropy_avg -> " \
           "actor/entropy, avg_response_len -> response_length/mean, reward_avg -> critic/score/mean; left " \
           "unmapped: nothing" in out  # reward_std: TRL's name, critic/score/std
    assert "stop the run at step 28" in out  # length_collapse: the median of the last 5, 20 < 0.25 x 300
    assert "Do this: read a few short responses" in out
