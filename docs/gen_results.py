"""Write the documentation's results tables from benchmarks/results/*.json (and the guard's keys from its schema).

    python docs/gen_results.py            # rewrite docs/generated/*.md and README's results table
    python docs/gen_results.py --check    # exit 1 naming each file that differs from what the JSON gives

The pages under docs/ include these tables (pymdownx.snippets), so a change in a result changes the page; the test
tests/docs/test_docs.py fails while a committed table is not the one this script writes. Standard library only,
apart from klguard itself for the guard's keys.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
OUT = ROOT / "docs" / "generated"
HEADER = "<!-- written by docs/gen_results.py from {source}: edit that or the script, not this file -->\n\n"

# What each benchmark contender is (its id is the name `benchmarks/hacking.py --only` takes).
LABELS = {
    "guarded": "klguard default (guard on)",
    "verl_default": "verl default (fixed 0.001, k1)",
    "seed_recipe": "adaptive 0.015, beta0 0.0005, horizon 10000, k3, no guard",
    "adaptive_0.03": "adaptive 0.03, beta0 0.0005, horizon 10000, k3, no guard",
    "pid_0.015": "pid, k3, target 0.015",
    "pid_0.03": "pid, k3, target 0.03",
    "guarded_warmup0": "looser guard (row above) + beta 0 for the first 20% of steps",
    "guarded_gold_free": "klguard default + `kl_growth` acting",
    "guarded_no_gold": "klguard default, no rule reads gold (guard.val_metric: the RM score)",
    "guarded_no_gold_no_ckpt": "klguard default, no rule reads gold, no checkpoints (`trainer.save_freq=-1`: every "
                               "rollback returns to the start)",
    "guarded_no_gold_demo_defaults": "klguard default, no rule reads gold, no checkpoints, the built-in demo's guard "
                                     "thresholds (kl_hard 0.1 at once)",
    "guarded_pid": "klguard default over pid, k3, target 0.03",
    "verl_default_par": "verl default + PAR shaping",
    "guarded_loose": "looser guard: re-anchoring at every rollback, targets within 1.2x length, one validation",
    "guarded_target_0.03": "klguard default at target_kl 0.03",
}
DEMO_ORDER = ("guarded", "verl_default", "seed_recipe", "fixed_0.01", "fixed_0.1", "fixed_0.3", "fixed_0.5",
              "adaptive_0.03", "pid_0.015", "pid_0.03", "guarded_target_0.03", "guarded_loose", "guarded_warmup0")
MATRIX_ORDER = ("guarded", "guarded_no_gold", "verl_default", "seed_recipe", "fixed_0.03", "fixed_0.1", "fixed_0.3",
                "fixed_1.0")
SETTINGS = {"ppo_rm": "PPO + reward model", "grpo": "GRPO + KL loss", "ppo_rule": "PPO + rule reward"}


def label(name: str) -> str:
    if name.startswith("fixed_"):
        return f"fixed {name.removeprefix('fixed_')}"
    return LABELS.get(name, name)


def f3(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def g4(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def pct(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{100 * value:.{digits}f}%"


def yes_no(flag: bool | None) -> str:
    return "-" if flag is None else "yes" if flag else "no"


def table(head: Iterable[str], rows: Iterable[Iterable[object]]) -> str:
    head = list(head)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def mean(values: Iterable[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


# --- the demo's KL settings (hacking_demo_seeds.json) ------------------------------------------------------------

def demo_seeds() -> str:
    data = load("hacking_demo_seeds.json")
    by_name: dict[str, list[tuple[int, dict]]] = {}
    for run, figures in data["runs"].items():
        name, seed = run.rsplit("_s", 1)
        by_name.setdefault(name, []).append((int(seed), figures))
    rows = []
    for name in [n for n in DEMO_ORDER if n in by_name] + sorted(set(by_name) - set(DEMO_ORDER)):
        runs = [f for _, f in sorted(by_name[name])]
        total = max(f["steps"] for f in runs)
        finals = " / ".join(f3(f["final_gold"]) + (f" (ended at step {f['steps']})" if f["steps"] < total else "")
                            for f in runs)
        rows.append([
            f"**{label(name)}**" if name == "guarded" else label(name),
            f"{finals} (mean {f3(mean(f['final_gold'] for f in runs))})",
            " / ".join(f3(f["best_gold"]) for f in runs),
            " / ".join(f3(f["hacking_rate"]) for f in runs) + f" ({f3(mean(f['hacking_rate'] for f in runs))})",
            " / ".join(f3(f["val_hacking_rate"]) for f in runs),
            f"{mean(f['length'] for f in runs):.1f}",
            f3(mean(f["kl_per_token"] for f in runs)),
            g4(mean(f["final_kl_coef"] for f in runs)),
        ])
    seeds = sorted({s for runs in by_name.values() for s, _ in runs})
    head = [f"KL setting (PPO seeds {', '.join(map(str, seeds))})", "final gold (per seed)", "best gold",
            "hacking, rollouts", "hacking, validation", "length", "KL/token", "final beta"]
    return table(head, rows)


# --- the matrix: two exploits, three SFT policies ----------------------------------------------------------------

def gold_figure(data: dict) -> tuple[str, str]:
    """The final-gold figure a hacking.py file's targets read, and how the tables name it."""
    if data.get("gold") == "final_gold_rescored":
        return "final_gold_rescored", f"final gold, {data['gold_problems']} problems"
    return "final_gold", "final gold"


def matrix_overview(name: str = "hacking.json") -> str:
    data = load(name)
    gold, gold_name = gold_figure(data)
    rows = []
    for cell, t in data["targets"].items():
        if not t:
            continue
        verl = data["means"][cell].get("verl_default", {})
        guarded = data["means"][cell]["guarded"]
        rows.append([cell, g4(t["guarded_final_gold"]), f"{label(t['oracle'])} ({g4(t['oracle_final_gold'])})",
                     g4(verl.get(gold)), g4(t["guarded_hacking"]), g4(t.get("sft_hacking")),
                     g4(t["verl_hacking"]), g4(guarded["final_kl_coef"]),
                     f"{t.get('guarded_paused', '-')} of {t.get('guarded_runs', '-')}",
                     "yes" if t["gold_within_0.01"] else "no", g4(t.get("no_gold_final_gold")),
                     yes_no(t.get("no_gold_within_0.02_of_oracle")), yes_no(t.get("no_gold_within_0.02_of_guarded")),
                     *(gap(t.get("paired", {}).get(key)) for key in ("guarded - oracle", "no_gold - oracle"))])
    head = ["cell", f"guarded {gold_name}", f"best fixed beta ({gold_name})", f"verl default {gold_name}",
            "guarded hacking (rollouts)", "SFT policy's own hacking", "verl hacking", "guarded final beta",
            "guarded runs paused", "gold >= best fixed - 0.01", f"no gold: {gold_name}", "no gold >= best fixed - 0.02",
            "no gold within 0.02 of guarded", "guarded - best fixed, seed by seed (mean +- SE, seeds)",
            "no gold - best fixed, seed by seed"]
    return table(head, rows)


def gap(paired: dict | None) -> str:
    """A paired difference of final gold: mean +- its standard error over the PPO seeds both contenders ran."""
    if not paired:
        return "-"
    se = "" if paired["se"] is None else f" +- {paired['se']:.3f}"
    return f"{paired['mean']:+.3f}{se} ({paired['seeds']})"


def headline() -> str:
    """README's one results table: the matrix, klguard's default against the best fixed beta and verl's default."""
    data = load("hacking.json")
    rows = []
    for cell, t in data["targets"].items():
        if t:
            verl = data["means"][cell].get("verl_default", {})
            rows.append([cell, f3(t["guarded_final_gold"]), f3(t.get("no_gold_final_gold")),
                         f"{f3(t['oracle_final_gold'])} ({label(t['oracle'])})",
                         f3(verl.get("final_gold")), f3(t["guarded_hacking"]), f3(t["verl_hacking"])])
    return table(["exploit / SFT policy", "klguard default: final gold", "klguard default, no gold: final gold",
                  "best fixed beta: final gold", "verl default: final gold", "klguard default: hacking",
                  "verl default: hacking"], rows)


README = ROOT / "README.md"
README_BEGIN = "<!-- results:begin (written by docs/gen_results.py from benchmarks/results/hacking.json) -->\n"
README_END = "<!-- results:end -->"


def readme_text() -> str:
    """README.md with its results table as the JSON gives it."""
    text = README.read_text()
    if README_BEGIN not in text or README_END not in text:
        raise SystemExit(f"README.md lacks the markers {README_BEGIN.strip()} ... {README_END}")
    head, rest = text.split(README_BEGIN, 1)
    return head + README_BEGIN + headline() + rest[rest.index(README_END):]


def matrix_cells(name: str = "hacking.json") -> str:
    data = load(name)
    columns = ("final_gold", "best_gold", "hacking_rate", "val_hacking_rate", "final_kl_coef", "guard_actions",
               "steps")
    if gold_figure(data)[0] == "final_gold_rescored":
        columns = ("final_gold", "final_gold_rescored", *columns[1:])
    parts = []
    for cell, by_name in data["means"].items():
        seeds = max(m["seeds"] for m in by_name.values())
        parts.append(f"**{cell}** (means over {seeds} PPO seeds)\n")
        names = [n for n in MATRIX_ORDER if n in by_name] + sorted(set(by_name) - set(MATRIX_ORDER))
        rows = [[f"{label(n)} (`{n}`)", *(g4(by_name[n][c]) for c in columns), by_name[n]["seeds"]] for n in names]
        parts.append(table(["contender", *columns, "seeds"], rows))
    return "\n".join(parts)


def signal_onsets() -> str:
    data = load("signal_onsets.json")
    parts = []
    for exploit, summary in data["summary"].items():
        runs = sum(1 for run in data["runs"] if run.startswith(exploit + "/"))
        parts.append(f"Signals on {exploit} ({runs} guard-off runs):\n")
        rows = []
        for name, s in summary.items():
            lead = f"{_g(s['median_lead_over_peak'])} / {_g(s['median_lead_over_fall'])}"
            rows.append([f"`{name}`" if name != "any" else "any of them", f"{s['fired']} / {s['hacking_runs']}",
                         s["before_peak"], s.get("at_or_before_peak", "-"), s["before_fall"], lead,
                         f"{s['false_alarms']} / {s['healthy_runs']}"])
        parts.append(table(["signal", "fired / hacking runs", "before the peak", "at or before the peak",
                            "before the fall", "median lead over peak / fall", "false alarms / healthy runs"], rows))
    return "\n".join(parts)


def _g(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


# --- the real model (benchmarks/real_model/matrix.py) ------------------------------------------------------------

def real_model() -> str:
    data = load("real_model.json")
    rows = [[label(name), c["runs"], f3(c["final_gold"]) + (f" ({c['final_gold_se']:.3f})" if c["final_gold_se"]
                                                             is not None else ""),
             f3(c["best_gold"]), f"{c['gao_shape']} of {c['runs']}",
             "-" if c["hacking_rate"] is None else f"{c['hacking_rate']:.2f}"]
            for name, c in data["contenders"].items()]
    parts = [table(["contender", "seeds", "final gold (SE)", "peak gold", "rose then fell", "hacking (last 5 steps)"],
                   rows), ""]
    runs = []
    for name, r in data["runs"].items():
        fired = ", ".join(f"`{k}` {v}" for k, v in sorted(r["onsets"].items(), key=lambda kv: kv[1] or 0)
                          if v is not None) or "none"
        rollbacks = "-" if r.get("guard_off", True) else r.get("rollbacks", "-")
        runs.append([name, f3(r["start_gold"]), f"{f3(r['peak_gold'])} ({r['peak_step']})", r["fall_step"] or "-",
                     f3(r["final_gold"]), f"{r['kl_per_token']:.2f}", f"{r['length']:.1f}", rollbacks, fired])
    parts.append(table(["run", "start gold", "peak gold (step)", "fall (step)", "final gold", "KL per token",
                        "length", "rollbacks", "gold-free signals (first step)"], runs))
    return "\n".join(parts)


def real_model_samples() -> str:
    data = load("real_model.json")
    parts, shown = [], set()
    for name, r in sorted(data["runs"].items(), key=lambda kv: (kv[0].split("/")[0], int(kv[0].split("seed")[-1]))):
        contender = name.split("/")[0]
        if contender in shown:  # one seed a contender: its lowest
            continue
        shown.add(contender)
        for when, step in (("peak", r["peak_step"]), ("final", r["steps"])):
            rows = [[_text_cell(s["prompt"]), _text_cell(s["text"]), f"{s['proxy']:.1f}", f"{s['gold']:.0f}",
                     ", ".join(s["failed"]) or "-"] for s in r["samples"][when]]
            parts += [f"**{name}, step {step} ({'the gold peak' if when == 'peak' else 'the end'})**\n",
                      table(["prompt", "response", "RM score", "gold", "gold's failed checks"], rows), ""]
    return "\n".join(parts)


def _text_cell(text: str) -> str:
    """A response as a table cell: one line, its pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def real_model_signals(key: str = "signals") -> str:
    """The signal table at the built-in defaults (`signals`) or as the guard runs on the model (`signals_host`)."""
    data = load("real_model.json")
    rows = [[f"`{name}`" if name != "any" else "any of them", f"{s['fired']} / {s['hacking_runs']}",
             s["at_or_before_peak"], s["before_fall"],
             f"{_g(s['median_lead_over_peak'])} / {_g(s['median_lead_over_fall'])}",
             f"{s['false_alarms']} / {s['healthy_runs']}"] for name, s in data.get(key, {}).items()]
    return table(["signal", "fired / hacking runs", "at or before the peak", "before the fall",
                  "median lead over peak / fall", "false alarms / healthy runs"], rows)


def real_model_trl(name: str = "real_model_trl.json") -> str:
    """benchmarks/real_model_trl.py: klguard's step against TRL's on SmolLM2, per variant, phases and peak RSS."""
    data = load(name)
    rows = []
    for r in data["results"]:
        if "error" in r:
            rows.append([r["variant"], f"failed: {r['error'].splitlines()[0]}"] + [""] * 10)
            continue
        for contender, c in r["contenders"].items():
            lora = " + LoRA" if r["variant"] == "lora" else ""
            if contender == "klguard":
                shown = "klguard" + (lora if r.get("klguard_lora") or not lora else " (full FT: no LoRA)")
            else:
                trainer = "PPOTrainer" if r["variant"] == "ppo" else "GRPOTrainer"
                shown = f"TRL {c['ready'].get('trl', '')} {trainer}{lora}"
            p = c["phase_s"]
            each = ", ".join(f"{x:.1f}" for x in c["s_per_step_all"])
            ratio = f"**{r['trl_s_over_klguard_s']:.2f}x**" if contender == "klguard" else ""
            rows.append([r["variant"], shown, f"{c['s_per_step']:.1f} ({each})", f"{c['warmup_s'][0]:.1f}",
                         f"{p['gen']:.1f}", f"{p['ref']:.1f}", f"{p.get('values', 0.0):.1f}", f"{p['reward']:.2f}",
                         f"{p['update']:.1f}", f"{p['other']:.1f}", f"{c['peak_rss_mib']:.0f}", ratio])
    head = ["variant", "contender", "s/step (each step)", "warm-up s", "gen", "ref", "values", "reward", "update",
            "other", "peak RSS MiB", "TRL s / klguard s"]
    m = data["machine"]
    versions = sorted({f"{k} {v}" for r in data["results"] for c in r.get("contenders", {}).values()
                       for k, v in c["ready"].items() if k in ("torch", "transformers", "trl")})
    flags = ", ".join(m["bf16"].get("cpu_flags", [])) or "no bf16 instructions"
    loads = [x for r in data["results"] for x in r.get("load_1min_per_round", [])]
    note = (f"\n{m['cpu']}, {m['cpu_count']} cores ({flags}), {m['threads_per_contender']} thread per contender; "
            f"{'; '.join(versions)}; {data['warmup']} warm-up + {data['steps']} measured steps per contender, "
            f"{data['elapsed_s'] / 60:.1f} min; load average {min(loads):.1f}-{max(loads):.1f} over the rounds.\n")
    return table(head, rows) + note


def trl_real_model() -> str:
    """examples/trl/grpo_real_model.py runs (benchmarks/trl_real_model.py): held-out figures and the guard's acts."""
    data = load("trl_real_model.json")
    rows = []
    for name, r in sorted(data["runs"].items(), key=lambda kv: (kv[1]["seed"], kv[0])):
        restored = r["restored"] or [None] * len(r["rollbacks"])
        rollbacks = "; ".join(f"{b['step']} ({b['rule']}, {b['value']:.2f}) -> "
                              + ("the start" if to == 0 else f"step {to}")
                              for b, to in zip(r["rollbacks"], restored, strict=True)) or "-"
        rows.append([r["seed"], name.split("/")[0], g4(r["train_log"][0].get("beta", r["final_beta"])),
                     f3(r["gold"]), f"{r['hacking_rate']:.2f}", f"{r['response_length']:.1f}", g4(r["final_beta"]),
                     rollbacks, f"{r['train_runtime_s'] / 60:.0f}"])
    return table(["seed", "run", "starting beta", "held-out gold", "hacked", "length (tokens)", "final beta",
                  "rollbacks: step (rule, KL a token) -> step restored", "minutes"], rows)


# --- calibration, TRL, throughput, rollout, tensor parallelism, soak ---------------------------------------------

def first_run() -> str:
    data = load("first_run.json")
    rows = []
    for seed, c in data["calibrate"].items():
        early, full, comp = c["early_stop"], c["full"], c["comparison"]
        rows.append([seed, early["recommended_target_kl"], f3(early["recommended_final_gold"]),
                     f3(_hacking_at(early, early["recommended_target_kl"])), early["steps_trained"],
                     f"{early['cpu_s']:.0f}", f"{full['recommended_target_kl']}, {full['cpu_s']:.0f}",
                     f"{comp['cpu_ratio']:.2f}"])
    head = ["seed", "recommended target_kl", "its final gold", "sampled hacking", "steps trained", "CPU s",
            "without early stopping: target, CPU s", "CPU ratio"]
    demo = data["demo"]
    note = (f"\n`klguard demo` in the same measurement: exit {demo['exit']}, {demo['wall_s']:.0f} s wall, "
            f"{demo['cpu_s']:.0f} CPU-seconds, a log of {demo['log_bytes']} bytes.\n")
    return table(head, rows) + note


def _hacking_at(record: dict, target: float) -> float | None:
    return next((p["hacking_rate"] for p in record["points"] if p["target_kl"] == target), None)


def default_grid() -> str:
    data = load("first_run.json")
    rows = []
    for seed, c in data["calibrate"].items():
        alone = c["default_grid_alone"]
        rows.append([seed, *(f"{f3(alone['final_gold'][k])} / {f3(alone['hacking'][k])}" for k in alone["hacking"]),
                     alone["recommended_target_kl"] or "none"])
    grid = next(iter(data["calibrate"].values()))["default_grid_alone"]["hacking"]
    return table(["seed", *(f"{k}: gold / hacking" for k in grid), "recommended"], rows)


def trl_guard() -> str:
    data = load("trl_guard.json")
    rows = [[r["seed"], "guarded (defaults)" if r["guarded"] else "unguarded", f3(r["gold"]), f3(r["hacking_rate"]),
             f"{r['response_length']:.1f}", g4(r["final_beta"]),
             f"{r['steps_trained']}" + (" (paused)" if r["steps_trained"] < data["steps"] else "")]
            for r in data["runs"]]
    guarded = [r for r in data["runs"] if r["guarded"]]
    note = (f"\nThe callback's own cost: {1000 * mean(r['callback_s_per_step'] for r in guarded):.2f} ms a step, "
            f"{pct(data['callback_share_of_trl_step_median'], 2)} of a TRL step (median); its rollbacks took "
            f"{min(r['rollback_s_total'] for r in guarded):.2f}-{max(r['rollback_s_total'] for r in guarded):.2f} s "
            "in all.\n")
    return table(["seed", "run", "held-out gold", "hacking rate", "length (tokens)", "final beta", "steps"],
                 rows) + note


def throughput() -> str:
    data = load("throughput.json")
    rows = []
    for r in data["results"]:
        c = r["contenders"]
        k, kc, trl = c.get("klguard"), c.get("klguard-compiled"), c.get("trl")
        speed = r.get("speedup_vs_trl") or {}
        speedup = f"{speed['klguard']:.2f}x ({speed['klguard-compiled']:.2f}x)" if speed else "-"
        setting = SETTINGS.get(r["setting"], r["setting"]) + (", bf16" if r["dtype"] == "bf16" else "")
        rows.append([r["workload"], setting, f3(k["s_per_step"]), f3(kc["s_per_step"]) if kc else "-",
                     f3(trl["s_per_step"]) if trl else "-", speedup,
                     " / ".join(pct(x["efficiency"]) if x else "-" for x in (k, kc, trl)),
                     pct(k["guard_s"] / k["s_per_step"], 2) if "guard_s" in k else "-",
                     " / ".join(f"{x['peak_rss_mib']:.0f}" if x else "-" for x in (k, kc, trl))])
    head = ["workload", "setting", "klguard s/step", "compiled s/step", "TRL s/step", "speedup (compiled)",
            "eff klguard / compiled / TRL", "guard", "peak RSS MiB klguard / compiled / TRL"]
    peak = data["matmul_flops_per_s"]["peak_used"]
    note = (f"\n{data['warmup']} warm-up + {data['steps']} measured steps per contender, "
            f"{data['elapsed_s'] / 60:.1f} min on {data['machine']['cpu_count']} cores (torch "
            f"{data['machine']['torch']}, transformers {data['machine']['transformers']}); load average "
            f"{data['load_start'].split()[0]} at the start, {data['load_end'].split()[0]} at the end; ceiling from "
            f"the best matmul rate measured in the run: {peak['fp32'] / 1e9:.0f} GFLOP/s fp32, "
            f"{peak['bf16'] / 1e9:.0f} bf16.\n")
    return table(head, rows) + note


def scaling() -> str:
    data = load("throughput.json")["scaling"]
    rows = [[f"{p['rollouts']} x {p['response_length']}", f"{p['s_per_step']:.2f}", f"{p['time_vs_base']:.2f}",
             f"{p['work_vs_base']:.2f}", pct(p["efficiency"])] for p in data["points"] if "time_vs_base" in p]
    return (f"{data['workload']}, {data['setting']}, {data['warmup']} warm-up + {data['steps']} steps:\n\n"
            + table(["rollouts x response tokens", "s/step", "x time", "x FLOPs", "eff"], rows))


def rollout_speed() -> str:
    data = load("rollout_speed.json")
    rows = [[p["new_tokens"], f"{1000 * p['klguard_median_s']:.0f}", f"{1000 * p['klguard_compiled_median_s']:.0f}",
             f"{1000 * p['hf_median_s']:.0f}", f"{p['compiled_speedup_median']:.2f}x", f"{p['speedup_median']:.2f}x"]
            for p in data["lengths"]]
    return (f"{data['batch']} rows, prompts of {data['prompt_len']} tokens, {data['threads']} threads, medians of "
            f"{data['repeats']} (torch {data['torch']}, transformers {data['transformers']}):\n\n"
            + table(["new tokens", "eager ms", "compiled ms", "HF generate ms", "compiled vs eager",
                     "eager vs HF generate"], rows))


def matmul_shapes() -> str:
    data = load("matmul_shapes.json")
    peak = data["peak_gflops"]["used"]
    rows = [[workload, layer, *(f"{g:.0f} ({g / peak:.0%})" for g in passes.values())]
            for workload, layers in data["workloads"].items() for layer, passes in layers.items()]
    passes = list(next(iter(next(iter(data["workloads"].values())).values())))
    shape = "x".join(map(str, data["peak_shape"]))
    return (f"GFLOP/s of each shape alone, in parentheses its share of the {shape} reference rate ({peak:.0f} "
            f"GFLOP/s); {data['rollouts']} rollouts, {data['tokens']} tokens, {data['threads']} threads:\n\n"
            + table(["workload", "layer", *passes], rows))


def tp_rollout() -> str:
    data = load("tp_rollout.json")
    rows = []
    for mode, what in (("replica", "a whole copy on each rank (`tensor_model_parallel_size=1`)"),
                       ("shards", "the tp shards (`tensor_model_parallel_size=2`)")):
        m, n = data["median"][mode], data["numerics"][mode]
        rows.append([what, f"{m['timing_s/gen']:.3f}", f"{m['timing_s/step']:.3f}", pct(m["perf/reshard_share"], 1),
                     f"{n['largest_difference_from_one_process']:.1e} ({n['where']}, {n['values_compared']} values)"])
    return (f"{data['ranks']} gloo ranks on {data['machine']}, tp={data['tensor_parallel_size']}, "
            f"{data['response_length']} response tokens, medians over {data['steps_measured']} steps:\n\n"
            + table(["generation on", "gen s", "step s", "gathering the copy (share of the step)",
                     "largest difference from one process"], rows)
            + f"\nGeneration on the shards takes {data['gen_ratio_shards_over_replica']:.1f}x as long as on the copy; "
            f"the built-in policy's parameters per rank at tp=2: "
            f"{', '.join(f'{p:,}' for p in data['numerics']['shards']['actor_params_per_rank'])}.\n")


def rm_overoptimisation() -> str:
    r = load("rm_overoptimisation.json")
    rms = table(["SFT policy", "RM held-out accuracy", "its training accuracy", "gold-correct share (base rate)"],
                [[k.removeprefix("sft"), f3(m["held_out_accuracy"]), f3(m["train_accuracy"]),
                  f3(m["gold_correct_share"])] for k, m in r["reward_models"].items()])
    runs = table(["run (SFT policy / PPO seed)", "step-0 gold", "peak gold before the fall (step)",
                  "lowest gold after the peak", f"first at or below step 0 - {r['fall']}", "final gold",
                  f"rise >= {r['rise']} then fall"],
                 [[label, f3(x["step0_gold"]), f"{f3(x['peak_gold'])} ({x['peak_step']})", f3(x["low_after_peak"]),
                   "never" if x["fall_step"] is None else f"step {x['fall_step']}", f3(x["final_gold"]),
                   "yes" if x["rise_then_fall"] else "no"] for label, x in r["runs"].items()])
    return f"{rms}\n{runs}\nRise then fall within {r['steps']} steps: {r['rise_then_fall']} runs.\n"


def soak() -> str:
    s = load("soak.json")
    rows = [["kill and resume cycles", s["cycles"]], ["SIGKILLs", s["kills"]], ["steps", s["steps"]],
            ["checkpoint every", f"{s['save_freq']} step(s)"], ["steps redone in all", s["steps_redone_total"]],
            ["steps lost beyond the last checkpoint", s["steps_lost_beyond_last_checkpoint"]],
            ["unreadable checkpoints", s["unreadable_checkpoints"]], ["run finished", "yes" if s["finished"] else "no"],
            ["metrics equal to an uninterrupted run", "yes" if s["metrics_equal_uninterrupted"] else "no"]]
    return table(["soak (`python benchmarks/soak.py`)", "measured"], rows)


# --- verl's own example lines (benchmarks/verl_examples.py) -------------------------------------------------------

VERL_CLASSES = {"fsdp_text": "FSDP text model", "megatron": "Megatron-LM", "megatron_lite": "Megatron Lite",
                "veomni": "VeOmni", "mindspeed": "MindSpeed", "torchtitan": "TorchTitan", "automodel": "NeMo AutoModel",
                "npu": "Ascend NPU", "multimodal": "multimodal", "multi_turn": "multi-turn tools",
                "distillation": "on-policy distillation", "unparsed": "script ends before its launch"}
VERL_OUTCOMES = ("loads", "plugin_line", "refusal", "traceback", "unparsed")


def verl_examples() -> str:
    """One table per verl ref measured: each class of line, how many load, get the plugin's command, another one-line
    refusal, a traceback; the other refusals and tracebacks named below it."""
    out = []
    for ref, run in load("verl_examples.json")["runs"].items():
        by_class = run["summary"]["by_class"]
        order = [c for c in VERL_CLASSES if c in by_class] + sorted(c for c in by_class if c not in VERL_CLASSES)
        rows = [[VERL_CLASSES.get(c, c), sum(by_class[c].values()), *(by_class[c].get(o, 0) for o in VERL_OUTCOMES)]
                for c in order]
        totals = run["summary"]["outcomes"]
        rows.append(["all", run["summary"]["lines"], *(totals.get(o, 0) for o in VERL_OUTCOMES)])
        name = "main, the newest snapshot read" if ref == "HEAD" else f"`{ref}`"
        out.append(f"verl {name} (commit `{run['commit'][:8]}` of {run['commit_date']}, version {run['verl_version']}"
                   f"), `{run['command']}`, klguard at `{run['klguard_commit']}`, {run['machine']}:\n")
        out.append(table(["Lines (class)", "Scripts", "Load", "Give the one line with verl's command",
                          "Other refusal", "Traceback", "Not read"], rows))
        odd = [(n, r) for n, r in run["lines"].items() if r["outcome"] in ("refusal", "traceback", "unparsed")
               or (r["class"] == "fsdp_text") != (r["outcome"] == "loads")]
        out += [f"- `{n}`: {r['outcome']}, {r['message'] or 'no launch line'}\n" for n, r in odd]
        trained = run["summary"]["fsdp_text_training"]
        out.append(("Trained 2 steps on the CPU (`--train`): " + ", ".join(f"{v} {k}" for k, v in trained.items())
                    if trained else "Loaded by `klguard train --print-config`; not trained (no `--train`).")
                   + "\n")
    return "\n".join(out)


# --- the guard's keys, from its schema ---------------------------------------------------------------------------

def _shown(value: object) -> str:
    return "null" if value is None else json.dumps(value) if not isinstance(value, str) else value


def guard_keys() -> str:
    """Every `guard.*` key: the guard's own, then each rule's from its declaration (klguard.guard.registry)."""
    from klguard.guard.config import GuardConfig
    from klguard.guard.registry import declared_keys

    owner = {key.name: (rule.name, key) for rule, key in declared_keys()}
    rows = []
    for f in dataclasses.fields(GuardConfig):
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        rule, key = owner.get(f.name, ("the guard", None))
        other = f"`{_shown(key.external)}`" if key is not None and key.has_external else ""
        rows.append([f"`guard.{f.name}`", rule, f"`{_shown(default)}`", other,
                     f.metadata.get("help", "").replace("|", "\\|")])
    return table(["key", "of", "default", "default on a real model", "what it does (and what measured it)"],
                 rows)


def guard_actions() -> str:
    from klguard.guard.actions import ACTION_KINDS

    return table(["action", "what the trainer does (the record's old and new values)"],
                 [[f"`{kind}`", text] for kind, text in ACTION_KINDS.items()])


def guard_rules() -> str:
    """Every rule and signal from its declaration: what it reads, what it does at the defaults, its keys, gold."""
    from klguard.guard.config import EXTERNAL_HOST_DEFAULTS, GuardConfig
    from klguard.guard.registry import rules

    own, other = GuardConfig(), GuardConfig(**EXTERNAL_HOST_DEFAULTS)
    kinds = {"alarm": "alarm", "signal": "hacking signal", "check": "check"}
    rows = []
    for r in rules():
        says = r.says(own)
        if r.active(SimpleNamespace(cfg=own, kl_controlled=True)):
            pass
        elif r.active(SimpleNamespace(cfg=other, kl_controlled=True)):
            says = f"{r.says(other)} (on a real model; off on the built-in demo)"
        else:
            says += " (logged only: off unless guard.hacking_signals names it)" if r.kind == "signal" else " (off)"
        rows.append([f"`{r.name}`", kinds[r.kind], " and ".join(" or ".join(f"`{n}`" for n in group)
                                                                 for group in r.reads),
                     says.replace("|", "\\|"), ", ".join(f"`{k.name}`" for k in r.keys) or "-",
                     "yes" if r.needs_gold else "no"])
    return table(["rule", "kind", "reads (verl's names)", "what it does (defaults)", "its keys", "needs gold"], rows)


def guard_signals() -> str:
    from klguard.guard.registry import rules

    return table(["signal", "raises the alarm by default", "logged as"],
                 [[f"`{r.name}`", "yes" if r.default_on else "no (logged only)", f"`guard/hack_{r.name}`"]
                  for r in rules("signal")])


def config_keys() -> str:
    """Every key klguard implements, its default and its one-line description (`klguard train --describe-config`)."""
    from klguard.config.loader import config_to_dict, schema_fields
    from klguard.config.schema import Config

    values = dict(_flat(config_to_dict(Config())))
    sections: dict[str, list[list[str]]] = {}
    for path, f in schema_fields():
        value = values.get(path, {} if f.type in ("dict", dict) else None)
        shown = "null" if value is None else json.dumps(value) if not isinstance(value, str) else value
        sections.setdefault(path.split(".")[0], []).append(
            [f"`{path}`", f"`{shown}`", f.metadata.get("help", "").replace("|", "\\|")])
    return "\n".join(f"### {name}\n\n" + table(["key", "default", "description"], rows)
                     for name, rows in sections.items())


def verl_ignored() -> str:
    """verl's keys that klguard accepts and does not implement, by section (listed in the one warning)."""
    from klguard.config.loader import schema_fields
    from klguard.config.verl_keys import RENAMED, verl_keys

    ours = {path for path, _ in schema_fields()}
    renamed = tuple(RENAMED)  # verl 0.9.1's spellings: listed under klguard's name, implemented or not
    ignored = sorted(k for k in verl_keys() if k not in ours and not any(k.startswith(o + ".") for o in ours)
                     and not any(k == r or k.startswith(r + ".") for r in renamed))
    groups: dict[str, list[str]] = {}
    for key in ignored:
        parts = key.split(".")
        head = ".".join(parts[:2]) if len(parts) > 2 else parts[0]
        groups.setdefault(head, []).append(key[len(head) + 1:] if key != head else "")
    lines = [f"- `{head}` ({len(rest)}): " + (", ".join(f"`{r}`" for r in rest if r) or "the key itself")
             for head, rest in groups.items()]
    return (f"{len(ignored)} keys of verl's two releases are accepted and not implemented:\n\n"
            + "\n".join(lines) + "\n")


def _flat(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


PAGES: dict[str, tuple[str, Callable[[], str]]] = {
    "demo_seeds.md": ("benchmarks/results/hacking_demo_seeds.json", demo_seeds),
    "matrix_overview.md": ("benchmarks/results/hacking.json", matrix_overview),
    "matrix_cells.md": ("benchmarks/results/hacking.json", matrix_cells),
    "replication_overview.md": ("benchmarks/results/hacking_replication.json",
                                lambda: matrix_overview("hacking_replication.json")),
    "replication_cells.md": ("benchmarks/results/hacking_replication.json",
                             lambda: matrix_cells("hacking_replication.json")),
    "signal_onsets.md": ("benchmarks/results/signal_onsets.json", signal_onsets),
    "first_run.md": ("benchmarks/results/first_run.json", first_run),
    "default_grid.md": ("benchmarks/results/first_run.json", default_grid),
    "trl_guard.md": ("benchmarks/results/trl_guard.json", trl_guard),
    "real_model.md": ("benchmarks/results/real_model.json", real_model),
    "real_model_trl.md": ("benchmarks/results/real_model_trl.json", real_model_trl),
    "real_model_trl_ppo_lora.md": ("benchmarks/results/real_model_trl_ppo_lora.json",
                                   lambda: real_model_trl("real_model_trl_ppo_lora.json")),
    "trl_real_model.md": ("benchmarks/results/trl_real_model.json", trl_real_model),
    "real_model_samples.md": ("benchmarks/results/real_model.json", real_model_samples),
    "real_model_signals.md": ("benchmarks/results/real_model.json", real_model_signals),
    "real_model_signals_host.md": ("benchmarks/results/real_model.json", partial(real_model_signals, "signals_host")),
    "throughput.md": ("benchmarks/results/throughput.json", throughput),
    "scaling.md": ("benchmarks/results/throughput.json", scaling),
    "rollout_speed.md": ("benchmarks/results/rollout_speed.json", rollout_speed),
    "matmul_shapes.md": ("benchmarks/results/matmul_shapes.json", matmul_shapes),
    "tp_rollout.md": ("benchmarks/results/tp_rollout.json", tp_rollout),
    "soak.md": ("benchmarks/results/soak.json", soak),
    "rm_overoptimisation.md": ("benchmarks/results/rm_overoptimisation.json", rm_overoptimisation),
    "guard_keys.md": ("src/klguard/guard/config.py and the rules' declarations (src/klguard/guard/rules/)",
                      guard_keys),
    "guard_actions.md": ("src/klguard/guard/actions.py", guard_actions),
    "guard_rules.md": ("the rules' declarations (src/klguard/guard/rules/)", guard_rules),
    "guard_signals.md": ("the signals' declarations (src/klguard/guard/rules/)", guard_signals),
    "config_keys.md": ("src/klguard/config/ (the schema)", config_keys),
    "verl_ignored.md": ("src/klguard/resources/verl*_keys.txt and the schema", verl_ignored),
    "verl_examples.md": ("benchmarks/results/verl_examples.json", verl_examples),
}


def render() -> dict[str, str]:
    return {name: HEADER.format(source=source) + make() for name, (source, make) in PAGES.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    args = parser.parse_args(argv)
    pages = render()
    if args.check:
        stale = [n for n, text in pages.items() if not (OUT / n).is_file() or (OUT / n).read_text() != text]
        stale = [f"docs/generated/{n}" for n in stale]
        stale += [f"docs/generated/{p.name}" for p in OUT.glob("*.md") if p.name not in pages]
        stale += ["README.md"] if README.read_text() != readme_text() else []
        for name in stale:
            print(f"{name} is not what the JSON gives: run python docs/gen_results.py")
        return 1 if stale else 0
    OUT.mkdir(parents=True, exist_ok=True)
    for name, text in pages.items():
        (OUT / name).write_text(text)
    README.write_text(readme_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
