"""ppo_kl: the policy moves too far per update (`actor/ppo_kl`): warn and cut the lr when an excursion above the max
starts, pause every `patience` steps of it."""

from __future__ import annotations

from klguard.fields import at_least, greater, interval
from klguard.guard.actions import Action
from klguard.guard.registry import GuardRule, Key, register
from klguard.guard.signals import PPO_KL
from klguard.guard.step import Step
from klguard.guard.tighten import cut_lr

NAME = "ppo_kl"


def measure(step: Step) -> None:
    value, memory = step.value(PPO_KL), step.memory(NAME)
    above = value is not None and value > step.cfg.ppo_kl_max
    step.st.alarms[NAME] = above
    if value is not None:  # a step without it (a critic warm-up) neither extends nor breaks the streak
        memory["streak"] = memory["streak"] + 1 if above else 0


def act(step: Step) -> list[Action]:
    st, cfg, value, now = step.st, step.cfg, step.value(PPO_KL), step.step
    if value is None or not st.alarms[NAME]:
        return []
    out: list[Action] = []
    streak, limit = step.memory(NAME)["streak"], cfg.ppo_kl_max
    if streak == 1:
        out.append(Action("warn", f"actor/ppo_kl {value:.4g} is above {limit:.4g}: the policy moves too far per "
                          "update.", PPO_KL, value, limit, None, None, now, NAME))
        if st.ready(NAME, now, cfg.cooldown):
            why = f"actor/ppo_kl {value:.4g} is above {limit:.4g}"
            action = cut_lr(cfg, st, now, NAME, cfg.lr_cut_factor, why, PPO_KL, value, limit, step.obs.lr)
            if action is not None:
                out.append(action)
                st.fired(NAME, now)
    if streak % cfg.patience == 0:
        step.last.append(Action("pause", f"actor/ppo_kl has stayed above {limit:.4g} for {streak} steps: pause the "
                                "run.", PPO_KL, value, limit, None, None, now, NAME))
    return out


register(GuardRule(
    name=NAME, kind="alarm", order=10, reads=((PPO_KL,),),
    says=lambda c: f"actor/ppo_kl > {c.ppo_kl_max:g}: cut the lr, {c.patience} steps: pause",
    sees="policy steps too large", actions=("warn", "cut_lr", "pause"),
    keys=(Key("ppo_kl_max", 0.025, "actor/ppo_kl above this: warn and cut the lr", greater(0)),
          Key("lr_cut_factor", 0.5, "Each lr cut multiplies the lr scale by this", interval("(0, 1]")),
          Key("patience", 5, "Consecutive steps with actor/ppo_kl above the max: pause", at_least(1))),
    memory={"streak": 0}, hint="lower {lr} or raise {guard}ppo_kl_max", measure=measure, act=act))
