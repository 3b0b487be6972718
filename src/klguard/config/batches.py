"""verl's batch arithmetic, resolved once: how many rollouts a step has, and how many of them each optimizer step
and each forward/backward takes on one data-parallel rank. The checks that name a bad key and the trainer read
the same numbers from here."""

from __future__ import annotations

from dataclasses import dataclass

from klguard.config.roles import run_tp
from klguard.config.schema import Config
from klguard.fields import fail

UPDATE_ROLES = ("actor_rollout_ref.actor", "critic")
"""The config sections that run PPO updates, by key prefix."""


@dataclass(frozen=True)
class UpdateBatches:
    """One role's update batches on one data-parallel rank (rows = rollouts)."""

    mini_rows: int  # rows per optimizer step, this rank's share
    micro_rows: int  # rows per forward/backward (accumulated into the mini-batch)


@dataclass(frozen=True)
class BatchSizes:
    prompts: int  # data.train_batch_size
    n: int  # rollout.n
    dp_size: int
    actor: UpdateBatches
    critic: UpdateBatches

    @property
    def rows(self) -> int:
        """Rollouts a step, over all ranks."""
        return self.prompts * self.n

    @property
    def actor_block(self) -> int:
        """Rollouts of one actor mini-batch over all ranks: the block each rank takes an even share of."""
        return self.actor.mini_rows * self.dp_size


def _section(cfg: Config, prefix: str):
    return cfg.actor_rollout_ref.actor if prefix == UPDATE_ROLES[0] else cfg.critic


def resolve_batches(cfg: Config, dp_size: int = 1) -> BatchSizes:
    """The step's batch sizes over `dp_size` data-parallel ranks; a ConfigError naming the key when they do not
    divide (verl #2505: a mismatch there is a silent grad_norm=NaN)."""
    n, prompts = cfg.actor_rollout_ref.rollout.n, cfg.data.train_batch_size
    per_role = []
    for prefix in UPDATE_ROLES:
        section = _section(cfg, prefix)
        mini, micro = section.ppo_mini_batch_size, section.ppo_micro_batch_size_per_gpu
        if prompts % mini:
            fail(f"{prefix}.ppo_mini_batch_size", mini, f"must divide data.train_batch_size={prompts}")
        rows = mini * n
        if rows % dp_size:
            fail(f"{prefix}.ppo_mini_batch_size", mini,
                 f"x rollout.n={n} = {rows} rollouts does not split evenly over {_ranks(cfg, dp_size)}")
        per_rank = rows // dp_size
        if micro is not None and dp_size == 1 and micro > rows:
            fail(f"{prefix}.ppo_micro_batch_size_per_gpu", micro,
                 f"is larger than the mini-batch ({prefix}.ppo_mini_batch_size={mini} x rollout.n={n})")
        if micro is not None and per_rank % micro:
            share = (f"mini-batch of {rows} rollouts (ppo_mini_batch_size x rollout.n)" if dp_size == 1 else
                     f"per-rank mini-batch of {per_rank} rollouts ({prefix}.ppo_mini_batch_size x rollout.n / "
                     f"{_ranks(cfg, dp_size)})")
            fail(f"{prefix}.ppo_micro_batch_size_per_gpu", micro, f"must divide the {share}")
        per_role.append(UpdateBatches(per_rank, micro or per_rank))
    return BatchSizes(prompts, n, dp_size, *per_role)


def _ranks(cfg: Config, dp_size: int) -> str:
    tp = run_tp(cfg)
    world = dp_size * tp
    return (f"{dp_size} data-parallel ranks (WORLD_SIZE {world} / tensor_parallel_size {tp})" if tp > 1
            else f"{world} ranks (WORLD_SIZE)")
