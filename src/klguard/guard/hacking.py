"""The hacking alarm: raised by the active signals named in ``guard.hacking_signals`` (each signal is declared in
klguard/guard/rules/, kind `signal`; none needs a gold score). Measured every step, each signal is logged as
``guard/hack_<name>``; the alarm does ``guard.hacking_action``: roll back (then tighten), warn and raise kl_coef,
or warn, at most once a cooldown. Its evidence names every active signal, in the signals' order."""

from __future__ import annotations

from klguard.guard import registry
from klguard.guard.actions import Action
from klguard.guard.step import Evidence, Step, Trigger
from klguard.guard.tighten import raise_kl_coef


def evidence(step: Step) -> list[Evidence]:
    """The evidence of the active signals that raise the alarm (their measures ran), in their order."""
    named = step.cfg.hacking_signals
    found = [step.found.get(r.name) for r in registry.rules("signal") if r.name in named]
    return [e for e in found if e is not None]


def describe(found: list[Evidence]) -> str:
    """One sentence naming every active signal."""
    return "Reward hacking suspected (" + "; ".join(e.text for e in found) + ")"


def trigger(step: Step, found: list[Evidence]) -> Trigger | None:
    """With ``hacking_action = rollback``: a rollback (its cooldown starts even when another rule names it)."""
    st, cfg = step.st, step.cfg
    if cfg.hacking_action != "rollback" or not found or not st.ready(registry.HACKING, step.step, cfg.cooldown):
        return None
    st.fired(registry.HACKING, step.step)
    first = found[0]
    return Trigger(registry.HACKING, first.metric, first.value, first.threshold, describe(found))


def act(step: Step, found: list[Evidence]) -> list[Action]:
    """Otherwise: a warning, and with ``raise_kl_coef`` a raise."""
    st, cfg, now = step.st, step.cfg, step.step
    if not found or cfg.hacking_action == "rollback" or not st.ready(registry.HACKING, now, cfg.cooldown):
        return []
    st.fired(registry.HACKING, now)
    first, why = found[0], describe(found)
    out = [Action("warn", why + ".", first.metric, first.value, first.threshold, None, None, now, registry.HACKING)]
    if cfg.hacking_action == "raise_kl_coef":
        action = raise_kl_coef(cfg, st, now, registry.HACKING, cfg.hacking_kl_coef_factor, why, first.metric,
                               first.value, first.threshold)
        out += [action] if action is not None else []
    return out
