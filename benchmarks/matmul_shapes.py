"""How fast this machine's `torch.mm` runs the throughput benchmark's own matrix shapes, in isolation.

The throughput benchmark's efficiency divides a step's FLOPs by the best square-ish matmul rate of the run. This
script times every linear-layer shape a step multiplies, alone and hot in cache, against that rate:

- batched passes (reference, critic, reward model, update forward): ``[tokens, in] @ [in, out]``;
- their backward: the input gradient ``[tokens, out] @ [out, in]`` and the weight gradient
  ``[out, tokens] @ [tokens, in]``;
- decode steps: ``[rollouts, in] @ [in, out]``, one token per rollout.

A shape's rate here bounds what a phase made of it can reach: the gap between this and a phase's measured rate
(``phase_gflops`` in benchmarks/results/throughput.json) is the work outside the matrix products (elementwise
operations, attention, sampling, Python). Writes ``benchmarks/results/matmul_shapes.json``.

    python benchmarks/matmul_shapes.py [--threads 2] [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch
from real_model_speed import mm_rate
from throughput import RESULTS, ROLLOUTS, WORKLOADS

OUT = RESULTS.parent / "matmul_shapes.json"
TOKENS = ROLLOUTS * 45  # 64 rollouts of ~13 prompt + 32 response tokens
PEAK_SHAPE = (2048, 1024, 1024)  # the throughput benchmark's square-ish reference shape


def gflops(m: int, k: int, n: int, repeats: int) -> float:
    """Median GFLOP/s of ``[m, k] @ [k, n]`` in float32 over `repeats` timings (real_model_speed.mm_rate)."""
    return mm_rate(m, k, n, torch.float32, repeats) / 1e9


def linear_shapes(hidden: int, intermediate: int) -> dict[str, tuple[int, int]]:
    """(in, out) of a Llama layer's matrices (q, k, v, o are hidden x hidden here: no grouped-query heads)."""
    return {"attn": (hidden, hidden), "mlp_up": (hidden, intermediate), "mlp_down": (intermediate, hidden)}


def workload_rates(hidden: int, intermediate: int, repeats: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name, (d_in, d_out) in linear_shapes(hidden, intermediate).items():
        out[name] = {
            "forward": gflops(TOKENS, d_in, d_out, repeats),
            "grad_input": gflops(TOKENS, d_out, d_in, repeats),
            "grad_weight": gflops(d_out, TOKENS, d_in, repeats),
            "decode": gflops(ROLLOUTS, d_in, d_out, repeats),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    peak_start = gflops(*PEAK_SHAPE, args.repeats)
    rates = {workload: workload_rates(dims["hidden_size"], dims["intermediate_size"], args.repeats)
             for workload, dims in WORKLOADS.items()}
    peak_end = gflops(*PEAK_SHAPE, args.repeats)
    peak = max(peak_start, peak_end)  # as the throughput benchmark: the best the machine showed in the run
    report = {"threads": args.threads, "torch": torch.__version__, "cpu": platform.processor() or platform.machine(),
              "tokens": TOKENS, "rollouts": ROLLOUTS, "peak_shape": list(PEAK_SHAPE),
              "peak_gflops": {"start": peak_start, "end": peak_end, "used": peak}, "workloads": rates}
    print(f"{'x'.join(map(str, PEAK_SHAPE))} (the throughput benchmark's reference): {peak_start:.0f} GFLOP/s at the "
          f"start, {peak_end:.0f} at the end; each shape as GFLOP/s (% of {peak:.0f})")
    print(f"{'workload':9}{'matrix':10}{'forward':>14}{'grad_input':>14}{'grad_weight':>14}{'decode':>14}")
    for workload, by_matrix in rates.items():
        for matrix, by_pass in by_matrix.items():
            cells = "".join(f"{rate:>7.0f} ({rate / peak:>4.0%})" for rate in by_pass.values())
            print(f"{workload:9}{matrix:10}{cells}")
    Path(OUT).parent.mkdir(parents=True, exist_ok=True)
    Path(OUT).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
