"""Which of the guard's rules a run's metrics give no input: those rules cannot fire there.

`klguard watch` lists them for a log, the name maps for a trainer (klguard.integrations.metric_maps), and
GuardSession says once, after a live run's first `guard.baseline_window` steps, which of the rules that can fire
there had none.
"""

from __future__ import annotations

from collections.abc import Collection
from fnmatch import fnmatchcase

from klguard.guard.registry import GuardRule, rules
from klguard.guard.signals import KL_SEQ_SUM, LENGTH, REF_KL, REF_KL_LOSS, VAL_METRIC

KL_TOKEN_MEANS = (REF_KL, REF_KL_LOSS)
"""The token-mean KLs a trainer logs (in the reward, in the loss): with the mean length, they give the KL per
sequence (klguard.integrations.metric_maps.with_kl_per_sequence)."""


def rules_without_input(names: Collection[str], val_metric: str = VAL_METRIC) -> list[str]:
    """The guard's rules and signals that none of `names` (a map's guard names, or a log's) gives an input: they
    cannot fire there (TRL's map has no actor/ppo_kl, OpenRLHF's no KL coefficient). The KL per sequence counts as
    given where a token-mean KL and the mean length are."""
    if LENGTH in names and any(k in names for k in KL_TOKEN_MEANS):
        names = {*names, KL_SEQ_SUM}
    return [r.name for r in rules() if missing_input(r, names, val_metric) is not None]


def missing_input(rule: GuardRule, names: Collection[str], val_metric: str = VAL_METRIC) -> tuple[str, ...] | None:
    """The first of `rule`'s input groups that none of `names` gives (None: it has them all), as the guard reads it:
    `val_metric` (guard.val_metric) where the rule reads the validation score."""
    groups = (tuple(val_metric if wanted == VAL_METRIC else wanted for wanted in group) for group in rule.reads)
    return next((group for group in groups if not any(matches(names, wanted) for wanted in group)), None)


def matches(names: Collection[str], wanted: str) -> bool:
    """Whether one of `names` is `wanted` (a glob where it has a `*`)."""
    return any(fnmatchcase(n, wanted) for n in names) if "*" in wanted else wanted in names
