"""Time ``klguard.rollout.generate`` against Hugging Face ``model.generate`` on a tiny Llama (CPU).

B=64 left-padded prompts, 32 new tokens, hidden-128 2-layer Llama with random weights. Both loops
sample the full 32 tokens (ours via ``ignore_eos``, HF via ``min_new_tokens``). Writes
``benchmarks/results/rollout_speed.json``.

    python benchmarks/rollout_speed.py [--threads 2] [--repeats 10]
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

from klguard.rollout import generate

B, PROMPT_LEN, NEW_TOKENS, VOCAB, PAD, EOS = 64, 16, 32, 256, 0, 2


def build() -> tuple[LlamaForCausalLM, torch.Tensor, torch.Tensor]:
    """Tiny random Llama plus a left-padded prompt batch."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=4, intermediate_size=256, max_position_embeddings=256,
                      pad_token_id=PAD, eos_token_id=EOS, bos_token_id=1)
    model = LlamaForCausalLM(cfg).eval()
    lens = torch.randint(4, PROMPT_LEN + 1, (B,))
    mask = (torch.arange(PROMPT_LEN) >= PROMPT_LEN - lens[:, None]).long()
    ids = torch.randint(3, VOCAB, (B, PROMPT_LEN)) * mask
    return model, ids, mask


def timeit(fn: Callable[[], object], repeats: int) -> list[float]:
    fn()  # warm-up
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, ids, mask = build()
    gen = torch.Generator().manual_seed(0)

    def ours() -> object:
        return generate(model, ids, mask, max_new_tokens=NEW_TOKENS, eos_token_id=EOS, pad_token_id=PAD,
                        ignore_eos=True, generator=gen)

    def hf() -> object:
        with torch.inference_mode():
            return model.generate(input_ids=ids, attention_mask=mask, do_sample=True, top_k=0, top_p=1.0,
                                  max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, pad_token_id=PAD,
                                  eos_token_id=EOS)

    # Interleave the two so background load hits both alike; report min and median.
    t_ours, t_hf = [], []
    for _ in range(args.repeats):
        t_ours += timeit(ours, 1)
        t_hf += timeit(hf, 1)
    res = {
        "batch": B, "prompt_len": PROMPT_LEN, "new_tokens": NEW_TOKENS, "threads": args.threads,
        "repeats": args.repeats, "torch": torch.__version__, "transformers": transformers.__version__,
        "python": platform.python_version(),
        "klguard_min_s": min(t_ours), "klguard_median_s": statistics.median(t_ours),
        "hf_min_s": min(t_hf), "hf_median_s": statistics.median(t_hf),
    }
    res["speedup_min"] = res["hf_min_s"] / res["klguard_min_s"]
    res["speedup_median"] = res["hf_median_s"] / res["klguard_median_s"]
    for label, key in (("klguard.generate ", "klguard"), ("HF model.generate", "hf")):
        print(f"{label}: min {res[key + '_min_s'] * 1e3:8.1f} ms  median {res[key + '_median_s'] * 1e3:8.1f} ms")
    print(f"speedup (HF / klguard): min {res['speedup_min']:.2f}x  median {res['speedup_median']:.2f}x")
    out = Path(__file__).resolve().parent / "results" / "rollout_speed.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
