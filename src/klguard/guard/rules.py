"""The guard's rules 1-6: each has a ``measure_*`` part (alarms, streaks, windows; runs every step)
and an ``act_*`` part (actions; skipped on a step that rolls back)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from klguard.guard.actions import Action
from klguard.guard.config import GuardConfig
from klguard.guard.signals import (
    GRAD_NORM,
    KL_SEQ_SUM,
    PPO_KL,
    REF_KL,
    REF_KL_LOSS,
    SCORE,
    Observation,
    median,
    penalty_share,
)
from klguard.guard.state import GuardState

KL_COEF_CHANGE = "kl_coef_change"
"""Pseudo-rule stamped whenever the guard raises kl_coef: the rules that raise it again from the
KL's level (penalty share, slow control) wait a cooldown after any raise, so the run shows the
effect of one change before the next (a raise lifts the penalty share at once, beta x KL)."""


KL_COEF_CAP = "kl_coef_cap"  # the rule name of the pause a capped raise becomes


def raise_kl_coef(cfg: GuardConfig, st: GuardState, step: int, rule: str, factor: float, why: str,
                  metric: str | None, value: float | None, threshold: float | None) -> Action | None:
    """Multiply the guard's beta by ``factor``; a raise that would reach ``kl_coef_max`` pauses the run instead
    (no ratchet: a beta at its cap holds the policy at the reference, which is a stopped run in disguise).

    None while warm-up holds beta, when beta is unknown, or when it would not change (0).
    """
    old = st.kl_coef
    if st.frozen or old is None:
        return None
    new = old * factor
    if new >= cfg.kl_coef_max:
        return Action("pause", f"{why}: raising kl_coef from {old:.4g} by {factor:g}x would reach its cap "
                      f"guard.kl_coef_max={cfg.kl_coef_max:g} ({rule}): pause instead of tightening further.", metric,
                      value, threshold, old, None, step, KL_COEF_CAP)
    if not new > old:
        return None
    st.kl_coef = new
    st.fired(KL_COEF_CHANGE, step)
    return Action("raise_kl_coef", f"{why}: raise kl_coef from {old:.4g} to {new:.4g}.", metric, value,
                  threshold, old, new, step, rule)


def lower_target_kl(cfg: GuardConfig, st: GuardState, step: int, rule: str, why: str, metric: str | None,
                    value: float | None, threshold: float | None) -> Action | None:
    """Lower the guard's target_kl by ``target_kl_step`` down to ``target_kl_min``; None if already there."""
    old = st.target_kl
    new = max(old - cfg.target_kl_step, cfg.target_kl_min)
    if not new < old:
        return None
    st.target_kl = new
    return Action("lower_target_kl", f"{why}: lower target_kl from {old:.4g} to {new:.4g}.", metric, value,
                  threshold, old, new, step, rule)


def cut_lr(cfg: GuardConfig, st: GuardState, step: int, rule: str, factor: float, why: str, metric: str | None,
           value: float | None, threshold: float | None, lr: float | None = None) -> Action | None:
    """Multiply the guard's lr scale by ``factor`` down to ``lr_floor_scale``; None if already there."""
    old = st.lr_scale
    new = max(old * factor, cfg.lr_floor_scale)
    if not new < old:
        return None
    st.lr_scale = new
    lr_text = "" if lr is None else f" (lr {lr:.3g} -> {lr * new / old:.3g})"
    return Action("cut_lr", f"{why}: cut the lr scale from {old:.4g} to {new:.4g}{lr_text}.", metric, value,
                  threshold, old, new, step, rule)


# ------------------------------------------------------------------ rule 1: actor/ppo_kl


def measure_ppo_kl(cfg: GuardConfig, st: GuardState, obs: Observation) -> None:
    if obs.ppo_kl is None:
        return  # e.g. critic warm-up: neither extends nor breaks the streak
    above = obs.ppo_kl > cfg.ppo_kl_max
    st.alarms["ppo_kl"] = above
    st.ppo_kl_streak = st.ppo_kl_streak + 1 if above else 0


def act_ppo_kl(cfg: GuardConfig, st: GuardState, step: int, obs: Observation) -> tuple[list[Action], list[Action]]:
    """Warn and cut the lr when an excursion above the max starts; pause every ``patience`` steps of it.

    Returns (actions now, actions that go last: the pause).
    """
    if obs.ppo_kl is None or not st.alarms["ppo_kl"]:
        return [], []
    now: list[Action] = []
    value, limit = obs.ppo_kl, cfg.ppo_kl_max
    if st.ppo_kl_streak == 1:
        now.append(Action("warn", f"actor/ppo_kl {value:.4g} is above {limit:.4g}: the policy moves too far per "
                          "update.", PPO_KL, value, limit, None, None, step, "ppo_kl"))
        if st.ready("ppo_kl", step, cfg.cooldown):
            why = f"actor/ppo_kl {value:.4g} is above {limit:.4g}"
            action = cut_lr(cfg, st, step, "ppo_kl", cfg.lr_cut_factor, why, PPO_KL, value, limit, obs.lr)
            if action is not None:
                now.append(action)
                st.fired("ppo_kl", step)
    last: list[Action] = []
    if st.ppo_kl_streak % cfg.patience == 0:
        last.append(Action("pause", f"actor/ppo_kl has stayed above {limit:.4g} for {st.ppo_kl_streak} steps: pause "
                           "the run.", PPO_KL, value, limit, None, None, step, "ppo_kl"))
    return now, last


# ------------------------------------------------------------------ rule 2: penalty share


def measure_penalty_share(cfg: GuardConfig, st: GuardState, obs: Observation) -> None:
    st.penalty_share = penalty_share(obs)
    st.alarms["penalty_share"] = st.penalty_share is not None and st.penalty_share > cfg.penalty_share_max


def act_penalty_share(cfg: GuardConfig, st: GuardState, step: int) -> list[Action]:
    """The penalty-share rule: penalty share above ``penalty_share_max`` -> raise kl_coef.

    Odd at first sight (a large share means KL is already expensive), but it reads: the policy pays
    a lot of KL for its reward, i.e. it is drifting from the reference faster than the penalty holds
    it, and tightening stops the drift. Raising beta raises the share at once (beta * S), so the
    rule leans on its cooldown and on ``kl_coef_max``; the share falls only as the KL falls.
    """
    share = st.penalty_share
    if share is None or not st.alarms["penalty_share"] or not st.ready("penalty_share", step, cfg.cooldown) \
            or not st.ready(KL_COEF_CHANGE, step, cfg.cooldown):
        return []
    why = f"The KL penalty is {share:.1%} of the score (max {cfg.penalty_share_max:.1%}), the policy is drifting"
    action = raise_kl_coef(cfg, st, step, "penalty_share", cfg.kl_coef_raise_factor, why, KL_SEQ_SUM, share,
                           cfg.penalty_share_max)
    if action is None:
        return []
    st.fired("penalty_share", step)
    return [action]


# ------------------------------------------------------------------ rule 3: gradient norm


def measure_grad_norm(cfg: GuardConfig, st: GuardState, obs: Observation) -> None:
    if obs.grad_clip is not None:
        st.grad_clip = obs.grad_clip
    st.alarms["grad_norm"] = obs.grad_norm is not None and obs.grad_norm > cfg.grad_norm_max


def act_grad_norm(cfg: GuardConfig, st: GuardState, step: int, obs: Observation) -> list[Action]:
    """Turn clipping on at ``grad_clip_on_alarm`` when it is off, unknown or looser."""
    clip, target = st.grad_clip, cfg.grad_clip_on_alarm
    if not st.alarms["grad_norm"] or (clip is not None and 0 < clip <= target):
        return []
    st.grad_clip = target
    state = "unknown" if clip is None else ("off" if clip <= 0 else f"{clip:.4g}")
    reason = (f"actor/grad_norm {obs.grad_norm:.4g} is above {cfg.grad_norm_max:.4g}: set gradient clipping to "
              f"{target:.4g} (was {state}).")
    return [Action("set_grad_clip", reason, GRAD_NORM, obs.grad_norm, cfg.grad_norm_max, clip, target, step,
                   "grad_norm")]


# ------------------------------------------------------------------ rule 6: KL spikes and slow control


def measure_kl(cfg: GuardConfig, st: GuardState, obs: Observation) -> float | None:
    """Spike: KL above ``spike_factor`` x the median of the previous ``spike_window`` values (at least
    ``spike_min_history`` of them, the median at least ``spike_median_floor`` x target_kl) and above target_kl.
    Slow: KL above target_kl for ``slow_window`` consecutive steps. Returns the spike threshold (None without
    enough history or with a median under the floor)."""
    kl = obs.kl
    if kl is None:
        return None
    st.last_kl = kl
    st.kl_hard_streak = st.kl_hard_streak + 1 if kl > cfg.kl_hard_limit else 0
    st.alarms["kl_hard"] = st.kl_hard_streak >= cfg.kl_hard_patience
    hist = st.kl_history
    threshold = None
    # Early in a run the policy is its reference and the KL estimates are rounding noise around 0: a median of
    # them is no baseline (its sign alone, which differs between CPUs, would decide whether any KL is a spike).
    if len(hist) >= cfg.spike_min_history and median(hist) >= cfg.spike_median_floor * st.target_kl:
        threshold = cfg.spike_factor * median(hist)
    st.alarms["kl_spike"] = threshold is not None and kl > threshold and kl > st.target_kl
    hist.append(kl)
    del hist[:-cfg.spike_window]
    st.slow_streak = st.slow_streak + 1 if kl > st.target_kl else 0
    st.alarms["kl_slow"] = st.slow_streak >= cfg.slow_window
    return threshold


def act_kl(cfg: GuardConfig, st: GuardState, step: int, obs: Observation, spike_threshold: float | None,
           kl_controlled: bool = True) -> list[Action]:
    out: list[Action] = []
    if obs.kl is None:
        return out
    kl, name = obs.kl, obs.kl_name
    if st.alarms["kl_spike"] and st.ready("kl_spike", step, cfg.cooldown):
        why = f"{name} {kl:.4g} spiked above {cfg.spike_factor:g}x its running median"
        action = lower_target_kl(cfg, st, step, "kl_spike", why, name, kl, spike_threshold)
        if action is not None:
            out.append(action)
            st.fired("kl_spike", step)
    if (kl_controlled and st.alarms["kl_slow"] and st.ready("kl_slow", step, cfg.cooldown)
            and st.ready(KL_COEF_CHANGE, step, cfg.cooldown)):
        why = f"{name} has stayed above target_kl for {st.slow_streak} steps, the controller is too slow"
        action = raise_kl_coef(cfg, st, step, "kl_slow", cfg.slow_kl_coef_factor, why, name, kl, st.target_kl)
        if action is not None:
            out.append(action)
            st.fired("kl_slow", step)
            st.slow_streak = 0
    return out


# ------------------------------------------------------------------ rule 4: validation


def measure_validation(cfg: GuardConfig, st: GuardState, obs: Observation) -> bool:
    """Update the best/previous validation score; True when ``val_patience`` validations in a row dropped too far
    (the first such one already raises the val_drop alarm, so no checkpoint taken then is stable).

    Drop = (best - val) / best (only when best > 0). Also closes the proxy-score interval and sets
    the proxy-vs-validation divergence signal (validation fell while the mean proxy score rose, both
    by more than ``val_fall_tol`` relative to the previous validation interval, at ``val_patience``
    validations in a row).
    """
    if obs.score is not None:
        st.proxy_sum += obs.score
        st.proxy_n += 1
    val = obs.val
    if val is None:
        return False
    best = val if st.best_val is None else st.best_val
    st.alarms["val_drop"] = best > 0 and (best - val) / best > cfg.val_drop_max
    st.val_drop_streak = st.val_drop_streak + 1 if st.alarms["val_drop"] else 0
    prev = st.prev_val
    st.val_falling = prev is not None and prev - val > cfg.val_fall_tol * abs(prev)
    proxy = st.proxy_sum / st.proxy_n if st.proxy_n else None
    before = st.prev_proxy
    diverged = (st.val_falling and proxy is not None and before is not None
                and proxy - before > cfg.val_fall_tol * abs(before))
    st.divergence_streak = st.divergence_streak + 1 if diverged else 0
    st.hack["proxy_val_divergence"] = st.divergence_streak >= cfg.val_patience
    if proxy is not None:
        st.prev_proxy = proxy
    st.proxy_sum, st.proxy_n = 0.0, 0
    st.best_val, st.prev_val = max(best, val), val
    return st.val_drop_streak >= cfg.val_patience


# ------------------------------------------------------------------ non-finite inputs

NONFINITE_INPUTS = (GRAD_NORM, "actor/pg_loss", PPO_KL, REF_KL, REF_KL_LOSS, SCORE)


def measure_nonfinite(cfg: GuardConfig, st: GuardState, step: int, metrics: Mapping[str, float]) -> Action | None:
    """A pause once ``nonfinite_patience`` consecutive steps logged a NaN or infinite gradient norm, loss, KL or score
    (the other rules read such a value as missing: a run whose gradients are NaN would look calm)."""
    if cfg.nonfinite_patience <= 0:
        return None
    bad = [name for name in NONFINITE_INPUTS if _nonfinite(metrics.get(name))]
    st.nonfinite_streak = st.nonfinite_streak + 1 if bad else 0
    if not bad or st.nonfinite_streak < cfg.nonfinite_patience:
        return None
    return Action("pause", f"{bad[0]} is {metrics[bad[0]]} for {st.nonfinite_streak} steps in a row: the update is "
                  "not a number, pause the run.", bad[0], None, None, None, None, step, "nonfinite")


def _nonfinite(value: object) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


# ------------------------------------------------------------------ response-length collapse


def measure_length_collapse(cfg: GuardConfig, st: GuardState, obs: Observation) -> tuple[float, float] | None:
    """(length, threshold) when ``response_length/mean`` fell below ``length_collapse_ratio`` x the mean of its first
    ``baseline_window`` values (those seen so far while they are collected): answers shrunk to a token or two."""
    if cfg.length_collapse_ratio <= 0 or obs.length is None:
        return None
    base = st.collapse_base
    threshold = cfg.length_collapse_ratio * sum(base) / len(base) if base else None
    if len(base) < cfg.baseline_window:
        base.append(obs.length)
    return (obs.length, threshold) if threshold is not None and obs.length < threshold else None
