"""The home page's pictures of `klguard demo`: a four-panel summary figure and the full report beside it.

    klguard demo --out DEMO && python benchmarks/demo_pictures.py DEMO

Writes benchmarks/results/demo_summary.png (validation gold, sampled hacking, KL and its coefficient, both runs
overlaid, the guard's actions as vertical lines) and benchmarks/results/demo_report.html (the demo's own report,
with the run folders named relative to it), which README and docs/index.md show and link.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from klguard.commands.demo import DEMO_RUNS, REPORT_TITLE
from klguard.commands.report import load_run, write_run_report
from klguard.commands.report.figures import SUMMARY_PANELS, training_figure

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("demo", type=Path, help="a `klguard demo --out` folder")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the two files go")
    args = parser.parse_args(argv)
    runs = [load_run(args.demo / folder, label) for label, folder, _ in DEMO_RUNS]
    args.out.mkdir(parents=True, exist_ok=True)
    summary = args.out / "demo_summary.png"
    summary.write_bytes(training_figure(runs, panels=SUMMARY_PANELS))
    report = write_run_report(runs, args.demo / "report.html", REPORT_TITLE)
    (args.out / "demo_report.html").write_text(report.read_text(encoding="utf-8"), encoding="utf-8")
    print(f"wrote {summary} ({summary.stat().st_size} bytes) and {args.out / 'demo_report.html'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
