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

from klguard.guard import hacking, registry
from klguard.guard.actions import Action
from klguard.guard.config import GuardConfig, default_target_kl
from klguard.guard.signals import REF_KL, read_metrics
from klguard.guard.state import GuardState
from klguard.guard.step import Evidence, Step, Trigger, Validation
from klguard.guard.tighten import cut_lr, lower_target_kl, raise_kl_coef


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
        hard limit (a restored checkpoint that keeps the reference starts there), no alarm (rule or hacking) is
        active but advice (registry.ADVISORY_ACTIONS: a warning, a lower target_kl, e.g. a KL spike below that
        share), the validation score is not falling and the response length is within ``stable_length_growth`` of
        its baseline (a rollback re-anchors the reference there, so a target already drifting toward the hack would
        lock the drift in)."""
        st = self._st
        if not self.cfg.enable:
            return True
        kl_ok = st.last_kl is None or st.last_kl <= self.cfg.stable_kl_share * self.cfg.kl_hard_limit
        length_ok = st.length_ratio is None or st.length_ratio <= 1 + self.cfg.stable_length_growth
        advice = registry.advisory_alarms()
        alarmed = any(on for name, on in st.alarms.items() if name not in advice)
        return kl_ok and length_ok and not alarmed and not self._alarmed() and not st.val_falling

    def _alarmed(self) -> bool:
        """Whether a signal that raises the hacking alarm (guard.hacking_signals) is active."""
        return any(self._st.hack.get(name, False) for name in self.cfg.hacking_signals)

    def guard_metrics(self) -> dict[str, float]:
        """``guard/*`` metrics for the latest step (flags as 0/1); empty when the guard is disabled."""
        if not self.cfg.enable:
            return {}
        st = self._st
        out = {f"guard/alarm_{r.name}": float(st.alarms.get(r.name, False)) for r in registry.rules("alarm")
               if r.flag_when_off or r.active(self)}
        out |= {f"guard/hack_{name}": float(st.hack.get(name, False)) for name in registry.names("signal")}
        out |= {"guard/hacking_alarm": float(self._alarmed()), "guard/target_kl": st.target_kl,
                "guard/lr_scale": st.lr_scale, "guard/rollbacks": float(st.rollbacks),
                "guard/in_warmup": float(st.frozen), "guard/stable": float(self.is_stable())}
        optional = {"guard/kl_coef": st.kl_coef, "guard/grad_clip": st.grad_clip, "guard/val_best": st.best_val}
        optional |= {f"guard/{r.name}": st.rules.get(r.name, {}).get("value") for r in registry.rules() if r.logs}
        out |= {k: float(v) for k, v in optional.items() if v is not None}
        return out

    # ------------------------------------------------------------------ the step
    def observe(self, step: int, metrics: Mapping[str, float]) -> list[Action]:
        """Take step ``step``'s metrics; return the actions to apply before the next step. Every rule measures (in
        the registry's order: alarms, then signals); a check may pause at once; else the first rollback trigger
        rolls back; else the warm-up's transition, the alarms' actions, the hacking alarm's, and what goes last."""
        if not self.cfg.enable:
            return []
        st, cfg = self._st, self.cfg
        obs = read_metrics(metrics, cfg.val_metric, self.kl_metric)
        if obs.kl_coef is not None:
            st.kl_coef = obs.kl_coef
        st.last_step = step
        now = Step(cfg, st, obs, step, metrics, self.kl_controlled)
        self._measure_own(now)
        for rule in registry.rules("alarm") + registry.rules("signal"):
            if rule.measure is not None:
                now.found[rule.name] = rule.measure(now)
        found = hacking.evidence(now)
        if st.rollbacks and self.is_stable():
            st.calm_since_rollback += 1

        for rule in registry.rules("check"):
            pause = rule.stop(now) if rule.stop is not None else None
            if pause is not None:
                return [pause]
        rollback = self._rollback(now, found)
        if rollback:
            return rollback
        actions = self._warmup_transition(step)
        for rule in registry.rules("alarm"):
            actions += rule.act(now) if rule.act is not None else []
        actions += hacking.act(now, found)
        return actions + now.last

    def _measure_own(self, now: Step) -> None:
        """What the guard itself keeps of a step: the KL, the validation score beside its best and previous one,
        the length against its baseline (a rollback target needs all three calm)."""
        st, cfg, obs = now.st, now.cfg, now.obs
        if obs.kl is not None:
            st.last_kl = obs.kl
        if obs.val is not None:
            val, prev = obs.val, st.prev_val
            best = val if st.best_val is None else st.best_val
            st.val_falling = prev is not None and prev - val > cfg.val_fall_tol * abs(prev)
            now.validation = Validation(val, best, prev)
            st.best_val, st.prev_val = max(best, val), val
        length0, length = now.baseline("length", obs.length), obs.length
        grow = length0 is not None and length0 > 0 and length is not None
        if length is not None:
            st.length_recent = [*st.length_recent, length][-cfg.stable_length_window:]
        st.length_ratio = sum(st.length_recent) / len(st.length_recent) / length0 if grow else None

    def _rollback(self, now: Step, found: list[Evidence]) -> list[Action]:
        """The rules that roll back (alarms, the hacking alarm with ``hacking_action = rollback``, checks): roll
        back and tighten, or pause when the rollbacks are used up. At most one rollback per step; the first
        trigger names it."""
        st, cfg, step = self._st, self.cfg, now.step
        triggers: list[Trigger | None] = [r.trigger(now) for r in registry.rules("alarm") if r.trigger is not None]
        triggers.append(hacking.trigger(now, found))
        triggers += [r.trigger(now) for r in registry.rules("check") if r.trigger is not None]
        first = next((t for t in triggers if t is not None), None)
        if first is None:
            return []
        rule, metric, value, threshold, why = first.rule, first.metric, first.value, first.threshold, first.why
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
        after = "After a rollback"
        tighten = [lower_target_kl(cfg, st, step, rule, after, metric, value, threshold),
                   raise_kl_coef(cfg, st, step, rule, cfg.rollback_kl_coef_factor, after, metric, value, threshold),
                   cut_lr(cfg, st, step, rule, cfg.rollback_lr_factor, after, metric, value, threshold, now.obs.lr)]
        return out + [a for a in tighten if a is not None]

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
        st.after_rollback(to_step)
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
            st.restart_reference_baselines()
        return out + self._warmup_transition(to_step)

    def state_dict(self) -> dict[str, Any]:
        """A JSON-serialisable copy of the guard's state."""
        return self._st.to_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a state from `state_dict`; the guard then continues as if never interrupted."""
        self._st = GuardState.from_dict(dict(state))
