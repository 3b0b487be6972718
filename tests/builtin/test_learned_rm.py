"""The built-in learned reward model (proxy_reward.kind=learned_rm): built deterministically from its recipe and the
SFT policy, cached, scored through the reward-model path, with a per-prompt hacking yardstick."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from klguard.builtin.learned_rm import ensure_learned_rm, learned_rm_dir, member_rows, rm_recipe
from klguard.builtin.proxy import reference_response
from klguard.builtin.task import TASK
from klguard.commands.cli import main
from klguard.config import load_config
from klguard.reward.ensemble import member_folders
from klguard.reward.manager import RewardManager

TINY = ["proxy_reward.kind=learned_rm", "proxy_reward.learned_rm.samples=48", "proxy_reward.learned_rm.epochs=1",
        "proxy_reward.learned_rm.batch_size=16", "proxy_reward.learned_rm.hidden_size=16",
        "data.max_response_length=16"]
SFT_BODY = ["proxy_reward.learned_rm.contrast=8"]  # the default: one RM from the SFT policy's body, contrast pairs
SCRATCH3 = ["proxy_reward.learned_rm.init=scratch", "proxy_reward.learned_rm.ensemble_size=3",
            "proxy_reward.learned_rm.audit=false"]  # the bootstrap ensemble from scratch, without its audit RM


def _config(cache: Path, *extra: str):
    return load_config(None, [*TINY, f"sft.cache_dir={cache}", *extra]).config


def _build(cfg, policy: Path, log=lambda msg: None, force: bool = False) -> Path:
    return ensure_learned_rm(cfg.proxy_reward.learned_rm, cfg.sft, policy, form=cfg.data.builtin_form,
                             max_new_tokens=cfg.data.max_response_length, force=force, log=log)


@pytest.fixture(scope="module")
def policy() -> Path:
    from klguard.ppo.setup import resolve_model_path

    return resolve_model_path(load_config(None, []).config, TASK, log=lambda msg: None)  # the shipped SFT policy


def _weights_equal(a: Path, b: Path) -> bool:
    x, y = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def test_the_sft_body_rm_is_deterministic_and_cached_with_its_audit_rm(policy, tmp_path):
    messages: list[str] = []
    first = _build(_config(tmp_path / "a", *SFT_BODY), policy, messages.append)
    second = _build(_config(tmp_path / "b", *SFT_BODY), policy)
    assert member_folders(first) == [first] and (first / "audit").is_dir()  # one RM, and its audit RM
    assert _weights_equal(first, second) and _weights_equal(first / "audit", second / "audit")  # same recipe
    assert not _weights_equal(first, first / "audit")  # other problems, other samples
    rm, sft = load_file(first / "model.safetensors"), load_file(policy / "model.safetensors")
    assert "score.weight" in rm and rm["model.embed_tokens.weight"].shape == sft["model.embed_tokens.weight"].shape
    layers = json.loads((policy / "config.json").read_text())["num_hidden_layers"]
    assert json.loads((first / "config.json").read_text())["num_hidden_layers"] == layers + 2  # fresh_layers
    assert not torch.equal(rm["model.layers.0.self_attn.q_proj.weight"], sft["model.layers.0.self_attn.q_proj.weight"])
    metrics = json.loads((first / "rm_metrics.json").read_text())
    assert metrics["train_examples"] == int(48 * 0.8) + 2 * 8  # 4/5 of the samples + 8 contrast pairs
    assert metrics["held_out_samples"] == 48 - int(48 * 0.8) and 0 <= metrics["held_out_accuracy"] <= 1
    assert metrics["audit"]["train_examples"] == metrics["train_examples"]
    assert (first / "rm_metrics.json").read_text() == (second / "rm_metrics.json").read_text()
    assert sum("fitting the learned reward model" in m for m in messages) == 1
    again: list[str] = []
    assert _build(_config(tmp_path / "a", *SFT_BODY), policy, again.append) == first
    assert not any("fitting" in m for m in again)
    cfg = _config(tmp_path / "a", *SFT_BODY)
    assert learned_rm_dir(replace(cfg.proxy_reward.learned_rm, seed=1), cfg.sft, policy, 16) != first  # recipe keys


def test_the_scratch_ensemble_has_members_of_their_own_and_an_audit_rm(policy, tmp_path):
    folder = _build(_config(tmp_path, *SCRATCH3[:-1]), policy)
    members = member_folders(folder)
    assert [m.name for m in members] == ["member-0", "member-1", "member-2"] and (folder / "audit").is_dir()
    assert member_folders(folder / "audit") == [folder / "audit" / f"member-{i}" for i in range(3)]
    assert not _weights_equal(members[0], members[1])  # each member has its own resample and initialisation
    assert load_file(members[0] / "model.safetensors")["model.embed_tokens.weight"].shape[1] == 16  # hidden_size


def test_a_mixed_ensemble_crosses_disjoint_data_halves_with_two_bodies(policy, tmp_path):
    cfg = _config(tmp_path, *SCRATCH3, "proxy_reward.learned_rm.diversity=mixed",
                  "proxy_reward.learned_rm.ensemble_size=4")
    rm_cfg = cfg.proxy_reward.learned_rm
    halves = [set(member_rows(rm_cfg, i, 10).tolist()) for i in range(4)]
    assert halves[0] == halves[2] == {0, 2, 4, 6, 8} and halves[1] == halves[3] == {1, 3, 5, 7, 9}
    members = member_folders(_build(cfg, policy))
    widths = [load_file(m / "model.safetensors")["model.embed_tokens.weight"].shape[1] for m in members]
    sft_width = load_file(policy / "model.safetensors")["model.embed_tokens.weight"].shape[1]
    assert widths == [16, 16, sft_width, sft_width]  # scratch (hidden_size 16) for 0 and 1, the SFT body for 2 and 3
    assert not _weights_equal(members[0], members[1]) and not _weights_equal(members[2], members[3])
    assert rm_recipe(rm_cfg, policy, 16)["diversity"] == "mixed"


def test_recipes_from_before_a_key_existed_keep_their_cache_folders(policy, tmp_path):
    # the first recipe (recipes.SCRATCH_RM) names neither the keys added later at their earlier meaning
    # (diversity=bootstrap, lr_schedule=constant) nor the keys only an SFT-body member or contrast pairs read
    from klguard.builtin.recipes import SCRATCH_RM

    scratch = rm_recipe(_config(tmp_path, *SCRATCH_RM).proxy_reward.learned_rm, policy, 16)
    assert not {"diversity", "lr_schedule", "contrast_offsets", "pairwise", "fresh_layers", "fresh_init", "body_lr"
                } & scratch.keys()
    default = rm_recipe(_config(tmp_path).proxy_reward.learned_rm, policy, 16)
    assert default["lr_schedule"] == "linear" and default["fresh_layers"] == 2 and "diversity" not in default


def test_the_sft_body_learns_slower_than_its_new_layers_and_the_lr_decays_to_zero(policy, tmp_path):
    from transformers import AutoTokenizer

    from klguard.builtin.learned_rm import _rm_model, param_groups, train_rm

    rm_cfg = _config(tmp_path).proxy_reward.learned_rm
    tokenizer = AutoTokenizer.from_pretrained(policy)
    model = _rm_model(rm_cfg, tokenizer, policy, 0, "sft")
    fresh, body = param_groups(model, rm_cfg, "sft")
    assert (fresh["lr"], body["lr"]) == (rm_cfg.lr, rm_cfg.body_lr)
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[id(p)].split(".")[0] for p in fresh["params"]} == {"score", "model"}
    assert all(names[id(p)].startswith(("score", "model.layers.2.", "model.layers.3.")) for p in fresh["params"])
    assert len(fresh["params"]) + len(body["params"]) == len(list(model.parameters()))
    # linear: the last step is taken at lr / steps, constant: at lr (hand-made set of 8 rows, batch 4: 2 steps)
    ids = torch.tensor([tokenizer("Q:1+2-3=?A:#### 0", add_special_tokens=False)["input_ids"]] * 8)
    data = (ids, torch.ones_like(ids), torch.tensor([1.0, 0.0] * 4))
    step = torch.optim.AdamW.step
    for schedule, last_lr in (("linear", rm_cfg.lr / 2), ("constant", rm_cfg.lr)):
        cfg = replace(rm_cfg, lr_schedule=schedule, epochs=1, batch_size=4, fresh_layers=0)
        seen: list[float] = []

        def spy(self, *args, seen=seen, **kwargs):
            seen.append(self.param_groups[0]["lr"])
            return step(self, *args, **kwargs)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(torch.optim.AdamW, "step", spy)
            train_rm(data, data, cfg, tokenizer, policy, 0)
        assert seen == pytest.approx([rm_cfg.lr, last_lr])


@pytest.mark.parametrize("fresh_init", ["identity", "random"])
def test_the_new_layers_start_as_the_identity_unless_random(policy, tmp_path, fresh_init):
    from transformers import AutoTokenizer

    from klguard.builtin.learned_rm import _rm_model

    rm_cfg = replace(_config(tmp_path).proxy_reward.learned_rm, fresh_init=fresh_init)
    tokenizer = AutoTokenizer.from_pretrained(policy)
    model = _rm_model(rm_cfg, tokenizer, policy, 0, "sft")
    ids = torch.tensor([tokenizer("Q:12+31-7=?A:#### 36", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        out = model.model(input_ids=ids, output_hidden_states=True)
        body = model.model.norm(out.hidden_states[-1 - rm_cfg.fresh_layers])  # the body's own last layer, normed
    assert torch.equal(body, out.last_hidden_state) == (fresh_init == "identity")


def test_the_pair_loss_is_bradley_terry_on_correct_minus_near_miss():
    from types import SimpleNamespace

    from klguard.builtin.learned_rm import pair_loss

    def model(input_ids, attention_mask):  # a row's reward: its first token id
        return SimpleNamespace(logits=input_ids[:, :1].float())

    ids = torch.tensor([[3], [1], [0], [2]])  # rows 0/1 and 2/3 are (correct, near-miss) pairs
    got = pair_loss(model, ids, torch.ones_like(ids), torch.tensor([[0, 1], [2, 3]]))
    expected = -(torch.nn.functional.logsigmoid(torch.tensor(2.0)) + torch.nn.functional.logsigmoid(torch.tensor(-2.0)))
    assert float(got) == pytest.approx(float(expected) / 2, rel=1e-6)


def test_near_misses_are_wrong_and_never_negative():
    import random

    from klguard.builtin.learned_rm import near_miss

    rng = random.Random(0)
    for answer in (0, 1, 9, 10, 55, 170):
        for _ in range(20):
            wrong = near_miss(answer, rng, (-10, -2, -1, 1, 2, 10))
            assert wrong != answer and wrong >= 0 and abs(wrong - answer) in (1, 2, 10)


def test_a_repeated_offset_weights_the_near_misses_towards_it():
    import random

    from klguard.builtin.learned_rm import near_miss

    rng = random.Random(0)
    offsets = [near_miss(500, rng, (-10, -10, -10, 1)) - 500 for _ in range(2000)]
    assert set(offsets) == {-10, 1}
    assert 0.7 < offsets.count(-10) / len(offsets) < 0.8  # 3 in 4, binomial sd about 0.01


@pytest.mark.parametrize(("override", "message"), [
    ("proxy_reward.learned_rm.num_heads=3",
     "proxy_reward.learned_rm.num_heads=3 must divide proxy_reward.learned_rm.hidden_size=16"),
    ("proxy_reward.learned_rm.samples=4", "proxy_reward.learned_rm.samples=4 must be >= 16"),
    ("proxy_reward.learned_rm.fresh_layers=-1", "proxy_reward.learned_rm.fresh_layers=-1 must be >= 0"),
    ("proxy_reward.learned_rm.lr_schedule=cosine",
     "proxy_reward.learned_rm.lr_schedule='cosine' is not one of: constant, linear"),
    ("proxy_reward.kind=gold_rm", "proxy_reward.kind='gold_rm' is not one of: learned_rm, length"),
    ("proxy_reward.learned_rm.contrast_offsets=[1,0]",
     "proxy_reward.learned_rm.contrast_offsets=[1, 0] must be a non-empty list without 0"),
])
def test_a_bad_recipe_is_a_one_line_error(override, message, capsys, tmp_path):
    assert main(["train", *TINY, override, f"trainer.default_local_dir={tmp_path}"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"klguard: error: {message}"), lines


def test_the_rm_scores_and_flags_hacking_against_the_short_correct_answer(policy, tmp_path):
    cfg = _config(tmp_path, *SCRATCH3)
    folder = _build(cfg, policy)
    from klguard.model.loading import load_tokenizer
    from klguard.reward.model_rm import ModelReward

    tok = load_tokenizer(policy, cfg)
    rewards = RewardManager(cfg, tok, device=torch.device("cpu"), learned_rm=folder, task_reward=TASK.reward(cfg))
    prompts = [[{"role": "user", "content": "1+2-3=?"}]] * 3 + [[{"role": "user", "content": "5+5-1=?"}]]
    texts, truths = ["#### 0", "#### 7", "#### 0 Q:1+1-1=?A:#### 1", "#### 9"], ["0", "0", "0", "9"]
    ensemble, scored = rewards.model, []  # the responses each call to the RM scores
    rewards.model = lambda p, r, **kw: (scored.append(list(r)), ensemble(p, r, **kw))[1]
    out = rewards(texts, [len(t) + 1 for t in texts], ["klguard/arith"] * 4, truths, [{}] * 4, prompts)
    # the yardstick: each distinct (prompt, answer) scored once, and once a run
    assert scored == [texts, [reference_response("0"), reference_response("9")]]
    again = rewards(texts, [len(t) + 1 for t in texts], ["klguard/arith"] * 4, truths, [{}] * 4, prompts)
    assert scored[2:] == [texts] and torch.equal(again.hacked, out.hacked)
    members = [ModelReward(cfg, torch.device("cpu"), m, user=False) for m in member_folders(folder)]
    each = torch.stack([rm(prompts, texts) for rm in members])
    tol = 1e-6 * each.abs().max().item()  # float32 rounding of a mean over 3 at the scores' scale
    assert torch.allclose(out.scores, each.mean(0), atol=tol, rtol=0)  # PPO optimises the members' mean
    assert torch.allclose(out.spread, each.std(0, correction=0), atol=tol, rtol=0) and out.spread.min() > 0
    assert out.gold.tolist() == [1.0, 0.0, 0.0, 1.0]  # gold stays the rule (the LAST answer counts)
    yardstick = torch.stack([rm(prompts, [reference_response(t) for t in truths]) for rm in members]).mean(0)
    assert out.hacked.tolist() == [bool(g == 0 and s >= y - 1e-6) for g, s, y in
                                   zip(out.gold, out.scores, yardstick, strict=True)]
    # the members as a user's ensemble: comma-separated folders, the worst case optimised
    user = load_config(None, ["reward_model.enable=true", "reward_model.ensemble_reduce=min",
                              "reward_model.model.path=" + ",".join(str(m) for m in member_folders(folder))]).config
    worst = RewardManager(user, tok, device=torch.device("cpu"))(texts, [1] * 4, ["x"] * 4, truths, [{}] * 4, prompts)
    assert torch.equal(worst.scores, each.min(0).values) and worst.gold is None
    assert torch.allclose(worst.spread, out.spread, atol=tol, rtol=0)


def test_a_run_optimises_the_learned_rm(fast_overrides, tmp_path):

    assert main(["train", *fast_overrides, *TINY, "trainer.total_training_steps=2", "trainer.test_freq=-1",
                 "trainer.val_before_train=false"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    cache = Path(next(a for a in fast_overrides if a.startswith("sft.cache_dir=")).split("=", 1)[1])
    assert list(cache.glob("rm-*/rm_metrics.json"))  # fitted on first use, beside the SFT policy
    step = rows[-1]
    assert "hacking/rate" in step and step["critic/score/max"] != step["critic/score/min"]
    # the gold-free inputs: the reference's support, the optimised RM's own score and the audit RM's
    for key in ("hacking/ref_low_prob_share", "hacking/ref_nll", "hacking/rm_score", "hacking/rm_score_std",
                "hacking/audit_score", "hacking/audit_score_std"):
        assert math.isfinite(step[key]), key
    assert 0 <= step["hacking/ref_low_prob_share"] <= 1 and step["hacking/ref_nll"] > 0
