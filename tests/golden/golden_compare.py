"""How a golden run's records are compared with the committed ones: exact where the value counts or decides,
within float32 rounding elsewhere (see golden_runs.py)."""

from __future__ import annotations

import re
from pathlib import Path

from transformers import AutoConfig

from tolerances import forward_terms, metric_tol

# Metrics that count or decide: equal on every CPU as long as the same tokens are sampled and the same guard
# decisions taken (lengths, rule-reward scores and what is computed from them, validation accuracy, alarms, the lr
# and clip the guard set, step counters).
EXACT_PREFIXES = (
    "step", "training/", "response_length/", "prompt_length/", "critic/score/", "hacking/rate", "hacking/gold_score",
    "hacking/proxy_score", "val-", "guard/alarm_", "guard/hack_", "guard/hacking_alarm", "guard/stable",
    "guard/in_warmup", "guard/rollbacks", "guard/target_kl", "guard/lr_scale", "guard/grad_clip", "actor/lr",
    "critic/lr", "actor/grad_clip", "actor/skipped_steps", "critic/skipped_steps",
)
# An event's fields that are decisions; `value` and `threshold` are measured, `reason` quotes them.
EVENT_DECISIONS = ("kind", "rule", "step", "metric", "old", "new", "where", "to_go_on")
_NUMBER = re.compile(r"-?\d+(\.\d+)?(e-?\d+)?")


def policy_terms(run_dir: Path) -> int:
    """`forward_terms` of the run's policy, read from the config.json of its newest checkpoint (whole or sharded)."""
    configs = sorted(run_dir.glob("global_step_*/actor/**/config.json"),
                     key=lambda path: int(path.relative_to(run_dir).parts[0].rpartition("_")[2]))
    return forward_terms(AutoConfig.from_pretrained(configs[-1].parent))


def metric_differences(want: list[dict], have: list[dict], rows: int, terms: int) -> list[str]:
    """What differs between the golden metrics `want` and a run's `have` (`rows`: rollouts per step)."""
    if len(have) != len(want):
        return [f"{len(have)} lines, the golden has {len(want)}"]
    out = []
    for expected, got in zip(want, have, strict=True):
        step = expected.get("step")
        if expected.keys() != got.keys():
            out.append(f"step {step}: keys differ: {sorted(expected.keys() ^ got.keys())}")
            continue
        for key, a in expected.items():
            b = got[key]
            if key.startswith(EXACT_PREFIXES) or not isinstance(a, float) or not isinstance(b, float):
                if a != b:
                    out.append(f"step {step} {key}: {b!r}, the golden has {a!r} (compared exactly)")
                continue
            tol = metric_tol(want, key, step, rows, terms)
            if not abs(a - b) <= tol:
                out.append(f"step {step} {key}: {b!r}, the golden has {a!r} (|diff| {abs(a - b):.3g} > tol {tol:.3g})")
    return out


def event_differences(want: list[dict], have: list[dict], metrics: list[dict], rows: int, terms: int) -> list[str]:
    """What differs between the golden events `want` and a run's `have`; `metrics`: the golden metrics, which give
    each measured value its tolerance."""
    decisions = [{k: e.get(k) for k in EVENT_DECISIONS} for e in want], [{k: e.get(k) for k in EVENT_DECISIONS}
                                                                          for e in have]
    if decisions[0] != decisions[1]:
        return [f"guard decisions differ:\n  golden {decisions[0]}\n  run    {decisions[1]}"]
    out = []
    for expected, got in zip(want, have, strict=True):
        if set(expected) != set(got):
            out.append(f"event at step {expected['step']}: fields differ: {sorted(set(expected) ^ set(got))}")
        if _NUMBER.sub("#", expected.get("reason", "")) != _NUMBER.sub("#", got.get("reason", "")):
            out.append(f"event at step {expected['step']}: reason {got.get('reason')!r}, the golden has "
                       f"{expected.get('reason')!r}")
        for field in ("value", "threshold"):
            a, b = expected.get(field), got.get(field)
            if a is None or b is None or expected.get("metric") is None:
                if a != b:
                    out.append(f"event at step {expected['step']}: {field} {b!r}, the golden has {a!r}")
                continue
            tol = metric_tol(metrics, expected["metric"], expected["step"], rows, terms)
            if not abs(a - b) <= tol:
                out.append(f"event at step {expected['step']}: {field} {b!r}, the golden has {a!r} (tol {tol:.3g})")
    return out
