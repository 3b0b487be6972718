"""The documentation: README is a front door, the site builds with warnings as errors, its results tables are the
ones benchmarks/results/*.json give, and no user-facing text tells the project's history."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
IN_CI = os.environ.get("CI", "").lower() == "true"


def _gen_results():
    spec = importlib.util.spec_from_file_location("gen_results", DOCS / "gen_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _need_mkdocs() -> None:
    modules = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers")
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing and not IN_CI:
        pytest.skip(f"the docs extra is not installed ({', '.join(missing)}): pip install -e '.[docs]'")


def test_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; the rest belongs in docs/"


def test_readme_links_point_at_files() -> None:
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", readme) + re.findall(r'src="([^"]+)"', readme)
    targets = [t.split("#")[0] for t in links if "://" not in t]
    assert targets and not [t for t in targets if not (ROOT / t).exists()]


def test_readme_test_command_is_the_one_ci_runs() -> None:
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("python -m venv")]
    assert len(ci) == 1
    assert ci[0] in (ROOT / "README.md").read_text()
    extras = next(w for w in shlex.split(ci[0]) if w.startswith(".["))
    assert "docs" in extras.strip(".[]").split(","), "the test command installs the docs extra (the site is tested)"


@pytest.mark.skipif(os.environ.get("CI") != "true", reason="a developer may run the suite from any environment")
def test_ci_runs_in_the_test_commands_own_venv() -> None:
    """Packages of the outer environment (a newer transformers, `kernels`) never reach CI's suite."""
    assert Path(sys.prefix).resolve() == (ROOT / ".venv-test").resolve(), f"the suite runs in {sys.prefix}"
    assert sys.prefix != sys.base_prefix


def test_generated_tables_are_current(capsys) -> None:
    """docs/generated/*.md and README's results table are what docs/gen_results.py writes from the JSON."""
    assert _gen_results().main(["--check"]) == 0, capsys.readouterr().out


def test_a_changed_result_changes_the_tables(tmp_path, monkeypatch) -> None:
    gen = _gen_results()
    results = tmp_path / "results"
    results.mkdir()
    for f in (ROOT / "benchmarks" / "results").glob("*.json"):
        (results / f.name).write_text(f.read_text())
    monkeypatch.setattr(gen, "RESULTS", results)
    before = gen.render()["matrix_overview.md"]
    data = json.loads((results / "hacking.json").read_text())
    assert data["targets"]["length/sft0"]["guarded_final_gold"] != 0.5
    data["targets"]["length/sft0"]["guarded_final_gold"] = 0.5
    (results / "hacking.json").write_text(json.dumps(data))
    after = gen.render()["matrix_overview.md"]
    assert before != after and "| length/sft0 | 0.5 |" in after


def test_the_site_builds_with_warnings_as_errors(tmp_path) -> None:
    _need_mkdocs()
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "WARNING" not in done.stderr
    site = tmp_path / "site"
    results = (site / "results" / "index.html").read_text()
    assert results.count("<table") >= 4, "the generated tables are included in the results page"
    api = (site / "api" / "guard" / "index.html").read_text()
    assert "observe" in api and "GuardSession" in api, "the API reference is generated from the docstrings"
    assert (site / "assets" / "results" / "demo_summary.png").is_file()
    assert (site / "assets" / "results" / "demo_report.html").is_file()


# Words that tell the project's history instead of what is: sessions, issues, past defaults and runs, the
# circumstances of a measurement (who, when, what was cut), folders outside the repository. External projects'
# issues (verl #2653) name a repository and stay.
HISTORY = re.compile(r"issue #\d|\bissues? \d|\bsession \d|previous session|this session|earlier session|"
                     r"seed document|the seed's|seed's recipe|generality issue|\(was \d|"
                     r"/work/|shared/(?:reference|docs)|\.\./shared/|"
                     r"\bthis time\b|cut for time|previous defaults?\b|previous matrix|\bnew (?:guard )?defaults?\b|"
                     r"\bthe default now\b|\b(?:was|were) re-run\b|the recipe before|nobody here|the issue's",
                     re.IGNORECASE)


def _user_facing_text() -> dict[str, str]:
    texts = {"README.md": (ROOT / "README.md").read_text()}
    texts |= {str(p.relative_to(ROOT)): p.read_text() for p in sorted(DOCS.rglob("*.md"))}
    from klguard.config import describe_config
    from klguard.config.schema import Config

    texts["klguard train --describe-config"] = describe_config(Config())
    cli = subprocess.run([sys.executable, "-m", "klguard", "--help"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    texts["klguard --help"] = cli.stdout
    return texts


def test_no_history_in_user_facing_text() -> None:
    hits = [f"{name}: {m.group(0)!r} in ...{text[max(0, m.start() - 40):m.end() + 40]!r}..."
            for name, text in _user_facing_text().items() for m in HISTORY.finditer(text)]
    assert not hits, "\n".join(hits)
