"""`klguard calibrate`: short runs over a grid of target_kl values, a gold-vs-KL fit, a recommendation."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

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
from klguard.commands.demo import fresh_run_dir, prepare_builtin_policy
from klguard.commands.report import load_run, write_run_report
from klguard.commands.report.summary import fmt
from klguard.commands.sweep import Job, default_parallel, run_jobs
from klguard.config import load_config
from klguard.errors import ConfigError

__all__ = ["run_calibration"]


def _sweep_overrides(cal, target: float) -> tuple[str, ...]:
    return (f"algorithm.kl_ctrl.type={cal.controller}", f"algorithm.kl_ctrl.target_kl={target}",
            f"algorithm.kl_ctrl.kl_coef={cal.kl_coef}", f"algorithm.kl_ctrl.horizon={cal.horizon}")


def run_calibration(config_file: str | None, overrides: Sequence[str], show_progress: bool = True) -> dict:
    """Run the sweep, print the table and the recommended command, write calibration.json and report.html."""
    base = load_config(config_file, overrides).config
    if not base.algorithm.use_kl_in_reward:
        raise ConfigError("klguard calibrate tunes the KL-in-reward controller: set algorithm.use_kl_in_reward=true")
    cal, unit = base.calibrate, base.algorithm.kl_ctrl.kl_unit
    out = Path(cal.output_dir)
    prepare_builtin_policy(base, lambda m: print(m, file=sys.stderr))
    jobs = []
    for target in cal.grid:
        run_dir = out / f"target_kl_{target:g}"
        fresh_run_dir(run_dir)
        jobs.append(Job(f"target_kl={target:g}", run_dir, (*overrides, *_sweep_overrides(cal, target),
                                                          "guard.enable=false", "trainer.resume_mode=disable"),
                        base.trainer.total_training_steps or 0))
    run_jobs(jobs, parallel=cal.parallel or default_parallel(), config_file=config_file, desc="klguard calibrate",
             show_progress=show_progress, progress_every=base.trainer.progress_every)

    runs = [load_run(j.run_dir, j.label) for j in jobs]
    metric = cal.metric
    points = [summarize(r, t, metric, unit) for r, t in zip(runs, cal.grid, strict=True)]
    pairs = [(kl, gain, r.label) for r in runs for kl, gain in fit_points(r, metric, unit)]
    fit = fit_gao([(kl, gain) for kl, gain, _ in pairs])
    rec = recommend(points, fit, cal.max_hacking_rate)
    gold = any(p.hacking_rate is not None for p in points)
    command = None
    if rec.target_kl is not None:
        chosen = _sweep_overrides(cal, rec.target_kl)
        kept = [o for o in overrides if not o.lstrip("+").startswith("calibrate.")]  # sweep-only keys
        parts = ["klguard", "train"] + (["--config", config_file] if config_file else []) + [*kept, *chosen]
        command = shlex.join(parts)
    result = {
        "metric": metric, "kl_unit": unit, "gold_labels": gold, "max_hacking_rate": cal.max_hacking_rate,
        "points": [as_dict(p) for p in points], "fit": as_dict(fit) if fit else None,
        "fit_points": [{"kl": kl, "gain": g, "run": label} for kl, g, label in pairs],
        "recommendation": as_dict(rec), "command": command,
    }
    (out / "calibration.json").write_text(json.dumps(result, indent=1))
    report = _write_report(runs, pairs, fit, rec, points, metric, out)
    _print(points, fit, rec, command, metric, unit, gold, report)
    return result


def _write_report(runs, pairs, fit: Fit | None, rec: Recommendation, points: list[SweepPoint], metric: str,
                  out: Path) -> Path:
    from klguard.commands.report.figures import calibration_figure
    from klguard.commands.report.html import image

    xs = [(kl ** 0.5, gain, label) for kl, gain, label in pairs]
    png = calibration_figure(xs, (fit.a, fit.b) if fit else None, rec.target_kl,
                             f"{metric} gain over step 0")
    rows = "".join(f"<tr><td>{p.target_kl:g}</td><td>{fmt(p.final_score)}</td><td>{fmt(p.best_score)}</td>"
                   f"<td>{fmt(p.hacking_rate)}</td><td>{fmt(p.mean_kl)}</td><td>{fmt(p.final_kl)}</td>"
                   f"<td>{fmt(p.response_length)}</td></tr>" for p in points)
    table = ("<table><tr><th>target_kl</th><th>final score</th><th>best score</th><th>hacking rate</th>"
             f"<th>mean KL</th><th>final KL</th><th>length</th></tr>{rows}</table>")
    fit_text = ("no fit (fewer than 3 points)" if fit is None else
                f"R(d) = d ({fit.a:.4g} - {fit.b:.4g} ln d), R^2 = {fit.r2:.3f} over {fit.n} points")
    body = (f"{table}<p>Fit: {fit_text}.</p><p><b>Recommended target_kl: "
            f"{'none' if rec.target_kl is None else f'{rec.target_kl:g}'}</b> &mdash; {rec.basis}.</p>"
            f"{image(png, 'score vs sqrt(KL)')}")
    return write_run_report(runs, out / "report.html", title="klguard calibrate: target_kl sweep",
                            extra_sections=[("Calibration", body)])


def _print(points, fit, rec, command, metric, unit, gold, report) -> None:
    print(f"\n{'target_kl':>10}{'final':>9}{'best':>9}{'hacking':>9}{'mean KL':>10}{'final KL':>10}{'length':>8}")
    for p in points:
        print(f"{p.target_kl:>10g}{fmt(p.final_score):>9}{fmt(p.best_score):>9}{fmt(p.hacking_rate):>9}"
              f"{fmt(p.mean_kl):>10}{fmt(p.final_kl):>10}{fmt(p.response_length):>8}")
    print(f"score: {metric}; KL unit: {unit}")
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
