"""Time ``klguard.ppo.rollout.generate`` (eager, and with the compiled decode step of
``actor_rollout_ref.rollout.enforce_eager=false``) against Hugging Face ``model.generate`` on a tiny Llama (CPU).

B=64 left-padded prompts, hidden-128 2-layer Llama with random weights. Every loop samples the full
``--new-tokens`` (ours via ``ignore_eos``, HF via ``min_new_tokens``); the three are interleaved so background
load hits them alike. The compiled step compiles in its warm-up call. Writes
``benchmarks/results/rollout_speed.json``.

    python benchmarks/rollout_speed.py [--threads 2] [--repeats 10] [--new-tokens 32 128 512]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

from klguard.ppo.rollout import SamplingParams, generate

B, PROMPT_LEN, VOCAB, PAD, EOS = 64, 16, 256, 0, 2


def build() -> tuple[LlamaForCausalLM, torch.Tensor, torch.Tensor]:
    """Tiny random Llama plus a left-padded prompt batch."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=4, intermediate_size=256, max_position_embeddings=1024,
                      pad_token_id=PAD, eos_token_id=EOS, bos_token_id=1)
    model = LlamaForCausalLM(cfg).eval()
    lens = torch.randint(4, PROMPT_LEN + 1, (B,))
    mask = (torch.arange(PROMPT_LEN) >= PROMPT_LEN - lens[:, None]).long()
    ids = torch.randint(3, VOCAB, (B, PROMPT_LEN)) * mask
    return model, ids, mask


def seconds(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--new-tokens", type=int, nargs="+", default=[32], help="response lengths to time")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, ids, mask = build()
    gen = torch.Generator().manual_seed(0)
    res = {"batch": B, "prompt_len": PROMPT_LEN, "threads": args.threads, "repeats": args.repeats,
           "torch": torch.__version__, "transformers": transformers.__version__,
           "python": platform.python_version(), "lengths": []}
    for new_tokens in args.new_tokens:
        def ours(compiled: bool, new_tokens: int = new_tokens) -> object:
            params = SamplingParams(max_new_tokens=new_tokens, eos_token_id=EOS, pad_token_id=PAD, ignore_eos=True,
                                    compile_step=compiled)
            return generate(model, ids, mask, params, generator=gen)

        def hf(new_tokens: int = new_tokens) -> object:
            with torch.inference_mode():
                return model.generate(input_ids=ids, attention_mask=mask, do_sample=True, top_k=0, top_p=1.0,
                                      max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=PAD,
                                      eos_token_id=EOS)

        contenders = {"klguard": lambda: ours(False), "klguard_compiled": lambda: ours(True), "hf": hf}
        times: dict[str, list[float]] = {name: [] for name in contenders}
        for fn in contenders.values():
            fn()  # warm-up (the compiled step compiles here)
        for _ in range(args.repeats):
            for name, fn in contenders.items():
                times[name].append(seconds(fn))
        row = {"new_tokens": new_tokens}
        for name, ts in times.items():
            row[f"{name}_min_s"], row[f"{name}_median_s"] = min(ts), statistics.median(ts)
        row["speedup_median"] = row["hf_median_s"] / row["klguard_median_s"]
        row["compiled_speedup_median"] = row["klguard_median_s"] / row["klguard_compiled_median_s"]
        res["lengths"].append(row)
        print(f"{new_tokens} tokens, median (min) ms: klguard {row['klguard_median_s'] * 1e3:.1f} "
              f"({row['klguard_min_s'] * 1e3:.1f}), compiled {row['klguard_compiled_median_s'] * 1e3:.1f} "
              f"({row['klguard_compiled_min_s'] * 1e3:.1f}), HF {row['hf_median_s'] * 1e3:.1f} "
              f"({row['hf_min_s'] * 1e3:.1f}); HF / klguard {row['speedup_median']:.2f}x, "
              f"klguard / compiled {row['compiled_speedup_median']:.2f}x", flush=True)
    out = Path(__file__).resolve().parent / "results" / "rollout_speed.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
