"""Scoring rollouts and validating a policy: shared by the trainer and `klguard eval`; PAR shaping.

PAR (`reward_model.shaping=par`, Fu et al. 2025, "Reward shaping to mitigate reward hacking in RLHF"): PPO
optimises sigmoid(r - r_ref), r_ref the score of the reference policy's own response to the same prompt (one
sampled per row, with the rollout's sampling settings). The shaped reward is bounded and saturates once a
response beats the reference's, so pushing the raw score ever higher, where the reward model is wrong, stops
paying.
"""

from __future__ import annotations

import torch

from klguard.config import Config
from klguard.data.dataset import RLDataset, collate_left_pad
from klguard.distributed import data_parallel, even_slice
from klguard.distributed.fsdp import unsharded
from klguard.errors import UserError
from klguard.model.loading import precision_scope
from klguard.ppo.generations import decode_responses, generation_records, write_generations
from klguard.ppo.metrics import validation_metrics
from klguard.ppo.rollout import RolloutBatch, SamplingParams, generate_rows
from klguard.reward.manager import RewardManager, RewardOutput
from klguard.runtime.seeding import step_generator


def score_rollout(rewards: RewardManager, tokenizer, rows, out: RolloutBatch, *, features: bool = False
                  ) -> RewardOutput:
    """Decode the valid response tokens and score them with the reward manager (`features`: and a reward model's
    last-layer features)."""
    return rewards(decode_responses(tokenizer, out), out.response_lengths.tolist(), [r.data_source for r in rows],
                   [r.ground_truth for r in rows], [r.extra_info for r in rows], prompts=[r.raw_prompt for r in rows],
                   features=features)


def gdpo_components(keys: list[str], extra: dict[str, torch.Tensor] | None) -> list[torch.Tensor]:
    """GDPO's per-key scores [N] from the custom reward function's returned dicts, in `algorithm.gdpo_reward_keys`
    order."""
    extra = extra or {}
    missing = [k for k in keys if k not in extra]
    if missing:
        have = ", ".join(sorted(extra)) or "none: it returns no dict, or the reward is not custom_reward_function's"
        raise UserError(f"algorithm.gdpo_reward_keys: the reward function's results have no number under "
                        f"{missing[0]!r} on every row (their keys: {have})")
    return [extra[k] for k in keys]


def par_shaped(scores: torch.Tensor, reference_scores: torch.Tensor) -> torch.Tensor:
    """PAR: sigmoid(score - the reference response's score), per row."""
    return torch.sigmoid(scores - reference_scores)


@torch.no_grad()
def reference_scores(ref: torch.nn.Module, rewards: RewardManager, tokenizer, rows, prompt_ids: torch.Tensor,
                     prompt_mask: torch.Tensor, index: torch.Tensor, order: torch.Tensor, params: SamplingParams,
                     generator: torch.Generator, reshard_after_forward: bool) -> torch.Tensor:
    """The score of a response the reference policy samples for each row's prompt (PAR's r_ref)."""
    with unsharded(ref, reshard_after_forward), precision_scope(ref):
        ref.eval()
        out = generate_rows(ref, prompt_ids, prompt_mask, index, order, params, generator=generator)
    return score_rollout(rewards, tokenizer, rows, out).scores


@torch.no_grad()
def validate_policy(model: torch.nn.Module, tokenizer, rewards: RewardManager, val_data: RLDataset, cfg: Config,
                    device: torch.device, *, step: int = 0, dump_to: str | None = None) -> dict[str, float]:
    """Sample `val_kwargs.n` responses per validation prompt; `val-core/...` and `val-aux/...` metrics; with
    `dump_to`, every response also goes to `<dump_to>/<step>.jsonl` (klguard.ppo.generations).
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
    if dump_to:
        write_generations(dump_to, step, [line for part, out, reward in results
                                          for line in generation_records(tokenizer, part, out, reward, step)])
    return validation_metrics(results, kw.n)
