"""Matplotlib figures of one or more runs, returned as PNG bytes (no display, no network)."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from klguard.commands.report.runs import RunRecord


@dataclass(frozen=True)
class Panel:
    title: str
    ylabel: str
    keys: tuple[tuple[str, str], ...]  # (metric, legend suffix)
    log_y: bool = False


PANELS: tuple[Panel, ...] = (
    Panel("Validation gold accuracy (greedy)", "accuracy (share of prompts)",
          (("val-core/", "val gold"), ("guard/gold_validation", "gold, training window (TRL)"))),
    Panel("Proxy (solid) vs gold (dashed) score on rollouts", "mean reward per response",
          (("hacking/proxy_score", "proxy"), ("hacking/gold_score", "gold"))),
    Panel("Hacking rate on rollouts", "share of responses", (("hacking/rate", "rollouts"),)),
    Panel("Response length", "tokens (mean)", (("response_length/mean", "length"),)),
    Panel("KL to the reference (dashed: guard's target)", "nats per token",
          (("actor/reward_kl_penalty", "KL"), ("guard/target_kl", "target"), ("actor/kl_loss", "KL in the loss"))),
    Panel("KL coefficient", "beta (log scale)",
          (("actor/reward_kl_penalty_coeff", "beta"), ("actor/kl_coef", "beta of the KL loss")), log_y=True),
    Panel("Actor learning rate", "lr", (("actor/lr", "lr"),)),
    Panel("Actor gradient norm (before clipping)", "L2 norm", (("actor/grad_norm", "grad norm"),)),
    Panel("RM ensemble spread (gold-free signal)", "std over members (mean)",
          (("hacking/rm_ensemble_std", "spread"),)),
    Panel("Repeated 3-grams (gold-free signal)", "share of a response's 3-grams",
          (("hacking/repeated_ngram_share", "repeats"),)),
    Panel("Off the reference's support (gold-free signal)", "nats per token; share of tokens",
          (("hacking/ref_nll", "NLL under the reference"), ("hacking/ref_low_prob_share", "tokens under the floor"))),
    Panel("Audit RM: unshared gain (gold-free signal)", "baseline stds",
          (("guard/audit_gap", "optimised RM gain - audit RM gain"),)),
    Panel("RM feature outliers (gold-free signal)", "share of rollouts",
          (("hacking/rm_feature_outlier_share", "outliers from the first steps' features"),)),
)

ACTION_COLORS = {"rollback": "tab:red", "pause": "black", "cut_lr": "tab:purple", "raise_kl_coef": "tab:orange",
                 "lower_target_kl": "tab:olive", "set_grad_clip": "tab:brown"}


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _smooth(values: list[float], window: int) -> list[float]:
    """Trailing mean over ``window`` points (rollout metrics of 64 samples are noisy)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


SUMMARY_PANELS: tuple[Panel, ...] = tuple(PANELS[i] for i in (0, 2, 4, 5))
"""Gold, hacking, KL and its coefficient: the four panels that tell a comparison at a glance."""


def recorded_panels(runs: Sequence[RunRecord], panels: Sequence[Panel] = PANELS) -> tuple[list[Panel], list[Panel]]:
    """The panels some run has a metric of, and the ones none has (drawn as nothing, named in a note)."""
    def has(panel: Panel) -> bool:
        return any(run.series(key)[0] for run in runs for key, _ in panel.keys)
    return [p for p in panels if has(p)], [p for p in panels if not has(p)]


def training_figure(runs: Sequence[RunRecord], smooth: int = 5, panels: Sequence[Panel] = PANELS,
                    cols: int = 2) -> bytes:
    """A grid of `panels` that some run recorded, every run overlaid, guard actions marked as vertical lines."""
    panels = recorded_panels(runs, panels)[0] or list(panels[:1])
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.0 * rows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, panel in zip(axes.flat, panels, strict=False):
        plotted = False
        for i, run in enumerate(runs):
            color = colors[i % len(colors)]
            for j, (key, suffix) in enumerate(panel.keys):
                steps, values = run.series(key)
                if not steps:
                    continue
                is_val = key.startswith("val-")
                y = values if is_val or key.startswith("guard/") else _smooth(values, smooth)
                ax.plot(steps, y, color=color, linestyle="-" if j == 0 else "--", marker="o" if is_val else None,
                        markersize=3, linewidth=1.4, label=f"{run.label} {suffix}" if len(panel.keys) > 1 or
                        len(runs) > 1 else suffix)
                plotted = True
            for event in run.events:
                if event.get("kind") in ACTION_COLORS:
                    strong = event["kind"] in ("rollback", "pause")
                    ax.axvline(event["step"], color=ACTION_COLORS[event["kind"]], alpha=0.7 if strong else 0.3,
                               linewidth=1.6 if strong else 0.8, linestyle="-" if strong else ":")
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel("training step", fontsize=8)
        ax.set_ylabel(panel.ylabel, fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        if panel.log_y and plotted:
            ax.set_yscale("log")
        if plotted:
            ax.legend(fontsize=7, loc="best")
        else:
            ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes, color="gray")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    return _png(fig)


def calibration_figure(points: Sequence[tuple[float, float, str]], fit: tuple[float, float] | None,
                       recommended: float | None, ylabel: str) -> bytes:
    """Gold score against sqrt(KL), one colour per run, with the fitted R(d) = d (a - b ln d)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    labels = sorted({p[2] for p in points}, key=lambda s: (len(s), s))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, label in enumerate(labels):
        xs = [p[0] for p in points if p[2] == label]
        ys = [p[1] for p in points if p[2] == label]
        ax.scatter(xs, ys, s=12, color=colors[i % len(colors)], label=label, alpha=0.8)
    if fit is not None and points:
        a, b = fit
        hi = max(p[0] for p in points)
        grid = [hi * (k + 1) / 200 for k in range(200)]
        ax.plot(grid, [d * (a - b * math.log(d)) for d in grid], color="black", linewidth=1.5,
                label=f"fit: d({a:.3g} - {b:.3g} ln d)")
    if recommended is not None:
        ax.axvline(math.sqrt(recommended), color="tab:green", linestyle="--", label=f"recommended target_kl "
                   f"{recommended:g}")
    ax.set_title("Score gained over the starting policy vs distance from the reference", fontsize=10)
    ax.set_xlabel("d = sqrt(KL to the reference), sqrt(nats)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return _png(fig)
