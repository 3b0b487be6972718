"""What `klguard watch` says before it judges a log: which guard inputs the log has, which rules therefore run
(with which values), which cannot fire and which are off; and after: which failures the rules that could not fire
would have seen (a log a rule has no input for is not calm for that rule, only unseen). Every rule and signal comes
from its declaration (klguard.guard.registry): a new one is listed here without an edit."""

from __future__ import annotations

from collections.abc import Collection

from klguard.guard import KLGuard
from klguard.guard.inputs import KL_TOKEN_MEANS, matches, missing_input
from klguard.guard.registry import GuardRule, rules
from klguard.guard.signals import VAL_METRIC

VAL = VAL_METRIC
KL = KL_TOKEN_MEANS  # the KL inputs, listed first
STOPS = ("rollback", "pause")  # the actions that stop a watched run (exit 3); the others are advice


def inputs_line(names: Collection[str]) -> str:
    """The guard inputs among a log's (mapped) metric names: the KL first, the validation score last."""
    read = [name for r in rules() for group in r.reads for name in group]
    wanted = dict.fromkeys([*KL, *(n for n in read if n not in KL and n != VAL), VAL])
    found = [w for w in wanted if matches(names, w)]
    return "guard inputs found: " + (", ".join(found) if found else "none")


def says(rule: GuardRule, guard: KLGuard) -> str:
    """What the rule does with the guard's values; "(advice)" where watch's exit code cannot show it."""
    advice = rule.kind != "signal" and bool(rule.actions) and not any(a in STOPS for a in rule.actions)
    return rule.says(guard.cfg) + (" (advice)" if advice else "")


def rules_lines(guard: KLGuard, names: Collection[str]) -> tuple[list[str], list[str]]:
    """(the rules that run, with their values; the rules that cannot fire, with the input they lack)."""
    run, cannot = [], []
    for rule in _on(guard):
        lacks = _lacks(rule, names)
        if lacks:
            cannot.append(f"{rule.name} (no {lacks})")
        else:
            run.append(f"{rule.name}: {says(rule, guard)}")
    return run, cannot


def off_line(guard: KLGuard) -> str:
    """The rules this guard's settings turn off (a signal guard.hacking_signals does not name is logged only)."""
    off = [rule.name for rule in rules() if not rule.active(guard)]
    return f"off by their settings: {', '.join(off)}" if off else ""


def blind_to(guard: KLGuard, names: Collection[str]) -> list[str]:
    """The failures no rule can see in a log with these names, each with the rule and the input it lacks."""
    return [f"{rule.sees} ({rule.name}: no {lacks})" for rule in _on(guard) if (lacks := _lacks(rule, names))]


def _on(guard: KLGuard) -> list[GuardRule]:
    """The rules that can fire for this guard, in the registry's order."""
    return [rule for rule in rules() if rule.active(guard)]


def _lacks(rule: GuardRule, names: Collection[str]) -> str:
    """The first input group the rule lacks in `names` (its first two names), or "" when it has them all."""
    missing = missing_input(rule, names)
    return " or ".join(missing[:2]) if missing else ""
