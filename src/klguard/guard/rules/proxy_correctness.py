"""proxy_correctness: where a log carries several reward columns (per-function rewards, `critic/score/<fn>/mean`), the
proxy holds or rises while correctness falls. The proxy is the column `proxy_reward` names (a glob over the
functions' names), else the one whose name says format, tags, style or length; correctness is the column whose name
says correct, accuracy or answer, else the validation score. Over the last `proxy_window` steps (the last
`proxy_validations` validation scores where correctness is the validation): correctness falls by the Mann-Kendall
test (one-sided, 5%) while the proxy's Theil-Sen slope is 0 or more. Advice. Off in klguard's own runs (0 steps)."""

from __future__ import annotations

import fnmatch
import re

from klguard.fields import at_least
from klguard.guard.actions import Action
from klguard.guard.registry import GuardRule, Key, register
from klguard.guard.shapes import advise
from klguard.guard.signals import VAL_METRIC
from klguard.guard.step import Step
from klguard.guard.trend import mann_kendall, theil_sen

NAME = "proxy_correctness"
FUNCTIONS = "critic/score/*/mean"
FUNCTION = re.compile(r"^critic/score/(.+)/mean$")
PROXY_WORDS = frozenset({"format", "formatting", "tag", "tags", "think", "xml", "xmlcount", "style", "length", "len",
                         "structure", "soft", "strict"})
CORRECT_WORDS = frozenset({"correct", "correctness", "accuracy", "acc", "answer", "exact", "solution", "solved",
                           "pass", "check"})
Z_FALL = -1.645  # Mann-Kendall one-sided 5%


def _words(name: str) -> set[str]:
    return {w.lower() for w in re.findall(r"[A-Za-z]+", re.sub(r"(?<=[a-z])(?=[A-Z])", " ", name))}


def _pick(functions: list[str], glob: str) -> tuple[str | None, str | None]:
    """(the proxy, the correctness column) among the functions' names."""
    proxy = next((f for f in functions if glob and fnmatch.fnmatchcase(f, glob)), None)
    proxy = proxy or next((f for f in functions if not glob and _words(f) & PROXY_WORDS), None)
    correct = next((f for f in functions if f != proxy and _words(f) & CORRECT_WORDS), None)
    return proxy, correct


def measure(step: Step) -> dict | None:
    cfg, memory = step.cfg, step.memory(NAME)
    step.st.alarms[NAME] = False
    if cfg.proxy_window <= 0:
        return None
    series = memory["series"]
    for name in step.metrics:
        match = FUNCTION.match(name)
        value = step.value(name) if match else None
        if value is not None:
            kept = series.setdefault(match.group(1), [])
            kept.append([step.step, value])
            del kept[:-cfg.proxy_window]
    if step.validation.val is not None:
        memory["val"].append([step.step, step.validation.val])
        del memory["val"][:-cfg.proxy_validations]
    proxy, correct = _pick(sorted(series), cfg.proxy_reward)
    truth = series.get(correct) if correct else memory["val"]
    if proxy is None or not truth or len(truth) < (3 if correct else cfg.proxy_validations):
        return None
    points = series[proxy]
    slope = theil_sen([p[0] for p in points], [p[1] for p in points])
    z = mann_kendall([p[1] for p in truth])
    step.st.alarms[NAME] = len(points) >= cfg.proxy_window // 2 and z <= Z_FALL and slope >= 0
    return {"proxy": proxy, "correct": correct or cfg.val_metric, "z": z, "slope": slope,
            "value": truth[-1][1]}


def act(step: Step) -> list[Action]:
    found = step.found[NAME]
    if not found:
        return []
    why = (f"correctness ({found['correct']}) is falling (Mann-Kendall z {found['z']:.2f}) while the proxy reward "
           f"{found['proxy']} holds or rises (Theil-Sen slope {found['slope']:.3g} a step): the proxy is paid for "
           "something other than correct answers.")
    return advise(step, NAME, found["correct"], found["value"], None, why)


register(GuardRule(
    name=NAME, kind="alarm", flag_when_off=False, order=80, reads=((FUNCTIONS,),), optional=(VAL_METRIC,),
    says=lambda c: (f"correctness falling (Mann-Kendall, {c.proxy_window} steps) while the proxy reward holds or "
                    "rises: advise"),
    sees="a proxy reward gamed while correctness falls", actions=("warn",),
    keys=(Key("proxy_window", 0, "Steps of per-function rewards proxy_correctness judges the trends over (0: off)",
              at_least(0), external=50),
          Key("proxy_validations", 4, "Validation scores proxy_correctness judges correctness over, where no column "
              "says correct", at_least(3)),
          Key("proxy_reward", "", "Glob of the per-function reward that is the proxy (empty: by its name: format, "
              "tags, style, length)")),
    memory={"series": {}, "val": []}, on=lambda guard: guard.cfg.proxy_window > 0,
    do="read responses the proxy pays well and correctness does not; lower the proxy's weight, or make it pay only "
       "with a correct answer", measure=measure, act=act))
