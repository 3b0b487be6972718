"""The report's panel of sampled responses, for runs that dumped their validations (`trainer.validation_data_dir`):
the first validation prompts' responses at the first validation, at the best one (by mean gold where the task has a
gold, else by mean score) and at the last, so a reader sees what the numbers were paid for."""

from __future__ import annotations

import html
from collections.abc import Sequence

from klguard.commands.report.runs import RunRecord

SHOWN = 4  # responses per chosen validation


def chosen_validations(run: RunRecord) -> list[tuple[str, int]]:
    """(label, step) of the first, the best and the last dumped validation, each step once."""
    steps = list(run.generations)
    if not steps:
        return []
    key = "gold" if any("gold" in r for r in run.generations[steps[0]]) else "score"

    def mean(step: int) -> float:
        value = _mean(run.generations[step], key)
        return float("-inf") if value is None else value

    best = max(steps, key=mean)  # the earliest of equal bests
    picks: dict[int, list[str]] = {}
    for label, step in (("first", steps[0]), (f"best mean {key}", best), ("last", steps[-1])):
        picks.setdefault(step, []).append(label)
    return [(", ".join(labels), step) for step, labels in picks.items()]


def samples_section(runs: Sequence[RunRecord]) -> str | None:
    """The panel's HTML, or None when no run dumped its validations."""
    parts = []
    for run in runs:
        chosen = chosen_validations(run)
        if not chosen:
            continue
        rows = []
        for label, step in chosen:
            records = run.generations[step]
            mean_gold = _mean(records, "gold")
            head = f"step {step} ({label}; mean score {_fmt(_mean(records, 'score'))}" + (
                f", mean gold {_fmt(mean_gold)})" if mean_gold is not None else ")")
            rows.append(f"<tr><th class=l colspan=4>{html.escape(head)}</th></tr>")
            for r in records[:SHOWN]:
                prompt = r.get("prompt") or r.get("input") or ""
                rows.append(f"<tr><td class=l>{html.escape(str(prompt))}</td>"
                            f"<td class=l>{html.escape(str(r.get('output', '')))}</td>"
                            f"<td>{_fmt(r.get('score'))}</td><td>{_fmt(r.get('gold'))}</td></tr>")
        parts.append(f"<h3>{html.escape(run.label)}</h3><table><tr><th class=l>prompt</th>"
                     f"<th class=l>response</th><th>score</th><th>gold</th></tr>{''.join(rows)}</table>")
    if not parts:
        return None
    return (f"<p class=note>The first {SHOWN} validation prompts' responses at the first, best and last "
            "validation of each run (from trainer.validation_data_dir).</p>" + "".join(parts))


def _mean(records: list[dict], key: str) -> float | None:
    values = [float(r[key]) for r in records if isinstance(r.get(key), (int, float))]
    return sum(values) / len(values) if values else None


def _fmt(value) -> str:
    return "&ndash;" if not isinstance(value, (int, float)) else f"{value:.3g}"
