"""Rewards on real tokenizers: the sequence-classification reward model, its combination with rules, the
length penalty, GSM8K strict/flexible by data_source, and custom reward files that fail (NaN scores are the
trainer's to handle)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from klguard.config import load_config
from klguard.errors import UserError
from klguard.reward.manager import RewardManager, hacked_by_model
from klguard.reward.registry import compute_gold_score
from tolerances import float32_tol, forward_terms

PROMPTS = [[{"role": "user", "content": "Tom has 3 apples and buys 11 more."}],
           [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "How many apples?"}],
           [{"role": "user", "content": "Tom has 4 apples."}]]
RESPONSES = ["#### 14", "He has 25 apples now, the answer is 25", ""]


def _manager(*overrides: str) -> RewardManager:
    config = load_config(None, ["data.train_files=x.parquet", "data.val_files=y.parquet", "trainer.device=cpu",
                                *overrides]).config
    return RewardManager(config, tokenizer=None)


def _direct_rm_scores(folder) -> list[float]:
    """One sequence at a time, rendered with the RM's own chat template: what batching must reproduce."""
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    scores = []
    for prompt, response in zip(PROMPTS, RESPONSES, strict=True):
        text = tok.apply_chat_template([*prompt, {"role": "assistant", "content": response}], tokenize=False)
        ids = tok(text, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            scores.append(model(**ids).logits[0, 0].item())
    return scores


@pytest.mark.parametrize("micro", [1, 2, 8])
def test_reward_model_batched_scores_match_one_at_a_time_minus_length_penalty(assets, micro):
    rm = _manager("reward_model.enable=true", f"reward_model.model.path={assets.rm}",
                  f"reward_model.micro_batch_size_per_gpu={micro}", "reward_model.length_penalty=0.1")
    n_tokens = [3, 12, 1]
    out = rm(RESPONSES, n_tokens, ["openai/gsm8k"] * 3, ["14", "25", "4"], [{}] * 3, prompts=PROMPTS)
    expected = torch.tensor(_direct_rm_scores(assets.rm)) - 0.1 * torch.tensor(n_tokens, dtype=torch.float)
    # padded micro-batches vs one row: forward_terms x eps32 x the scores' scale (tests/tolerances.py), 1e-5 here,
    # while a score read one token early moves it by 0.18
    atol = float32_tol(expected, forward_terms(AutoConfig.from_pretrained(assets.rm)))
    torch.testing.assert_close(out.scores, expected, rtol=0, atol=atol)
    assert out.gold.tolist() == [1.0, 0.0, 0.0]  # GSM8K strict is kept as the gold score


def test_rule_weight_adds_the_rule_score_and_unknown_sources_have_no_gold(assets):
    base = ["reward_model.enable=true", f"reward_model.model.path={assets.rm}"]
    args = (RESPONSES, [3, 12, 1], ["openai/gsm8k"] * 3, ["14", "25", "4"], [{}] * 3)
    alone = _manager(*base)(*args, prompts=PROMPTS)
    mixed = _manager(*base, "reward_model.rule_weight=2.0")(*args, prompts=PROMPTS)
    torch.testing.assert_close(mixed.scores, alone.scores + 2.0 * torch.tensor([1.0, 0.0, 0.0]))
    chat = _manager(*base)(RESPONSES, [3, 12, 1], ["hh_rlhf"] * 3, ["", "", ""], [{}] * 3, prompts=PROMPTS)
    assert chat.gold is None and chat.hacked is None  # an RM-only data source needs no rule


def test_hacked_by_model_compares_with_the_correct_answers_mean():
    gold, scores = torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.tensor([1.0, 3.0, 2.5, 1.5])
    assert hacked_by_model(gold, scores).tolist() == [False, False, True, False]
    assert not hacked_by_model(torch.zeros(2), torch.ones(2)).any()


def test_gsm8k_strict_and_flexible_by_data_source():
    text = "The answer is 25"
    assert compute_gold_score("openai/gsm8k", text, "25") == 0.0
    assert compute_gold_score("openai/gsm8k:flexible", text, "25") == 1.0
    assert compute_gold_score("openai/gsm8k:flexible", "#### 24 then 25", "25") == 1.0


@pytest.mark.parametrize(("body", "message"), [
    ("def other(*a):\n    return 1.0\n", "custom_reward_function.name=compute_score is not a function in"),
    ("def compute_score(ds, s, gt, ei=None):\n    return 1 / (len(s) - 7)\n",
     "reward function failed on sample 1 (data_source=openai/gsm8k): ZeroDivisionError"),
])
def test_custom_reward_failures_name_the_sample(tmp_path, body, message):
    file = tmp_path / "reward.py"
    file.write_text(body)
    with pytest.raises(UserError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        manager = _manager(f"custom_reward_function.path={file}")
        manager(["fine", "sevenCh", "bad"], [1, 1, 1], ["openai/gsm8k"] * 3, ["1"] * 3, [{}] * 3)


def test_the_audit_rm_scores_every_response_and_is_not_optimised(assets):
    base = ["reward_model.enable=true", f"reward_model.model.path={assets.rm}"]
    args = (RESPONSES, [3, 12, 1], ["openai/gsm8k"] * 3, ["14", "25", "4"], [{}] * 3)
    plain = _manager(*base)(*args, prompts=PROMPTS)
    audited = _manager(*base, f"reward_model.audit_model.path={assets.rm}", "reward_model.length_penalty=0.1")(
        *args, prompts=PROMPTS)
    assert plain.audit is None
    # the audit RM (here the same folder) reads the same chats: its scores are the RM's own, before the penalty
    torch.testing.assert_close(audited.audit, audited.rm_scores, rtol=0, atol=0)
    torch.testing.assert_close(audited.rm_scores, plain.rm_scores, rtol=0, atol=0)
    assert not torch.equal(audited.scores, audited.audit)  # PPO optimises the penalised score, never the audit's


@pytest.mark.parametrize(("folder", "message"), [
    ("missing", "reward_model.audit_model.path={p} is not a folder"),
    ("empty", "reward_model.audit_model.path={p}"),
])
def test_a_bad_audit_folder_is_one_line_and_exit_2(assets, tmp_path, capsys, folder, message):
    from klguard.commands.cli import main

    path = tmp_path / folder
    if folder == "empty":
        path.mkdir()
    code = main(["train", "trainer.total_training_steps=1", "reward_model.enable=true",
                 f"reward_model.model.path={assets.rm}", f"reward_model.audit_model.path={path}",
                 f"trainer.default_local_dir={tmp_path / 'run'}"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("klguard: error: " + message.format(p=path)), lines


def _rm_variant(source, dest, *, head_seed: int, body_shift: float = 0.0):
    """A copy of the RM `source` with another score head (and, with `body_shift`, another final norm)."""
    model = AutoModelForSequenceClassification.from_pretrained(source)
    with torch.no_grad():
        model.score.weight.copy_(torch.randn(model.score.weight.shape,
                                             generator=torch.Generator().manual_seed(head_seed)))
        model.model.norm.weight.add_(body_shift)
    model.save_pretrained(dest)
    AutoTokenizer.from_pretrained(source).save_pretrained(dest)
    return dest


def test_reward_models_that_differ_only_in_their_head_share_one_forward(assets, tmp_path):
    from klguard.reward.ensemble import RewardEnsemble
    from klguard.reward.model_rm import ModelReward, SharedHead

    head_b = _rm_variant(assets.rm, tmp_path / "head-b", head_seed=3)
    other_body = _rm_variant(assets.rm, tmp_path / "other-body", head_seed=3, body_shift=0.5)
    config = load_config(None, ["trainer.device=cpu", "reward_model.micro_batch_size_per_gpu=2"]).config
    ensemble = RewardEnsemble(config, torch.device("cpu"), [assets.rm, head_b, other_body], user=True)
    assert isinstance(ensemble.members[1], SharedHead)  # same body, another head
    assert isinstance(ensemble.members[2], ModelReward)  # another body: a forward of its own
    forwards = []
    ensemble.body.model.register_forward_hook(lambda *_: forwards.append(1))
    shared = ensemble.members[1](PROMPTS, RESPONSES)  # texts the body has not scored: a forward of its own
    assert len(forwards) == 2  # 3 responses in micro-batches of 2
    ensemble(PROMPTS, RESPONSES)
    assert len(forwards) == 4  # the first member's forward, and the shared head read on it
    # each member's scores are its own model's, loaded alone and scored in the same micro-batches
    alone = {f: ModelReward(config, torch.device("cpu"), f, user=True)(PROMPTS, RESPONSES)
             for f in (assets.rm, head_b, other_body)}
    torch.testing.assert_close(shared, alone[head_b], rtol=0, atol=0)
    torch.testing.assert_close(ensemble.members[1](PROMPTS, RESPONSES), alone[head_b], rtol=0, atol=0)
    assert len(forwards) == 4
    assert not torch.equal(alone[head_b], alone[assets.rm]) and not torch.equal(alone[head_b], alone[other_body])
    mean = (alone[assets.rm] + alone[head_b] + alone[other_body]) / 3
    torch.testing.assert_close(ensemble(PROMPTS, RESPONSES).scores, mean, rtol=0, atol=0)


def test_an_audit_rm_on_the_reward_models_body_is_read_on_its_forward(assets, tmp_path):
    from klguard.reward.model_rm import ModelReward, SharedHead

    head_b = _rm_variant(assets.rm, tmp_path / "head-b", head_seed=4)
    base = ["reward_model.enable=true", f"reward_model.model.path={assets.rm}"]
    manager = _manager(*base, f"reward_model.audit_model.path={head_b}")
    assert isinstance(manager.audit, SharedHead)
    out = manager(RESPONSES, [3, 12, 1], ["openai/gsm8k"] * 3, ["14", "25", "4"], [{}] * 3, prompts=PROMPTS)
    config = load_config(None, ["trainer.device=cpu"]).config
    torch.testing.assert_close(out.audit, ModelReward(config, torch.device("cpu"), head_b, user=True)(
        PROMPTS, RESPONSES), rtol=0, atol=0)
    torch.testing.assert_close(out.rm_scores, _manager(*base)(
        RESPONSES, [3, 12, 1], ["openai/gsm8k"] * 3, ["14", "25", "4"], [{}] * 3, prompts=PROMPTS).rm_scores,
        rtol=0, atol=0)
