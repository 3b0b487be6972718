"""kl_slow: the KL above target_kl for `slow_window` steps in a row while a controller chases target_kl: raise
kl_coef (the controller is too slow). Off under a fixed coefficient, where it would become a second controller."""

from __future__ import annotations

from klguard.fields import at_least
from klguard.guard.actions import Action
from klguard.guard.registry import GuardRule, Key, register
from klguard.guard.signals import REF_KL, REF_KL_LOSS
from klguard.guard.step import Step
from klguard.guard.tighten import KL_COEF_CHANGE, raise_kl_coef

NAME = "kl_slow"


def measure(step: Step) -> None:
    kl, st, memory = step.obs.kl, step.st, step.memory(NAME)
    if kl is not None:
        memory["streak"] = memory["streak"] + 1 if kl > st.target_kl else 0
        st.alarms[NAME] = memory["streak"] >= step.cfg.slow_window
    if not step.kl_controlled:  # no controller chases target_kl: KL above it is no alarm (nor unstable)
        st.alarms[NAME] = False


def act(step: Step) -> list[Action]:
    st, cfg, obs, now, memory = step.st, step.cfg, step.obs, step.step, step.memory(NAME)
    if (obs.kl is None or not step.kl_controlled or not st.alarms[NAME] or not st.ready(NAME, now, cfg.cooldown)
            or not st.ready(KL_COEF_CHANGE, now, cfg.cooldown)):
        return []
    why = f"{obs.kl_name} has stayed above target_kl for {memory['streak']} steps, the controller is too slow"
    action = raise_kl_coef(cfg, st, now, NAME, cfg.slow_kl_coef_factor, why, obs.kl_name, obs.kl, st.target_kl)
    if action is None:
        return []
    st.fired(NAME, now)
    memory["streak"] = 0
    return [action]


register(GuardRule(
    name=NAME, kind="alarm", order=60, reads=((REF_KL, REF_KL_LOSS),),
    says=lambda c: (f"KL above target_kl for {c.slow_window} steps (adaptive or pid controller): raise kl_coef "
                    f"x{c.slow_kl_coef_factor:g}"),
    sees="a KL controller too slow to hold its target", actions=("raise_kl_coef", "pause"),
    keys=(Key("slow_window", 10, "Consecutive steps with KL above target_kl before kl_coef is raised", at_least(1)),
          Key("slow_kl_coef_factor", 1.2, "kl_coef multiplier when KL stays above target", at_least(1))),
    memory={"streak": 0}, on=lambda guard: guard.kl_controlled, hint="lower {lr} or raise {target_kl}",
    measure=measure, act=act))
