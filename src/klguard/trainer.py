"""The PPO loop. The only module that knows every part; read `train_step` top to bottom.

One step: 1 prompts -> 2 rollout -> 3 rewards -> 4 reference and KL -> 5 values and advantages
-> 6 critic and actor updates -> 7 metrics. Validation and checkpoints happen between steps.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path

import torch

from klguard.algo.advantage import compute_advantage
from klguard.algo.kl import build_kl_controller, kl_penalty
from klguard.algo.stats import masked_mean
from klguard.config import Config, ConfigError, config_to_yaml
from klguard.data.dataset import collate_left_pad
from klguard.data.sampler import PromptSampler
from klguard.guard_runtime import GuardRuntime
from klguard.metrics import rollout_metrics
from klguard.model.loading import (
    load_critic,
    load_policy,
    load_tokenizer,
    resolve_model_path,
    resolve_tokenizer_path,
)
from klguard.reward.manager import RewardManager
from klguard.rollout import compute_logprobs, generate
from klguard.run_setup import build_datasets, build_optimizer, resolve_device, seed_everything, step_generator
from klguard.run_state import REFERENCE_DIR, RunState
from klguard.update import NonFiniteError, PPOBatch, check_finite, critic_values, update_actor, update_critic
from klguard.validation import score_rollout, validate_policy


class PPOTrainer:
    def __init__(self, config: Config, *, log=print) -> None:
        self.cfg = config
        self.log = log
        tr = config.trainer
        self.run_dir = Path(tr.default_local_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(config_to_yaml(config))
        self.device = resolve_device(tr.device)
        seed_everything(tr.seed)

        # data first: a bad row fails in seconds, before any model loads or SFT runs
        self.tokenizer = load_tokenizer(resolve_tokenizer_path(config), config)
        self.train_data, self.val_data = build_datasets(config, self.tokenizer, self.run_dir)
        if len(self.train_data) < config.data.train_batch_size:
            raise ConfigError(f"data.train_batch_size={config.data.train_batch_size} is larger than the training "
                              f"set ({len(self.train_data)} prompts)")
        self.policy_path = resolve_model_path(config, log=log)
        self.use_critic = config.critic.enable if config.critic.enable is not None else (
            config.algorithm.adv_estimator == "gae")
        self.use_ref = config.algorithm.use_kl_in_reward or config.actor_rollout_ref.actor.use_kl_loss
        self.sampler = PromptSampler(len(self.train_data), config.data.train_batch_size, shuffle=config.data.shuffle,
                                     seed=tr.seed if config.data.seed is None else config.data.seed)
        self.total_steps = tr.total_training_steps or tr.total_epochs * self.sampler.batches_per_epoch
        self.kl_ctrl = build_kl_controller(**vars(config.algorithm.kl_ctrl))
        self.rewards = RewardManager(config, self.tokenizer, device=self.device)
        self.state = RunState(self.run_dir, tr.max_actor_ckpt_to_keep)
        self.global_step = 0

        resume_from = self.state.find_resume_checkpoint(tr.resume_mode, tr.resume_from_path)
        actor_path = resume_from / "actor" if resume_from else self.policy_path
        self.actor = load_policy(actor_path, config, trainable=True, device=self.device)
        ref_path = resume_from / REFERENCE_DIR if resume_from and (resume_from / REFERENCE_DIR).is_dir() else None
        self.ref = load_policy(ref_path or self.policy_path, config, trainable=False,
                               device=self.device) if self.use_ref else None
        self.reference_step = 0  # set by re-anchoring; restored from the guard state on resume
        self.critic = None
        if self.use_critic:
            critic_path = resume_from / "critic" if resume_from else None
            self.critic = load_critic(self.policy_path, config, device=self.device, resume_path=critic_path)
        self.actor_optim, self.actor_sched = build_optimizer(self.actor, config.actor_rollout_ref.actor.optim,
                                                             self.total_steps)
        self.critic_optim, self.critic_sched = (build_optimizer(self.critic, config.critic.optim, self.total_steps)
                                                if self.critic is not None else (None, None))
        self.lr_scale = 1.0  # the guard's multiplier of the scheduled actor lr
        self.actor_grad_clip = config.actor_rollout_ref.actor.grad_clip
        self.kl_frozen = False  # the guard's warm-up holds the KL coefficient
        self.guard = GuardRuntime(self)
        if resume_from:
            self.global_step = self.state.restore(resume_from, self)
            log(f"klguard: resumed from {resume_from} at step {self.global_step}")

    # ------------------------------------------------------------------ one PPO step
    def train_step(self) -> dict[str, float]:
        cfg, step = self.cfg, self.global_step
        rollout_cfg, actor_cfg = cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.actor
        timing: dict[str, float] = {}
        started = time.perf_counter()

        # 1. prompts: each repeated rollout.n times, consecutive, so groups share an index
        rows = [self.train_data[i] for i in self.sampler.next_batch() for _ in range(rollout_cfg.n)]
        group_index = torch.arange(len(rows)) // rollout_cfg.n
        prompt_ids, prompt_mask = collate_left_pad(rows, self.tokenizer.pad_token_id)

        # 2. rollout: sampled with the KV cache; old log-probs come from the same weights
        with _timed(timing, "gen"):
            self.actor.eval()
            out = generate(self.actor, prompt_ids.to(self.device), prompt_mask.to(self.device),
                           max_new_tokens=cfg.data.max_response_length, eos_token_id=self.tokenizer.eos_token_id,
                           pad_token_id=self.tokenizer.pad_token_id, temperature=rollout_cfg.temperature,
                           top_k=rollout_cfg.top_k, top_p=rollout_cfg.top_p, do_sample=rollout_cfg.do_sample,
                           ignore_eos=rollout_cfg.ignore_eos, generator=step_generator(cfg.trainer.seed, step, 0,
                                                                                       self.device))
        mask = out.response_mask.float()
        input_ids, attention_mask = out.input_ids, out.attention_mask
        check_finite({"old_log_probs": out.old_logprobs}, mask)  # NaN here or below: fit() skips the step

        # 3. rewards: the score sits on the last response token
        with _timed(timing, "reward"):
            reward = self._score(rows, out)
        check_finite({"rewards": reward.scores})
        token_scores = torch.zeros_like(mask)
        last = (out.response_lengths - 1).clamp(min=0)
        token_scores[torch.arange(len(rows)), last] = reward.scores.to(mask)

        # 4. reference log-probs and the KL penalty in the reward
        ref_logprobs, kl_metrics = None, {}
        token_rewards = token_scores
        if self.ref is not None:
            with _timed(timing, "ref"), torch.no_grad():
                ref_logprobs = compute_logprobs(self.ref, input_ids, attention_mask, mask.shape[1],
                                                rollout_cfg.temperature,
                                                micro_batch_size=cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu)
            kl = kl_penalty(out.old_logprobs, ref_logprobs, cfg.algorithm.kl_penalty)
            check_finite({"ref_log_probs": ref_logprobs, "kl": kl}, mask)  # before the controller sees it
            kl = kl * mask
            current_kl = masked_mean(kl, mask, dim=-1).mean().item()  # verl: mean over sequences of token means
            kl_seq_sum = kl.sum(-1).mean().item()
            beta = self.kl_ctrl.value
            if cfg.algorithm.use_kl_in_reward:
                token_rewards = token_scores - beta * kl
                controlled = kl_seq_sum if cfg.algorithm.kl_ctrl.kl_unit == "seq_sum" else current_kl
                if not self.kl_frozen:
                    self.kl_ctrl.update(controlled, n_steps=len(rows))
            kl_metrics = {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta,
                          "actor/kl_seq_sum": kl_seq_sum}

        # 5. values and advantages
        values = None
        if self.critic is not None:
            with _timed(timing, "values"), torch.no_grad():
                values = critic_values(self.critic, input_ids, attention_mask, mask.shape[1]) * mask
        with _timed(timing, "adv"):
            advantages, returns = compute_advantage(
                cfg.algorithm.adv_estimator, token_level_rewards=token_rewards, response_mask=mask, values=values,
                group_index=group_index, gamma=cfg.algorithm.gamma, lam=cfg.algorithm.lam,
                norm_adv_by_std_in_grpo=cfg.algorithm.norm_adv_by_std_in_grpo)
        check_finite({"critic/values": values, "critic/advantages": advantages, "critic/returns": returns}, mask)

        # 6. updates: critic first, the actor once the critic has warmed up
        batch = PPOBatch(input_ids, attention_mask, mask, out.old_logprobs, advantages, returns, values, ref_logprobs)
        update_metrics: dict[str, float] = {}
        nonfinite: list[str] = []  # loss terms or grad norms whose mini-batch was not applied
        gen = step_generator(cfg.trainer.seed, step, 1, torch.device("cpu"))
        if self.critic is not None:
            with _timed(timing, "update_critic"):
                update_metrics |= update_critic(self.critic, self.critic_optim, batch, cfg.critic,
                                                mini_batch_size=cfg.critic.ppo_mini_batch_size * rollout_cfg.n,
                                                generator=gen, nonfinite=nonfinite)
            self.critic_sched.step()
        if step >= cfg.trainer.critic_warmup:
            with _timed(timing, "update_actor"):
                update_metrics |= update_actor(self.actor, self.actor_optim, batch, actor_cfg,
                                               mini_batch_size=actor_cfg.ppo_mini_batch_size * rollout_cfg.n,
                                               temperature=rollout_cfg.temperature, generator=gen,
                                               grad_clip=self.actor_grad_clip, nonfinite=nonfinite)
            update_metrics["actor/grad_clip"] = self.actor_grad_clip
            self.actor_sched.step()
            self.apply_lr_scale()

        # 7. metrics
        timing["step"] = time.perf_counter() - started
        self.global_step += 1
        for where in nonfinite:
            self.guard.record_nonfinite(self.global_step, where)
        return {
            **rollout_metrics(out, reward, token_scores, token_rewards, advantages, returns, values, mask),
            **kl_metrics, **update_metrics,
            **{f"timing_s/{k}": v for k, v in timing.items()},
            "perf/throughput": float(out.attention_mask.sum()) / timing["step"],
            "training/global_step": self.global_step, "training/epoch": self.sampler.epoch,
            "training/nonfinite_skipped": float(bool(nonfinite)),
        }

    def _score(self, rows, out):
        return score_rollout(self.rewards, self.tokenizer, rows, out)

    def validate(self) -> dict[str, float]:
        return validate_policy(self.actor, self.tokenizer, self.rewards, self.val_data, self.cfg, self.device)

    # ------------------------------------------------------------------ guard hooks
    def apply_lr_scale(self) -> None:
        """Scheduled lr times the guard's scale (LambdaLR recomputes from base lrs every step)."""
        for group, base in zip(self.actor_optim.param_groups, self.actor_sched.get_last_lr(), strict=True):
            group["lr"] = base * self.lr_scale

    def rollback_to_stable(self) -> int:
        """Restore the weights and optimizer states of the newest stable checkpoint (the initial
        policy when there is none); the step counter, data position and guard state go on."""
        folder = self.state.latest_stable()
        if folder is None:
            self.actor.load_state_dict(load_policy(self.policy_path, self.cfg, trainable=True,
                                                   device=self.device).state_dict())
            if self.critic is not None:
                self.critic.load_state_dict(load_critic(self.policy_path, self.cfg, device=self.device).state_dict())
            for optim in (self.actor_optim, self.critic_optim):
                if optim is not None:
                    optim.state.clear()
            self.log("klguard: rolled back to the initial policy (no stable checkpoint yet)")
            return 0
        step = self.state.restore_weights(folder, self)
        self.log(f"klguard: rolled back to {folder}")
        return step

    def reanchor_reference(self, step: int) -> None:
        """Make the reference a frozen copy of the current (just restored) policy of step `step`."""
        if self.ref is None:
            return
        self.ref.load_state_dict(self.actor.state_dict())
        self.reference_step = step
        self.log(f"klguard: the reference is now the policy of step {step}")

    # ------------------------------------------------------------------ the run
    def fit(self, tracker, progress=None, preemption=None) -> dict[str, float]:
        """Train to `total_steps`; stops early on a guard pause, `trainer.max_nonfinite_steps` skipped
        steps in a row, or once `preemption.requested` (klguard.preemption), always with a checkpoint."""
        tr = self.cfg.trainer
        last: dict[str, float] = {}
        if tr.val_before_train and self.global_step == 0:
            last = self.validate()
            self.guard.observe(0, last)
            tracker.log(last, step=0)
        pending_stable: int | None = None  # the last checkpoint, stable once the next step confirms it
        nonfinite_run = 0  # consecutive steps with a NaN/Inf somewhere
        while self.global_step < self.total_steps and self.guard.pause_reason is None:
            try:
                metrics = self.train_step()
            except NonFiniteError as exc:  # rewards, log-probs, KL or values: nothing of this step is applied
                self.global_step += 1
                self.guard.record_nonfinite(self.global_step, exc.where)
                metrics = {"training/global_step": self.global_step, "training/epoch": self.sampler.epoch,
                           "training/nonfinite_skipped": 1.0}
            step = self.global_step
            skipped = bool(metrics["training/nonfinite_skipped"])
            nonfinite_run = nonfinite_run + 1 if skipped else 0
            is_last = step >= self.total_steps
            if (tr.test_freq > 0 and step % tr.test_freq == 0) or is_last:
                metrics |= self.validate()
            metrics |= self.guard.observe(step, metrics)
            if 0 < tr.max_nonfinite_steps <= nonfinite_run and self.guard.pause_reason is None:
                self.guard.pause_reason = (
                    f"{nonfinite_run} steps in a row had non-finite values (see events.jsonl). To go on: check the "
                    "reward function or lower actor_rollout_ref.actor.optim.lr, then rerun (trainer.resume_mode=auto "
                    "resumes).")
            if pending_stable is not None and not skipped and self.guard.confirms(step):
                self.state.mark_stable(pending_stable)  # its weights were just measured and found calm
            pending_stable = None
            tracker.log(metrics, step=step)
            stopping = preemption is not None and preemption.requested
            if (tr.save_freq > 0 and step % tr.save_freq == 0) or is_last or self.guard.pause_reason or stopping:
                pending_stable = step if self.state.save(self) is not None else None
            if progress is not None:
                progress(step, metrics)
            last = metrics
            if stopping:
                break
        if self.guard.pause_reason:
            self.log(f"klguard: paused at step {self.global_step}: {self.guard.pause_reason}")
        return last


@contextmanager
def _timed(timing: dict[str, float], name: str):
    start = time.perf_counter()
    yield
    timing[name] = timing.get(name, 0.0) + time.perf_counter() - start
