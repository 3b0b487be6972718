"""verl's batch arithmetic, resolved once (klguard.config.batches): the sizes at 1 and 2 ranks, and one error line
naming the key when a size does not divide."""

from __future__ import annotations

import pytest

from klguard.config import ConfigError, load_config
from klguard.config.batches import UpdateBatches, resolve_batches


def _cfg(*overrides):
    return load_config(None, ["data.train_batch_size=16", "actor_rollout_ref.rollout.n=4",
                              "actor_rollout_ref.actor.ppo_mini_batch_size=8", "critic.ppo_mini_batch_size=16",
                              *overrides]).config


def test_sizes_at_one_and_two_ranks():
    one = resolve_batches(_cfg("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"))
    assert (one.prompts, one.n, one.rows) == (16, 4, 64)
    assert one.actor == UpdateBatches(mini_rows=32, micro_rows=8)  # 8 prompts x 4 rollouts, passes of 8
    assert one.critic == UpdateBatches(mini_rows=64, micro_rows=64)  # no micro size: the whole mini-batch
    assert one.actor_block == 32
    two = resolve_batches(_cfg("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"), dp_size=2)
    assert two.actor == UpdateBatches(16, 8) and two.critic == UpdateBatches(32, 32) and two.actor_block == 32


@pytest.mark.parametrize(("overrides", "dp", "message"), [
    (["actor_rollout_ref.actor.ppo_mini_batch_size=6"], 1,
     "actor_rollout_ref.actor.ppo_mini_batch_size=6 must divide data.train_batch_size=16"),
    (["critic.ppo_micro_batch_size_per_gpu=128"], 1, "critic.ppo_micro_batch_size_per_gpu=128 is larger than"),
    (["critic.ppo_micro_batch_size_per_gpu=24"], 1, "must divide the mini-batch of 64 rollouts"),
    (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32"], 2,
     "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32 must divide the per-rank mini-batch of 16 rollouts"),
    (["actor_rollout_ref.actor.ppo_mini_batch_size=1", "actor_rollout_ref.rollout.n=3"], 2,
     "x rollout.n=3 = 3 rollouts does not split evenly over 2 ranks"),
])
def test_a_size_that_does_not_divide_names_its_key(overrides, dp, message):
    if dp == 1:
        with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
            _cfg(*overrides)
        return
    cfg = _cfg(*overrides)
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        resolve_batches(cfg, dp)
