"""How often the SFT policy itself hacks the length proxy: the floor a KL penalty to it holds a run at.

The KL-regularised optimum is the reference reweighted by exp(proxy / beta), so a policy held near the SFT policy
runs on past its answer at least as often as the SFT policy does. This samples each SFT policy (`sft.seed`) at
temperature 1 on `--prompts` held-out problems and counts the responses the proxy pays at least as much as the short
correct answer while gold says wrong (`hacking/rate`'s rule), and scores greedy decoding with the gold rule.
Writes ``benchmarks/results/sft_hacking.json`` (or ``--out``: SFT policies trained on another machine).
``--policies`` measures any Hugging Face policy folders instead (a run's ``global_step_N/actor``: what a rollback
restores or re-anchors to), keyed by folder.

    python benchmarks/sft_hacking.py [--sft-seeds 0 1 2] [--prompts 1024] [--out FILE]
    python benchmarks/sft_hacking.py --policies RUN/global_step_20/actor RUN/global_step_200/actor --out FILE
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from klguard.builtin.arith import make_arith_rows
from klguard.builtin.proxy import BuiltinReward
from klguard.builtin.warm_start import ensure_sft_policy
from klguard.config import load_config
from klguard.ppo.rollout import SamplingParams, generate
from klguard.reward.gsm8k import compute_score

OUT = Path(__file__).parent / "results" / "sft_hacking.json"


@torch.no_grad()
def measure(policy: Path, rows: list[dict], reward: BuiltinReward, max_new_tokens: int) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(policy)
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32).eval()
    prompts = [tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows]
    enc = tokenizer(prompts, add_special_tokens=False, padding=True, return_tensors="pt")
    truth = [r["reward_model"]["ground_truth"] for r in rows]
    out = {}
    for mode, temperature in (("greedy", 0.0), ("sampled", 1.0)):
        params = SamplingParams(max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                                pad_token_id=tokenizer.pad_token_id, temperature=temperature)
        result = generate(model, enc["input_ids"], enc["attention_mask"], params,
                          generator=torch.Generator().manual_seed(0))
        texts = tokenizer.batch_decode(result.response_ids, skip_special_tokens=True)
        lengths = (result.response_ids != tokenizer.pad_token_id).sum(1).tolist()
        gold = torch.tensor([float(compute_score(t, g)) for t, g in zip(texts, truth, strict=True)])
        proxy = torch.tensor([reward.proxy(t, n, g) for t, n, g in zip(texts, lengths, truth, strict=True)])
        yardstick = torch.tensor([reward.reference_proxy(g, tokenizer) for g in truth])
        rate = float(reward.hacked(gold, proxy, yardstick).float().mean())
        out[mode] = {"gold": float(gold.mean()), "hacking_rate": rate,
                     "hacking_rate_se": math.sqrt(rate * (1 - rate) / len(rows))}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sft-seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--prompts", type=int, default=1024)
    parser.add_argument("--policies", type=Path, nargs="+", help="policy folders to measure instead of SFT seeds")
    parser.add_argument("--out", type=Path, default=OUT, help="results file (default: the committed one)")
    args = parser.parse_args()
    if args.policies and args.out == OUT:
        parser.error("--policies needs --out (the committed file holds the SFT policies)")
    torch.set_num_threads(1)
    config = load_config(None, []).config
    rows = make_arith_rows(args.prompts, "val", 0, form=config.data.builtin_form)
    reward, max_new_tokens = BuiltinReward.of(config.proxy_reward), config.data.max_response_length
    if args.policies:
        missing = next((p for p in args.policies if not (p / "config.json").is_file()), None)
        if missing:
            parser.error(f"not a policy folder (no config.json): {missing}")
        policies = {str(p): p for p in args.policies}
    else:
        policies = {f"sft{seed}": ensure_sft_policy(load_config(None, [f"sft.seed={seed}"]).config.sft,
                                                    form=config.data.builtin_form) for seed in args.sft_seeds}
    results = {}
    for name, policy in policies.items():
        results[name] = s = measure(policy, rows, reward, max_new_tokens)
        print(f"{name}: sampled hacking {s['sampled']['hacking_rate']:.3f} "
              f"(+- {s['sampled']['hacking_rate_se']:.3f}), sampled gold {s['sampled']['gold']:.3f}, "
              f"greedy gold {s['greedy']['gold']:.3f}, greedy hacking {s['greedy']['hacking_rate']:.3f}")
    args.out.write_text(json.dumps({"prompts": args.prompts, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
