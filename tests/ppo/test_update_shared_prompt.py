"""The PPO updates with each group's prompt run once (issue #8): the same losses and steps as before."""

from __future__ import annotations

import pytest
import torch

from klguard.builtin.char_tokenizer import build_char_tokenizer
from klguard.builtin.tiny import build_tiny_llama
from klguard.config.batches import UpdateBatches
from klguard.config.schema import ActorConfig, CriticConfig
from klguard.ppo import shared_prefix
from klguard.ppo.forward import critic_values
from klguard.ppo.shared_prefix import sequence_logprobs
from klguard.ppo.update import PPOBatch, update_actor, update_critic
from tolerances import EPS32, forward_terms, step_tol

P, R, GROUP = 7, 6, 4


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


# Two paths, one update (tests/tolerances.py): the shared path's outputs move by up to forward_terms(model) x eps32 x
# their scale; a metric is a mean over the N valid tokens of per-token terms that move by that times their
# sensitivity, plus the N-term mean's own rounding; each gradient entry, a sum over the batch's token positions taken
# in another order (tests/ppo/test_shared_prefix.py), moves by up to positions x eps32 x max|grad| more, and the
# weights by lr x that (step_tol). What that catches: a shared forward whose logits are 0.1% off (log-probs ~6e-4
# off; responses one position off move them by 1e-3) fails the weights by 3x and grad_norm by 30x (the critic's
# outputs 0.01% off: 3x); 1% off fails pg_loss, entropy and ppo_kl too. kl_loss is loose (its terms move by
# |1 - exp(ref - lp)| ~ 0.05 of a log-prob change), not the sharp check.
def _metric_terms(model: torch.nn.Module, batch: PPOBatch) -> int:
    return forward_terms(model) + int(batch.response_mask.sum())


def _grad_terms(model: torch.nn.Module, batch: PPOBatch) -> int:
    return forward_terms(model) + batch.input_ids.numel()


def _assert_same_weights(plain: torch.nn.Module, shared: torch.nn.Module, start: torch.nn.Module, terms: int) -> None:
    for (name, a), b, p0 in zip(plain.named_parameters(), shared.parameters(), start.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=step_tol(p0, a, terms), msg=lambda m, name=name: f"{name}: {m}")


def _actor_step(share: bool, micro: int | None) -> tuple[dict[str, float], torch.nn.Module]:
    model, batch = _policy(), _grouped_batch()
    cfg = ActorConfig(ppo_mini_batch_size=len(batch), ppo_micro_batch_size_per_gpu=micro, use_kl_loss=True,
                      kl_loss_coef=0.1, entropy_coeff=0.01)
    optim = torch.optim.SGD(model.parameters(), lr=0.1)  # weights move by lr x gradient
    metrics, _ = update_actor(model, optim, batch, cfg, batches=UpdateBatches(len(batch), micro or len(batch)),
                              temperature=0.9, share_prompt=share)
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
    batch = _grouped_batch()
    valid = batch.response_mask.bool()
    lp, adv = batch.old_logprobs[valid].abs(), batch.advantages[valid].abs()
    # per-token scales: a log-prob's, times |A| in pg_loss's -A x ratio (ratio ~ 1); k3 (kl_loss) and ppo_kl move
    # by at most their log-prob's change (|ref - lp| < 0.3), the entropy by its logits' (~ |lp|) scale
    scales = {"actor/pg_loss": float((adv * lp).mean()), "actor/kl_loss": float(lp.mean()),
              "actor/entropy": max(float(lp.mean()), plain["actor/entropy"]), "actor/ppo_kl": float(lp.mean())}
    metric_terms = _metric_terms(plain_model, batch)
    for key, scale in scales.items():
        assert shared[key] == pytest.approx(plain[key], rel=0, abs=metric_terms * EPS32 * scale), key
    grad_terms = _grad_terms(plain_model, batch)
    grad_norm = plain["actor/grad_norm"]
    assert shared["actor/grad_norm"] == pytest.approx(grad_norm, rel=0, abs=grad_terms * EPS32 * grad_norm)
    _assert_same_weights(plain_model, shared_model, _policy(), grad_terms)
    moved = [n for (n, a), b in zip(plain_model.named_parameters(), _policy().parameters(), strict=True)
             if not torch.equal(a, b)]
    assert moved, "the update changed nothing"


def test_critic_update_with_shared_prompts_matches_the_plain_one():
    from transformers import LlamaForTokenClassification

    def new_critic():
        policy = _policy()
        policy.config.num_labels, policy.config.classifier_dropout = 1, 0.0
        torch.manual_seed(0)
        return LlamaForTokenClassification(policy.config)

    def step(share: bool):
        critic, batch = new_critic(), _grouped_batch()
        cfg = CriticConfig(ppo_mini_batch_size=len(batch), ppo_epochs=1, shuffle=False, loss_agg_mode="token-mean")
        metrics, _ = update_critic(critic, torch.optim.SGD(critic.parameters(), lr=0.1), batch, cfg,
                                   batches=UpdateBatches(len(batch), len(batch)), share_prompt=share)
        return metrics, critic

    (plain, a), (shared, b) = step(False), step(True)
    assert plain["critic/vf_loss"] > 0
    start, batch = new_critic(), _grouped_batch()
    with torch.no_grad():
        values = critic_values(start, batch.input_ids, batch.attention_mask, R)
    valid = batch.response_mask.bool()
    # 0.5 (v - R)^2 moves by |v - R| x its value's change, and rounds at its own scale in the mean
    scale = max(float(((values - batch.returns).abs() * values.abs())[valid].mean()), plain["critic/vf_loss"])
    vf_loss = plain["critic/vf_loss"]
    assert shared["critic/vf_loss"] == pytest.approx(vf_loss, rel=0, abs=_metric_terms(start, batch) * EPS32 * scale)
    grad_terms = _grad_terms(start, batch)
    grad_norm = plain["critic/grad_norm"]
    assert shared["critic/grad_norm"] == pytest.approx(grad_norm, rel=0, abs=grad_terms * EPS32 * grad_norm)
    _assert_same_weights(a, b, start, grad_terms)
