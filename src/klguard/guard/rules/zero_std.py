"""zero_std: the share of prompt groups whose responses all scored the same (`critic/score/frac_zero_std`, TRL's
`frac_reward_zero_std`), as the median of its last `robust_window` values, above `zero_std_max`: those groups give
GRPO no advantage and no gradient. The advice says whether they are mostly all-correct (the prompts are too easy) or
all-wrong (too hard), from where the batch's mean score lies between the lowest and highest seen. Advice, never a
stop. Off in klguard's own runs (0)."""

from __future__ import annotations

from klguard.fields import interval
from klguard.guard.actions import Action
from klguard.guard.registry import GuardRule, Key, register
from klguard.guard.shapes import advise
from klguard.guard.signals import SCORE, ZERO_STD
from klguard.guard.step import Step

NAME = "zero_std"


def measure(step: Step) -> float | None:
    memory, score, share = step.memory(NAME), step.value(SCORE), step.recent(ZERO_STD)
    if score is not None:
        memory["low"] = score if memory["low"] is None else min(memory["low"], score)
        memory["high"] = score if memory["high"] is None else max(memory["high"], score)
    limit = step.cfg.zero_std_max
    step.st.alarms[NAME] = limit > 0 and share is not None and share > limit
    return share


def act(step: Step) -> list[Action]:
    share, memory, score = step.found[NAME], step.memory(NAME), step.value(SCORE)
    which = ""
    if score is not None and memory["high"] is not None and memory["high"] > memory["low"]:
        place = (score - memory["low"]) / (memory["high"] - memory["low"])
        easy = " (the mean score is near the highest seen: mostly all-correct groups, prompts too easy)"
        hard = " (the mean score is near the lowest seen: mostly all-wrong groups, prompts too hard)"
        which = easy if place > 0.5 else hard
    if share is None:
        return []
    why = f"{share:.0%} of the prompt groups scored alike and give no gradient{which}."
    return advise(step, NAME, ZERO_STD, share, step.cfg.zero_std_max, why)


register(GuardRule(
    name=NAME, kind="alarm", flag_when_off=False, order=115, reads=((ZERO_STD,),), optional=(SCORE,),
    says=lambda c: f"groups with no reward spread > {c.zero_std_max:.0%}: advise",
    sees="groups that give no gradient", actions=("warn",),
    keys=(Key("zero_std_max", 0.0, "Share of prompt groups whose responses all scored alike above this: advise "
              "(0: off)",
              interval("[0, 1)"), external=0.5),),
    memory={"low": None, "high": None}, keep=("low", "high"), on=lambda guard: guard.cfg.zero_std_max > 0,
    do="filter the prompts to those the policy sometimes solves (DAPO's dynamic sampling), or sample more responses "
       "per prompt", measure=measure, act=act))
