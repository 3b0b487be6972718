"""Put the built-in SFT policy into the package: `python tools/ship_builtin_policy.py [--from FOLDER]`.

Without --from it runs `klguard sft` (the default recipe) into a scratch cache with one thread and
CPU-independent kernels (MKL_CBWR=COMPATIBLE, ATEN_CPU_CAPABILITY=default), the settings the golden runs
use, so a machine with the same torch can retrain the same bytes. --from takes a finished `klguard sft`
folder instead (it must come from the default recipe). The files go to src/klguard/builtin/policy/
with manifest.json: the recipe, each file's SHA-256 and how it was built. Commit the result.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

import torch
import transformers

from klguard.builtin.shipped import MANIFEST, file_digests
from klguard.builtin.warm_start import sft_cache_dir, sft_recipe
from klguard.config import load_config

DEST = Path(__file__).resolve().parents[1] / "src" / "klguard" / "builtin" / "policy"
BUILD_ENV = {"OMP_NUM_THREADS": "1", "MKL_CBWR": "COMPATIBLE", "ATEN_CPU_CAPABILITY": "default",
             "ONEDNN_MAX_CPU_ISA": "SSE41"}
SHIPPED_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json", "sft_metrics.json")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def build(scratch: Path) -> Path:
    cfg = load_config(None, [f"sft.cache_dir={scratch}"]).config
    subprocess.run([sys.executable, "-m", "klguard", "sft", f"sft.cache_dir={scratch}"], check=True,
                   env={**os.environ, **BUILD_ENV})
    return sft_cache_dir(cfg.sft, cfg.data.builtin_form)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", help="a finished `klguard sft` folder of the default recipe")
    parser.add_argument("--from-build-env", action="store_true",
                        help="the --from folder was trained with this script's BUILD_ENV (recorded as such)")
    args = parser.parse_args()
    cfg = load_config().config
    recipe = sft_recipe(cfg.sft, cfg.data.builtin_form)
    with tempfile.TemporaryDirectory() as scratch:
        source = Path(args.source) if args.source else build(Path(scratch))
        metrics = json.loads((source / "sft_metrics.json").read_text())
        wanted = {k: v for k, v in asdict(cfg.sft).items() if k != "cache_dir"}
        if {k: v for k, v in metrics["recipe"].items() if k != "cache_dir"} != wanted:
            sys.exit(f"{source} was not trained from the default sft recipe: {metrics['recipe']}")
        shutil.rmtree(DEST, ignore_errors=True)
        DEST.mkdir(parents=True)
        for name in SHIPPED_FILES:
            if (source / name).is_file():
                shutil.copy2(source / name, DEST / name)
    env = BUILD_ENV if not args.source or args.from_build_env else "not recorded (--from)"
    manifest = {
        "recipe": recipe,
        "files": file_digests(DEST),
        "sft": {"steps": metrics["steps"], "final": metrics["final"]},
        "built": {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "torch": torch.__version__,
                  "transformers": transformers.__version__, "python": platform.python_version(),
                  "cpu": _cpu_model(), "env": env,
                  "command": "klguard sft (tools/ship_builtin_policy.py)"},
    }
    (DEST / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    size = sum(p.stat().st_size for p in DEST.iterdir())
    print(f"shipped {len(manifest['files'])} files ({size / 1e6:.2f} MB) to {DEST}: SFT {metrics['steps']} steps, "
          f"held-out accuracy {metrics['final'].get('accuracy', float('nan')):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
