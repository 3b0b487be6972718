"""The built-in task's second exploit (`proxy_reward.kind=learned_rm`): a reward model fit to the SFT policy's own
samples, labelled by the gold rule, from limited data, as Gao, Schulman and Hilton (2022) and Coste et al. (2024) fit
their proxy RMs. PPO optimises its score while gold stays the rule; what it gets wrong is the exploit.

The recipe (`proxy_reward.learned_rm.*`):
- data: `samples` responses of the SFT policy at temperature 1 (its run-on continuations included) on training-split
  problems drawn with the recipe's seed, each labelled 1 when the gold rule says correct, else 0. The last fifth is
  held out to measure the RM (`rm_metrics.json`). `contrast` more training problems each add the short correct answer
  (label 1) and a near-miss wrong one (label 0, off by one of `contrast_offsets`), so the RM learns to check the
  arithmetic, not only the form;
- body (`init`): `sft`, the SFT policy's body with `fresh_layers` new decoder layers and a fresh one-label
  `AutoModelForSequenceClassification` head (an RM that is right on the policy's distribution and wrong off it; the
  new layers and head learn at `lr`, the body at `body_lr`), or `scratch`, a fresh `hidden_size` x `num_layers`
  Llama on the built-in character tokenizer;
- binary cross-entropy for `epochs` passes, plus with `pairwise` the Bradley-Terry loss of each contrast pair (the
  two share problem and form, so only the arithmetic lowers it); the new layers start as the identity
  (`fresh_init=identity`: output projections zero); the lr held or decayed linearly to 0 (`lr_schedule`);
  `ensemble_size` members, each fit to its own bootstrap resample, or with `diversity=mixed` to one of two disjoint
  halves of the samples, from scratch or from the SFT body (crossed), so that they differ in more than resample and
  seed (members that share their data and body share its blind spots);
- `audit`: a second RM by the same recipe on disjoint problems and samples, saved in `audit/`. It is never optimised:
  the run scores every rollout with it as well, and the optimised RM's gain that it does not share is a gold-free
  hacking signal.
The folder is cached beside the SFT policy, keyed by the recipe and the SFT policy's weights, and built by `klguard
sft` or on first use; it loads through the same code as a user's reward model (klguard.reward.model_rm).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForSequenceClassification
from transformers.utils import logging as hf_logging

from klguard.builtin.arith import make_arith_rows
from klguard.builtin.warm_start import cache_root
from klguard.config.schema import LearnedRMConfig, SFTConfig
from klguard.files import build_lock, publish
from klguard.ppo.rollout import SamplingParams, generate
from klguard.reward.gsm8k import compute_score
from klguard.reward.model_rm import render_chat

RM_FORMAT_VERSION = 2  # bump when the recipe's meaning changes, so stale caches are not reused
SAMPLE_BATCH = 256
HELD_OUT_SHARE = 0.2


def policy_fingerprint(policy: Path) -> str:
    """SHA-256 of the SFT policy's weight files: the RM is fit to that policy's samples."""
    digest = hashlib.sha256()
    for file in sorted(Path(policy).glob("*.safetensors")):
        digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


LEGACY_VALUES = {"diversity": "bootstrap", "lr_schedule": "constant", "contrast_offsets": [-10, -2, -1, 1, 2, 10],
                 "pairwise": False, "fresh_init": "random"}
"""Keys added to the recipe later, at the value that reproduces the recipes before them: left out of the cache key,
so that those recipes keep their folders' names."""
SFT_BODY_KEYS = ("fresh_layers", "fresh_init", "body_lr")
CONTRAST_KEYS = ("contrast_offsets", "pairwise")


def uses_sft_body(cfg: LearnedRMConfig) -> bool:
    return any(member_init(cfg, member) == "sft" for member in range(cfg.ensemble_size))


def rm_recipe(cfg: LearnedRMConfig, policy: Path, max_new_tokens: int) -> dict:
    recipe = asdict(cfg)
    for key, value in LEGACY_VALUES.items():
        if recipe[key] == value:
            del recipe[key]
    unread = (SFT_BODY_KEYS if not uses_sft_body(cfg) else ()) + (CONTRAST_KEYS if not cfg.contrast else ())
    for key in unread:  # keys that only an SFT-body member, or only contrast pairs, read
        recipe.pop(key, None)
    return recipe | {"format": RM_FORMAT_VERSION, "policy": policy_fingerprint(policy),
                     "max_new_tokens": max_new_tokens}


def learned_rm_dir(cfg: LearnedRMConfig, sft: SFTConfig, policy: Path, max_new_tokens: int) -> Path:
    recipe = rm_recipe(cfg, policy, max_new_tokens)
    return cache_root(sft) / f"rm-{hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]}"


AUDIT_SEED_OFFSET = 7919  # the audit RM's sampling and initialisation seeds: apart from the proxy's


@torch.no_grad()
def sample_labelled(policy: Path, rows: list[dict], seed: int, *, max_new_tokens: int
                    ) -> tuple[list[str], list[float], object]:
    """The SFT policy's samples on `rows` rendered as (prompt, response) chats, their gold labels, the tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained(policy)
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32).eval()
    params = SamplingParams(max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                            pad_token_id=tokenizer.pad_token_id, temperature=1.0)
    gen = torch.Generator().manual_seed(seed)
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


def near_miss(answer: int, rng: random.Random, offsets: Sequence[int]) -> int:
    """A wrong answer a tiny model might write (`offsets`: off by one or two, or by ten, a carry), never negative."""
    for _ in range(8):
        wrong = answer + rng.choice(offsets)
        if wrong >= 0:
            return wrong
    return answer + 1


def contrast_examples(rows: list[dict], tokenizer, seed: int, offsets: Sequence[int]) -> tuple[list[str], list[float]]:
    """Each row's short correct answer (label 1) and a near-miss wrong answer (label 0), as chats."""
    rng = random.Random(f"klguard-rm-contrast:{seed}")
    texts, labels = [], []
    for row in rows:
        answer = int(row["reward_model"]["ground_truth"])
        for value, label in ((answer, 1.0), (near_miss(answer, rng, offsets), 0.0)):
            texts.append(render_chat(tokenizer, row["prompt"], f"#### {value}"))
            labels.append(label)
    return texts, labels


def new_layers(model: LlamaForSequenceClassification, cfg: LearnedRMConfig) -> torch.nn.ModuleList:
    """The `fresh_layers` decoder layers an SFT-body RM adds on top of the body's own."""
    return model.model.layers[len(model.model.layers) - cfg.fresh_layers:]


def _rm_model(cfg: LearnedRMConfig, tokenizer, policy: Path, seed: int, init: str) -> LlamaForSequenceClassification:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if init == "sft":  # the SFT body; the new layers and the one-label head are drawn from the seed above
            layers = AutoConfig.from_pretrained(policy).num_hidden_layers + cfg.fresh_layers
            verbosity = hf_logging.get_verbosity()
            hf_logging.set_verbosity_error()  # "some weights were newly initialised": those, as intended
            try:
                model = LlamaForSequenceClassification.from_pretrained(
                    policy, num_labels=1, pad_token_id=tokenizer.pad_token_id, num_hidden_layers=layers,
                    dtype=torch.float32)
            finally:
                hf_logging.set_verbosity(verbosity)
            if cfg.fresh_init == "identity":  # each new layer adds nothing to the residual stream until trained
                for layer in new_layers(model, cfg):
                    torch.nn.init.zeros_(layer.self_attn.o_proj.weight)
                    torch.nn.init.zeros_(layer.mlp.down_proj.weight)
            return model
        config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=cfg.hidden_size,
                             num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
                             num_key_value_heads=cfg.num_heads, intermediate_size=2 * cfg.hidden_size,
                             max_position_embeddings=128, num_labels=1, pad_token_id=tokenizer.pad_token_id,
                             bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                             tie_word_embeddings=False)
        return LlamaForSequenceClassification(config)


def param_groups(model: LlamaForSequenceClassification, cfg: LearnedRMConfig, init: str) -> list[dict]:
    """The optimizer's groups: with the SFT body, its own weights at `body_lr` and the new layers and head at `lr`
    (the body already computes what the new ones must learn to read); from scratch, every weight at `lr`."""
    if init != "sft":
        return [{"params": list(model.parameters()), "lr": cfg.lr}]
    fresh = [*model.score.parameters(), *(p for layer in new_layers(model, cfg) for p in layer.parameters())]
    fresh_ids = {id(p) for p in fresh}
    return [{"params": fresh, "lr": cfg.lr},
            {"params": [p for p in model.parameters() if id(p) not in fresh_ids], "lr": cfg.body_lr}]


def _accuracy(model, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> float:
    if not len(labels):
        return float("nan")
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[:, 0]
    return float(((logits > 0).float() == labels).float().mean())


def member_rows(cfg: LearnedRMConfig, member: int, n: int) -> torch.Tensor:
    """The training rows of one member: all ``n`` for a single RM; with `diversity=bootstrap` a resample (n draws with
    replacement, the member's own), so that members disagree where the samples leave them free to; with `mixed` the
    member's half of the rows (even rows for even members), disjoint from the other half's."""
    if cfg.ensemble_size == 1 or n == 0:
        return torch.arange(n)
    if cfg.diversity == "mixed":
        return torch.arange(member % 2, n, 2)
    gen = torch.Generator().manual_seed(cfg.seed * 1009 + member + 1)
    return torch.randint(0, n, (n,), generator=gen)


def member_init(cfg: LearnedRMConfig, member: int) -> str:
    """One member's body: `cfg.init` for every member, or with `diversity=mixed` scratch for members 0 and 1, the SFT
    body for 2 and 3, and so on (with 4 members every pair of data half and body is there once)."""
    if cfg.diversity == "mixed" and cfg.ensemble_size > 1:
        return ("scratch", "sft")[(member // 2) % 2]
    return cfg.init


def encode(texts: list[str], labels: list[float], tokenizer) -> tuple[torch.Tensor, ...]:
    """(ids, mask, labels), right-padded."""
    tokenizer.padding_side = "right"
    enc = tokenizer(texts, add_special_tokens=False, padding=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"], torch.tensor(labels)


def rm_dataset(policy: Path, cfg: LearnedRMConfig, rows: list[dict], seed: int, *, max_new_tokens: int
               ) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], object, torch.Tensor]:
    """(train, held_out) encoded sets of one RM: the SFT policy's samples on `rows`, their last fifth held out,
    and `contrast` pairs on the first training problems added to the training set; the tokenizer; and the pairs'
    (correct, near-miss) row numbers in the training set, shape (pairs, 2)."""
    texts, labels, tokenizer = sample_labelled(policy, rows, seed, max_new_tokens=max_new_tokens)
    cut = int(len(labels) * (1 - HELD_OUT_SHARE))
    extra_texts, extra_labels = contrast_examples(rows[: min(cfg.contrast, cut)], tokenizer, seed, cfg.contrast_offsets)
    train = encode(texts[:cut] + extra_texts, labels[:cut] + extra_labels, tokenizer)
    pairs = torch.arange(cut, cut + len(extra_texts)).view(-1, 2)  # contrast_examples: correct, then its near-miss
    return train, encode(texts[cut:], labels[cut:], tokenizer), tokenizer, pairs


def pair_loss(model, ids: torch.Tensor, mask: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    """Bradley-Terry: -log sigmoid(r(correct) - r(near-miss)), mean over the (correct, near-miss) row pairs."""
    both = pairs.T.reshape(-1)  # every correct row, then every near-miss row
    reward = model(input_ids=ids[both], attention_mask=mask[both]).logits[:, 0].view(2, -1)
    return -torch.nn.functional.logsigmoid(reward[0] - reward[1]).mean()


def train_rm(train: tuple[torch.Tensor, ...], held_out: tuple[torch.Tensor, ...], cfg: LearnedRMConfig, tokenizer,
             policy: Path, seed: int, member: int = 0, pairs: torch.Tensor | None = None,
             progress: Callable[[str], None] | None = None) -> tuple[torch.nn.Module, dict]:
    """One member fit to (a resample of) the training set, with `cfg.pairwise` the Bradley-Terry loss on (its share
    of) the contrast `pairs` added, and its accuracy on both sets; `progress` hears of each epoch."""
    ids, mask, y = train
    rows = member_rows(cfg, member, len(y))
    if pairs is None or not cfg.pairwise:
        pairs = torch.zeros((0, 2), dtype=torch.long)
    pairs = pairs[member_rows(cfg, member, len(pairs))]
    init = member_init(cfg, member)
    model = _rm_model(cfg, tokenizer, policy, seed + member, init)
    optim = torch.optim.AdamW(param_groups(model, cfg, init), weight_decay=0.0)
    total = cfg.epochs * -(-len(rows) // cfg.batch_size)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optim, (lambda step: 1 - step / total) if cfg.lr_schedule == "linear" else (lambda step: 1.0))
    gen = torch.Generator().manual_seed(seed + member)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    loss = torch.zeros(())
    started = time.monotonic()
    for epoch in range(cfg.epochs):
        model.train()
        batches = rows[torch.randperm(len(rows), generator=gen)].split(cfg.batch_size)
        pair_batches = pairs[torch.randperm(len(pairs), generator=gen)].chunk(len(batches))  # [] when no pairs
        for i, batch in enumerate(batches):
            loss = loss_fn(model(input_ids=ids[batch], attention_mask=mask[batch]).logits[:, 0], y[batch])
            if i < len(pair_batches) and len(pair_batches[i]):
                loss = loss + pair_loss(model, ids, mask, pair_batches[i])
            loss.backward()
            optim.step()
            schedule.step()
            optim.zero_grad(set_to_none=True)
        if progress is not None:
            progress(f"epoch {epoch + 1}/{cfg.epochs}, last batch loss {float(loss.detach()):.3f}, "
                     f"{time.monotonic() - started:.0f} s")
    model.eval()
    return model, {"train_accuracy": _accuracy(model, *train), "held_out_accuracy": _accuracy(model, *held_out),
                   "gold_correct_share": float(held_out[2].mean()), "final_loss": float(loss.detach()),
                   "train_examples": len(y), "held_out_samples": len(held_out[2])}


def fit_rms(policy: Path, cfg: LearnedRMConfig, rows: list[dict], seed: int, target: Path, *,
            max_new_tokens: int, name: str = "learned RM", log: Callable[[str], None] = print) -> dict:
    """Fit one RM (or `ensemble_size` members in `member-<i>/`) on `rows` into `target`; their mean metrics.
    `log` hears one line as sampling starts and one per member and epoch."""
    log(f"klguard: {name}: sampling and labelling {len(rows)} responses of the SFT policy")
    started = time.monotonic()
    train, held_out, tokenizer, pairs = rm_dataset(policy, cfg, rows, seed, max_new_tokens=max_new_tokens)
    log(f"klguard: {name}: {len(train[2])} training examples in {time.monotonic() - started:.0f} s")
    members = []
    for member in range(cfg.ensemble_size):
        def progress(line: str, member: int = member) -> None:
            log(f"klguard: {name}: member {member + 1}/{cfg.ensemble_size}, {line}")
        model, metrics = train_rm(train, held_out, cfg, tokenizer, policy, seed, member, pairs, progress)
        folder = target if cfg.ensemble_size == 1 else target / f"member-{member}"
        model.save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)
        members.append(metrics)
    mean = {key: sum(m[key] for m in members) / len(members)
            for key in ("train_accuracy", "held_out_accuracy", "final_loss")}
    return mean | {key: members[0][key] for key in ("gold_correct_share", "train_examples", "held_out_samples")} \
        | {"members": members}


def ensure_learned_rm(cfg: LearnedRMConfig, sft: SFTConfig, policy: Path, *, form: str, max_new_tokens: int,
                      force: bool = False, log=print) -> Path:
    """The learned RM's folder for this recipe and SFT policy: cached, or built now (`force`: always built).
    With `cfg.audit` the folder's `audit/` holds the audit RM."""
    out = learned_rm_dir(cfg, sft, policy, max_new_tokens)
    if not force and (out / "rm_metrics.json").is_file():
        return out
    with build_lock(out, "the learned reward model", log):
        if not force and (out / "rm_metrics.json").is_file():
            return out  # fitted by the process this one waited for
        return _fit_learned_rm(cfg, policy, out, form=form, max_new_tokens=max_new_tokens, force=force, log=log)


def _fit_learned_rm(cfg: LearnedRMConfig, policy: Path, out: Path, *, form: str, max_new_tokens: int, force: bool,
                    log) -> Path:
    log(f"klguard: fitting the learned reward model to {cfg.samples} samples of the SFT policy (cached at {out})")
    tmp = out.with_name(out.name + f".partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    # one stream of distinct problems: the proxy's first, the audit RM's after them (disjoint by construction)
    rows = make_arith_rows(cfg.samples * (2 if cfg.audit else 1), "train", 1000 + cfg.seed, form=form)
    metrics = fit_rms(policy, cfg, rows[: cfg.samples], cfg.seed, tmp, max_new_tokens=max_new_tokens, log=log)
    if cfg.audit:
        metrics["audit"] = fit_rms(policy, cfg, rows[cfg.samples :], cfg.seed + AUDIT_SEED_OFFSET, tmp / "audit",
                                   max_new_tokens=max_new_tokens, name="audit RM", log=log)
    metrics["recipe"] = rm_recipe(cfg, policy, max_new_tokens)
    (tmp / "rm_metrics.json").write_text(json.dumps(metrics, indent=1))
    publish(tmp, out, "rm_metrics.json", replace=force)
    log(f"klguard: learned RM accuracy {metrics['train_accuracy']:.3f} on its training set, "
        f"{metrics['held_out_accuracy']:.3f} on held-out samples of the SFT policy (mean of {cfg.ensemble_size} "
        f"member(s); {metrics['gold_correct_share']:.3f} of those gold-correct)")
    return out
