"""Ship a fitted probe RM's heads with klguard: `python tools/ship_probe_rm.py CACHE_FOLDER [--samples OUT.jsonl]`.

CACHE_FOLDER is a finished fit under klguard's cache (`~/.cache/klguard/probe-rm/<task>-<key>`, written by a
`proxy_reward.kind=learned_rm` run of the reviews or constraints task). Its head weights (the RM's and the audit
RM's) go to src/klguard/builtin/probe_heads/<task>-<key>.safetensors, its metrics and where it was fit to the
`.json` beside it; `--samples` also writes the labelled samples both heads were fit on (one JSON object a line, the
audit's marked). Commit the result: runs of that recipe on that policy then build the RM from these heads on every
machine instead of fitting their own (klguard.builtin.probe_rm).
"""

from __future__ import annotations

import argparse
import json
import platform
from datetime import datetime, timezone
from pathlib import Path

import torch
import transformers

from klguard.builtin.probe_rm import ship_head, shipped_heads


def cpu_name() -> str | None:
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.is_file() else []
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")),
                platform.processor() or None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="a finished probe-RM fit in klguard's cache")
    ap.add_argument("--samples", type=Path, help="also write the labelled samples the heads were fit on here")
    args = ap.parse_args()
    if not (args.folder / "rm_metrics.json").is_file():
        raise SystemExit(f"{args.folder}: no rm_metrics.json, not a finished probe-RM fit")
    provenance = {"fit_on": {"cpu": cpu_name(), "torch": torch.__version__, "transformers": transformers.__version__},
                  "shipped_at": datetime.now(timezone.utc).strftime("%Y-%m-%d")}
    try:
        head = ship_head(args.folder, shipped_heads(), provenance)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    if args.samples:
        lines = [json.loads(line) for line in (args.folder / "samples.jsonl").read_text().splitlines()]
        if (args.folder / "audit").is_dir():
            audit_lines = (args.folder / "audit" / "samples.jsonl").read_text().splitlines()
            lines += [{**json.loads(line), "audit": True} for line in audit_lines]
        args.samples.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in lines))
    print(f"shipped {head}")


if __name__ == "__main__":
    main()
