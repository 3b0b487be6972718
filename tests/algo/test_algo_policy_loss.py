"""The policy-loss registry: `vanilla` is PPO's clipped surrogate on hand-computed values, names resolve once, the
config key chooses the loss the update calls (every registered one runs there)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from klguard.algo.loss import PolicyLossOutput
from klguard.algo.policy_loss_registry import get_policy_loss, policy_loss_names, register_policy_loss
from klguard.config import ConfigError, load_config
from klguard.config.batches import UpdateBatches

SETTINGS = SimpleNamespace(clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=3.0,
                           use_dual_clip=True, loss_agg_mode="token-mean")


def test_vanilla_is_the_clipped_surrogate_on_hand_computed_values():
    # ratios e^0.5 = 1.6487 (A=+1: the clipped term -1.2 is the larger, chosen), e^-0.5 = 0.6065 (A=+1: the
    # unclipped -0.6065 is the larger), e^1.5 = 4.4817 (A=-1: the unclipped 4.48 is the larger; the dual clip caps
    # it at clip_ratio_c x |A| = 3)
    old = torch.zeros(1, 3)
    new = torch.tensor([[0.5, -0.5, 1.5]])
    adv = torch.tensor([[1.0, 1.0, -1.0]])
    out = get_policy_loss("vanilla")(old, new, adv, torch.ones(1, 3), SETTINGS)
    assert isinstance(out, PolicyLossOutput)
    assert out.pg_loss.item() == pytest.approx((-1.2 - math.exp(-0.5) + 3.0) / 3, rel=1e-6)
    assert out.pg_clipfrac.item() == pytest.approx(1 / 3)  # the first token's clipped term was chosen
    assert out.pg_clipfrac_lower.item() == pytest.approx(1 / 3)  # the third token hit the dual clip
    assert out.ppo_kl.item() == pytest.approx(-0.5, rel=1e-6)  # mean(old - new)


def test_names_are_registered_once_and_unknown_ones_list_the_valid():
    assert "vanilla" in policy_loss_names()
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("vanilla")(lambda *args: None)
    with pytest.raises(ValueError, match="unknown policy loss 'grpo'; valid: vanilla, "):
        get_policy_loss("grpo")


def test_the_config_key_names_a_registered_loss():
    cfg = load_config(None, ["actor_rollout_ref.actor.policy_loss.loss_mode=vanilla"]).config
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "vanilla"
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.actor\.policy_loss\.loss_mode.*must be one of"):
        load_config(None, ["actor_rollout_ref.actor.policy_loss.loss_mode=nope"])
    # a verl key under policy_loss that klguard does not implement is read and reported as ignored
    loaded = load_config(None, ["actor_rollout_ref.actor.policy_loss._target_=verl.workers.config.PolicyLossConfig"])
    assert loaded.ignored_verl_keys == ["actor_rollout_ref.actor.policy_loss._target_"]


@pytest.mark.parametrize("name", policy_loss_names())
def test_the_update_calls_the_configured_loss(monkeypatch, name: str):
    from klguard.ppo import update

    called = []

    def spy(name):
        called.append(name)
        return get_policy_loss(name)

    monkeypatch.setattr(update, "get_policy_loss", spy)
    model = _tiny_model()
    ids = torch.randint(3, 20, (2, 6))
    batch = update.PPOBatch(ids, torch.ones_like(ids), torch.ones(2, 3), torch.zeros(2, 3) - 3.0,
                            torch.ones(2, 3), torch.zeros(2, 3))
    overrides = [f"actor_rollout_ref.actor.policy_loss.loss_mode={name}"]
    if name == "dro":
        overrides.append("actor_rollout_ref.actor.policy_loss.dro_beta=0.1")
    cfg = load_config(None, overrides).config.actor_rollout_ref.actor
    metrics, skipped = update.update_actor(model, torch.optim.SGD(model.parameters(), lr=0.0), batch, cfg,
                                  batches=UpdateBatches(2, 2), temperature=1.0)
    assert called == [name] and math.isfinite(metrics["actor/pg_loss"]) and skipped == []


def _tiny_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2))
