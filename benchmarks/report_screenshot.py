"""Render a klguard report in headless Chromium and save a screenshot, to check it by eye.

    python benchmarks/report_screenshot.py RUN_DIR [RUN_DIR ...] [--out benchmarks/results/report.png]

Needs a Chromium binary (`apt-get install chromium`; found as chromium, chromium-browser or
google-chrome). Writes the report next to the screenshot, then the PNG of the full page.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from klguard.commands.report import load_run, write_run_report

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "report.png"))
    parser.add_argument("--height", type=int, default=2600, help="window height in pixels (the page is long)")
    args = parser.parse_args(argv)
    browser = next((b for b in map(shutil.which, BROWSERS) if b), None)
    if browser is None:
        print("report_screenshot: no chromium found (apt-get install chromium)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    html = write_run_report([load_run(d) for d in args.run_dirs], out.with_suffix(".html"), "klguard report")
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--window-size=1300,{args.height}", f"--screenshot={out.resolve()}", html.resolve().as_uri()],
                   check=True, capture_output=True, timeout=120)
    print(f"screenshot: {out} ({out.stat().st_size} bytes) of {html}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
