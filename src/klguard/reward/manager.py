"""Scores a batch of responses: the score PPO optimises, and the gold score that measures hacking.

Sources, as verl picks them: a user's `custom_reward_function` file, else the rule reward chosen by
`data_source`. With `proxy_reward.enable` (the built-in demo) PPO optimises the built-in task's length-biased
proxy and the rule score becomes the gold score: the gap between them is the hacking signal. The task's scoring
comes from above (`TaskReward`, implemented by klguard.builtin), so this layer never imports the task.

With `reward_model.enable` PPO optimises `RM(q, o) - length_penalty * |o| + rule_weight * rule`
(verl: the RM score alone). The rule score, where one exists (a custom function, or a data source
with a known rule), is the gold score; a response hacks when gold says wrong and its score is at
least the mean score of the batch's gold-correct responses. The built-in learned RM
(`proxy_reward.kind=learned_rm`, klguard.builtin) scores the same way; its hacking yardstick is
per prompt, as the length proxy's: the RM's score of the short correct answer `#### <answer>` (defined
also when no response of the batch is correct, which is where a collapsed run ends).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from klguard.config.schema import Config
from klguard.errors import UserError
from klguard.reward.registry import DEFAULT_RULES, RuleReward, ScoreFn

AUDIT_KEY = "reward_model.audit_model.path"


@dataclass
class RewardOutput:
    scores: torch.Tensor  # [N] what PPO optimises
    gold: torch.Tensor | None  # [N] the true score, where one exists
    hacked: torch.Tensor | None  # [N] bool: gold says wrong, the proxy scores it at least as a correct answer
    spread: torch.Tensor | None = None  # [N] an RM ensemble's disagreement (standard deviation over members)
    rm_scores: torch.Tensor | None = None  # [N] the optimised reward model's own score (before penalties, rules)
    audit: torch.Tensor | None = None  # [N] the audit reward model's score (never optimised)
    features: torch.Tensor | None = None  # [N, H] the reward model's last-layer features (klguard.reward.rm_outliers)
    extra: dict[str, torch.Tensor] | None = None  # [N] each number the custom function's dicts returned (GDPO's keys)


class TaskReward(Protocol):
    """The built-in task's side of scoring: its proxy, the short correct answer whose score is a prompt's hacking
    yardstick, and the rule that flags a response against that yardstick."""

    def proxy(self, text: str, n_tokens: int, ground_truth: str) -> float:
        """The proxy score of one response of `n_tokens` tokens (EOS included)."""
        ...

    def reference_proxy(self, ground_truth: str, tokenizer: Any) -> float:
        """The proxy score of the prompt's short correct answer."""
        ...

    def reference_response(self, ground_truth: str) -> str:
        """The prompt's short correct answer, which a reward model scores for the yardstick."""
        ...

    def hacked(self, gold: torch.Tensor, scores: torch.Tensor, yardstick: torch.Tensor) -> torch.Tensor:
        """Flags (bool) of the responses that hack: gold says wrong, the score reaches the yardstick."""
        ...

    def gold_rules(self) -> Mapping[str, ScoreFn]:
        """Gold rules of the task's own data sources, beside the default table's (klguard.reward.registry)."""
        ...


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


def proxy_enabled(config: Config) -> bool:
    """proxy_reward.enable, where null means: on for the built-in task, unless a reward model scores."""
    if config.proxy_reward.enable is not None:
        return config.proxy_reward.enable
    return config.data.train_files is None and not config.reward_model.enable


def hacked_by_model(gold: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Gold says wrong while the score reaches the mean score of the batch's gold-correct responses."""
    correct = gold > 0
    if not correct.any():
        return torch.zeros_like(correct)
    return ~correct & (scores >= scores[correct].mean())


def audit_model(config: Config, device: torch.device, learned_rm: Path | None, body=None):
    """The audit RM of `reward_model.audit_model.path` (a user's folder), else the built-in learned RM's `audit/`
    folder (one RM or an ensemble, whose mean scores) where it has one, else None. Called as the reward model is:
    (prompts, responses) -> [N] scores. One that differs from `body` (the reward model's) only in its score head is
    read on `body`'s forward (a ModelReward: klguard.reward.model_rm.share_body)."""
    from klguard.reward.ensemble import RewardEnsemble, member_folders
    from klguard.reward.model_rm import ModelReward, share_body

    path = config.reward_model.audit_model.path
    if path is not None:
        audit = ModelReward(config, device, Path(path).expanduser(), user=True, key=AUDIT_KEY)
        return share_body(body, audit) if body is not None else audit
    if learned_rm is not None and (learned_rm / "audit").is_dir():
        ensemble = RewardEnsemble(config, device, member_folders(learned_rm / "audit"), user=False)
        if body is not None and len(ensemble.members) == 1:
            return share_body(body, ensemble.body)
        return lambda prompts, responses: ensemble(prompts, responses).scores
    return None


class RewardManager:
    """`learned_rm`: the built-in learned reward model's folder (proxy_reward.kind=learned_rm), which then scores;
    `task_reward`: the built-in task's scoring, needed with the proxy on or a learned RM."""

    def __init__(self, config: Config, tokenizer, *, device: torch.device | None = None,
                 learned_rm: Path | None = None, task_reward: TaskReward | None = None) -> None:
        self.proxy_on = proxy_enabled(config)
        if (self.proxy_on or learned_rm is not None) and task_reward is None:
            raise ValueError("the proxy reward and the learned RM score with the built-in task's TaskReward: "
                             "pass task_reward")
        self.task = task_reward
        self.rules = RuleReward({**DEFAULT_RULES, **(task_reward.gold_rules() if task_reward is not None else {})})
        self.tokenizer = tokenizer
        crf = config.custom_reward_function
        self.custom = load_custom_reward(crf.path, crf.name) if crf.path else None
        self.custom_kwargs = dict(crf.reward_kwargs)
        self.rm_cfg = config.reward_model
        self._extra: list[dict[str, float]] = []
        self._rows = 0
        self.model = self.audit = None
        self.learned_rm = learned_rm is not None
        self._yardsticks: dict[bytes, float] = {}  # the learned RM's yardstick by (prompt, answer): see _yardstick
        if config.reward_model.enable or learned_rm is not None:
            from klguard.distributed.context import resolve_device
            from klguard.reward.ensemble import RewardEnsemble, member_folders, user_rm_folders

            folders = user_rm_folders(config.reward_model.model.path) if learned_rm is None \
                else member_folders(learned_rm)
            device = device or resolve_device(config.trainer.device)
            self.model = RewardEnsemble(config, device, folders, user=learned_rm is None)
            self.audit = audit_model(config, device, learned_rm, self.model.body)

    def _rule(self, i: int, data_source: str, text: str, ground_truth: str, extra_info: Any) -> float:
        try:
            if self.custom is not None:
                result = self.custom(data_source, text, ground_truth, extra_info, **self.custom_kwargs)
                if isinstance(result, dict):
                    self._extra.append({k: float(v) for k, v in result.items() if isinstance(v, (int, float, bool))})
                value = result["score"] if isinstance(result, dict) else result
            else:
                value = self.rules(data_source, text, ground_truth)
            value = float(value)
        except Exception as exc:
            raise UserError(f"reward function failed on sample {i} (data_source={data_source}): "
                            f"{type(exc).__name__}: {exc}") from None
        return value  # a NaN/Inf is caught by the trainer, which skips the step and logs it

    def _rules(self, texts, data_sources, ground_truths, extra_infos) -> list[float]:
        return [self._rule(i, ds, t, gt, ex) for i, (t, ds, gt, ex)
                in enumerate(zip(texts, data_sources, ground_truths, extra_infos, strict=True))]

    def _extras(self) -> dict[str, torch.Tensor] | None:
        """The numbers every row's dict holds, one tensor per key (None without dicts)."""
        rows = self._extra
        if not rows or len(rows) != self._rows:
            return None
        keys = [k for k in rows[0] if all(k in r for r in rows)]
        return {k: torch.tensor([r[k] for r in rows]) for k in keys}

    def _with_model(self, texts, n_tokens, data_sources, ground_truths, extra_infos, prompts, features: bool
                    ) -> RewardOutput:
        if prompts is None:
            raise ValueError("a reward model needs the prompts")
        lengths = torch.tensor([float(n) for n in n_tokens])
        rm = self.model(prompts, texts, features=features)
        audit = self.audit(prompts, texts) if self.audit is not None else None
        scores = rm.scores - self.rm_cfg.length_penalty * lengths
        has_rule = self.custom is not None or all(ds in self.rules for ds in data_sources)
        if not has_rule and self.rm_cfg.rule_weight == 0:
            return RewardOutput(scores, None, None, rm.spread, rm.scores, audit, rm.features)
        gold = torch.tensor(self._rules(texts, data_sources, ground_truths, extra_infos))
        scores = scores + self.rm_cfg.rule_weight * gold
        if self.learned_rm:  # the built-in task: the yardstick is the RM's score of the short correct answer
            yardstick = self._yardstick(prompts, ground_truths)
            hacked = self.task.hacked(gold, scores, yardstick + self.rm_cfg.rule_weight)
            return RewardOutput(scores, gold, hacked, rm.spread, rm.scores, audit, rm.features)
        return RewardOutput(scores, gold, hacked_by_model(gold, scores), rm.spread, rm.scores, audit, rm.features)

    def _yardstick(self, prompts: Sequence[Sequence[dict[str, str]]], ground_truths: Sequence[str]) -> torch.Tensor:
        """The reward model's score of each prompt's short correct answer. The model is frozen, so each distinct
        (prompt, answer) is scored once a run (a group's rollouts share theirs) and kept."""
        keys = [hashlib.sha1(json.dumps([p, gt], sort_keys=True, default=str).encode()).digest()
                for p, gt in zip(prompts, ground_truths, strict=True)]
        new = {k: (p, gt) for k, p, gt in zip(keys, prompts, ground_truths, strict=True) if k not in self._yardsticks}
        if new:
            scores = self.model([p for p, _ in new.values()],
                                [self.task.reference_response(gt) for _, gt in new.values()]).scores
            self._yardsticks.update(zip(new, scores.tolist(), strict=True))
        return torch.tensor([self._yardsticks[k] for k in keys])

    def __call__(self, texts: Sequence[str], n_tokens: Sequence[int], data_sources: Sequence[str],
                 ground_truths: Sequence[str], extra_infos: Sequence[Any],
                 prompts: Sequence[Sequence[dict[str, str]]] | None = None, *, features: bool = False
                 ) -> RewardOutput:
        """`prompts` (each row's chat messages) are needed only by a reward model. `features`: with a reward model,
        also its last-layer features (`RewardOutput.features`; an ensemble's first member's)."""
        self._extra, self._rows = [], len(texts)  # the custom function's dicts of this call, one per row
        if self.model is not None:
            out = self._with_model(texts, n_tokens, data_sources, ground_truths, extra_infos, prompts, features)
            out.extra = self._extras()
            return out
        rule = self._rules(texts, data_sources, ground_truths, extra_infos)
        if not self.proxy_on:
            return RewardOutput(torch.tensor(rule), None, None, extra=self._extras())
        proxy = [self.task.proxy(t, n, gt) for t, n, gt in zip(texts, n_tokens, ground_truths, strict=True)]
        yardstick = [self.task.reference_proxy(gt, self.tokenizer) for gt in ground_truths]
        scores, gold = torch.tensor(proxy), torch.tensor(rule)
        return RewardOutput(scores, gold, self.task.hacked(gold, scores, torch.tensor(yardstick)), extra=self._extras())
