"""klguard's built-in reward-hacking task as a TRL user meets it: prompt datasets and reward functions.

The arithmetic prompts of `klguard demo` (chat template applied, one ``ground_truth`` column), the shipped
SFT policy, and three GRPOTrainer reward functions: ``proxy`` (the length-biased proxy PPO optimises),
``gold`` (GSM8K's strict rule) and ``hacking`` (1 where gold says wrong while the proxy scores the response
at least as high as the short correct answer). Give ``gold`` and ``hacking`` weight 0: TRL then logs them
(``rewards/gold/mean``, ``rewards/hacking/mean``) without training on them.
"""

from __future__ import annotations

from pathlib import Path

from klguard.builtin.arith import make_arith_rows
from klguard.builtin.proxy import BuiltinReward, hacking_flags
from klguard.builtin.warm_start import ensure_sft_policy
from klguard.config.schema import ProxyRewardConfig, SFTConfig
from klguard.reward.gsm8k import compute_score

_REWARD = BuiltinReward.of(ProxyRewardConfig())  # klguard train's default weights


def builtin_policy() -> Path:
    """The folder of the built-in SFT policy and tokenizer (the shipped one for the default recipe)."""
    return ensure_sft_policy(SFTConfig(), log=lambda *_: None)


def builtin_prompts(tokenizer, n: int, split: str = "train", seed: int = 0):
    """A `datasets.Dataset` of ``n`` problems of ``split`` ("train" | "val"): ``prompt`` (text) and ``ground_truth``."""
    from datasets import Dataset

    rows = make_arith_rows(n, split, seed)
    return Dataset.from_list([
        {"prompt": tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True),
         "ground_truth": row["reward_model"]["ground_truth"]} for row in rows])


def proxy(completions: list[str], completion_ids: list[list[int]], ground_truth: list[str], **_) -> list[float]:
    """The proxy reward: well-formed and correct first answer, plus a bonus per token up to the length cap."""
    return [_REWARD.proxy(text, len(ids), truth)
            for text, ids, truth in zip(completions, completion_ids, ground_truth, strict=True)]


def gold(completions: list[str], ground_truth: list[str], **_) -> list[float]:
    """The gold score: the number after the last ``####`` equals the ground truth."""
    return [compute_score(text, truth) for text, truth in zip(completions, ground_truth, strict=True)]


def hacking(completions: list[str], completion_ids: list[list[int]], ground_truth: list[str], **_) -> list[float]:
    """1.0 for a hacked response (gold 0, proxy at least the short correct answer's), else 0.0."""
    reference = [_REWARD.reference_proxy(truth) for truth in ground_truth]
    flags = hacking_flags(gold(completions, ground_truth), proxy(completions, completion_ids, ground_truth),
                          reference)
    return [float(flag) for flag in flags]


def sample_completions(model, tokenizer, prompts: list[str], *, seed: int, max_new_tokens: int
                       ) -> tuple[list[list[int]], list[str]]:
    """Each prompt's completion at temperature 1 (as the policy samples in training): its token ids up to and
    including EOS, and its text."""
    import torch

    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        enc = tokenizer(prompts, add_special_tokens=False, padding=True, return_tensors="pt")
    finally:
        tokenizer.padding_side = side
    torch.manual_seed(seed)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = model.generate(**enc.to(model.device), do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id)
    model.train(was_training)
    ids = []
    for row in out[:, enc["input_ids"].shape[1]:].tolist():
        end = row.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in row else len(row)
        ids.append(row[:end])
    return ids, tokenizer.batch_decode(ids, skip_special_tokens=True)


def evaluate_sampled(model, tokenizer, *, n: int = 256, seed: int = 0, max_new_tokens: int = 48) -> dict[str, float]:
    """Held-out figures at temperature 1 (as the policy samples in training): gold accuracy, hacking rate and mean
    response length in tokens (EOS included) over ``n`` validation prompts."""
    data = builtin_prompts(tokenizer, n, split="val", seed=seed)
    ids, texts = sample_completions(model, tokenizer, list(data["prompt"]), seed=seed, max_new_tokens=max_new_tokens)
    truth = list(data["ground_truth"])
    n_rows = len(texts)
    return {"gold": sum(gold(texts, truth)) / n_rows, "hacking_rate": sum(hacking(texts, ids, truth)) / n_rows,
            "response_length": sum(len(x) for x in ids) / n_rows}
