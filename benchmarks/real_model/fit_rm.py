"""Fit a Gao-style proxy reward model for the reviews task: SmolLM2-135M-Instruct's own samples on the training
prompts, labelled by the task's gold, and a fresh one-label head on SmolLM2's pretrained body.

    python benchmarks/real_model/fit_rm.py --out /tmp/rv/rm --samples 768
    python benchmarks/real_model/probe.py --out /tmp/rv/p6 --rm /tmp/rv/rm      # PPO against it

Recipe (Gao, Schulman and Hilton 2022 fit their proxies from pretrained bodies on limited labelled data):
- samples: `--samples` responses of SmolLM2-135M-Instruct at temperature 1 (no top-k/top-p), `--tokens` new tokens,
  on the reviews task's training prompts (every row in turn), each labelled 1 or 0 by `reviews.gold_score`;
- body: SmolLM2's, frozen, as `LlamaForSequenceClassification` (the score is read at the last token that is not the
  pad token, as Hugging Face's classifiers and klguard's reward manager read it);
- head: L2-regularised logistic regression on that token's final hidden state, the strength chosen on a held-out
  fifth; the head's bias is dropped (a constant shift changes neither GRPO's advantages nor the hacking flag).
The RM is a linear probe of a 135M body fit on a few hundred labels: it learns what separates gold in the initial
policy's samples, and nothing about text the policy has not written yet. Writes the HF folder (tokenizer included),
`rm_metrics.json` (sizes, base rate, accuracy and AUC on both parts) and `samples.jsonl` (every labelled sample).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForSequenceClassification

from klguard.builtin import reviews
from klguard.config import load_config
from klguard.model.gguf import smollm2_path
from klguard.model.loading import check_model_folder
from klguard.reward.model_rm import ModelReward

HELD_OUT = 0.2
STRENGTHS = (1e-3, 1e-2, 1e-1, 1.0)  # L2 on standardised features, per sample


def sample(folder: Path, n: int, tokens: int, seed: int, batch: int) -> list[dict]:
    """`n` sampled responses over the training rows in turn, each with its row's prompt and item words and gold."""
    tok = AutoTokenizer.from_pretrained(folder, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    rows = reviews.make_rows("train")
    torch.manual_seed(seed)
    out = []
    for start in range(0, n, batch):
        part = [rows[i % len(rows)] for i in range(start, min(n, start + batch))]
        enc = tok.apply_chat_template([r["prompt"] for r in part], add_generation_prompt=True, padding=True,
                                      return_tensors="pt", return_dict=True)
        with torch.no_grad():
            ids = model.generate(**enc, max_new_tokens=tokens, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                 pad_token_id=tok.pad_token_id)
        texts = tok.batch_decode(ids[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        for row, text in zip(part, texts, strict=True):
            gt = row["reward_model"]["ground_truth"]
            out.append({"prompt": row["prompt"], "item": gt, "text": text, "gold": reviews.gold_score(text, gt)})
        print(f"sampled {len(out)}/{n}", flush=True)
    return out


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Probability that a random gold-1 sample outscores a random gold-0 one (ties count half)."""
    pos, neg = scores[labels > 0], scores[labels <= 0]
    if not len(pos) or not len(neg):
        return float("nan")
    diff = pos[:, None] - neg[None, :]
    return float(((diff > 0).float() + 0.5 * (diff == 0).float()).mean())


def fit_head(x: torch.Tensor, y: torch.Tensor, strength: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Logistic regression (weights, bias) by L-BFGS with L2 `strength` on `x` (already standardised)."""
    w = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=500, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(x @ w + b, y) + strength * (w @ w) / 2
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach(), b.detach()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the RM folder to write (made anew)")
    parser.add_argument("--samples", type=int, default=768)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--from-samples", type=Path, help="labelled samples.jsonl of an earlier fit (no sampling)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    folder = check_model_folder(smollm2_path(), "SmolLM2-135M-Instruct")
    if args.from_samples:
        data = [json.loads(line) for line in args.from_samples.read_text().splitlines()]
    else:
        data = sample(folder, args.samples, args.tokens, args.seed, args.batch)
    args.out.mkdir(parents=True, exist_ok=False)
    with (args.out / "samples.jsonl").open("w") as f:
        for d in data:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    sampled_s = time.monotonic() - started

    tok = AutoTokenizer.from_pretrained(folder)
    rm = LlamaForSequenceClassification.from_pretrained(folder, num_labels=1)
    rm.config.pad_token_id = tok.pad_token_id
    torch.nn.init.zeros_(rm.score.weight)
    rm.save_pretrained(args.out)
    tok.save_pretrained(args.out)
    config = load_config(None, ["reward_model.micro_batch_size_per_gpu=32"]).config
    scorer = ModelReward(config, torch.device("cpu"), args.out, user=False)
    _, feats = scorer.score([d["prompt"] for d in data], [d["text"] for d in data], features=True)
    x = feats.double()
    y = torch.tensor([d["gold"] for d in data], dtype=torch.float64)
    gen = torch.Generator().manual_seed(args.seed)
    order = torch.randperm(len(y), generator=gen)
    cut = int(len(y) * (1 - HELD_OUT))
    train, held = order[:cut], order[cut:]
    mu, sigma = x[train].mean(0), x[train].std(0).clamp_min(1e-6)
    z = (x - mu) / sigma
    fits = {}
    for strength in STRENGTHS:
        w, b = fit_head(z[train], y[train], strength)
        s = z @ w + b
        fits[strength] = (auc(s[held], y[held]), w, b)
        print(f"L2 {strength:g}: held-out AUC {fits[strength][0]:.3f}", flush=True)
    strength = max(fits, key=lambda k: fits[k][0])
    w, b = fit_head(z, y, strength)  # the chosen strength, refit on every sample
    weight = (w / sigma).float()
    rm.score.weight.data.copy_(weight[None, :])
    rm.save_pretrained(args.out)
    check = ModelReward(config, torch.device("cpu"), args.out, user=False)(
        [d["prompt"] for d in data[:8]], [d["text"] for d in data[:8]])
    expected = (x[:8] @ weight.double()).float()
    assert torch.allclose(check, expected, atol=1e-3 * (1 + expected.abs().max())), (check, expected)
    s_train = z[train] @ fits[strength][1] + fits[strength][2]
    s_held = z[held] @ fits[strength][1] + fits[strength][2]
    metrics = {
        "samples": len(y), "gold_rate": float(y.mean()), "l2": strength, "tokens": args.tokens, "seed": args.seed,
        "train_auc": auc(s_train, y[train]), "held_out_auc": fits[strength][0],
        "train_accuracy": float(((s_train > 0) == (y[train] > 0)).double().mean()),
        "held_out_accuracy": float(((s_held > 0) == (y[held] > 0)).double().mean()),
        "held_out_n": len(held), "sampling_s": round(sampled_s, 1), "total_s": round(time.monotonic() - started, 1),
    }
    (args.out / "rm_metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    print(json.dumps(metrics))
    return 0 if math.isfinite(metrics["held_out_auc"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
