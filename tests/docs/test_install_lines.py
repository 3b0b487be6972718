"""Every `pip install` line a user reads (README, docs, examples, klguard's own messages) installs klguard from the
clone it is read in (klguard is on no package index), and names only extras that pyproject.toml defines."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("README.md", "docs/**/*.md", "examples/**/*.py", "src/klguard/**/*.py", "benchmarks/*.py")
LINE = re.compile(r"pip install ([^`\n\"]+)")
_OPTIONAL = (ROOT / "pyproject.toml").read_text().split("[project.optional-dependencies]")[1].split("\n[")[0]
EXTRAS = set(re.findall(r"^([\w-]+) = \[", _OPTIONAL, re.M))


def _install_lines() -> list[tuple[str, str]]:
    files = sorted({p for pattern in SOURCES for p in ROOT.glob(pattern)} - set(ROOT.glob("docs/generated/*")))
    return [(str(f.relative_to(ROOT)), m.group(1)) for f in files for m in LINE.finditer(f.read_text())]


def _requirements(args: str) -> list[str]:
    words = shlex.split(args.split("&&")[0].split("#")[0].replace(")", " "), posix=True)
    return [w for w in words if not w.startswith("-")]


def test_klguard_is_installed_from_the_clone() -> None:
    lines = _install_lines()
    assert len(lines) >= 10, "the search for install lines finds the ones README and docs give"
    from_index = [(name, args) for name, args in lines if any(r.startswith("klguard") for r in _requirements(args))]
    assert not from_index, f"klguard is on no package index; install it from the clone (-e .): {from_index}"


def test_extras_named_in_install_lines_exist() -> None:
    named = {(name, extra) for name, args in _install_lines() for r in _requirements(args)
             if r.startswith(".[") for extra in r.strip(".[]'").split(",")}
    assert named, "README's commands name extras"
    assert not {(n, e) for n, e in named if e not in EXTRAS}, f"extras pyproject.toml lacks: {named}"


def test_a_line_from_an_index_is_caught() -> None:
    assert _requirements("'klguard[trl]'") == ["klguard[trl]"]
    assert _requirements("torch==2.13.0 -e '.[test,trl]' -c constraints-test.txt && python -m pytest") == [
        "torch==2.13.0", ".[test,trl]", "constraints-test.txt"]
