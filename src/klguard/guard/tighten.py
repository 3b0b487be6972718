"""How the guard tightens, whichever rule asks: raise beta (or pause at its cap), lower target_kl, cut the lr, each
bounded, each an `Action`. `cfg` is the GuardConfig, `st` the GuardState."""

from __future__ import annotations

from typing import Any

from klguard.guard.actions import Action

KL_COEF_CHANGE = "kl_coef_change"
"""Pseudo-rule stamped whenever the guard raises kl_coef: the rules that raise it again from the
KL's level (penalty share, slow control) wait a cooldown after any raise, so the run shows the
effect of one change before the next (a raise lifts the penalty share at once, beta x KL)."""


KL_COEF_CAP = "kl_coef_cap"  # the rule name of the pause a capped raise becomes


def raise_kl_coef(cfg: Any, st: Any, step: int, rule: str, factor: float, why: str,
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


def lower_target_kl(cfg: Any, st: Any, step: int, rule: str, why: str, metric: str | None,
                    value: float | None, threshold: float | None) -> Action | None:
    """Lower the guard's target_kl by ``target_kl_step`` down to ``target_kl_min``; None if already there."""
    old = st.target_kl
    new = max(old - cfg.target_kl_step, cfg.target_kl_min)
    if not new < old:
        return None
    st.target_kl = new
    return Action("lower_target_kl", f"{why}: lower target_kl from {old:.4g} to {new:.4g}.", metric, value,
                  threshold, old, new, step, rule)


def cut_lr(cfg: Any, st: Any, step: int, rule: str, factor: float, why: str, metric: str | None,
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
