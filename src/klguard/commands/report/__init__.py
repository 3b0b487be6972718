"""`klguard report`: one self-contained HTML page for a run, a comparison of runs, or a calibration."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from klguard.commands.report.figures import recorded_panels, training_figure
from klguard.commands.report.html import events_table, image, page, summary_table
from klguard.commands.report.runs import RunRecord, load_run
from klguard.commands.report.samples import samples_section

__all__ = ["RunRecord", "load_run", "write_run_report"]

LEGEND = ("Vertical lines mark guard actions: red rollback, orange kl_coef raised, purple lr cut, olive target_kl "
          "lowered, brown gradient clipping, black pause. Rollout curves are smoothed over 5 steps; validation points "
          "are greedy decoding on the held-out split.")


def write_run_report(runs: Sequence[RunRecord], out: str | Path, title: str = "klguard run",
                     extra_sections: Sequence[tuple[str, str]] = ()) -> Path:
    """Write ``out`` (an .html file) for one run or several runs compared side by side."""
    out = Path(out)
    missing = recorded_panels(runs)[1]
    absent = (f" Not recorded in {'this run' if len(runs) == 1 else 'these runs'}: "
              f"{'; '.join(p.title for p in missing)}." if missing else "")
    sections = [("Summary", summary_table(runs)),
                ("Training curves", image(training_figure(runs), "training curves")
                 + f"<p class=note>{LEGEND}{absent}</p>"),
                *extra_sections,
                ("Guard actions", events_table(runs))]
    samples = samples_section(runs)
    if samples is not None:
        sections.insert(-1, ("Sampled responses", samples))
    intro = "Runs: " + ", ".join(f"{r.label} ({_shown_path(r.path, out.parent)})" for r in runs)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(page(title, sections, intro), encoding="utf-8")
    tmp.replace(out)
    return out


def _shown_path(path: str | Path, folder: Path) -> str:
    """A run inside the report's folder by its relative path (a report that moves keeps true names); else absolute."""
    rel = os.path.relpath(Path(path).resolve(), folder.resolve())
    return rel if not rel.startswith("..") else str(Path(path).resolve())
