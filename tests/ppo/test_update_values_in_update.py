"""The critic's rollout-time values taken from its update forward (issue #8): same losses, same weights."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaForTokenClassification

from klguard.builtin.char_tokenizer import build_char_tokenizer
from klguard.builtin.tiny import tiny_llama_config
from klguard.config.batches import UpdateBatches
from klguard.config.schema import CriticConfig
from klguard.ppo.forward import critic_values
from klguard.ppo.update import PPOBatch, critic_values_in_update, update_critic
from tolerances import EPS32, forward_terms, step_tol

R = 6


def _critic() -> torch.nn.Module:
    config = tiny_llama_config(build_char_tokenizer(), hidden_size=32, num_layers=2, num_heads=2,
                               intermediate_size=64)
    config.num_labels, config.classifier_dropout = 1, 0.0
    torch.manual_seed(0)
    return LlamaForTokenClassification(config)


def _batch(n: int = 8) -> PPOBatch:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 20, (n, 5 + R), generator=gen)
    mask = torch.ones_like(ids)
    mask[: n // 2, :2] = 0  # left-padded prompts
    response_mask = torch.ones(n, R)
    response_mask[1, 4:] = 0  # a short response
    mask[:, 5:] = response_mask.long()
    returns = torch.randn(n, R, generator=gen)
    zeros = torch.zeros(n, R)
    return PPOBatch(ids, mask, response_mask, zeros, zeros, returns)


def _cfg(**changes) -> CriticConfig:
    return CriticConfig(**{"ppo_mini_batch_size": 8, "ppo_epochs": 1, "shuffle": False,
                           "loss_agg_mode": "token-mean", **changes})


def _update(critic, batch, cfg, in_update: bool) -> dict[str, float]:
    optim = torch.optim.SGD(critic.parameters(), lr=1e-2)  # weights move by lr x gradient
    with torch.set_grad_enabled(in_update):
        vpreds = critic_values(critic, batch.input_ids, batch.attention_mask, R)
    batch.values = vpreds.detach() * batch.response_mask
    batch.vpreds = vpreds if in_update else None
    return update_critic(critic, optim, batch, cfg, batches=UpdateBatches(len(batch), len(batch)))[0]


@pytest.mark.parametrize("cliprange_value", [0.5, 0.0])
@pytest.mark.parametrize("shuffle", [False, True])
def test_values_from_the_update_forward_give_the_same_loss_and_weights(cliprange_value, shuffle):
    cfg = _cfg(cliprange_value=cliprange_value, shuffle=shuffle)
    separate, fused = _critic(), _critic()
    assert critic_values_in_update(cfg, 8, UpdateBatches(8, 8))
    metrics_separate = _update(separate, _batch(), cfg, in_update=False)
    metrics_fused = _update(fused, _batch(), cfg, in_update=True)
    assert metrics_fused["critic/vf_loss"] > 0
    # in batch order the two are the same computation, bit for bit; shuffled, the separate path runs its
    # forward on permuted rows, which changes float rounding only (tests/tolerances.py): the values by up to
    # forward_terms x eps32 x |v|, the N-token loss means and the gradients' sums over the token positions by
    # their length x eps32 x their terms' scale. Held values 0.1% off (2e-4) fail the weights by 7x, grad_norm by 40x.
    batch = _batch()
    with torch.no_grad():
        values = critic_values(_critic(), batch.input_ids, batch.attention_mask, R)
    valid = batch.response_mask.bool()
    metric_terms = forward_terms(separate) + int(valid.sum())
    grad_terms = forward_terms(separate) + batch.input_ids.numel()
    scales = {  # 0.5 (v - R)^2 moves by |v - R| x its value's change; clipfrac and grad_norm have no cancellation
        "critic/vf_loss": (metric_terms, max(float(((values - batch.returns).abs() * values.abs())[valid].mean()),
                                             metrics_separate["critic/vf_loss"])),
        "critic/vf_clipfrac": (metric_terms, metrics_separate["critic/vf_clipfrac"]),
        "critic/grad_norm": (grad_terms, metrics_separate["critic/grad_norm"]),
    }
    for key, (terms, scale) in scales.items():
        tol = terms * EPS32 * scale if shuffle else 0.0
        assert metrics_fused[key] == pytest.approx(metrics_separate[key], rel=0, abs=tol), key
    for (name, a), b, p0 in zip(separate.named_parameters(), fused.parameters(), _critic().parameters(), strict=True):
        tol = step_tol(p0, a, grad_terms) if shuffle else 0.0
        torch.testing.assert_close(a, b, rtol=0, atol=tol, msg=lambda m, name=name: f"{name}: {m}")


def test_the_update_changes_the_critic():
    cfg = _cfg()
    critic = _critic()
    before = copy.deepcopy(critic.state_dict())
    _update(critic, _batch(), cfg, in_update=True)
    changed = [k for k, v in critic.state_dict().items() if not torch.equal(v, before[k])]
    assert len(changed) == len(before)


@pytest.mark.parametrize(("epochs", "mini", "micro", "expected"), [
    (1, 8, None, True), (1, 8, 8, True), (1, 16, None, True),
    (2, 8, None, False), (1, 4, None, False), (1, 8, 4, False)])
def test_values_come_from_the_update_only_for_one_step_in_one_micro_batch(epochs, mini, micro, expected):
    cfg = _cfg(ppo_epochs=epochs, ppo_micro_batch_size_per_gpu=micro)
    assert critic_values_in_update(cfg, 8, UpdateBatches(mini, micro or mini)) is expected


def test_update_critic_refuses_held_predictions_it_cannot_use():
    cfg = _cfg(ppo_epochs=2)
    critic, batch = _critic(), _batch()
    with pytest.raises(ValueError, match="one epoch of one mini-batch"):
        _update(critic, batch, cfg, in_update=True)
