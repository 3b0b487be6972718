"""The built-in policy that ships inside the package: the SFT'd tiny Llama and its tokenizer.

`klguard sft` trained it from the recipe recorded in `manifest.json` (tools/ship_builtin_policy.py
put it here), so every machine starts PPO from the same weights instead of training its own policy,
whose SFT jump lands at a different step on every CPU. The manifest also holds each file's SHA-256:
a damaged install is one line with the way out, never a half-loaded model.
"""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path
from typing import Any

from klguard.errors import UserError

__all__ = ["MANIFEST", "file_digests", "shipped_folder", "shipped_policy"]

MANIFEST = "manifest.json"


def shipped_folder() -> Path:
    return Path(str(resources.files("klguard.builtin") / "policy"))


def file_digests(folder: Path) -> dict[str, str]:
    """SHA-256 of every file in `folder` but the manifest, by name."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.iterdir()) if p.is_file() and p.name != MANIFEST}


def _manifest(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise UserError(f"the shipped built-in policy's {folder / MANIFEST} is unreadable ({exc}): "
                        "reinstall klguard, or run `klguard sft` to train the policy into the cache") from None


def shipped_policy(recipe: dict[str, Any], folder: Path | None = None) -> Path | None:
    """The shipped policy folder when it was built from `recipe` (None when it was not, or none ships);
    raises UserError naming the file when a checksum does not match."""
    folder = folder or shipped_folder()
    manifest = _manifest(folder)
    if manifest is None or manifest.get("recipe") != recipe:
        return None
    for name, expected in manifest["files"].items():
        path = folder / name
        actual = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
        if actual != expected:
            problem = "missing" if actual is None else "fails its SHA-256 check"
            raise UserError(f"the shipped built-in policy is damaged: {path} {problem}; reinstall klguard, "
                            "or run `klguard sft` to train the policy into the cache (used from then on)")
    return folder
