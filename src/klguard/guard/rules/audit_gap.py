"""audit_gap: the optimised RM's score gain over its baseline minus the audit RM's (`hacking/rm_score`,
`hacking/audit_score`), each in units of its baseline's within-batch standard deviation, above `audit_gap_max`: the
optimised RM sees a gain that an RM fit to other data does not share. Logged as `guard/audit_gap`."""

from __future__ import annotations

from klguard.fields import at_least
from klguard.guard.registry import GuardRule, Key, register
from klguard.guard.signals import AUDIT_SCORE, AUDIT_SCORE_STD, RM_SCORE, RM_SCORE_STD
from klguard.guard.step import Evidence, Step

NAME = "audit_gap"


def audit_gap(step: Step) -> float | None:
    """The optimised RM's gain in baseline standard deviations minus the audit RM's (None until both baselines are
    in, or where either is missing or had no spread)."""
    rm, audit = step.value(RM_SCORE), step.value(AUDIT_SCORE)
    rm0 = step.score_baseline("rm_score", rm, step.value(RM_SCORE_STD))
    audit0 = step.score_baseline("audit_score", audit, step.value(AUDIT_SCORE_STD))
    if rm0 is None or audit0 is None or rm is None or audit is None or not rm0[1] or not audit0[1]:
        return None
    return (rm - rm0[0]) / rm0[1] - (audit - audit0[0]) / audit0[1]


def measure(step: Step) -> Evidence | None:
    gap = step.memory(NAME)["value"] = audit_gap(step)
    return step.limit(NAME, AUDIT_SCORE, gap, step.cfg.audit_gap_max, True, "RM gain the audit RM does not share")


register(GuardRule(
    name=NAME, kind="signal", order=200, reads=((RM_SCORE,), (RM_SCORE_STD,), (AUDIT_SCORE,), (AUDIT_SCORE_STD,)),
    says=lambda c: f"the RM's gain minus the audit RM's > {c.audit_gap_max:g} baseline stds: hacking",
    sees="a reward gain an audit RM does not share",
    keys=(Key("audit_gap_max", 1.0, "Optimised RM's gain minus the audit RM's, in baseline stds, above this: hacking "
              "signal", at_least(0)),),
    memory={"value": None}, keep=("value",), logs=True, measure=measure))
