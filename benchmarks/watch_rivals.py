"""`klguard watch` and rldoctor side by side over the public-log corpus (benchmarks/corpus/labels.json), per half.

    python benchmarks/watch_rivals.py                      # logs: benchmarks/corpus, ../shared/reallogs, the cache
    python benchmarks/watch_rivals.py --fetch              # first download the source-only logs into the cache
    python benchmarks/watch_rivals.py --rldoctor /path/to/venv/bin/rl-doctor --out /tmp/rivals.json

The corpus is labels.json: every log's source, licence, the author's verdict (healthy, or a failure kind and the
step window the author names), its format, its trainer and its half (tune or held-out, by SPLIT_RULE). A log lives
in one of three places: committed under benchmarks/corpus/ (licence allows), in ../shared/reallogs/ (read in place,
never copied), or, for a source whose licence does not allow committing it, in a cache folder that `--fetch` fills
from the recorded source (raw GitHub file at a commit, plus the recorded row filter) and checks against the recorded
sha256. A log that is not there is listed as missing, never silently dropped.

Each log is given to
- klguard watch, as it is in this working tree (`klguard watch LOG --events TMP`, no option): read = a step was read
  (exit 0, 3 or 4 after a step), inputs found = its "guard inputs found:" line names at least one input and it was
  not blind (exit 0 or 3), stop = the first rollback or pause in its events file (exit 3), warnings = its advice
  and warn events;
- rldoctor (`rl-doctor diagnose LOG --format json`, its defaults): read = it loaded the log with at least one step,
  inputs found = at least one detector ran (not SKIPPED), stop-equivalent = a CRITICAL finding, warnings = WARNING
  findings. rldoctor has no stop step, so the step it would have flagged at is its live monitor's
  (`rl_doctor.live.LiveMonitor` with its defaults: a check every 25 records after 60) first check with a CRITICAL
  finding, replayed over the log's records; where only the whole-log diagnosis has one, the log's last step.
  rldoctor reads .jsonl, .json (trainer_state.json) and .csv only; where it refuses a console log (verl's or TRL's
  printed lines, `[Step N/M] k=v` lines, JSON lines under another extension) the benchmark gives it a JSONL
  conversion made here (CONVERTERS; the row says `rldoctor_input: converted`), as issue 51's filer did.

Scoring (score(), per tool and half): a healthy log with a stop (klguard) or a CRITICAL (rldoctor) is a false alarm;
warnings on a healthy log are counted apart. A failure is flagged at all when it has a stop / CRITICAL anywhere, and
flagged within its window when that step, in the author's step units (a log whose tool counted entries is converted
with the label's steps_per_entry), lies in the author's window [lo, hi] (hi null: to the end of the run); failures
whose author names no window count only in "flagged at all". A last column counts failures with a warning or advice
or worse (rldoctor's WARNING is its usual output). Logs labelled unlabelled (no author verdict) are read
and searched for inputs but judged on nothing. Writes benchmarks/results/watch_rivals.json and prints the table.
"""

from __future__ import annotations

import argparse
import ast
import csv
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "benchmarks" / "corpus"
LABELS = CORPUS / "labels.json"
OUT = ROOT / "benchmarks" / "results" / "watch_rivals.json"
DEFAULT_SHARED = ROOT.parent / "shared" / "reallogs"
DEFAULT_CACHE = Path(os.environ.get("KLGUARD_CORPUS_CACHE", "~/.cache/klguard/corpus")).expanduser()
DEFAULT_RLDOCTOR = "/tmp/rldoctor-venv/bin/rl-doctor"
HALVES = ("tune", "heldout")
TOOLS = ("klguard", "rldoctor")
STOP_KINDS = ("rollback", "pause")
TIMEOUT_S = 600

SPLIT_RULE = (
    "Logs are grouped by run (two files of one run share a run_group and a half). Runs fall into strata by "
    "(verdict, trainer family); within a stratum they are ordered by sha256 of the run_group name and dealt "
    "alternately to the two halves. The first stratum (strata in sorted order) starts with tune; each stratum after "
    "one with an odd number of runs starts with the half that odd stratum gave one fewer, so the halves differ by "
    "at most one run overall.")


# -- the corpus ---------------------------------------------------------------------------------------------------

def load_labels(path: Path = LABELS) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def split_halves(logs: list[dict]) -> dict[str, str]:
    """SPLIT_RULE: run_group -> half."""
    strata: dict[tuple[str, str], list[str]] = {}
    for log in logs:
        key = (log["verdict"], log["trainer_family"])
        if log["run_group"] not in strata.setdefault(key, []):
            strata[key].append(log["run_group"])
    halves: dict[str, str] = {}
    start = 0  # index into HALVES of the half the next stratum begins with
    for key in sorted(strata):
        groups = sorted(strata[key], key=lambda g: hashlib.sha256(g.encode()).hexdigest())
        for i, group in enumerate(groups):
            halves[group] = HALVES[(start + i) % 2]
        if len(groups) % 2:
            start = 1 - start  # this stratum gave its first half one more: the next begins with the other
    return halves


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def locate(log: dict, shared: Path, cache: Path) -> Path | None:
    where = {"repo": CORPUS, "shared": shared, "cache": cache}[log["location"]]
    path = where / log["file"]
    return path if path.is_file() else None


def raw_url(source: dict) -> str:
    return f"https://raw.githubusercontent.com/{source['repo']}/{source['commit']}/{source['path']}"


def extract(log: dict, raw: bytes) -> bytes:
    """The log's text from its source file: all of it, or the CSV header and the rows of one run (in file order)."""
    rule = log["source"].get("extract")
    if not rule:
        return raw
    column, value = rule["csv_rows_where"]["column"], rule["csv_rows_where"]["equals"]
    lines = raw.decode("utf-8").splitlines(keepends=True)
    index = next(csv.reader([lines[0]])).index(column)
    keep = [lines[0]] + [line for line in lines[1:] if next(csv.reader([line]))[index] == value]
    return "".join(keep).encode("utf-8")


def fetch(log: dict, cache: Path) -> str:
    """Download a source-only log into the cache; 'ok', 'present' or why not."""
    target = cache / log["file"]
    if target.is_file() and sha256_bytes(target.read_bytes()) == log["sha256"]:
        return "present"
    try:
        with urllib.request.urlopen(raw_url(log["source"]), timeout=60) as reply:
            data = extract(log, reply.read())
    except OSError as exc:
        return f"not fetched: {exc}"
    if sha256_bytes(data) != log["sha256"]:
        return "not fetched: sha256 differs from labels.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return "ok"


# -- klguard watch ------------------------------------------------------------------------------------------------

def klguard_command() -> list[str]:
    script = Path(sys.executable).with_name("klguard")
    found = str(script) if script.is_file() else shutil.which("klguard")
    if not found:
        raise SystemExit("watch_rivals: no klguard command next to this python or on PATH (pip install -e .)")
    return [found]


def run_klguard(path: Path, work: Path) -> dict:
    events = work / "events.jsonl"
    if events.exists():
        events.unlink()
    started = time.perf_counter()
    done = subprocess.run([*klguard_command(), "watch", str(path), "--events", str(events)], capture_output=True,
                          text=True, timeout=TIMEOUT_S, cwd=work)
    seconds = time.perf_counter() - started
    said = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    text = events.read_text() if events.exists() else ""
    decisions = [json.loads(line) for line in text.splitlines() if line.strip()]
    stop = next((d for d in decisions if d.get("kind") in STOP_KINDS), None)
    inputs = next((m.group(1) for m in (re.search(r"guard inputs found: (.*?) \(", s) for s in said) if m), None)
    no_step = any("no step with a metric was read" in s for s in said)
    code = done.returncode
    return {"exit": code, "seconds": round(seconds, 2),
            "read": code in (0, 3, 4) and not no_step,
            "inputs_found": code in (0, 3) and inputs not in (None, "none"),
            "inputs": inputs,
            "counted_entries": any("carry no step" in s for s in said),
            "stop": None if stop is None else {k: stop.get(k) for k in ("kind", "step", "rule", "metric", "value")},
            "flag_step": None if stop is None else stop.get("step"),
            "warnings": sum(1 for d in decisions if d.get("kind") not in STOP_KINDS),
            "last_line": said[-1][:300] if said else ""}


# -- rldoctor -----------------------------------------------------------------------------------------------------

NATIVE = (".jsonl", ".ndjson", ".json", ".csv", ".tsv")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf|-inf"


def _number(text: str) -> float | None:
    text = text.strip()
    wrapped = re.fullmatch(r"np\.float\d*\((.*)\)", text)
    if wrapped:
        text = wrapped.group(1)
    try:
        return float(text)
    except ValueError:
        return None


def verl_console_records(text: str) -> list[dict]:
    """verl's console lines `step:N - name:value - ...` (ANSI codes and Ray prefixes dropped), one record per step."""
    records: dict[int, dict] = {}
    for line in text.splitlines():
        line = ANSI.sub("", line)
        match = re.search(r"\bstep:(\d+) - (.*)$", line)
        if not match:
            continue
        record = records.setdefault(int(match.group(1)), {"step": int(match.group(1))})
        for part in match.group(2).split(" - "):
            name, sep, value = part.partition(":")
            number = _number(value) if sep else None
            if number is not None:
                record.setdefault(name.strip(), number)
    return [records[k] for k in sorted(records)]


def trl_console_records(text: str) -> list[dict]:
    """transformers' printed dicts `{'loss': ..., ...}`, one record per training entry, numbered from 1 as `step`."""
    records = []
    for found in re.findall(r"\{'[^{}]*\}", text):
        quoted = re.sub(r"(?<=: )(-?(?:nan|inf))(?=[,}])", r"'\1'", found)
        try:
            entry = ast.literal_eval(quoted)
        except (ValueError, SyntaxError):
            continue
        if not isinstance(entry, dict) or "train_runtime" in entry or any(str(k).startswith("eval_") for k in entry):
            continue
        numbers = {k: _number(str(v)) for k, v in entry.items()}
        records.append({"step": len(records) + 1, **{k: v for k, v in numbers.items() if v is not None}})
    return records


def kv_step_records(text: str) -> list[dict]:
    """`[Step N/M] name=value ...` lines (any case of `step`); pairs whose value is not a number are left out."""
    records = []
    for line in text.splitlines():
        match = re.match(r"\s*\[step (\d+)(?:/\d+)?\]\s*(.*)$", line, re.I)
        if not match:
            continue
        record = {"step": int(match.group(1))}
        for name, value in re.findall(rf"([A-Za-z_][\w/.]*)=({NUMBER})(?=\s|$)", match.group(2)):
            record[name] = float(value)
        records.append(record)
    return records


def json_lines_records(text: str) -> list[dict]:
    """JSON lines under another extension, the dicts kept as published (a legend line such as `"mean|std"` left out)."""
    records = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


CONVERTERS = {"verl-console": verl_console_records, "trl-console": trl_console_records,
              "kv-lines": kv_step_records, "jsonl-text": json_lines_records}
"""labels.json's `rldoctor_conversion` -> how its text becomes JSONL for rldoctor."""

LIVE_REPLAY = r"""
import csv, json, sys
from rl_doctor.live import LiveMonitor
from rl_doctor.detectors.base import Severity
from rl_doctor.ingest.base import _STEP_KEYS, _as_float
path = sys.argv[1]
if path.endswith(".csv"):
    records = [dict(r) for r in csv.DictReader(open(path, newline="", encoding="utf-8"))]
elif path.endswith(".json"):
    payload = json.load(open(path, encoding="utf-8"))
    records = payload if isinstance(payload, list) else payload.get("log_history") or payload.get("history") or []
else:
    records = [json.loads(l) for l in open(path, encoding="utf-8") if l.strip()]
    records = [r for r in records if isinstance(r, dict) and set(r) != {"config"}]
monitor = LiveMonitor(on_finding=lambda f: None)
first = {}
def step_of(i, r):
    for k in _STEP_KEYS:
        v = _as_float(r.get(k)) if isinstance(r, dict) else None
        if v is not None:
            return v
    return float(i)
for i, r in enumerate(records):
    for f in monitor.log(r):
        first.setdefault(f.severity.name, step_of(i, r))
print(json.dumps({"records": len(records), "first": first}))
"""


def rldoctor_version(rldoctor: str) -> str:
    done = subprocess.run([rldoctor, "--version"], capture_output=True, text=True, timeout=60)
    return (done.stdout or done.stderr).strip()


def _diagnose(rldoctor: str, path: Path) -> tuple[int, dict | None, str]:
    done = subprocess.run([rldoctor, "diagnose", str(path), "--format", "json", "--no-color"], capture_output=True,
                          text=True, timeout=TIMEOUT_S)
    try:
        return done.returncode, json.loads(done.stdout), done.stderr.strip()
    except json.JSONDecodeError:
        return done.returncode or 2, None, (done.stderr or done.stdout).strip()


def run_rldoctor(path: Path, work: Path, rldoctor: str, conversion: str | None) -> dict:
    started = time.perf_counter()
    used, converted = path, False
    code, report, err = _diagnose(rldoctor, path) if path.suffix.lower() in NATIVE else (2, None, "not tried")
    if report is None and conversion:
        used, converted = work / (path.stem + ".converted.jsonl"), True
        records = CONVERTERS[conversion](path.read_text(encoding="utf-8", errors="replace"))
        used.write_text("".join(json.dumps(r) + "\n" for r in records))
        code, report, err = _diagnose(rldoctor, used)
    row = {"input": "converted" if converted else "as published", "converted_records": None, "seconds": None}
    if converted:
        row["converted_records"] = sum(1 for _ in used.open())
    if report is None:
        return {**row, "exit": code, "read": False, "inputs_found": False, "worst": None, "critical": [],
                "warning": [], "flag_step": None, "warn_step": None,
                "refused": err.splitlines()[-1][:300] if err else "",
                "seconds": round(time.perf_counter() - started, 2)}
    findings = report.get("findings", [])
    critical = [f["detector"] for f in findings if f["severity"] == "CRITICAL"]
    warning = [f["detector"] for f in findings if f["severity"] == "WARNING"]
    ran = [f["detector"] for f in findings if f["severity"] != "SKIPPED"]
    steps = report["run"]["n_steps"]
    python = str(Path(rldoctor).with_name("python"))
    live = subprocess.run([python, "-c", LIVE_REPLAY, str(used)], capture_output=True, text=True, timeout=TIMEOUT_S)
    first = json.loads(live.stdout).get("first", {}) if live.returncode == 0 and live.stdout.strip() else {}
    last = _last_step(used)
    flag = first.get("CRITICAL", last if critical else None)
    warn = first.get("WARNING", last if warning else None)
    return {**row, "exit": code, "read": steps > 0, "steps": steps, "inputs_found": bool(ran),
            "fields": report["run"]["fields"],
            "worst": report.get("worst_severity"), "critical": critical, "warning": warning,
            "flag_step": flag if critical else None, "warn_step": warn if (critical or warning) else None,
            "live_first": first, "live_error": live.stderr.strip()[-300:] if live.returncode else None,
            "seconds": round(time.perf_counter() - started, 2)}


def _last_step(path: Path) -> float | None:
    """The last record's step (as rldoctor's step keys read it), or its index."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".csv":
            records = list(csv.DictReader(path.open(newline="", encoding="utf-8")))
        elif suffix == ".json":
            payload = json.loads(path.read_text(encoding="utf-8"))
            records = payload if isinstance(payload, list) else payload.get("log_history") or []
        else:
            records = [json.loads(line) for line in path.open(encoding="utf-8") if line.strip()]
    except (ValueError, OSError):
        return None
    for key in ("step", "global_step", "_step", "iteration", "iter"):
        values = [_number(str(r.get(key))) for r in records if isinstance(r, dict) and key in r]
        values = [v for v in values if v is not None]
        if values:
            return max(values)
    return float(len(records) - 1) if records else None


# -- scoring ------------------------------------------------------------------------------------------------------

def author_step(step: float | None, log: dict, counted: bool) -> float | None:
    """A tool's flag step in the author's step units: entries times steps_per_entry where the tool counted entries."""
    if step is None:
        return None
    return step * log.get("steps_per_entry", 1) if counted else step


def in_window(step: float | None, window: list | None) -> bool | None:
    if window is None:
        return None
    if step is None:
        return False
    lo, hi = window
    return (lo is None or step >= lo) and (hi is None or step <= hi)


def judge(log: dict, result: dict, counted: bool) -> dict:
    """One tool's outcome on one labelled log."""
    flagged = result.get("flag_step") is not None
    step = author_step(result.get("flag_step"), log, counted)
    warned = bool(result.get("warnings") or result.get("warning"))
    out = {"read": bool(result.get("read")), "inputs_found": bool(result.get("inputs_found")),
           "flag_step_author_units": step}
    if log["verdict"] == "healthy":
        out.update(false_alarm=flagged, warnings_only=warned and not flagged)
    elif log["verdict"] == "failure":
        out.update(flagged=flagged, in_window=in_window(step, log.get("window")) if flagged else
                   (False if log.get("window") is not None else None), warned=flagged or warned)
    return out


def score(rows: list[dict]) -> dict:
    """Per tool and half: logs, read, inputs found, healthy false alarms and warnings, failures flagged."""
    summary: dict = {}
    for tool in TOOLS:
        for half in (*HALVES, "all"):
            chosen = [r for r in rows if r.get(tool) is not None and half in ("all", r["half"])]
            judged = [r[tool + "_judged"] for r in chosen]
            healthy = [j for r, j in zip(chosen, judged, strict=True) if r["verdict"] == "healthy"]
            failures = [j for r, j in zip(chosen, judged, strict=True) if r["verdict"] == "failure"]
            windowed = [j for j in failures if j["in_window"] is not None]
            summary.setdefault(tool, {})[half] = {
                "logs": len(chosen), "read": sum(j["read"] for j in judged),
                "inputs_found": sum(j["inputs_found"] for j in judged),
                "healthy": len(healthy), "false_alarms": sum(j["false_alarm"] for j in healthy),
                "warnings_only_on_healthy": sum(j["warnings_only"] for j in healthy),
                "failures": len(failures), "failures_with_window": len(windowed),
                "flagged_in_window": sum(bool(j["in_window"]) for j in windowed),
                "flagged_at_all": sum(j["flagged"] for j in failures),
                "warned_at_all": sum(j["warned"] for j in failures)}
    return summary


def table(summary: dict) -> str:
    head = ("| tool | half | logs | read | inputs found | false alarms on healthy (stop / critical) "
            "| warnings or advice only, on healthy | failures flagged in window | failures flagged at all "
            "| failures with a warning or worse |")
    lines = [head, "|" + "---|" * 10]
    for tool in TOOLS:
        for half in (*HALVES, "all"):
            s = summary[tool][half]
            lines.append(f"| {tool} | {half} | {s['logs']} | {s['read']} | {s['inputs_found']} | "
                         f"{s['false_alarms']} of {s['healthy']} | {s['warnings_only_on_healthy']} of {s['healthy']} | "
                         f"{s['flagged_in_window']} of {s['failures_with_window']} | "
                         f"{s['flagged_at_all']} of {s['failures']} | {s['warned_at_all']} of {s['failures']} |")
    return "\n".join(lines)


def log_table(rows: list[dict]) -> str:
    lines = ["| log | half | verdict | window | klguard | rldoctor |", "|---|---|---|---|---|---|"]
    for r in rows:
        window = "-" if r.get("window") is None else f"{r['window'][0]}-{r['window'][1] or 'end'}"
        kind = f" ({r['failure_kind']})" if r.get("failure_kind") else ""
        lines.append(f"| {r['id']} | {r['half']} | {r['verdict']}{kind} | {window} | {_brief(r, 'klguard')} "
                     f"| {_brief(r, 'rldoctor')} |")
    return "\n".join(lines)


def _brief(row: dict, tool: str) -> str:
    res = row.get(tool)
    if res is None:
        return "missing"
    if not res.get("read"):
        return "not read"
    if not res.get("inputs_found"):
        return "read, no input"
    j = row[tool + "_judged"]
    if tool == "klguard":
        what = f"stop @{res['stop']['step']} ({res['stop']['rule']})" if res.get("stop") else "calm"
        extra = f", {res['warnings']} advice/warn" if res.get("warnings") else ""
    else:
        if res.get("flag_step") is not None:
            what = f"critical @{res['flag_step']:g} ({','.join(res['critical'])})"
        else:
            what = "warning" if res.get("warning") else "nothing"
        extra = f", warn: {','.join(res['warning'])}" if res.get("warning") and res.get("critical") else (
            f" ({','.join(res['warning'])})" if res.get("warning") else "")
        extra += " [converted]" if res.get("input") == "converted" else ""
    if j.get("flag_step_author_units") is not None and j.get("flag_step_author_units") != (res.get("flag_step")):
        extra += f" = step {j['flag_step_author_units']:g}"
    return what + extra


# -- main ---------------------------------------------------------------------------------------------------------

def machine() -> str:
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.is_file() else []
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), None)
    return f"{os.cpu_count()} cores, {model or platform.machine()}"


def working_tree() -> str:
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "src"], capture_output=True,
                               text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}{' with uncommitted changes under src/' if dirty else ''}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--labels", default=str(LABELS))
    parser.add_argument("--shared", default=str(DEFAULT_SHARED), help="the shared reallogs folder (read in place)")
    parser.add_argument("--cache", default=str(DEFAULT_CACHE), help="where source-only logs are kept")
    parser.add_argument("--fetch", action="store_true", help="download the source-only logs missing from the cache")
    parser.add_argument("--rldoctor", default=DEFAULT_RLDOCTOR, help="rldoctor's rl-doctor command (its own venv)")
    parser.add_argument("--only", nargs="*", default=[], help="log ids to run (default: all)")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    labels = load_labels(Path(args.labels))
    logs = labels["logs"]
    halves = split_halves(logs)
    wrong = [log["id"] for log in logs if log["half"] != halves[log["run_group"]]]
    if wrong:
        print(f"watch_rivals: labels.json's halves differ from SPLIT_RULE for {', '.join(wrong)}", file=sys.stderr)
        return 2
    shared, cache = Path(args.shared), Path(args.cache)
    if args.fetch:
        for log in logs:
            if log["location"] == "cache":
                print(f"fetch {log['id']}: {fetch(log, cache)}")
    if not Path(args.rldoctor).is_file():
        print(f"watch_rivals: no rldoctor at {args.rldoctor} (python -m venv /tmp/rldoctor-venv && "
              "/tmp/rldoctor-venv/bin/pip install rldoctor==0.2.0)", file=sys.stderr)
        return 2
    rows, missing = [], []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for log in logs:
            if args.only and log["id"] not in args.only:
                continue
            row = {k: log.get(k) for k in ("id", "file", "location", "half", "verdict", "failure_kind", "window",
                                           "trainer", "trainer_family", "format", "run_group")}
            path = locate(log, shared, cache)
            if path is None or sha256_bytes(path.read_bytes()) != log["sha256"]:
                missing.append(log["id"])
                row.update(klguard=None, rldoctor=None, missing="not found" if path is None else "sha256 differs")
                rows.append(row)
                continue
            work = Path(tmp) / log["id"]
            work.mkdir()
            row["klguard"] = kg = run_klguard(path, work)
            row["rldoctor"] = rd = run_rldoctor(path, work, args.rldoctor, log.get("rldoctor_conversion"))
            row["klguard_judged"] = judge(log, kg, kg["counted_entries"])
            row["rldoctor_judged"] = judge(log, rd, log.get("rldoctor_conversion") == "trl-console"
                                           and rd["input"] == "converted")
            rows.append(row)
            print(f"{log['id']:<4} {log['verdict']:<10} klguard: {_brief(row, 'klguard'):<45} "
                  f"rldoctor: {_brief(row, 'rldoctor')}", flush=True)
    seconds = time.perf_counter() - started
    summary = score([r for r in rows if r.get("klguard") is not None])
    print()
    print(log_table(rows))
    print()
    print(table(summary))
    if missing:
        print(f"missing (run with --fetch, or pass --shared/--cache): {', '.join(missing)}")
    result = {"command": "python benchmarks/watch_rivals.py", "seconds": round(seconds, 1), "machine": machine(),
              "python": platform.python_version(), "klguard": {"version": _klguard_version(),
                                                               "working_tree": working_tree()},
              "rldoctor": {"version": rldoctor_version(args.rldoctor),
                           "command": "rl-doctor diagnose LOG --format json",
                           "live": "rl_doctor.live.LiveMonitor defaults (check every 25 records after 60)"},
              "split_rule": SPLIT_RULE, "missing": missing, "summary": summary,
              "rldoctor_live_differs": live_differs(rows), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"{len(rows)} logs in {seconds:.1f} s; written {args.out}")
    return 0


def live_differs(rows: list[dict]) -> list[dict]:
    """Logs where rldoctor's live monitor, replayed, raised a severity its whole-log diagnosis does not end with (a
    CRITICAL during the run that the final report drops, or the reverse): the table scores the whole-log diagnosis."""
    out = []
    for r in rows:
        rd = r.get("rldoctor") or {}
        live = set((rd.get("live_first") or {}).keys())
        final = {"CRITICAL"} if rd.get("critical") else set()
        if ("CRITICAL" in live) != bool(final):
            out.append({"id": r["id"], "verdict": r["verdict"], "live_first": rd.get("live_first"),
                        "whole_log_worst": rd.get("worst")})
    return out


def _klguard_version() -> str:
    done = subprocess.run([*klguard_command(), "--version"], capture_output=True, text=True, timeout=60)
    return (done.stdout or done.stderr).strip()


if __name__ == "__main__":
    sys.exit(main())
