"""A learned proxy fit as a probe of the policy's own body (the reviews task's `proxy_reward.kind=learned_rm`): a
reward model fit the way Gao, Schulman and Hilton (2022) fit theirs, from a pretrained body and a limited set of the
policy's own samples labelled by the gold. The task gives its training rows and its gold.

- samples: `proxy_reward.learned_rm.samples` responses of the run's policy at temperature 1 (klguard's rollout),
  `data.max_response_length` new tokens, on the task's training prompts in turn, each labelled by the task's gold;
- body: the policy's own, frozen, as a one-label sequence classifier (the score is read at the last token that is
  not the pad token, as Hugging Face's classifiers and klguard's reward manager read it);
- head: L2-regularised logistic regression on that token's final hidden state, its strength chosen by the AUC on a
  held-out fifth, then refit on every sample; the bias is dropped (a constant shift changes neither advantages nor the
  hacking flag);
- `audit` (proxy_reward.learned_rm.audit): a second head by the same recipe on as many further samples, in `audit/`,
  never optimised (the guard's `audit_gap` signal reads it).
A linear probe of a 135M body on a few hundred labels learns what separates gold in the starting policy's samples
and nothing about text the policy has not written yet: optimised, it first lifts gold, then is exploited. The folder
is cached under klguard's cache, keyed by the recipe and the policy's weights, and fit once however many runs start
together.

A fit draws its samples on this machine's CPU, and sampling rounds differently on each kind: a fit elsewhere is
another proxy (held-out AUC 0.837 and 0.842 for two fits of one recipe). So klguard ships the heads it measured with
(`probe_heads/<folder name>.safetensors`, written by tools/ship_probe_rm.py, with the fit's metrics beside it): where
one matches the recipe and the policy, the folder is built from it in seconds and every machine optimises the same
proxy; `proxy_reward.learned_rm.shipped=false` fits anew. The other `proxy_reward.learned_rm.*` keys belong to the
arithmetic task's RM and are not read here.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from klguard.builtin.learned_rm import policy_fingerprint
from klguard.config.schema import Config
from klguard.files import build_lock, cache_root, publish
from klguard.model.loading import set_pad_token
from klguard.ppo.rollout import SamplingParams, generate
from klguard.reward.model_rm import ModelReward

RM_VERSION = 1  # bump when the recipe's meaning changes, so stale caches are not reused
HELD_OUT = 0.2
STRENGTHS = (1e-3, 1e-2, 1e-1, 1.0)  # L2 on standardised features, per sample
SAMPLE_BATCH = 64


Gold = Callable[[str, str], float]  # (response, ground truth) -> 0 or 1


def probe_rm_dir(task: str, cfg: Config, policy: Path, gold_version: int = 1) -> Path:
    rm = cfg.proxy_reward.learned_rm
    recipe = {"version": RM_VERSION, "task": task, "gold": gold_version, "samples": rm.samples, "seed": rm.seed,
              "audit": rm.audit, "tokens": cfg.data.max_response_length, "policy": policy_fingerprint(policy)}
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / "probe-rm" / (f"{task}-{key}" if rm.shipped else f"{task}-{key}-local")


def shipped_heads() -> Path:
    return Path(str(resources.files("klguard.builtin") / "probe_heads"))


def shipped_head(name: str) -> Path | None:
    """The head klguard ships for the folder `name` (recipe and policy), if any."""
    path = shipped_heads() / f"{name}.safetensors"
    return path if path.is_file() else None


def sample_labelled(policy: Path, rows: list[dict], gold: Gold, n: int, tokens: int, seed: int,
                    log: Callable[[str], None]) -> list[dict]:
    """`n` responses sampled by klguard's own rollout (temperature 1, as the arithmetic task's RM samples) over
    `rows` in turn, each with its prompt, ground truth and gold."""
    tok = set_pad_token(AutoTokenizer.from_pretrained(policy), "the policy")
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32).eval()
    params = SamplingParams(max_new_tokens=tokens, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                            temperature=1.0)
    gen = torch.Generator().manual_seed(seed)
    out: list[dict] = []
    for start in range(0, n, SAMPLE_BATCH):
        part = [rows[i % len(rows)] for i in range(start, min(n, start + SAMPLE_BATCH))]
        prompts = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in part]
        enc = tok(prompts, add_special_tokens=False, padding=True, return_tensors="pt")
        batch = generate(model, enc["input_ids"], enc["attention_mask"], params, generator=gen)
        texts = tok.batch_decode(batch.response_ids, skip_special_tokens=True)
        for row, text in zip(part, texts, strict=True):
            truth = row["reward_model"]["ground_truth"]
            out.append({"prompt": row["prompt"], "ground_truth": truth, "text": text, "gold": gold(text, truth)})
        log(f"klguard: learned RM: sampled {len(out)}/{n}")
    return out


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """The chance that a random gold-1 sample outscores a random gold-0 one (ties count half); NaN with one class."""
    pos, neg = scores[labels > 0], scores[labels <= 0]
    if not len(pos) or not len(neg):
        return float("nan")
    diff = pos[:, None] - neg[None, :]
    return float(((diff > 0).double() + 0.5 * (diff == 0).double()).mean())


def fit_logistic(x: torch.Tensor, y: torch.Tensor, strength: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Logistic regression (weights, bias) of `y` on `x`, L2 `strength` on the weights, by L-BFGS in float64."""
    x, y = x.double(), y.double()
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


def fit_head(x: torch.Tensor, y: torch.Tensor, seed: int) -> tuple[torch.Tensor, dict]:
    """The head's weights on raw features `x` [N, H] for labels `y`, and its metrics on the held-out fifth."""
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    cut = int(len(y) * (1 - HELD_OUT))
    train, held = order[:cut], order[cut:]
    mu, sigma = x[train].mean(0), x[train].std(0).clamp_min(1e-6)
    z = (x.double() - mu) / sigma
    fits = {s: fit_logistic(z[train], y[train], s) for s in STRENGTHS}
    held_auc = {s: auc(z[held] @ w + b, y[held]) for s, (w, b) in fits.items()}
    best = max(STRENGTHS, key=lambda s: -1.0 if held_auc[s] != held_auc[s] else held_auc[s])
    w, b = fits[best]
    metrics = {"samples": len(y), "gold_rate": float(y.double().mean()), "l2": best, "held_out_n": len(held),
               "train_auc": auc(z[train] @ w + b, y[train]), "held_out_auc": held_auc[best],
               "held_out_accuracy": float((((z[held] @ w + b) > 0) == (y[held] > 0)).double().mean())}
    w_all, _ = fit_logistic(z, y, best)
    return (w_all / sigma).float(), metrics


def save_classifier(policy: Path, out: Path, weight: torch.Tensor | None = None):
    """The policy's body as a one-label classifier in `out` (its tokenizer with it), its head `weight` [1, H]
    (zero when None); returns the model."""
    tok = set_pad_token(AutoTokenizer.from_pretrained(policy), "the policy")
    rm = AutoModelForSequenceClassification.from_pretrained(policy, num_labels=1)
    rm.config.pad_token_id = tok.pad_token_id
    if weight is None:
        torch.nn.init.zeros_(rm.score.weight)
    else:
        rm.score.weight.data.copy_(weight.reshape(rm.score.weight.shape))
    rm.save_pretrained(out)
    tok.save_pretrained(out)
    return rm


def write_rm(policy: Path, cfg: Config, data: list[dict], out: Path, seed: int) -> dict:
    """Fit one head on `data` and save the classifier (the policy's body and tokenizer with it) to `out`."""
    rm = save_classifier(policy, out)
    scorer = ModelReward(cfg, torch.device("cpu"), out, user=False)
    feats = torch.cat([scorer.score([d["prompt"] for d in part], [d["text"] for d in part], features=True)[1]
                       for part in (data[i:i + SAMPLE_BATCH] for i in range(0, len(data), SAMPLE_BATCH))])
    weight, metrics = fit_head(feats, torch.tensor([d["gold"] for d in data]), seed)
    rm.score.weight.data.copy_(weight[None, :])
    rm.save_pretrained(out)
    (out / "samples.jsonl").write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in data))
    return metrics


def ensure_probe_rm(task: str, rows: list[dict], gold: Gold, cfg: Config, policy: Path, *, gold_version: int = 1,
                    log: Callable[[str], None] = print) -> Path:
    """The learned RM's folder for `task` (its training `rows` and `gold`, whose labels change with `gold_version`),
    this recipe and policy: cached, or fit now (the audit RM in its `audit/`)."""
    out = probe_rm_dir(task, cfg, policy, gold_version)
    if (out / "rm_metrics.json").is_file():
        return out
    with build_lock(out, f"the {task} task's learned reward model", log):
        if (out / "rm_metrics.json").is_file():
            return out  # fit by the process this one waited for
        rm = cfg.proxy_reward.learned_rm
        head = shipped_head(out.name) if rm.shipped else None
        if head is not None:
            return build_from_head(policy, head, out, log)
        if rm.shipped:
            log(f"klguard: no {task} RM head shipped for this recipe and policy ({out.name}): fitting one here")
        started = time.monotonic()
        n = rm.samples * (2 if rm.audit else 1)
        log(f"klguard: fitting the {task} task's learned RM on {n} samples of {policy} (once; cached at {out})")
        data = sample_labelled(policy, rows, gold, n, cfg.data.max_response_length, rm.seed, log)
        tmp = out.with_name(out.name + f".partial-{os.getpid()}")
        tmp.mkdir(parents=True)
        metrics = write_rm(policy, cfg, data[:rm.samples], tmp, rm.seed)
        if rm.audit:
            metrics["audit"] = write_rm(policy, cfg, data[rm.samples:], tmp / "audit", rm.seed + 1)
        metrics["fit_s"] = round(time.monotonic() - started, 1)
        (tmp / "rm_metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
        publish(tmp, out, "rm_metrics.json")
        log(f"klguard: learned RM held-out AUC {metrics['held_out_auc']:.3f} ({metrics['fit_s']:.0f} s)")
    return out


def build_from_head(policy: Path, head: Path, out: Path, log: Callable[[str], None]) -> Path:
    """The RM folder `out` from a shipped `head` (its `score` and, where fit, `audit` weights) on the policy's body."""
    weights = load_file(head)
    metrics = json.loads(head.with_suffix(".json").read_text())["metrics"]
    tmp = out.with_name(out.name + f".partial-{os.getpid()}")
    tmp.mkdir(parents=True)
    save_classifier(policy, tmp, weights["score"])
    if "audit" in weights:
        save_classifier(policy, tmp / "audit", weights["audit"])
    (tmp / "rm_metrics.json").write_text(json.dumps({**metrics, "shipped": head.name}, indent=1) + "\n")
    publish(tmp, out, "rm_metrics.json")
    log(f"klguard: learned RM: the shipped head {head.name} (held-out AUC {metrics['held_out_auc']:.3f} where fit)")
    return out


def ship_head(folder: Path, dest: Path, provenance: dict) -> Path:
    """Write the heads of a finished fit `folder` (the RM's `score`, the audit RM's `audit`) to
    `dest/<folder name>.safetensors`, its metrics and `provenance` (where it was fit) to the `.json` beside it."""
    metrics = json.loads((folder / "rm_metrics.json").read_text())
    if "shipped" in metrics:
        raise ValueError(f"{folder} was built from the shipped head {metrics['shipped']}, not fit")
    heads = {"score": load_file(folder / "model.safetensors")["score.weight"].contiguous()}
    if (folder / "audit").is_dir():
        heads["audit"] = load_file(folder / "audit" / "model.safetensors")["score.weight"].contiguous()
    dest.mkdir(parents=True, exist_ok=True)
    save_file(heads, dest / f"{folder.name}.safetensors")
    (dest / f"{folder.name}.json").write_text(json.dumps({"metrics": metrics, **provenance}, indent=1) + "\n")
    return dest / f"{folder.name}.safetensors"
