"""The PPO loop. The only module that knows every part; read `train_step` top to bottom.

One step: 1 prompts -> 2 rollout -> 3 rewards -> 4 reference and KL -> 5 values and advantages
-> 6 critic and actor updates -> 7 metrics. Validation and checkpoints happen between steps. What the run
changes as it trains lives in `self.state` (a TrainState); the guard acts on it through `self.guard`.

Under torchrun every rank runs this same loop on its share of the rollouts (`PromptBatch.layout`): forwards and
updates on its rows, everything else (rewards, KL and its controller, advantages, metrics, guard) on the
gathered global batch, so all ranks hold the same numbers. With one process the layout is the identity.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch
from torch import Tensor

from klguard.algo.advantage_registry import adv_estimator_inputs, compute_advantage
from klguard.algo.reward_shaping import shape_rewards, token_level_scores
from klguard.config import Config, ConfigError, config_to_yaml
from klguard.config.batches import resolve_batches
from klguard.config.roles import run_tp, sharding, steers_kl_loss
from klguard.config.validate import validate_world
from klguard.data.dataset import collate_left_pad
from klguard.data.sampler import PromptSampler
from klguard.distributed import RowLayout, any_rank, assert_same_across_ranks, gather_objects, init_distributed
from klguard.distributed.context import world_size_from_env
from klguard.distributed.fsdp import local_numel
from klguard.guard.signals import KL_BATCH_TOKEN_MEAN, KL_UNIT_METRICS
from klguard.model.loading import load_tokenizer, precision_scope
from klguard.ppo.checkpointing import Checkpoints
from klguard.ppo.generations import generation_records, write_generations
from klguard.ppo.guard_host import PPOHost
from klguard.ppo.metrics import rollout_metrics, support_metrics
from klguard.ppo.rollout import RolloutBatch, SamplingParams, generate_rows
from klguard.ppo.sampled import PromptBatch, Sampled, greedy_baselines, sample, sum_pi_squared
from klguard.ppo.sampled import timed as _timed
from klguard.ppo.scoring import gdpo_components, reference_scores, validate_policy
from klguard.ppo.setup import (
    build_datasets,
    build_reference,
    build_rewards,
    build_train_state,
    check_split,
    generation_weights,
    resolve_learned_rm,
    resolve_model_path,
    resolve_tokenizer_path,
)
from klguard.ppo.shared_prefix import sequence_logprobs, sequence_values
from klguard.ppo.task import BuiltinTask
from klguard.ppo.update import (
    NonFiniteError,
    PPOBatch,
    check_finite,
    critic_values_in_update,
    update_actor,
    update_critic,
)
from klguard.runtime.profiling import build_profiler, phase
from klguard.runtime.seeding import seed_everything, step_generator


class PPOTrainer:
    """Builds a run from its config (data first, then models, resumed from the run directory's latest checkpoint
    unless trainer.resume_mode says otherwise) and trains it with `fit`. `task`: the built-in task
    (klguard.builtin.task.TASK), needed where the config names it (klguard.ppo.task)."""

    def __init__(self, config: Config, *, task: BuiltinTask | None = None, log=print) -> None:
        self.cfg = config
        tr = config.trainer
        validate_world(config, world_size_from_env())  # a batch that does not split fails before any rendezvous
        check_split(config)  # and so does a model that tensor parallelism cannot split
        self.dist = init_distributed(tr.device, tr.dist_timeout_s, run_tp(config),  # torchrun's ranks, or one
                                     one_rank_fsdp=config.actor_rollout_ref.actor.fsdp_config.offload_policy)
        self.log = log if self.dist.is_main else _quiet  # only rank 0 logs and writes reports
        self.run_dir = Path(tr.default_local_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.dist.is_main:
            (self.run_dir / "config.yaml").write_text(config_to_yaml(config))
        self.device = self.dist.device
        self.batches = resolve_batches(config, self.dist.dp_size)  # rows per step, per optimizer step, per pass
        seed_everything(tr.seed)

        # data first: a bad row fails in seconds, before any model loads or SFT runs; rank 0 first (it
        # writes the built-in task and fills the caches the other ranks then read)
        main_first = self.dist.main_first
        self.tokenizer = main_first(lambda: load_tokenizer(resolve_tokenizer_path(config, task), config))
        self.train_data, self.val_data = main_first(
            lambda: build_datasets(config, self.tokenizer, self.run_dir, task, write_builtin=self.dist.is_main))
        if len(self.train_data) < config.data.train_batch_size:
            raise ConfigError(f"data.train_batch_size={config.data.train_batch_size} is larger than the training "
                              f"set ({len(self.train_data)} prompts)")
        self.policy_path = main_first(lambda: resolve_model_path(config, task, log=self.log))
        sampler = PromptSampler(len(self.train_data), config.data.train_batch_size, shuffle=config.data.shuffle,
                                seed=tr.seed if config.data.seed is None else config.data.seed)
        self.total_steps = tr.total_training_steps or tr.total_epochs * sampler.batches_per_epoch
        learned_rm = main_first(lambda: resolve_learned_rm(config, task, self.policy_path, log=self.log))
        self.rewards = build_rewards(config, self.tokenizer, task, learned_rm, device=self.device)
        self.checkpoints = Checkpoints(self.run_dir, tr.max_actor_ckpt_to_keep, self.dist, config=config,
                                       policy_path=self.policy_path, log=self.log)
        resume_from = self.checkpoints.find_resume_checkpoint(tr.resume_mode, tr.resume_from_path)
        self.state = build_train_state(config, self.dist, self.policy_path, resume_from, sampler, self.total_steps,
                                       rm_features=self.rewards.model is not None)
        self.generation_weights = generation_weights(config, self.state.actor, self.policy_path, self.device)
        self.guard = PPOHost(config, self.state, self.checkpoints, total_steps=self.total_steps,
                             run_dir=self.run_dir, writes=self.dist.is_main, log=self.log,
                             new_reference=partial(build_reference, config, self.dist, self.policy_path))
        self.profiler = build_profiler(config, self.dist.rank, self.device, self.log)
        rollout = config.actor_rollout_ref.rollout
        self.sampling = SamplingParams.of(rollout, self.tokenizer, max_new_tokens=config.data.max_response_length,
                                          compile_step=not rollout.enforce_eager)
        if resume_from:
            self.guard.load_state_dict(self.checkpoints.restore(resume_from, self.state))
            log(f"klguard: resumed from {resume_from} at step {self.state.step}")

    # ------------------------------------------------------------------ one PPO step
    def train_step(self) -> tuple[dict[str, float], list[str]]:
        """Step `state.step + 1`, phase by phase; returns its metrics and the non-finite loss terms or gradient norms
        whose mini-batches were skipped, and leaves advancing `state.step` to `fit`. A NaN/Inf in what a phase
        produced raises NonFiniteError (fit skips the whole step)."""
        cfg, state, timing = self.cfg, self.state, {}
        self.dist.maybe_inject_failure(state.step)
        started = time.perf_counter()
        sampled = sample(self, timing)  # 1-3. prompts (each rollout.n times), rollouts, scores (klguard.ppo.sampled)
        prompts, out, reward = sampled.prompts, sampled.out, sampled.reward
        if cfg.trainer.rollout_data_dir and self.dist.is_main:
            write_generations(cfg.trainer.rollout_data_dir, state.step + 1,
                              generation_records(self.tokenizer, prompts.rows, out, reward, state.step + 1))
        mask = out.response_mask.float()
        token_scores = token_level_scores(sampled.scores, out.response_lengths, mask)
        ref_logprobs, token_rewards, kl_metrics = None, token_scores, {}
        kl_coef = state.kl_ctrl.value  # this step's coefficient, in the reward or (steers_kl_loss) in the loss
        if state.has_reference:  # 4. reference log-probs, the KL penalty in the reward
            with _timed(timing, "ref"):
                ref_logprobs = self._reference_logprobs(prompts.layout, out)
            token_rewards, kl_metrics = self._shape_rewards(token_scores, out.old_logprobs, ref_logprobs, mask,
                                                            kl_coef)
            self._update_kl_controller(kl_metrics, rows=len(mask))  # 4b. the controller sees the batch KL
        values = vpreds = None  # 5. values (GAE's critic) and advantages
        if state.critic is not None:
            with _timed(timing, "values"):
                values, vpreds = self._values(prompts.layout, out, mask)
        with _timed(timing, "adv"):
            advantages, returns = self._advantages(sampled, token_rewards, mask, values)
        check_finite({"critic/values": values, "critic/advantages": advantages, "critic/returns": returns}, mask)
        batch = self._local_batch(prompts.layout, PPOBatch(out.input_ids, out.attention_mask, mask,
                                                           out.old_logprobs, advantages, returns, values,
                                                           ref_logprobs, vpreds))
        shuffling, update_metrics, nonfinite = self._shuffling(), {}, []  # 6. updates, one shuffling stream
        if state.critic is not None:
            with _timed(timing, "update_critic"):
                update_metrics, nonfinite = self._update_critic(batch, shuffling)
        if state.step >= cfg.trainer.critic_warmup:
            with _timed(timing, "update_actor"):
                actor_metrics, actor_nonfinite = self._update_actor(batch, kl_coef, shuffling)
            update_metrics, nonfinite = update_metrics | actor_metrics, nonfinite + actor_nonfinite
        timing["step"] = time.perf_counter() - started  # 7. metrics
        reshard = {"perf/reshard_share": timing["reshard"] / timing["step"]} if "reshard" in timing else {}
        outliers = state.rm_outliers.update(reward.features) if state.rm_outliers is not None else {}
        return {
            **rollout_metrics(out, reward, token_scores, token_rewards, advantages, returns, values, mask,
                            prompts.group_index),
            **kl_metrics, **update_metrics, **outliers,
            **sampled.metrics, **{f"timing_s/{k}": v for k, v in timing.items()},
            "perf/throughput": float(out.attention_mask.sum()) / timing["step"], **reshard,
            "training/global_step": state.step + 1, "training/epoch": state.sampler.epoch,
            "training/nonfinite_skipped": float(bool(nonfinite)),
        }, nonfinite

    def _prompts(self) -> PromptBatch:
        n = self.cfg.actor_rollout_ref.rollout.n
        return self._prompt_batch([self.train_data[i] for i in self.state.sampler.next_batch() for _ in range(n)])

    def _prompt_batch(self, rows: list) -> PromptBatch:
        """Rows of consecutive groups of rollout.n, collated, with this rank's share of them."""
        prompt_ids, prompt_mask = collate_left_pad(rows, self.tokenizer.pad_token_id)
        layout = RowLayout(len(rows), self.batches.actor_block, self.dist.dp_rank, self.dist.dp_size)  # this rank's
        return PromptBatch(rows, torch.arange(len(rows)) // self.cfg.actor_rollout_ref.rollout.n, prompt_ids,
                           prompt_mask, layout)

    def _advantages(self, sampled: Sampled, token_rewards: Tensor, mask: Tensor, values: Tensor | None
                    ) -> tuple[Tensor, Tensor]:
        """algorithm.adv_estimator's advantages and returns, given the inputs its registration declares: one builder
        here per input an estimator may declare (klguard.algo.advantage_registry.ADV_INPUTS)."""
        alg, prompts, out = self.cfg.algorithm, sampled.prompts, sampled.out
        build = {"values": lambda: values, "group_index": lambda: prompts.group_index,
                 "reward_baselines": lambda: greedy_baselines(self, prompts).to(token_rewards),
                 "old_log_probs": lambda: out.old_logprobs.float(),
                 "sum_pi_squared": lambda: sum_pi_squared(self, prompts, out).to(token_rewards),
                 "reward_components": lambda: gdpo_components(alg.gdpo_reward_keys, sampled.reward.extra),
                 "reward_weights": lambda: alg.gdpo_reward_weights}
        inputs = {name: build[name]() for name in adv_estimator_inputs(alg.adv_estimator)}
        return compute_advantage(alg.adv_estimator, token_level_rewards=token_rewards, response_mask=mask,
                                 gamma=alg.gamma, lam=alg.lam, norm_adv_by_std_in_grpo=alg.norm_adv_by_std_in_grpo,
                                 **inputs)

    def _rollout(self, prompts: PromptBatch) -> tuple[RolloutBatch, float | None]:
        """Sampled with the KV cache from this rank's rows, gathered; on the actor's weights, gathered for it
        (klguard.ppo.generation_weights). Returns the rollouts and the seconds spent gathering the weights (None
        when there was nothing to gather)."""
        with self.generation_weights() as (model, resharding), precision_scope(model):
            model.eval()
            out = generate_rows(model, prompts.prompt_ids.to(self.device), prompts.prompt_mask.to(self.device),
                                prompts.layout.index, prompts.layout.order, self.sampling,
                                generator=step_generator(self.cfg.trainer.seed, self.state.step, 0, self.device))
        return out, resharding.seconds if resharding.gathered else None

    def _reference_scores(self, prompts: PromptBatch) -> Tensor:
        """PAR's r_ref: the reference policy's own responses to the step's prompts, scored (their own stream of
        sampling noise); the compiled decode step is kept for the actor."""
        params = replace(self.sampling, compile_step=False)
        generator = step_generator(self.cfg.trainer.seed, self.state.step, 3, self.device)
        role = "ref" if self.state.ref is not None else "actor"
        with self.state.reference() as ref:
            return reference_scores(ref, self.rewards, self.tokenizer, prompts.rows,
                                    prompts.prompt_ids.to(self.device), prompts.prompt_mask.to(self.device),
                                    prompts.layout.index, prompts.layout.order, params, generator,
                                    sharding(self.cfg, role).reshard_after_forward)

    def _reference_logprobs(self, layout: RowLayout, out: RolloutBatch) -> Tensor:
        arr = self.cfg.actor_rollout_ref
        with torch.no_grad(), self.state.reference() as ref:
            return layout.gather(sequence_logprobs(
                ref, layout.local(out.input_ids), layout.local(out.attention_mask),
                out.response_mask.shape[1], arr.rollout.temperature, share_prompt=arr.model.share_prompt_forward,
                micro_batch_size=arr.ref.log_prob_micro_batch_size_per_gpu))

    def _shape_rewards(self, token_scores: Tensor, old_logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor,
                       beta: float) -> tuple[Tensor, dict[str, float]]:
        """Token rewards with the KL penalty `beta` x KL (algorithm.use_kl_in_reward), the batch KL's metrics and the
        samples' distance from the reference's support (klguard.ppo.metrics.support_metrics)."""
        alg = self.cfg.algorithm
        shaped = shape_rewards(token_scores, old_logprobs, ref_logprobs, mask, estimator=alg.kl_penalty, beta=beta,
                               kl_in_reward=alg.use_kl_in_reward)
        check_finite({"ref_log_probs": ref_logprobs, "kl": shaped.kl}, mask)  # before the controller sees it
        return shaped.token_rewards, {"actor/reward_kl_penalty": shaped.kl_token_mean.item(),
                                      "actor/reward_kl_penalty_coeff": beta,
                                      "actor/kl_seq_sum": shaped.kl_seq_sum.item(),
                                      KL_BATCH_TOKEN_MEAN: shaped.kl_batch_token_mean.item(),
                                      **support_metrics(ref_logprobs, mask, self.cfg.guard.support_prob_floor)}

    def _update_kl_controller(self, kl_metrics: dict[str, float], rows: int) -> None:
        """The KL controller steps on the batch KL (in `algorithm.kl_ctrl.kl_unit`) when it steers a coefficient (the
        reward's, or the KL loss's) and the guard's warm-up does not hold it."""
        alg = self.cfg.algorithm
        if alg.use_kl_in_reward or steers_kl_loss(self.cfg):
            self.guard.update_kl(kl_metrics[KL_UNIT_METRICS[alg.kl_ctrl.kl_unit]], n_steps=rows)

    def _values(self, layout: RowLayout, out: RolloutBatch, mask: Tensor) -> tuple[Tensor, Tensor | None]:
        """The critic's values, and its forward with autograd when that is also its update's (vpreds)."""
        critic = self.state.critic
        in_update = critic_values_in_update(self.cfg.critic, len(layout.index), self.batches.critic)
        with torch.set_grad_enabled(in_update):
            critic.train(in_update)
            local = sequence_values(critic, layout.local(out.input_ids), layout.local(out.attention_mask),
                                    mask.shape[1], share_prompt=self.cfg.actor_rollout_ref.model.share_prompt_forward)
            values = layout.gather(local.detach()) * mask
        return values, local if in_update else None

    def _local_batch(self, layout: RowLayout, batch: PPOBatch) -> PPOBatch:
        """This rank's rollouts of the step's batch (vpreds, when set, are this rank's already)."""
        if self.dist.dp_size == 1:
            return batch
        vpreds, batch.vpreds = batch.vpreds, None
        local = batch.select(layout.index.to(batch.response_mask.device))
        local.vpreds = vpreds
        return local

    def _shuffling(self) -> torch.Generator:
        """Mini-batch shuffling noise of this step, the same for the critic and the actor."""
        return step_generator(self.cfg.trainer.seed, self.state.step, 1, torch.device("cpu"))

    def _update_critic(self, batch: PPOBatch, shuffling: torch.Generator) -> tuple[dict[str, float], list[str]]:
        state = self.state
        out = update_critic(state.critic, state.critic_optim, batch, self.cfg.critic, batches=self.batches.critic,
                            generator=shuffling,
                            share_prompt=self.cfg.actor_rollout_ref.model.share_prompt_forward)
        state.critic_sched.step()
        return out

    def _update_actor(self, batch: PPOBatch, kl_coef: float, shuffling: torch.Generator
                      ) -> tuple[dict[str, float], list[str]]:
        cfg, state, clip = self.cfg, self.state, self.guard.actor_grad_clip
        metrics, nonfinite = update_actor(
            state.actor, state.actor_optim, batch, cfg.actor_rollout_ref.actor, batches=self.batches.actor,
            temperature=cfg.actor_rollout_ref.rollout.temperature, generator=shuffling,
            grad_clip=clip, share_prompt=cfg.actor_rollout_ref.model.share_prompt_forward,
            kl_loss_coef=kl_coef if steers_kl_loss(cfg) else None)
        state.actor_sched.step()
        state.apply_lr_scale(self.guard.lr_scale)
        return metrics | {"actor/grad_clip": clip}, nonfinite

    def validate(self) -> dict[str, float]:
        dump_to = self.cfg.trainer.validation_data_dir if self.dist.is_main else None
        with self.generation_weights() as (model, _):
            return validate_policy(model, self.tokenizer, self.rewards, self.val_data, self.cfg, self.device,
                                   step=self.state.step, dump_to=dump_to)

    # ------------------------------------------------------------------ checks
    def check_ranks(self, step: int, metrics: dict[str, float]) -> None:
        """trainer.debug: assert that every rank holds the same KL coefficient, guard state and metrics, and
        write each rank's coefficient, mesh coordinates and share of the actor's parameters to
        `rank_checks.jsonl`."""
        same = {k: v for k, v in metrics.items() if not k.startswith(("timing_s/", "perf/"))}
        state = self.state
        same |= {"kl_coef": state.kl_ctrl.value, **self.guard.same_on_every_rank()}
        ranks = assert_same_across_ranks(same, f"step {step}")
        params = gather_objects(local_numel(state.actor))
        coords = gather_objects((self.dist.dp_rank, self.dist.tp_rank))  # each rank's place on the (dp, tp) mesh
        if self.dist.is_main:
            record = {"step": step, "kl_coef": [r["kl_coef"] for r in ranks], "actor_params": params,
                      "dp_rank": [c[0] for c in coords], "tp_rank": [c[1] for c in coords],
                      "actor_params_total": sum(p.numel() for p in state.actor.parameters())}
            with open(self.run_dir / "rank_checks.jsonl", "a", encoding="utf-8") as fh:
                fh.write(json.dumps(record) + "\n")

    # ------------------------------------------------------------------ the run
    def fit(self, tracker, progress=None, preemption=None) -> dict[str, float]:
        """Train to `total_steps`; stops early on a guard pause, `trainer.max_nonfinite_steps` skipped
        steps in a row, or once `preemption.requested` (klguard.runtime.preemption), always with a checkpoint."""
        tr = self.cfg.trainer
        last: dict[str, float] = {}
        state = self.state
        if tr.val_before_train and state.step == 0:
            last = self.validate()
            self.guard.observe(0, last)
            tracker.log(last, step=0)
        nonfinite_run = 0  # consecutive steps with a NaN/Inf somewhere
        while state.step < self.total_steps and self.guard.pause_reason is None:
            with self.profiler.step(state.step + 1):  # global_profiler: the step and its validation
                step = state.step + 1
                try:
                    metrics, nonfinite = self.train_step()
                except NonFiniteError as exc:  # rewards, log-probs, KL or values: nothing of this step is applied
                    metrics, nonfinite = {"training/global_step": step, "training/epoch": state.sampler.epoch,
                                          "training/nonfinite_skipped": 1.0}, [exc.where]
                state.step = step  # the one place the step advances
                for where in nonfinite:
                    self.guard.record_nonfinite(step, where)
                is_last = step >= self.total_steps
                if (tr.test_freq > 0 and step % tr.test_freq == 0) or is_last:
                    with phase("validate"):
                        metrics |= self.validate()
            skipped = bool(metrics["training/nonfinite_skipped"])
            nonfinite_run = nonfinite_run + 1 if skipped else 0
            metrics |= self.guard.observe(step, metrics, measured=not skipped)
            if self.guard.restored and (is_last or self.guard.pause_reason):  # the run ends on restored weights:
                with phase("validate"):  # its last validation describes them, the checkpoint it writes
                    metrics |= self.validate()
            if tr.debug:
                self.check_ranks(step, metrics)
            if 0 < tr.max_nonfinite_steps <= nonfinite_run and self.guard.pause_reason is None:
                self.guard.stop(
                    f"{nonfinite_run} steps in a row had non-finite values (see events.jsonl). To go on: check the "
                    "reward function or lower actor_rollout_ref.actor.optim.lr, then rerun (trainer.resume_mode=auto "
                    "resumes).", step)
            tracker.log(metrics, step=step)
            stopping = preemption is not None and any_rank(preemption.requested)  # a signal to one rank stops all
            if (tr.save_freq > 0 and step % tr.save_freq == 0) or is_last or self.guard.pause_reason or stopping:
                self.guard.save_checkpoint(self.tokenizer)  # stable once the next step finds its weights calm
            if progress is not None:
                progress(step, metrics)
            last = metrics
            if stopping:
                break
        self.profiler.close()  # a continuous window the run did not finish
        return last  # a pause was said as the guard decided it


def _quiet(message: str) -> None:
    """The log of ranks other than 0."""
