"""`klguard calibrate`: short runs over a grid of target_kl values, a gold-vs-KL fit, a recommendation."""

from __future__ import annotations

import html
import json
import resource
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from klguard.builtin.task import prepare_task
from klguard.commands.calibrate.analysis import (
    Fit,
    Recommendation,
    SweepPoint,
    as_dict,
    fit_gao,
    fit_points,
    recommend,
    summarize,
)
from klguard.commands.calibrate.early_stop import StopRule, next_targets
from klguard.commands.calibrate.runs import SweepRuns, sweep_overrides
from klguard.commands.report import write_run_report
from klguard.commands.report.summary import fmt
from klguard.commands.sweep import default_parallel
from klguard.config import load_config
from klguard.errors import ConfigError

__all__ = ["run_calibration"]


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _points(sweep: SweepRuns, metric: str, unit: str) -> list[SweepPoint]:
    return [summarize(run, target, metric, unit) for target, run in sweep.records()]


def _start_score(sweep: SweepRuns, metric: str) -> float | None:
    for _, run in sweep.records():
        steps, scores = run.series(metric)
        if steps and steps[0] == 0:
            return scores[0]
    return None


def _extend(sweep: SweepRuns, cal, metric: str, unit: str, budget: int, parallel: int, **progress) -> str:
    """Add targets while the grid has no target that learns without hacking and the budget lasts;
    returns what the sweep found (the bracket, or why there is none)."""
    while True:
        found = next_targets(_points(sweep, metric, unit), _start_score(sweep, metric), cal.max_hacking_rate,
                             cal.min_gain, count=parallel, stopped=sweep.stopped)
        new = [t for t in found.targets if t not in sweep.targets]
        if not new:
            return found.reason
        if not cal.extend_grid:
            return f"{found.reason}; calibrate.extend_grid=false: try target_kl {', '.join(f'{t:g}' for t in new)}"
        affordable = (budget - sweep.steps_trained()) // max(1, sweep.steps)
        if affordable < 1:
            return f"{found.reason}; calibrate.budget_steps={budget} spent"
        new = new[:affordable]
        _log(f"klguard calibrate: {found.reason}: adding target_kl {', '.join(f'{t:g}' for t in new)}")
        sweep.run(new, parallel=parallel, **progress)


def run_calibration(config_file: str | None, overrides: Sequence[str], show_progress: bool = True) -> dict:
    """Run the sweep, print the table and the recommended command, write calibration.json and report.html."""
    base = load_config(config_file, overrides).config
    if not base.algorithm.use_kl_in_reward:
        raise ConfigError("klguard calibrate tunes the KL-in-reward controller: set algorithm.use_kl_in_reward=true")
    cal, unit, metric = base.calibrate, base.algorithm.kl_ctrl.kl_unit, base.calibrate.metric
    steps = base.trainer.total_training_steps or 0
    budget = cal.budget_steps or 2 * len(cal.grid) * steps  # the extension may cost what the grid would
    parallel = cal.parallel or default_parallel()
    out = Path(cal.output_dir)
    prepare_task(base, _log)
    rule = (StopRule(metric, cal.stop_hacking_rate, cal.stop_hacking_validations, cal.stop_behind,
                     cal.max_hacking_rate) if cal.early_stop else None)
    run_overrides = tuple(o for o in overrides if not o.lstrip("+").startswith("calibrate."))  # sweep-only keys
    sweep = SweepRuns(out, run_overrides, cal, steps, config_file, rule)
    progress = {"show_progress": show_progress, "progress_every": base.trainer.progress_every}
    cpu_before = _children_cpu_s()
    sweep.run(list(cal.grid), parallel=parallel, **progress)
    if sweep.kept:
        _log(f"klguard calibrate: kept {len(sweep.kept)} finished run(s) from {out}")
    bracket = _extend(sweep, cal, metric, unit, budget, parallel, **progress)

    records = sweep.records()
    runs = [run for _, run in records]
    points = _points(sweep, metric, unit)
    pairs = [(kl, gain, r.label) for r in runs for kl, gain in fit_points(r, metric, unit)]
    fit = fit_gao([(kl, gain) for kl, gain, _ in pairs])
    finished = [p for p in points if p.target_kl not in sweep.stopped]  # a stopped run's score is not its end's
    rec = recommend(finished, fit, cal.max_hacking_rate)
    gold = any(p.hacking_rate is not None for p in points)
    command = None
    if rec.target_kl is not None:
        chosen = sweep_overrides(cal, rec.target_kl)
        parts = ["klguard", "train"] + (["--config", config_file] if config_file else []) + [*run_overrides, *chosen]
        command = shlex.join(parts)
    result = {
        "metric": metric, "kl_unit": unit, "gold_labels": gold, "max_hacking_rate": cal.max_hacking_rate,
        "points": [as_dict(p) | {"stopped": sweep.stopped.get(p.target_kl)} for p in points],
        "fit": as_dict(fit) if fit else None,
        "fit_points": [{"kl": kl, "gain": g, "run": label} for kl, g, label in pairs],
        "recommendation": as_dict(rec), "command": command, "bracket": bracket,
        "grid": list(cal.grid), "added_targets": [t for t in sweep.targets if t not in cal.grid],
        "early_stop": as_dict(rule) if rule else None, "steps_trained": sweep.steps_trained(),
        "budget_steps": budget, "cpu_s": _children_cpu_s() - cpu_before,
    }
    (out / "calibration.json").write_text(json.dumps(result, indent=1))
    report = _write_report(runs, pairs, fit, rec, points, metric, out, sweep.stopped, bracket)
    _print(points, sweep.stopped, fit, rec, command, metric, unit, gold, report, bracket)
    return result


def _children_cpu_s() -> float:
    """CPU seconds (user + system) of the finished child processes: the sweep's training runs."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _write_report(runs, pairs, fit: Fit | None, rec: Recommendation, points: list[SweepPoint], metric: str,
                  out: Path, stopped: dict[float, str], bracket: str) -> Path:
    from klguard.commands.report.figures import calibration_figure
    from klguard.commands.report.html import image

    xs = [(kl ** 0.5, gain, label) for kl, gain, label in pairs]
    png = calibration_figure(xs, (fit.a, fit.b) if fit else None, rec.target_kl,
                             f"{metric} gain over step 0")
    rows = "".join(f"<tr><td>{p.target_kl:g}</td><td>{fmt(p.final_score)}</td><td>{fmt(p.best_score)}</td>"
                   f"<td>{fmt(p.hacking_rate)}</td><td>{fmt(p.mean_kl)}</td><td>{fmt(p.final_kl)}</td>"
                   f"<td>{fmt(p.response_length)}</td><td>{p.steps}</td>"
                   f"<td>{html.escape(stopped.get(p.target_kl, ''))}</td></tr>" for p in points)
    table = ("<table><tr><th>target_kl</th><th>final score</th><th>best score</th><th>hacking rate</th>"
             f"<th>mean KL</th><th>final KL</th><th>length</th><th>steps</th><th>stopped early</th></tr>{rows}</table>")
    fit_text = ("no fit (fewer than 3 points)" if fit is None else
                f"R(d) = d ({fit.a:.4g} - {fit.b:.4g} ln d), R^2 = {fit.r2:.3f} over {fit.n} points")
    body = (f"{table}<p>Fit: {fit_text}.</p><p><b>Recommended target_kl: "
            f"{'none' if rec.target_kl is None else f'{rec.target_kl:g}'}</b> &mdash; {rec.basis}.</p>"
            f"<p>Sweep: {html.escape(bracket)}.</p>"
            f"{image(png, 'score vs sqrt(KL)')}")
    return write_run_report(runs, out / "report.html", title="klguard calibrate: target_kl sweep",
                            extra_sections=[("Calibration", body)])


def _print(points, stopped, fit, rec, command, metric, unit, gold, report, bracket) -> None:
    print(f"\n{'target_kl':>10}{'final':>9}{'best':>9}{'hacking':>9}{'mean KL':>10}{'final KL':>10}{'length':>8}"
          f"{'steps':>7}")
    for p in points:
        print(f"{p.target_kl:>10g}{fmt(p.final_score):>9}{fmt(p.best_score):>9}{fmt(p.hacking_rate):>9}"
              f"{fmt(p.mean_kl):>10}{fmt(p.final_kl):>10}{fmt(p.response_length):>8}{p.steps:>7}")
    for target, reason in sorted(stopped.items()):
        print(f"stopped early: target_kl={target:g}: {reason}")
    print(f"score: {metric}; KL unit: {unit}")
    print(f"sweep: {bracket}")
    if not gold:
        print("note: no gold labels (hacking/rate absent): the recommendation uses the validation score named by "
              "calibrate.metric and cannot check hacking")
    if fit is not None:
        print(f"fit: R(d) = d ({fit.a:.4g} - {fit.b:.4g} ln d), d = sqrt(KL); R^2 = {fit.r2:.3f} over {fit.n} points")
    else:
        print("fit: fewer than 3 usable points")
    if rec.target_kl is None:
        print(f"no recommendation: {rec.basis}")
    else:
        print(f"recommended target_kl = {rec.target_kl:g}: {rec.basis}")
        print(f"train with:\n  {command}")
    print(f"report: {report.resolve()}")
