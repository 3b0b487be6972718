"""Scoring rollouts and validating a policy: shared by the trainer and `klguard eval`."""

from __future__ import annotations

import torch

from klguard.config import Config
from klguard.data.dataset import RLDataset, collate_left_pad
from klguard.distributed import data_parallel, even_slice
from klguard.model.loading import precision_scope
from klguard.ppo.metrics import validation_metrics
from klguard.ppo.rollout import RolloutBatch, SamplingParams, generate_rows
from klguard.reward.manager import RewardManager, RewardOutput
from klguard.runtime.seeding import step_generator


def score_rollout(rewards: RewardManager, tokenizer, rows, out: RolloutBatch) -> RewardOutput:
    """Decode the valid response tokens and score them with the reward manager."""
    texts = tokenizer.batch_decode(
        out.response_ids.masked_fill(out.response_mask == 0, tokenizer.pad_token_id).cpu(),
        skip_special_tokens=True)
    return rewards(texts, out.response_lengths.tolist(), [r.data_source for r in rows],
                   [r.ground_truth for r in rows], [r.extra_info for r in rows], prompts=[r.raw_prompt for r in rows])


@torch.no_grad()
def validate_policy(model: torch.nn.Module, tokenizer, rewards: RewardManager, val_data: RLDataset, cfg: Config,
                    device: torch.device) -> dict[str, float]:
    """Sample `val_kwargs.n` responses per validation prompt; `val-core/...` and `val-aux/...` metrics.
    Under torchrun each rank generates its share of every batch; all ranks score the gathered batch."""
    kw = cfg.actor_rollout_ref.rollout.val_kwargs
    rows = [val_data[i] for i in range(len(val_data)) for _ in range(kw.n)]
    size = (cfg.data.val_batch_size or len(val_data)) * kw.n
    gen = step_generator(cfg.trainer.seed, 0, 2, device)  # the same noise at every validation
    params = SamplingParams.of(kw, tokenizer, max_new_tokens=cfg.data.max_response_length,
                               compile_step=not cfg.actor_rollout_ref.rollout.enforce_eager)
    model.eval()
    results = []
    _, rank, world = data_parallel()  # the tp ranks of a dp group generate the same rows
    for start in range(0, len(rows), size):
        part = rows[start : start + size]
        ids, pmask = collate_left_pad(part, tokenizer.pad_token_id)
        everyone = torch.arange(len(part))
        with precision_scope(model):
            out = generate_rows(model, ids.to(device), pmask.to(device), everyone[even_slice(len(part), rank, world)],
                                everyone, params, generator=gen)
        results.append((part, out, score_rollout(rewards, tokenizer, part, out)))
    return validation_metrics(results, kw.n)
