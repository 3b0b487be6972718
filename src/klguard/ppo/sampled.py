"""Steps 1-3 of a PPO step: prompts, rollouts and their scores, with verl's DAPO options and what some advantage
estimators need besides the rewards.

- Overlong shaping (`reward_model.reward_kwargs.overlong_buffer_cfg`): the score minus DAPO's length penalty.
- Dynamic sampling (`algorithm.filter_groups`): groups whose responses all got the same metric are dropped and more
  prompts sampled until `data.train_batch_size` groups remain (the first ones, in sampling order).
- `remax`: the score of a greedy response to each row's prompt (`reward_baselines`); `optimal_token_baseline`:
  sum over the vocabulary of the actor's squared probabilities at each response token (`sum_pi_squared`); `gdpo`:
  the custom reward function's per-key scores.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from klguard.algo.reward_shaping import informative_groups, overlong_penalty
from klguard.distributed import RowLayout
from klguard.errors import UserError
from klguard.model.loading import precision_scope
from klguard.ppo.forward import response_logits
from klguard.ppo.rollout import RolloutBatch, generate_rows
from klguard.ppo.scoring import par_shaped, score_rollout
from klguard.ppo.update import check_finite
from klguard.reward.manager import RewardOutput
from klguard.runtime.profiling import phase
from klguard.runtime.seeding import step_generator


@dataclass
class PromptBatch:
    """One step's prompts: dataset rows (each repeated rollout.n times), their left-padded ids, and this rank's
    share of them (one process: all of them)."""

    rows: list
    group_index: Tensor  # [B] the prompt (group) of each row
    prompt_ids: Tensor  # [B, P]
    prompt_mask: Tensor  # [B, P]
    layout: RowLayout


@dataclass
class Sampled:
    prompts: PromptBatch
    out: RolloutBatch
    reward: RewardOutput
    scores: Tensor  # [B] what PPO optimises: the reward's score, overlong-shaped, then PAR-shaped
    metrics: dict[str, float]


@contextmanager
def timed(timing: dict[str, float], name: str):
    """Adds the block's wall time to `timing[name]`; a labelled range in a global_profiler trace."""
    start = time.perf_counter()
    with phase(name):
        yield
    timing[name] = timing.get(name, 0.0) + time.perf_counter() - start


def shaped_scores(cfg, scores: Tensor, lengths: Tensor) -> tuple[Tensor, dict[str, float]]:
    """The scores with DAPO's overlong penalty when `overlong_buffer_cfg.enable`, and its metrics when `log`."""
    kwargs = cfg.reward_model.reward_kwargs
    buffer = kwargs.overlong_buffer_cfg
    if not buffer.enable:
        return scores, {}
    penalty = overlong_penalty(lengths.cpu(), kwargs.max_resp_len or cfg.data.max_response_length, buffer.len,
                               buffer.penalty_factor)
    metrics = {"reward/overlong_penalty": penalty.mean().item(), "reward/overlong": (penalty < 0).float().mean().item()}
    return scores + penalty.to(scores), metrics if buffer.log else {}


def _filter_values(metric: str, reward: RewardOutput, shaped: Tensor) -> Tensor:
    if metric == "reward":
        return shaped
    if metric == "acc" and reward.gold is not None:
        return reward.gold
    return reward.scores


def _one_batch(trainer, timing: dict[str, float]) -> tuple[PromptBatch, RolloutBatch, RewardOutput, Tensor, dict]:
    cfg = trainer.cfg
    prompts = trainer._prompts()
    with timed(timing, "gen"):  # old log-probs come from the sampling loop itself
        out, resharding = trainer._rollout(prompts)
    if resharding is not None:  # gathering the actor's weights for generation
        timing["reshard"] = timing.get("reshard", 0.0) + resharding
    check_finite({"old_log_probs": out.old_logprobs}, out.response_mask.float())
    with timed(timing, "reward"):  # the score sits on the last response token
        reward = score_rollout(trainer.rewards, trainer.tokenizer, prompts.rows, out, features=True)
    check_finite({"rewards": reward.scores})
    scores, metrics = shaped_scores(cfg, reward.scores, out.response_lengths)
    if cfg.reward_model.shaping == "par":  # PAR: the score relative to the reference policy's response
        with timed(timing, "par"):
            scores = par_shaped(scores, trainer._reference_scores(prompts))
    return prompts, out, reward, scores, metrics


def sample(trainer, timing: dict[str, float]) -> Sampled:
    """One step's rollouts and scores; with `algorithm.filter_groups.enable`, only informative groups, sampling
    generation batches until `data.train_batch_size` of them are found."""
    cfg = trainer.cfg
    fg, n, want = cfg.algorithm.filter_groups, cfg.actor_rollout_ref.rollout.n, cfg.data.train_batch_size
    parts, found, dropped, batches = [], 0, 0, 0
    while True:
        prompts, out, reward, scores, metrics = _one_batch(trainer, timing)
        batches += 1
        if not fg.enable:
            return Sampled(prompts, out, reward, scores, metrics)
        keep = informative_groups(_filter_values(fg.metric, reward, scores).cpu(), prompts.group_index)
        rows = torch.nonzero(keep[prompts.group_index]).squeeze(-1)
        parts.append((prompts, out, reward, scores, rows))
        found, dropped = found + int(keep.sum()), dropped + int((~keep).sum())
        if found >= want:
            break
        if 0 < fg.max_num_gen_batches <= batches:
            raise UserError(f"algorithm.filter_groups.max_num_gen_batches={fg.max_num_gen_batches}: {batches} "
                            f"generation batches gave {found} of the {want} groups whose responses scored apart "
                            f"(metric {fg.metric}); the prompts may be too hard or too easy (<= 0: no limit)")
    filtered = _join(trainer, parts, want * n)
    return replace(filtered, metrics=metrics | {"filter_groups/num_gen_batches": float(batches),
                                                "filter_groups/filtered_groups": float(dropped)})


def _join(trainer, parts: list, total: int) -> Sampled:
    """The kept rows of every generation batch, in order, the first `total` of them, as one batch."""
    rows, outs, rewards, scores = [], [], [], []
    for prompts, out, reward, shaped, keep in parts:
        rows += [prompts.rows[i] for i in keep.tolist()]
        outs.append(_rows_of(out, keep.to(out.response_ids.device)))
        rewards.append(reward)
        scores.append(shaped[keep.to(shaped.device)])
    rows = rows[:total]
    prompts = trainer._prompt_batch(rows)
    device = outs[0].response_ids.device
    out = RolloutBatch(prompts.prompt_ids.to(device), prompts.prompt_mask.to(device),
                       *(torch.cat([getattr(o, k) for o in outs])[:total] for k in
                         ("response_ids", "response_mask", "old_logprobs", "response_lengths")))
    keeps = [p[4] for p in parts]
    reward = RewardOutput(*(None if getattr(rewards[0], k) is None else
                            torch.cat([getattr(r, k)[i] for r, i in zip(rewards, keeps, strict=True)])[:total]
                            for k in ("scores", "gold", "hacked", "spread", "rm_scores", "audit", "features")),
                          extra=None if not rewards[0].extra else
                          {k: torch.cat([r.extra[k][i] for r, i in zip(rewards, keeps, strict=True)])[:total]
                           for k in rewards[0].extra})
    return Sampled(prompts, out, reward, torch.cat(scores)[:total], {})


def _rows_of(out: RolloutBatch, rows: Tensor) -> RolloutBatch:
    return RolloutBatch(out.prompt_ids[rows], out.prompt_mask[rows], out.response_ids[rows], out.response_mask[rows],
                        out.old_logprobs[rows], out.response_lengths[rows])


@torch.no_grad()
def greedy_baselines(trainer, prompts: PromptBatch) -> Tensor:
    """ReMax's baseline: the (overlong-shaped) score of the actor's greedy response to each row's prompt."""
    params = replace(trainer.sampling, do_sample=False, compile_step=False)
    device = trainer.device
    with trainer.generation_weights() as (model, _), precision_scope(model):
        model.eval()
        out = generate_rows(model, prompts.prompt_ids.to(device), prompts.prompt_mask.to(device),
                            prompts.layout.index, prompts.layout.order, params,
                            generator=step_generator(trainer.cfg.trainer.seed, trainer.state.step, 4, device))
    reward = score_rollout(trainer.rewards, trainer.tokenizer, prompts.rows, out)
    return shaped_scores(trainer.cfg, reward.scores, out.response_lengths)[0]


@torch.no_grad()
def sum_pi_squared(trainer, prompts: PromptBatch, out: RolloutBatch) -> Tensor:
    """``[B, R]`` sum over the vocabulary of the actor's squared probabilities (at the rollout temperature) at each
    response position, for `optimal_token_baseline` (verl's `actor.calculate_sum_pi_squared`)."""
    arr, layout = trainer.cfg.actor_rollout_ref, prompts.layout
    ids, mask = layout.local(out.input_ids), layout.local(out.attention_mask)
    width, parts = out.response_mask.shape[1], []
    step = arr.actor.ppo_micro_batch_size_per_gpu or len(ids)
    actor = trainer.state.actor
    with precision_scope(actor):
        for i, m in zip(ids.split(step), mask.split(step), strict=True):
            logits = response_logits(actor, i, m, width).float() / arr.rollout.temperature
            parts.append(torch.softmax(logits, dim=-1).pow(2).sum(-1))
    return layout.gather(torch.cat(parts)) * out.response_mask
