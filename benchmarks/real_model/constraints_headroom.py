"""How often SmolLM2-135M-Instruct meets verifiable constraints (IFEval-style) unaided: the start of a candidate task
whose gold is the specification itself, so that a careful reader cannot disagree with it.

    python benchmarks/real_model/constraints_headroom.py --samples 96 --out /tmp/constraints.json

Each prompt asks for one sentence about an item of the reviews task with two of: use a given word, at most N words,
no commas, start with a given word, end with an exclamation mark. Gold is 1 when the response's first line meets
every constraint asked. Prints the gold rate and each constraint's pass rate at temperature 1 (no top-k/top-p).
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from klguard.builtin.reviews import TRAIN_ITEMS, article
from klguard.model.gguf import smollm2_path
from klguard.model.loading import check_model_folder

WORDS = ("quiet", "sturdy", "bright", "simple", "cheap", "heavy", "small", "modern")
STARTS = ("Honestly", "Overall", "Sadly", "Surprisingly")
WORD = re.compile(r"[A-Za-z][A-Za-z'\-]*")


def constraints(rng: random.Random) -> list[tuple[str, str, object]]:
    pool = [("uses", f"uses the word '{(w := rng.choice(WORDS))}'", w),
            ("max_words", f"has at most {(n := rng.choice((10, 12, 15)))} words", n),
            ("no_commas", "has no commas", None),
            ("starts", f"starts with the word '{(s := rng.choice(STARTS))}'", s),
            ("exclaims", "ends with an exclamation mark", None)]
    return rng.sample(pool, 2)


def passes(kind: str, arg, text: str) -> bool:
    line = text.strip().split("\n")[0].strip()
    words = WORD.findall(line)
    return {"uses": lambda: arg in (w.lower() for w in words), "max_words": lambda: 0 < len(words) <= arg,
            "no_commas": lambda: "," not in line, "starts": lambda: bool(words) and words[0] == arg,
            "exclaims": lambda: line.endswith("!")}[kind]()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=96)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rng = random.Random(0)
    torch.manual_seed(0)
    folder = check_model_folder(smollm2_path(), "SmolLM2-135M-Instruct")
    tok = AutoTokenizer.from_pretrained(folder, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tasks = []
    for i in range(args.samples):
        item = TRAIN_ITEMS[i % len(TRAIN_ITEMS)][0]
        cons = constraints(rng)
        prompt = f"Write one sentence about {article(item)} {item} that " + " and ".join(c[1] for c in cons) + "."
        tasks.append((prompt, cons))
    results = []
    for start in range(0, len(tasks), 32):
        part = tasks[start:start + 32]
        enc = tok.apply_chat_template([[{"role": "user", "content": p}] for p, _ in part], add_generation_prompt=True,
                                      padding=True, return_tensors="pt", return_dict=True)
        with torch.no_grad():
            ids = model.generate(**enc, max_new_tokens=40, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                 pad_token_id=tok.pad_token_id)
        for (prompt, cons), text in zip(part, tok.batch_decode(ids[:, enc["input_ids"].shape[1]:],
                                                               skip_special_tokens=True), strict=True):
            checks = {kind: passes(kind, arg, text) for kind, _, arg in cons}
            results.append({"prompt": prompt, "text": text, "checks": checks, "gold": float(all(checks.values()))})
    by_kind: dict[str, list[bool]] = {}
    for r in results:
        for kind, ok in r["checks"].items():
            by_kind.setdefault(kind, []).append(ok)
    summary = {"samples": len(results), "gold_rate": sum(r["gold"] for r in results) / len(results),
               "pass_rate": {k: round(sum(v) / len(v), 3) for k, v in sorted(by_kind.items())}}
    print(json.dumps(summary))
    for r in results[:6]:
        print(r["gold"], r["checks"], "|", r["prompt"], "|", r["text"][:120].replace("\n", " "))
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
