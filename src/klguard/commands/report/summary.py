"""The numbers that sum a run up, shared by the HTML report and the terminal tables."""

from __future__ import annotations

from collections.abc import Sequence

from klguard.commands.report.runs import RunRecord

# (label, metric, how): "last" = final value, "best" = maximum, "tail" = mean of the last 10 steps
SUMMARY_ROWS: tuple[tuple[str, str, str], ...] = (
    ("final validation gold", "val-core/", "last"),
    ("best validation gold", "val-core/", "best"),
    ("final validation hacking rate", "val-aux/*", "last"),
    ("proxy score (last 10 steps)", "hacking/proxy_score", "tail"),
    ("gold score (last 10 steps)", "hacking/gold_score", "tail"),
    ("hacking rate (last 10 steps)", "hacking/rate", "tail"),
    ("response length (last 10 steps)", "response_length/mean", "tail"),
    ("KL per token (last 10 steps)", "actor/reward_kl_penalty", "tail"),
    ("KL per sequence (last 10 steps)", "actor/kl_seq_sum", "tail"),
    ("final KL coefficient", "actor/reward_kl_penalty_coeff", "last"),
)


# where a run has no KL in the reward (TRL: the KL is a loss term), its KL-loss figures stand in
FALLBACKS = {"actor/reward_kl_penalty": "actor/kl_loss", "actor/reward_kl_penalty_coeff": "actor/kl_coef"}


def summary_value(run: RunRecord, metric: str, how: str) -> float | None:
    if metric in FALLBACKS and not run.series(metric)[0]:
        metric = FALLBACKS[metric]
    if how == "best":
        return run.best(metric)
    if how == "tail":
        return run.mean_last(metric, 10)
    return run.last(metric)



def text_table(runs: Sequence[RunRecord]) -> str:
    """The summary as a fixed-width terminal table, one column per run."""
    width = max(12, *(len(r.label) + 2 for r in runs))
    lines = [f"{'metric':<34}" + "".join(f"{r.label:>{width}}" for r in runs)]
    for label, metric, how in SUMMARY_ROWS:
        cells = "".join(f"{fmt(summary_value(r, metric, how)):>{width}}" for r in runs)
        lines.append(f"{label:<34}{cells}")
    actions = "".join(f"{r.action_count:>{width}}" for r in runs)
    lines.append(f"{'guard actions':<34}{actions}")
    lines.append(f"{'steps trained':<34}" + "".join(f"{r.steps:>{width}}" for r in runs))
    pauses = {run.label: next((e for e in run.events if e.get("kind") == "pause"), None) for run in runs}
    ended = "".join(f"{'no, paused' if pauses[r.label] else 'yes':>{width}}" for r in runs)
    lines.append(f"{'trained to the end':<34}{ended}")
    for run in runs:  # a paused run says so, with the guard's reason
        pause = pauses[run.label]
        if pause is not None:
            hint = f" To go on: {pause['to_go_on']}." if pause.get("to_go_on") else ""
            lines.append(f"{run.label} paused at step {pause.get('step')}: {pause.get('reason', '')}{hint}")
    return "\n".join(lines)


def fmt(value: float | None) -> str:
    """A figure to 4 significant digits, '-' when missing (shared by terminal tables)."""
    return "-" if value is None else f"{value:.4g}"
