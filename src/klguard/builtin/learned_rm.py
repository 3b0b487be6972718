"""The built-in task's second exploit (`proxy_reward.kind=learned_rm`): a small reward model fit to the SFT
policy's own samples, labelled by the gold rule, from limited data, as Gao, Schulman and Hilton (2022) fit their
proxy RMs. PPO optimises its score while gold stays the rule; what it gets wrong is the exploit, length or not.

The recipe (`proxy_reward.learned_rm.*`): `samples` responses of the SFT policy at temperature 1 (its run-on
continuations included), on training-split problems drawn with the recipe's seed; each labelled 1 when the gold rule
says correct, else 0; a Llama body of `hidden_size` x `num_layers` on the built-in character tokenizer with a
one-label `AutoModelForSequenceClassification` head, trained with binary cross-entropy for `epochs` passes. A fifth
of the samples is held out to measure its accuracy (`rm_metrics.json`). The folder is cached beside the SFT policy,
keyed by the recipe and the SFT policy's weights, and built by `klguard sft` or on first use; it loads through
the same code as a user's reward model (klguard.reward.model_rm).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

from klguard.builtin.arith import make_arith_rows
from klguard.builtin.warm_start import cache_root, publish
from klguard.config.schema import LearnedRMConfig, SFTConfig
from klguard.ppo.rollout import SamplingParams, generate
from klguard.reward.gsm8k import compute_score
from klguard.reward.model_rm import render_chat

RM_FORMAT_VERSION = 1  # bump when the recipe's meaning changes, so stale caches are not reused
SAMPLE_BATCH = 256
HELD_OUT_SHARE = 0.2


def policy_fingerprint(policy: Path) -> str:
    """SHA-256 of the SFT policy's weight files: the RM is fit to that policy's samples."""
    digest = hashlib.sha256()
    for file in sorted(Path(policy).glob("*.safetensors")):
        digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def rm_recipe(cfg: LearnedRMConfig, policy: Path, max_new_tokens: int) -> dict:
    return asdict(cfg) | {"format": RM_FORMAT_VERSION, "policy": policy_fingerprint(policy),
                          "max_new_tokens": max_new_tokens}


def learned_rm_dir(cfg: LearnedRMConfig, sft: SFTConfig, policy: Path, max_new_tokens: int) -> Path:
    recipe = rm_recipe(cfg, policy, max_new_tokens)
    return cache_root(sft) / f"rm-{hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]}"


@torch.no_grad()
def sample_labelled(policy: Path, cfg: LearnedRMConfig, *, form: str, max_new_tokens: int
                    ) -> tuple[list[str], list[float], object]:
    """The SFT policy's samples rendered as (prompt, response) chats, their gold labels, and the tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained(policy)
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32).eval()
    rows = make_arith_rows(cfg.samples, "train", 1000 + cfg.seed, form=form)
    params = SamplingParams(max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                            pad_token_id=tokenizer.pad_token_id, temperature=1.0)
    gen = torch.Generator().manual_seed(cfg.seed)
    texts, labels = [], []
    for start in range(0, len(rows), SAMPLE_BATCH):
        part = rows[start : start + SAMPLE_BATCH]
        prompts = [tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False)
                   for r in part]
        enc = tokenizer(prompts, add_special_tokens=False, padding=True, return_tensors="pt")
        out = generate(model, enc["input_ids"], enc["attention_mask"], params, generator=gen)
        for row, text in zip(part, tokenizer.batch_decode(out.response_ids, skip_special_tokens=True), strict=True):
            texts.append(render_chat(tokenizer, row["prompt"], text))
            labels.append(float(compute_score(text, row["reward_model"]["ground_truth"])))
    return texts, labels, tokenizer


def _rm_model(cfg: LearnedRMConfig, tokenizer, member: int) -> LlamaForSequenceClassification:
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
                         num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_heads,
                         intermediate_size=2 * cfg.hidden_size, max_position_embeddings=128, num_labels=1,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed + member)
        return LlamaForSequenceClassification(config)


def _accuracy(model, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> float:
    if not len(labels):
        return float("nan")
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[:, 0]
    return float(((logits > 0).float() == labels).float().mean())


def member_rows(cfg: LearnedRMConfig, member: int, n: int) -> torch.Tensor:
    """The training rows of one member: all ``n`` for a single RM, else a bootstrap resample (n draws with
    replacement, the member's own), so that members disagree where the samples leave them free to."""
    if cfg.ensemble_size == 1:
        return torch.arange(n)
    gen = torch.Generator().manual_seed(cfg.seed * 1009 + member + 1)
    return torch.randint(0, n, (n,), generator=gen)


def encode_samples(texts: list[str], labels: list[float], tokenizer) -> tuple[torch.Tensor, ...]:
    """(ids, mask, labels) of the samples, right-padded: encoded once for every member."""
    tokenizer.padding_side = "right"
    enc = tokenizer(texts, add_special_tokens=False, padding=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"], torch.tensor(labels)


def train_rm(samples: tuple[torch.Tensor, ...], cfg: LearnedRMConfig, tokenizer, member: int = 0
             ) -> tuple[torch.nn.Module, dict]:
    """One member fit to (a resample of) the first 4/5 of the encoded samples, and its accuracy on both parts."""
    ids, mask, y = samples
    cut = int(len(y) * (1 - HELD_OUT_SHARE))
    rows = member_rows(cfg, member, cut)
    model = _rm_model(cfg, tokenizer, member)
    optim = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(cfg.seed + member)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    loss = torch.zeros(())
    for _ in range(cfg.epochs):
        model.train()
        for batch in rows[torch.randperm(len(rows), generator=gen)].split(cfg.batch_size):
            loss = loss_fn(model(input_ids=ids[batch], attention_mask=mask[batch]).logits[:, 0], y[batch])
            loss.backward()
            optim.step()
            optim.zero_grad(set_to_none=True)
    model.eval()
    return model, {"train_accuracy": _accuracy(model, ids[:cut], mask[:cut], y[:cut]),
                   "held_out_accuracy": _accuracy(model, ids[cut:], mask[cut:], y[cut:]),
                   "gold_correct_share": float(y.mean()), "final_loss": float(loss.detach()), "samples": len(y)}


def ensure_learned_rm(cfg: LearnedRMConfig, sft: SFTConfig, policy: Path, *, form: str, max_new_tokens: int,
                      force: bool = False, log=print) -> Path:
    """The learned RM's folder for this recipe and SFT policy: cached, or built now (`force`: always built)."""
    out = learned_rm_dir(cfg, sft, policy, max_new_tokens)
    if not force and (out / "rm_metrics.json").is_file():
        return out
    log(f"klguard: fitting the learned reward model to {cfg.samples} samples of the SFT policy (cached at {out})")
    tmp = out.with_name(out.name + f".partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    texts, labels, tokenizer = sample_labelled(policy, cfg, form=form, max_new_tokens=max_new_tokens)
    samples, members = encode_samples(texts, labels, tokenizer), []
    for member in range(cfg.ensemble_size):
        model, metrics = train_rm(samples, cfg, tokenizer, member)
        target = tmp if cfg.ensemble_size == 1 else tmp / f"member-{member}"
        model.save_pretrained(target, safe_serialization=True)
        tokenizer.save_pretrained(target)
        members.append(metrics)
    metrics = {key: sum(m[key] for m in members) / len(members) for key in ("train_accuracy", "held_out_accuracy",
                                                                           "final_loss")}
    metrics |= {"gold_correct_share": members[0]["gold_correct_share"], "samples": len(texts), "members": members,
                "recipe": rm_recipe(cfg, policy, max_new_tokens)}
    (tmp / "rm_metrics.json").write_text(json.dumps(metrics, indent=1))
    publish(tmp, out, "rm_metrics.json", replace=force)
    log(f"klguard: learned RM accuracy {metrics['train_accuracy']:.3f} on its samples, "
        f"{metrics['held_out_accuracy']:.3f} held out (mean of {cfg.ensemble_size} member(s); "
        f"{metrics['gold_correct_share']:.3f} of the samples gold-correct)")
    return out
