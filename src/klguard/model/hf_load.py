"""Hugging Face's from_pretrained behind one-line errors that name the user's key."""

from __future__ import annotations

from pathlib import Path

from klguard.errors import UserError


def one_line(exc: BaseException, limit: int = 200) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def hf_load(loader, path: Path, key: str, **kwargs):
    """`loader(path, **kwargs)` (a from_pretrained); a folder HF cannot read is one line naming `key`."""
    try:
        return loader(path, **kwargs)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{key}={path} could not be loaded: {type(exc).__name__}: {one_line(exc)}") from None
