"""reward_collapse: the training score falls from the plateau it had reached. The mean of `critic/score/mean` over
the last `reward_collapse_window` steps below `reward_collapse_ratio` x the best such mean since the start-up
(start_up's `baseline_settle`): a run that had learnt the task and lost it. A mean over a window, not a step's
value: one batch of a few prompts swings between 0 and 1. Roll back. Off in klguard's own runs (0)."""

from __future__ import annotations

from klguard.fields import at_least, interval
from klguard.guard.registry import GuardRule, Key, register
from klguard.guard.signals import SCORE
from klguard.guard.step import Step, Trigger

NAME = "reward_collapse"


def measure(step: Step) -> None:
    """Keep the window's scores and the plateau (the best window mean after the start-up)."""
    memory, score, cfg = step.memory(NAME), step.value(SCORE), step.cfg
    step.st.alarms[NAME] = False
    if cfg.reward_collapse_ratio <= 0 or score is None:
        return
    if memory["first"] is None:
        memory["first"] = step.step
    scores = memory["scores"]
    scores.append(score)
    del scores[:-cfg.reward_collapse_window]
    if step.step < memory["first"] + step.settle or len(scores) < cfg.reward_collapse_window:
        return
    mean, best = sum(scores) / len(scores), memory["plateau"]
    step.st.alarms[NAME] = best is not None and best > 0 and mean < cfg.reward_collapse_ratio * best
    memory["mean"] = mean
    memory["plateau"] = mean if best is None else max(best, mean)


def trigger(step: Step) -> Trigger | None:
    if not step.st.alarms[NAME]:
        return None
    memory, ratio = step.memory(NAME), step.cfg.reward_collapse_ratio
    mean, plateau = memory["mean"], memory["plateau"]
    return Trigger(NAME, SCORE, mean, ratio * plateau, f"critic/score/mean averaged {mean:.3g} over the last "
                   f"{step.cfg.reward_collapse_window} steps, below {ratio:g}x its plateau {plateau:.3g}")


register(GuardRule(
    name=NAME, kind="alarm", flag_when_off=False, order=75, reads=((SCORE,),),
    says=lambda c: (f"critic/score/mean over {c.reward_collapse_window} steps < {c.reward_collapse_ratio:g}x its "
                    "plateau: roll back"),
    sees="the reward collapsing after a plateau", actions=("rollback",),
    keys=(Key("reward_collapse_ratio", 0.0, "Score's window mean below this x its best window mean: roll back (0: off; "
              "tune: healthy >= 0.94x)", interval("[0, 1)"), external=0.35),
          Key("reward_collapse_window", 20, "Steps in the score's window mean (reward_collapse)", at_least(2))),
    memory={"scores": [], "first": None, "plateau": None, "mean": None}, rolls_back=True,
    on=lambda guard: guard.cfg.reward_collapse_ratio > 0,
    hint="lower {lr} or raise {kl_coef}, and read the responses of the fall",
    do="go back to a checkpoint on the plateau and lower the lr; read the responses of the fall (gibberish, an empty "
       "answer, a format the reward stopped paying)", measure=measure, trigger=trigger))
