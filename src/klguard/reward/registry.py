"""Choose the gold (rule) reward by a row's `data_source`, like verl's `default_compute_score`."""

from __future__ import annotations

from collections.abc import Callable

from klguard.reward import gsm8k

ScoreFn = Callable[[str, str], float]


def _gsm8k_strict(response_text: str, ground_truth: str) -> float:
    return gsm8k.compute_score(response_text, ground_truth, method="strict")


def _gsm8k_flexible(response_text: str, ground_truth: str) -> float:
    return gsm8k.compute_score(response_text, ground_truth, method="flexible")


class RuleReward:
    """A table from `data_source` to a `(response_text, ground_truth) -> float` rule."""

    def __init__(self, rules: dict[str, ScoreFn] | None = None) -> None:
        self._rules: dict[str, ScoreFn] = dict(DEFAULT_RULES if rules is None else rules)

    @property
    def data_sources(self) -> tuple[str, ...]:
        """The data sources this table can score, sorted."""
        return tuple(sorted(self._rules))

    def register(self, data_source: str, fn: ScoreFn) -> None:
        """Add or replace the rule for `data_source`."""
        self._rules[data_source] = fn

    def __contains__(self, data_source: str) -> bool:
        return data_source in self._rules

    def __call__(self, data_source: str, response_text: str, ground_truth: str) -> float:
        """Score one response; ValueError naming `data_source` when no rule is known."""
        try:
            rule = self._rules[data_source]
        except KeyError:
            raise ValueError(
                f"no rule reward for data_source {data_source!r}; known: {', '.join(self.data_sources)}"
            ) from None
        return float(rule(response_text, ground_truth))


# GSM8K's strict rule as verl scores `openai/gsm8k` (the arithmetic demo writes `#### <number>` too);
# `openai/gsm8k:flexible` reads the last number in the response instead (verl's flexible method).
DEFAULT_RULES: dict[str, ScoreFn] = {
    "openai/gsm8k": _gsm8k_strict,
    "openai/gsm8k:flexible": _gsm8k_flexible,
    "klguard/arith": _gsm8k_strict,
}

_DEFAULT = RuleReward()


def compute_gold_score(data_source: str, response_text: str, ground_truth: str) -> float:
    """The gold score of one response under the default rule table."""
    return _DEFAULT(data_source, response_text, ground_truth)

