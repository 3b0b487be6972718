"""KLGuard: metrics in, actions out. Pure Python; it never touches optimizers, models or files.

Call protocol (step numbers as the trainer's ``global_step``, the first training step being 1):

1. optionally ``observe(0, val_metrics_or_empty)`` before training: returns the warm-up freeze
   for step 1 and seeds the validation baseline;
2. after each step ``s``: ``actions = observe(s, metrics)``; apply them in order before step s+1
   (see :mod:`klguard.guard.actions`); log ``guard_metrics()``;
3. after restoring a checkpoint for a ``rollback``: ``on_rollback(restored_step)``, then apply the
   rest of that step's actions and any actions ``on_rollback`` returns. Keep the guard's live
   state across the restore: do not load the guard state stored in the older checkpoint, or the
   rollback counter and the tightening are lost;
4. save ``state_dict()`` with each checkpoint; ``load_state_dict()`` on resume.

The guard only ever tightens: kl_coef up, target_kl down, lr down, clipping on. The one exception
is the end of the (opt-in) warm-up freeze.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from klguard.guard import rules
from klguard.guard.actions import Action
from klguard.guard.config import GuardConfig, default_target_kl
from klguard.guard.hacking import Evidence, describe, measure_hacking, restart_reference_baselines
from klguard.guard.signals import LENGTH, REF_KL, Observation, read_metrics
from klguard.guard.state import ALARMS, HACK_SIGNALS, GuardState

_STEP_ALARMS = ("ppo_kl", "penalty_share", "grad_norm", "kl_hard", "kl_spike")
"""Alarms that describe the latest step only (the others persist: val_drop until the next
validation, kl_slow with its streak)."""


class KLGuard:
    """Watches a run's metrics and returns the actions that keep its KL, and its reward, honest.

    ``target_kl`` and ``kl_coef`` are the controller's starting values (``algorithm.kl_ctrl``);
    ``target_kl`` defaults to `default_target_kl` for one node, ``kl_coef`` is learnt from
    ``actor/reward_kl_penalty_coeff`` when not given. ``kl_controlled=False`` says no controller
    pursues ``target_kl`` (a fixed coefficient): the slow-control rule, which speeds up a
    controller, then stays off instead of acting as a second, ratcheting controller. ``kl_metric`` names the
    per-token KL the KL rules read when a step has it (the one the controller steers on).
    """

    def __init__(self, cfg: GuardConfig, *, total_steps: int, target_kl: float | None = None,
                 kl_coef: float | None = None, kl_controlled: bool = True,
                 kl_metric: str = REF_KL) -> None:
        cfg.validate()
        if total_steps < 0:
            raise ValueError(f"total_steps must be >= 0, got {total_steps}")
        target = default_target_kl(1) if target_kl is None else float(target_kl)
        if not math.isfinite(target) or target <= 0:
            raise ValueError(f"target_kl must be a positive finite number, got {target_kl!r}")
        if kl_coef is not None and (not math.isfinite(kl_coef) or kl_coef < 0):
            raise ValueError(f"kl_coef must be a finite number >= 0, got {kl_coef!r}")
        self.cfg = cfg
        self.kl_controlled = kl_controlled
        self.kl_metric = kl_metric
        self.total_steps = int(total_steps)
        self.warmup_steps = int(cfg.warmup_ratio * self.total_steps)
        self._st = GuardState(target_kl=target, kl_coef=None if kl_coef is None else float(kl_coef))

    # ------------------------------------------------------------------ queries
    @property
    def target_kl(self) -> float:
        return self._st.target_kl

    @property
    def kl_coef(self) -> float | None:
        return self._st.kl_coef

    @property
    def lr_scale(self) -> float:
        return self._st.lr_scale

    @property
    def rollbacks(self) -> int:
        return self._st.rollbacks

    @property
    def grad_clip(self) -> float | None:
        """The gradient clip the guard set (None: it set none)."""
        return self._st.grad_clip

    @property
    def kl_frozen(self) -> bool:
        """Whether the warm-up holds kl_coef (between its freeze_kl_coef and release_kl_coef actions)."""
        return self._st.frozen

    @property
    def reference_step(self) -> int:
        """The step whose weights the reference holds (0: the initial policy)."""
        return self._st.reference_step

    def in_warmup(self, step: int) -> bool:
        """Whether step ``step`` must run with kl_coef frozen at ``warmup_kl_coef`` (steps 1..warmup_steps)."""
        cfg = self.cfg
        return cfg.enable and cfg.warmup_kl_coef is not None and self.warmup_steps > 0 and step <= self.warmup_steps

    def is_stable(self) -> bool:
        """True when a checkpoint taken now is a safe rollback target: the KL is at most ``stable_kl_share`` of the
        hard limit (a restored checkpoint that keeps the reference starts there),
        no alarm (rule or hacking) is active, the validation score is not falling and the response
        length is within ``stable_length_growth`` of its baseline (a rollback re-anchors the
        reference there, so a target already drifting toward the hack would lock the drift in)."""
        st = self._st
        if not self.cfg.enable:
            return True
        kl_ok = st.last_kl is None or st.last_kl <= self.cfg.stable_kl_share * self.cfg.kl_hard_limit
        length_ok = st.length_ratio is None or st.length_ratio <= 1 + self.cfg.stable_length_growth
        return kl_ok and length_ok and not any(st.alarms.values()) and not self._alarmed() and not st.val_falling

    def _alarmed(self) -> bool:
        """Whether a signal that raises the hacking alarm (guard.hacking_signals) is active."""
        return any(self._st.hack[name] for name in self.cfg.hacking_signals)

    def guard_metrics(self) -> dict[str, float]:
        """``guard/*`` metrics for the latest step (flags as 0/1); empty when the guard is disabled."""
        if not self.cfg.enable:
            return {}
        st = self._st
        out = {f"guard/alarm_{name}": float(st.alarms[name]) for name in ALARMS}
        out |= {f"guard/hack_{name}": float(st.hack[name]) for name in HACK_SIGNALS}
        out |= {"guard/hacking_alarm": float(self._alarmed()), "guard/target_kl": st.target_kl,
                "guard/lr_scale": st.lr_scale, "guard/rollbacks": float(st.rollbacks),
                "guard/in_warmup": float(st.frozen), "guard/stable": float(self.is_stable())}
        optional = {"guard/kl_coef": st.kl_coef, "guard/grad_clip": st.grad_clip,
                    "guard/penalty_share": st.penalty_share, "guard/val_best": st.best_val,
                    "guard/audit_gap": st.audit_gap}
        out |= {k: float(v) for k, v in optional.items() if v is not None}
        return out

    # ------------------------------------------------------------------ the step
    def observe(self, step: int, metrics: Mapping[str, float]) -> list[Action]:
        """Take step ``step``'s metrics; return the actions to apply before the next step."""
        if not self.cfg.enable:
            return []
        st, cfg = self._st, self.cfg
        obs = read_metrics(metrics, cfg.val_metric, self.kl_metric)
        if obs.kl_coef is not None:
            st.kl_coef = obs.kl_coef
        st.last_step = step
        for name in _STEP_ALARMS:
            st.alarms[name] = False
        rules.measure_ppo_kl(cfg, st, obs)
        rules.measure_penalty_share(cfg, st, obs)
        rules.measure_grad_norm(cfg, st, obs)
        spike_threshold = rules.measure_kl(cfg, st, obs)
        if not self.kl_controlled:  # no controller chases target_kl: KL above it is no alarm (nor unstable)
            st.alarms["kl_slow"] = False
        val_dropped = rules.measure_validation(cfg, st, obs)
        evidence = measure_hacking(cfg, st, obs)
        if st.rollbacks and self.is_stable():
            st.calm_since_rollback += 1

        nonfinite = rules.measure_nonfinite(cfg, st, step, metrics)
        if nonfinite is not None:
            return [nonfinite]
        rollback = self._rollback(step, obs, val_dropped, evidence, rules.measure_length_collapse(cfg, st, obs))
        if rollback:
            return rollback
        actions = self._warmup_transition(step)
        now, last = rules.act_ppo_kl(cfg, st, step, obs)
        actions += now
        actions += rules.act_grad_norm(cfg, st, step, obs)
        actions += rules.act_penalty_share(cfg, st, step)
        actions += rules.act_kl(cfg, st, step, obs, spike_threshold, self.kl_controlled)
        actions += self._act_hacking(step, evidence)
        return actions + last

    def _rollback(self, step: int, obs: Observation, val_dropped: bool, evidence: list[Evidence],
                  collapse: tuple[float, float] | None = None) -> list[Action]:
        """Rules 4, 5 and 9 (``hacking_action = rollback``) and a length collapse: roll back and tighten, or pause
        when the rollbacks are used up. At most one rollback per step; the first trigger names it."""
        st, cfg = self._st, self.cfg
        triggers: list[tuple[str, str | None, float | None, float | None, str]] = []
        if st.alarms["kl_hard"] and obs.kl is not None:
            triggers.append(("kl_hard", obs.kl_name, obs.kl, cfg.kl_hard_limit,
                             f"{obs.kl_name} {obs.kl:.4g} is above the hard limit {cfg.kl_hard_limit:.4g}"
                             + (f" for {st.kl_hard_streak} steps" if cfg.kl_hard_patience > 1 else "")))
        if val_dropped and st.best_val is not None and obs.val is not None:
            limit = st.best_val * (1 - cfg.val_drop_max)
            triggers.append(("val_drop", cfg.val_metric, obs.val, limit, f"the validation score {obs.val:.4g} fell "
                             f"more than {cfg.val_drop_max:.0%} below its best {st.best_val:.4g}"))
        if cfg.hacking_action == "rollback" and evidence and st.ready("hacking", step, cfg.cooldown):
            st.fired("hacking", step)
            first = evidence[0]
            triggers.append(("hacking", first.metric, first.value, first.threshold, describe(evidence)))
        if collapse is not None:
            triggers.append(("length_collapse", LENGTH, *collapse, f"response_length/mean {collapse[0]:.3g} collapsed "
                             f"below {cfg.length_collapse_ratio:g}x its first steps' mean ({collapse[1]:.3g})"))
        if not triggers:
            return []
        rule, metric, value, threshold, why = triggers[0]
        if st.rollbacks >= cfg.max_rollbacks:
            return [Action("pause", f"{why}, and all {cfg.max_rollbacks} rollbacks are used: pause the run.",
                           metric, value, threshold, None, None, step, rule)]
        if st.rollbacks and st.calm_since_rollback < cfg.hold_steps:  # no ratchet: the last tightening did not hold
            return [Action("pause", f"{why}, {st.calm_since_rollback} calm steps after rollback {st.rollbacks} "
                           f"(guard.hold_steps={cfg.hold_steps}): its tightening did not hold, so pause instead of "
                           "tightening again.", metric, value, threshold, None, None, step, rule)]
        st.rollbacks += 1
        st.calm_since_rollback = 0
        st.rollback_rule = rule
        out = [Action("rollback", f"{why}: roll back to the last stable checkpoint (rollback {st.rollbacks} of "
                      f"{cfg.max_rollbacks}).", metric, value, threshold, st.rollbacks - 1, st.rollbacks, step, rule)]
        tighten = [rules.lower_target_kl(cfg, st, step, rule, "After a rollback", metric, value, threshold),
                   rules.raise_kl_coef(cfg, st, step, rule, cfg.rollback_kl_coef_factor, "After a rollback", metric,
                                       value, threshold),
                   rules.cut_lr(cfg, st, step, rule, cfg.rollback_lr_factor, "After a rollback", metric, value,
                                threshold, obs.lr)]
        return out + [a for a in tighten if a is not None]

    def _act_hacking(self, step: int, evidence: list[Evidence]) -> list[Action]:
        st, cfg = self._st, self.cfg
        if not evidence or cfg.hacking_action == "rollback" or not st.ready("hacking", step, cfg.cooldown):
            return []
        st.fired("hacking", step)
        first, why = evidence[0], describe(evidence)
        out = [Action("warn", why + ".", first.metric, first.value, first.threshold, None,
                      None, step, "hacking")]
        if cfg.hacking_action == "raise_kl_coef":
            action = rules.raise_kl_coef(cfg, st, step, "hacking", cfg.hacking_kl_coef_factor, why, first.metric,
                                         first.value, first.threshold)
            out += [action] if action is not None else []
        return out

    def _warmup_transition(self, step: int) -> list[Action]:
        """Freeze kl_coef when the next step is in the warm-up, release it when it is not."""
        st, held = self._st, self.cfg.warmup_kl_coef
        want = self.in_warmup(step + 1)
        if want and not st.frozen and held is not None:
            st.frozen, st.resume_kl_coef, old = True, st.kl_coef, st.kl_coef
            st.kl_coef = held
            return [Action("freeze_kl_coef", f"Warm-up: hold kl_coef at {held:.4g} up to step {self.warmup_steps}.",
                           None, None, None, old, held, step, "warmup")]
        if st.frozen and not want:
            st.frozen = False
            new, st.resume_kl_coef = st.resume_kl_coef, None
            if new is not None:
                st.kl_coef = new
            resume = "its own value" if new is None else f"{new:.4g}"
            return [Action("release_kl_coef", f"Warm-up over: the KL controller resumes from {resume}.", None, None,
                           None, held, new, step, "warmup")]
        return []

    # ------------------------------------------------------------------ rollback and state
    def on_rollback(self, to_step: int) -> list[Action]:
        """The trainer restored the state of step ``to_step``: clear the windows that would fire again
        at once (KL history, streaks, validation best, alarms), keep the tightened target_kl/kl_coef,
        lr scale, grad clip, rollback count and the hacking baselines (those measured against the reference start
        again when it is re-anchored). Returns the follow-ups: the re-anchoring of the reference
        (``reanchor_on_rollback``) and the warm-up action the restored position needs (usually none)."""
        st = self._st
        st.kl_history.clear()
        st.last_kl = st.penalty_share = st.best_val = st.prev_val = st.prev_proxy = None
        st.slow_streak = st.ppo_kl_streak = st.proxy_n = st.kl_hard_streak = st.nonfinite_streak = 0
        st.val_drop_streak = st.divergence_streak = 0
        st.proxy_sum = 0.0
        st.val_falling = False
        st.alarms = dict.fromkeys(ALARMS, False)
        st.hack = dict.fromkeys(HACK_SIGNALS, False)
        st.last_fired = {rule: min(last, to_step) for rule, last in st.last_fired.items()}
        now, st.last_step = st.last_step, to_step
        if not self.cfg.enable:
            return []
        out = []
        reanchor = (self.cfg.reanchor_on_rollback and st.rollbacks <= self.cfg.reanchor_rollbacks
                    and (st.rollback_rule is None or st.rollback_rule in self.cfg.reanchor_rules))
        if reanchor and to_step != st.reference_step:
            out.append(Action("reanchor_reference", f"After the rollback: the reference becomes the policy of step "
                              f"{to_step} (was step {st.reference_step}).", None, None, None, st.reference_step,
                              to_step, to_step if now is None else now, "rollback"))
            st.reference_step = to_step
            restart_reference_baselines(st)
        return out + self._warmup_transition(to_step)

    def state_dict(self) -> dict[str, Any]:
        """A JSON-serialisable copy of the guard's state."""
        return self._st.to_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a state from `state_dict`; the guard then continues as if never interrupted."""
        self._st = GuardState.from_dict(dict(state))
