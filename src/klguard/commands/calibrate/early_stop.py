"""When a calibration run may stop before its last step, and where the grid goes next.

Both are pure functions of the runs' records (metrics.jsonl read back), so a resumed sweep takes the
same decisions and the rules are tested on scripted metrics.

Stopping (asynchronous successive halving, ASHA-style, with every validation a rung): a run stops
once its sampled hacking rate (mean of the 10 steps up to a validation) stays over
`calibrate.stop_hacking_rate` for `calibrate.stop_hacking_validations` validations in a row, or once its
score at a validation is more than `calibrate.stop_behind` under the best score another run that was not
hacking (at most `calibrate.max_hacking_rate`) had at that same step. Its partial record still enters the
fit. The stopping threshold sits above max_hacking_rate: on the built-in task every target hacks 10-25%
of its samples around step 50, before the controller has raised beta, and the small targets come back
under 0.1 by the end; a run that stayed over 0.3 for three validations did not.

The grid: when every target hacked, the next targets are halvings of the smallest; when none hacked and
none learned, doublings of the largest; when the clean targets do not learn and the larger ones hack,
geometric steps between the two, until they are closer than a factor 1.25 (then no target does both).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from klguard.commands.calibrate.analysis import HACKING_METRIC, SweepPoint, window_mean
from klguard.commands.report.runs import RunRecord

MIN_TARGET, MAX_TARGET = 1e-4, 1.0  # the grid never extends past these
CLOSEST_RATIO = 1.25  # a bracket narrower than this is not split again


@dataclass(frozen=True)
class StopRule:
    metric: str
    hacking_rate: float  # stop once the sampled hacking rate stays over this ...
    hacking_validations: int  # ... at this many validations in a row
    behind: float
    max_hacking_rate: float  # a run over this is no yardstick for the behind rule


def _rungs(run: RunRecord, metric: str) -> dict[int, tuple[float, float | None]]:
    """The run's score and sampled hacking rate at each of its validation steps."""
    hacking_steps, hacking = run.series(HACKING_METRIC)
    return {step: (score, window_mean(hacking_steps, hacking, step)) for step, score in zip(*run.series(metric),
                                                                                            strict=True)}


def stop_reason(run: RunRecord, others: Sequence[RunRecord], rule: StopRule) -> str | None:
    """Why `run` should stop now, or None; `others` are the sweep's other runs as far as they got."""
    own = _rungs(run, rule.metric)
    theirs = [_rungs(o, rule.metric) for o in others]
    streak = 0
    for step in sorted(s for s in own if s > 0):
        score, rate = own[step]
        streak = streak + 1 if rate is not None and rate > rule.hacking_rate else 0
        if streak >= rule.hacking_validations:
            return (f"hacking rate over {rule.hacking_rate:g} at {streak} validations in a row "
                    f"(step {step}: {rate:.2f})")
        clean = [t[step][0] for t in theirs if step in t and (t[step][1] or 0.0) <= rule.max_hacking_rate]
        if clean and max(clean) - score > rule.behind:
            return (f"score {score:.3f} at step {step} is {max(clean) - score:.2f} under the best "
                    f"clean run's {max(clean):.3f}")
    return None


@dataclass(frozen=True)
class GridStep:
    targets: tuple[float, ...]  # the next targets to try; empty when the sweep is done
    reason: str  # why those targets, or what the sweep found


def _fmt_point(p: SweepPoint, start: float | None) -> str:
    gain = "" if p.final_score is None or start is None else f", gain {p.final_score - start:+.3f}"
    hacking = "" if p.hacking_rate is None else f", hacking {p.hacking_rate:.2f}"
    return f"{p.target_kl:g} ({gain[2:]}{hacking})" if gain or hacking else f"{p.target_kl:g}"


def next_targets(points: Sequence[SweepPoint], start: float | None, max_hacking_rate: float, min_gain: float,
                 count: int = 1, stopped: Collection[float] = ()) -> GridStep:
    """Where to extend the grid (`count` new targets) or why not, from the points so far and the step-0 score;
    a run in `stopped` (early) never counts as one that learns."""
    hacked = sorted((p for p in points if p.hacking_rate is not None and p.hacking_rate > max_hacking_rate),
                    key=lambda p: p.target_kl)
    clean = sorted((p for p in points if p not in hacked and p.final_score is not None), key=lambda p: p.target_kl)
    good = [p for p in clean if p.target_kl not in stopped and (start is None or p.final_score - start > min_gain)]
    if good:
        above = [p for p in hacked if p.target_kl > good[-1].target_kl]
        upper = f"; {_fmt_point(above[0], start)} hacks" if above else ""
        return GridStep((), f"bracket: {_fmt_point(good[-1], start)} learns without hacking{upper}")
    if not clean and not hacked:
        return GridStep((), "no run reached a validation")
    if not clean:
        lowest = hacked[0].target_kl
        return _bounded([lowest / 2 ** k for k in range(1, count + 1)], f"every target_kl hacked down to {lowest:g}")
    if not hacked:
        highest = clean[-1].target_kl
        return _bounded([highest * 2 ** k for k in range(1, count + 1)],
                        f"no target_kl up to {highest:g} learned (gain <= {min_gain:g}) and none hacked")
    below = [p for p in clean if p.target_kl < hacked[0].target_kl]
    if not below:  # the clean runs lie above the hacking ones: no bracket to split
        return GridStep((), "no target learns without hacking: " + "; ".join(_fmt_point(p, start) for p in points))
    lo, hi = below[-1], hacked[0]
    found = f"{_fmt_point(lo, start)} does not learn, {_fmt_point(hi, start)} hacks"
    if hi.target_kl / lo.target_kl < CLOSEST_RATIO:
        return GridStep((), f"no target learns without hacking: {found}")
    ratio = hi.target_kl / lo.target_kl
    return _bounded([lo.target_kl * ratio ** (k / (count + 1)) for k in range(1, count + 1)], found)


def _bounded(targets: list[float], why: str) -> GridStep:
    kept = tuple(t for t in (float(f"{t:.3g}") for t in targets) if MIN_TARGET <= t <= MAX_TARGET)
    if not kept:
        return GridStep((), f"{why}; the grid stops at [{MIN_TARGET:g}, {MAX_TARGET:g}]")
    return GridStep(kept, why)
