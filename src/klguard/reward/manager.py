"""Scores a batch of responses: the score PPO optimises, and the gold score that measures hacking.

Sources, as verl picks them: a user's `custom_reward_function` file, else the rule reward chosen by
`data_source`. With `proxy_reward.enable` (the built-in demo) PPO optimises the length-biased proxy
and the rule score becomes the gold score: the gap between them is the hacking signal.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from klguard.config.schema import Config
from klguard.errors import UserError
from klguard.reward.proxy import hacking_flags, proxy_score, reference_proxy_score
from klguard.reward.registry import compute_gold_score


@dataclass
class RewardOutput:
    scores: torch.Tensor  # [N] what PPO optimises
    gold: torch.Tensor | None  # [N] the true score, where one exists
    hacked: torch.Tensor | None  # [N] bool: gold says wrong, the proxy scores it at least as a correct answer


def load_custom_reward(path: str, name: str) -> Callable[..., Any]:
    """Import the user's reward file (the only user code klguard runs) and return the named function."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise UserError(f"custom_reward_function.path={path} does not exist")
    spec = importlib.util.spec_from_file_location(f"klguard_custom_reward_{abs(hash(str(file)))}", file)
    if spec is None or spec.loader is None:
        raise UserError(f"custom_reward_function.path={path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise UserError(f"custom_reward_function.path={path} failed to import: {type(exc).__name__}: {exc}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise UserError(f"custom_reward_function.name={name} is not a function in {path}")
    return fn


class RewardManager:
    def __init__(self, config: Config, tokenizer) -> None:
        self.proxy = config.proxy_reward
        self.tokenizer = tokenizer
        crf = config.custom_reward_function
        self.custom = load_custom_reward(crf.path, crf.name) if crf.path else None

    def _rule(self, i: int, data_source: str, text: str, ground_truth: str, extra_info: Any) -> float:
        try:
            if self.custom is not None:
                result = self.custom(data_source, text, ground_truth, extra_info)
                value = result["score"] if isinstance(result, dict) else result
            else:
                value = compute_gold_score(data_source, text, ground_truth)
            value = float(value)
        except Exception as exc:
            raise UserError(f"reward function failed on sample {i} (data_source={data_source}): "
                            f"{type(exc).__name__}: {exc}") from None
        if not math.isfinite(value):
            raise UserError(f"reward function returned {value} on sample {i} (data_source={data_source})")
        return value

    def __call__(self, texts: Sequence[str], n_tokens: Sequence[int], data_sources: Sequence[str],
                 ground_truths: Sequence[str], extra_infos: Sequence[Any]) -> RewardOutput:
        rule = [self._rule(i, ds, t, gt, ex) for i, (t, ds, gt, ex)
                in enumerate(zip(texts, data_sources, ground_truths, extra_infos, strict=True))]
        if not self.proxy.enable:
            return RewardOutput(torch.tensor(rule), None, None)
        weights = {"format_weight": self.proxy.format_weight, "correct_weight": self.proxy.correct_weight,
                   "length_weight": self.proxy.length_weight, "length_cap": self.proxy.length_cap}
        proxy = [proxy_score(t, n, gt, **weights) for t, n, gt in zip(texts, n_tokens, ground_truths, strict=True)]
        yardstick = [reference_proxy_score(gt, self.tokenizer, **weights) for gt in ground_truths]
        scores, gold = torch.tensor(proxy), torch.tensor(rule)
        return RewardOutput(scores, gold, hacking_flags(gold, scores, torch.tensor(yardstick)))
