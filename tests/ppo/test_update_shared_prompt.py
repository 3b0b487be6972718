"""The PPO updates with each group's prompt run once (issue #8): the same losses and steps as before."""

from __future__ import annotations

import pytest
import torch

from klguard.config.schema import ActorConfig, CriticConfig
from klguard.model.char_tokenizer import build_char_tokenizer
from klguard.model.tiny import build_tiny_llama
from klguard.ppo import shared_prefix
from klguard.ppo.shared_prefix import sequence_logprobs
from klguard.ppo.update import PPOBatch, update_actor, update_critic

P, R, GROUP = 7, 6, 4
TOL = {"rtol": 1e-5, "atol": 1e-6}


def _policy() -> torch.nn.Module:
    return build_tiny_llama(build_char_tokenizer(), seed=0, hidden_size=32, num_layers=2, num_heads=2,
                            intermediate_size=64)


def _grouped_batch(prompts: int = 3) -> PPOBatch:
    """`prompts` prompts x GROUP rollouts each, left-padded prompts of different lengths, some short responses."""
    gen = torch.Generator().manual_seed(3)
    n = prompts * GROUP
    prompt = torch.randint(3, 20, (prompts, P), generator=gen).repeat_interleave(GROUP, 0)
    prompt_mask = torch.ones(prompts, P, dtype=torch.long)
    for i in range(prompts):
        prompt_mask[i, : 2 * i] = 0
    prompt_mask = prompt_mask.repeat_interleave(GROUP, 0)
    response = torch.randint(3, 20, (n, R), generator=gen)
    response_mask = torch.ones(n, R)
    response_mask[1, 3:] = 0
    response_mask[6, 1:] = 0
    ids, mask = torch.cat([prompt, response], 1), torch.cat([prompt_mask, response_mask.long()], 1)
    with torch.no_grad():
        old = sequence_logprobs(_policy(), ids, mask, R, share_prompt=False)
    ref = old + 0.05 * torch.randn(n, R, generator=gen)
    advantages = torch.randn(n, R, generator=gen)
    returns = torch.randn(n, R, generator=gen)
    return PPOBatch(ids, mask, response_mask, old, advantages, returns, values=torch.zeros(n, R),
                    ref_logprobs=ref)


def _actor_step(share: bool, micro: int | None) -> tuple[dict[str, float], torch.nn.Module]:
    model, batch = _policy(), _grouped_batch()
    cfg = ActorConfig(ppo_mini_batch_size=len(batch), ppo_micro_batch_size_per_gpu=micro, use_kl_loss=True,
                      kl_loss_coef=0.1, entropy_coeff=0.01)
    optim = torch.optim.SGD(model.parameters(), lr=0.1)  # weights move by lr x gradient
    metrics = update_actor(model, optim, batch, cfg, mini_batch_size=len(batch), temperature=0.9,
                           share_prompt=share)
    return metrics, model


@pytest.mark.parametrize("micro", [None, 8])
def test_actor_update_with_shared_prompts_matches_the_plain_one(micro, monkeypatch):
    calls = []
    real = shared_prefix.shared_prefix_forward
    monkeypatch.setattr(shared_prefix, "shared_prefix_forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    plain, plain_model = _actor_step(False, micro)
    assert not calls
    shared, shared_model = _actor_step(True, micro)
    assert len(calls) == (1 if micro is None else 2)  # one shared forward per micro-batch
    assert plain["actor/pg_loss"] != 0 and plain["actor/kl_loss"] > 0
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/ppo_kl", "actor/grad_norm"):
        assert shared[key] == pytest.approx(plain[key], rel=1e-5, abs=1e-7), key
    for (name, a), b in zip(plain_model.named_parameters(), shared_model.parameters(), strict=True):
        torch.testing.assert_close(b, a, **TOL, msg=lambda m, name=name: f"{name}: {m}")
    moved = [n for (n, a), b in zip(plain_model.named_parameters(), _policy().parameters(), strict=True)
             if not torch.equal(a, b)]
    assert moved, "the update changed nothing"


def test_critic_update_with_shared_prompts_matches_the_plain_one():
    from transformers import LlamaForTokenClassification

    def step(share: bool):
        policy = _policy()
        policy.config.num_labels, policy.config.classifier_dropout = 1, 0.0
        torch.manual_seed(0)
        critic = LlamaForTokenClassification(policy.config)
        batch = _grouped_batch()
        cfg = CriticConfig(ppo_mini_batch_size=len(batch), ppo_epochs=1, shuffle=False, loss_agg_mode="token-mean")
        metrics = update_critic(critic, torch.optim.SGD(critic.parameters(), lr=0.1), batch, cfg,
                                mini_batch_size=len(batch), share_prompt=share)
        return metrics, critic

    (plain, a), (shared, b) = step(False), step(True)
    assert plain["critic/vf_loss"] > 0
    assert shared["critic/vf_loss"] == pytest.approx(plain["critic/vf_loss"], rel=1e-5)
    assert shared["critic/grad_norm"] == pytest.approx(plain["critic/grad_norm"], rel=1e-5)
    for (name, x), y in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(y, x, **TOL, msg=lambda m, name=name: f"{name}: {m}")
