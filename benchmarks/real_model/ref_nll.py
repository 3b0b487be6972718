"""Each recorded response's mean negative log-likelihood per token under the reference policy (SmolLM2-135M-Instruct,
the run's start), grouped: the start of the run, the hacked responses later, the gold-accepted ones later.

    python benchmarks/real_model/ref_nll.py RUN_DIR [--early 1-5] [--late 41-80] [--out ref_nll.json]

Reads RUN_DIR/samples.jsonl (written by probe.py: prompt and response of every rollout), renders each prompt with
the tokenizer's chat template as the trainer does, and scores the response's tokens (re-tokenised from the decoded
text, the end-of-turn token included where the response ended before the token limit). The trainer's own
`hacking/ref_nll` is the token-weighted batch mean of the same quantity on the sampled tokens; this splits it by
kind of response.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from klguard.model.gguf import resolve_gguf, smollm2_path


def _range(text: str) -> tuple[int, int]:
    lo, hi = text.split("-")
    return int(lo), int(hi)


@torch.no_grad()
def nll(model, tok, prompt: str, response: str, ended: bool) -> float:
    chat = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
    p_ids = tok(chat, add_special_tokens=False)["input_ids"]
    r_ids = tok(response, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if ended else [])
    ids = torch.tensor([p_ids + r_ids])
    logp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
    targets = ids[0, 1:]
    token_logp = logp.gather(-1, targets[:, None])[:, 0][len(p_ids) - 1:]
    return float(-token_logp.mean())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path)
    parser.add_argument("--early", type=_range, default=(1, 5), help="steps of the start (healthy) group")
    parser.add_argument("--late", type=_range, default=None, help="steps of the late group (default: last 20)")
    parser.add_argument("--max-tokens", type=int, default=48, help="the run's data.max_response_length")
    parser.add_argument("--out", type=Path, default=None, help="JSON of the groups' figures (default: print only)")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    rows = [json.loads(line) for line in (args.run / "samples.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["split"] == "train"]
    last = max(r["step"] for r in rows)
    late = args.late or (max(1, last - 19), last)
    folder = resolve_gguf(smollm2_path(), "reference")
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    groups: dict[str, list[float]] = {"start (all)": [], "start, gold 1": [], "late, hacked": [],
                                      "late, gold 1": [], "late (all)": []}
    for r in rows:
        in_early, in_late = args.early[0] <= r["step"] <= args.early[1], late[0] <= r["step"] <= late[1]
        if not (in_early or in_late):
            continue
        value = nll(model, tok, r["prompt"], r["text"], ended=r["tokens"] < args.max_tokens)
        if in_early:
            groups["start (all)"].append(value)
            if r["gold"] == 1:
                groups["start, gold 1"].append(value)
        if in_late:
            groups["late (all)"].append(value)
            kind = "late, hacked" if r["hacked"] else "late, gold 1" if r["gold"] == 1 else "late, other"
            groups.setdefault(kind, []).append(value)
    result = {"early_steps": list(args.early), "late_steps": list(late)}
    for name, values in groups.items():
        if values:
            result[name] = {"n": len(values), "mean_nll": round(statistics.fmean(values), 3),
                            "median_nll": round(statistics.median(values), 3)}
            print(f"{name:>16}: n={len(values):4d}  mean NLL {statistics.fmean(values):.3f} nats/token  "
                  f"median {statistics.median(values):.3f}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
