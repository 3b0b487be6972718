"""`klguard sft`: the supervised warm start of the built-in tiny policy, cached on disk.

The policy learns `Q:23+45-7=?A:` -> `#### 61</s>`. A small share of targets run on into a second
packed problem (`#### 61 Q:12+34-5=?A:#### 41</s>`): that gives the reference policy a small chance
of not stopping after its answer, the opening a length-biased reward exploits. Training stops once
held-out accuracy at temperature 1 reaches `sft.target_accuracy`, so RL has room to improve and to hack.

The default recipe's policy ships inside the package (klguard.builtin.shipped): it is used as is, and
SFT runs only for another recipe or when `klguard sft` rebuilds (a policy in the cache wins).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import torch

from klguard.builtin.arith import make_arith_rows
from klguard.builtin.char_tokenizer import build_char_tokenizer
from klguard.builtin.shipped import shipped_policy
from klguard.builtin.tiny import build_tiny_llama, save_hf_folder
from klguard.config.schema import SFTConfig
from klguard.files import build_lock, publish
from klguard.files import cache_root as default_cache_root
from klguard.ppo.rollout import SamplingParams, generate
from klguard.reward.gsm8k import compute_score

SFT_FORMAT_VERSION = 3  # bump when the recipe changes, so stale caches are not reused (3: the policy ships)
POOL_SIZE = 30_000
EVAL_SIZE = 512


def cache_root(cfg: SFTConfig) -> Path:
    return Path(cfg.cache_dir).expanduser() if cfg.cache_dir else default_cache_root()


def sft_recipe(cfg: SFTConfig, form: str) -> dict:
    """Everything that decides the SFT policy's weights (not where it is cached)."""
    recipe = {k: v for k, v in asdict(cfg).items() if k != "cache_dir"}
    return recipe | {"format": SFT_FORMAT_VERSION, "form": form}


def sft_cache_dir(cfg: SFTConfig, form: str) -> Path:
    digest = hashlib.sha256(json.dumps(sft_recipe(cfg, form), sort_keys=True).encode()).hexdigest()[:16]
    return cache_root(cfg) / f"sft-{digest}"


def ensure_builtin_tokenizer(cfg: SFTConfig) -> Path:
    """The built-in character tokenizer as a saved HF folder, so it loads through AutoTokenizer
    before (and independently of) the SFT run; data can then be checked before any training."""
    out = cache_root(cfg) / f"char-tokenizer-v{SFT_FORMAT_VERSION}"
    if not (out / "tokenizer_config.json").is_file():
        tmp = out.with_name(out.name + f".partial-{os.getpid()}")
        build_char_tokenizer().save_pretrained(tmp)
        publish(tmp, out, "tokenizer_config.json")
    return out


def ensure_sft_policy(cfg: SFTConfig, *, form: str = "a+b-c", force: bool = False, log=print) -> Path:
    """The SFT policy folder for this recipe: the cached one (a rebuild), else the shipped one, else
    trained now into the cache; `force` always trains."""
    out = sft_cache_dir(cfg, form)
    if not force:
        if (out / "sft_metrics.json").is_file():
            return out
        shipped = shipped_policy(sft_recipe(cfg, form))
        if shipped is not None:
            return shipped
    with build_lock(out, "the SFT policy", log):
        if not force and (out / "sft_metrics.json").is_file():
            return out  # trained by the process this one waited for
        log(f"klguard sft: training the built-in policy (cached at {out})")
        tmp = out.with_name(out.name + f".partial-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        metrics = run_sft(cfg, tmp, form=form, log=log)
        (tmp / "sft_metrics.json").write_text(json.dumps(metrics, indent=1))
        publish(tmp, out, "sft_metrics.json", replace=force)
    return out


class SFTExamples:
    """The training pool tokenized once: prompt ids and answer ids (`#### <gt>`) per problem."""

    def __init__(self, tokenizer, rows: list[dict]) -> None:
        prompts = [tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False)
                   for r in rows]
        answers = [f"#### {r['reward_model']['ground_truth']}" for r in rows]
        self.prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
        self.answer_ids = tokenizer(answers, add_special_tokens=False)["input_ids"]
        self.space_ids = tokenizer(" ", add_special_tokens=False)["input_ids"]
        self.eos, self.pad = tokenizer.eos_token_id, tokenizer.pad_token_id

    def __len__(self) -> int:
        return len(self.prompt_ids)

    def batch(self, index: list[int], continue_mask: list[bool], partner: list[int]
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded input ids and labels (-100 outside the answer) for one SFT batch."""
        sequences, prompt_lens = [], []
        for i, cont, other in zip(index, continue_mask, partner, strict=True):
            answer = self.answer_ids[i]
            if cont:  # run on into a second packed problem: `#### 61 Q:12+34-5=?A:#### 41`
                answer = answer + self.space_ids + self.prompt_ids[other] + self.answer_ids[other]
            sequences.append(self.prompt_ids[i] + answer + [self.eos])
            prompt_lens.append(len(self.prompt_ids[i]))
        width = max(map(len, sequences))
        ids = torch.full((len(sequences), width), self.pad, dtype=torch.long)
        labels = torch.full_like(ids, -100)
        for row, (seq, plen) in enumerate(zip(sequences, prompt_lens, strict=True)):
            ids[row, : len(seq)] = torch.tensor(seq)
            labels[row, plen : len(seq)] = ids[row, plen : len(seq)]
        return ids, labels


@torch.no_grad()
def evaluate_policy(model, tokenizer, rows: list[dict], *, seed: int, max_new_tokens: int = 32) -> dict[str, float]:
    """Accuracy (GSM8K strict) and continuation rate at temperature 1 on `rows`."""
    model.eval()
    prompts = [tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows]
    enc = tokenizer(prompts, add_special_tokens=False, padding=True, return_tensors="pt")
    params = SamplingParams(max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                            pad_token_id=tokenizer.pad_token_id, temperature=1.0)
    gen = torch.Generator().manual_seed(seed)
    out = generate(model, enc["input_ids"], enc["attention_mask"], params, generator=gen)
    texts = tokenizer.batch_decode(out.response_ids, skip_special_tokens=True)
    gold = [compute_score(t, r["reward_model"]["ground_truth"]) for t, r in zip(texts, rows, strict=True)]
    longer = [t.count("####") > 1 for t in texts]
    return {
        "accuracy": sum(gold) / len(gold),
        "continuation_rate": sum(longer) / len(longer),
        "response_length": out.response_lengths.float().mean().item(),
    }


def run_sft(cfg: SFTConfig, out_dir: Path, *, form: str = "a+b-c", log=print) -> dict:
    """Train the tiny policy and write it to `out_dir` as a Hugging Face folder."""
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    tokenizer = build_char_tokenizer()
    model = build_tiny_llama(tokenizer, seed=cfg.seed)
    pool = SFTExamples(tokenizer, make_arith_rows(POOL_SIZE, "train", cfg.seed, form=form))
    held_out = make_arith_rows(EVAL_SIZE, "val", cfg.seed + 1, form=form)
    optim = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)

    def schedule(s: int) -> float:  # linear warm-up, then cosine decay over cfg.steps
        return min(1.0, (s + 1) / max(1, cfg.warmup_steps)) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / cfg.steps)))

    sched = torch.optim.lr_scheduler.LambdaLR(optim, schedule)
    history, started, step = [], time.time(), 0
    for step in range(1, cfg.steps + 1):
        model.train()
        idx = torch.randint(len(pool), (cfg.batch_size,), generator=gen).tolist()
        cont = (torch.rand(cfg.batch_size, generator=gen) < cfg.continue_rate).tolist()
        partner = torch.randint(len(pool), (cfg.batch_size,), generator=gen).tolist()
        ids, labels = pool.batch(idx, cont, partner)
        loss = model(input_ids=ids, labels=labels, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        sched.step()
        optim.zero_grad(set_to_none=True)
        if step % cfg.eval_every == 0 or step == cfg.steps:
            stats = evaluate_policy(model, tokenizer, held_out, seed=cfg.seed)
            history.append({"step": step, "loss": loss.item(), **stats, "elapsed_s": time.time() - started})
            log(f"klguard sft: step {step} loss {loss.item():.3f} held-out accuracy {stats['accuracy']:.3f} "
                f"continuation {stats['continuation_rate']:.3f}")
            if stats["accuracy"] >= cfg.target_accuracy:
                break
    save_hf_folder(model, tokenizer, out_dir)
    final = history[-1] if history else {}
    if final.get("accuracy", 0.0) < cfg.target_accuracy:
        log(f"klguard sft: warning: accuracy {final.get('accuracy', 0.0):.3f} stayed below "
            f"sft.target_accuracy={cfg.target_accuracy} after {step} steps")
    return {"steps": step, "final": final, "history": history, "recipe": asdict(cfg)}
