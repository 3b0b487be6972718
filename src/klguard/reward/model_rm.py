"""A reward model RM(q, o): an `AutoModelForSequenceClassification` (one label) from a local folder.

As verl does when the RM's tokenizer differs from the policy's, each prompt (its chat messages) and
decoded response are re-rendered with the RM's own chat template (`[*prompt, {assistant: response}]`)
and re-tokenised; an RM tokenizer without a template reads `prompt text + response`. Sequences are
right-padded and scored in micro-batches of `reward_model.micro_batch_size_per_gpu`; longer than
`reward_model.max_length` keeps the end (the score sits on the last token). `ModelReward.score` can also return the
final hidden state at that token (`output_hidden_states`), the features klguard.reward.rm_outliers measures.

Reward models that differ only in their score head (the built-in probe RM and its audit RM: heads fit on one frozen
body; an ensemble of heads) share one body (`share_body`): the others become `SharedHead`s, scored by their own head
on the hidden states of the body's forward over the same texts. One forward serves them all and one copy of the body
is kept; the scores are those of each model's own forward (the same body, inputs and head operation).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from klguard.config.schema import Config
from klguard.errors import UserError
from klguard.model.loading import (
    apply_precision,
    check_architecture,
    check_model_folder,
    hf_config,
    hf_load,
    precision_scope,
    set_pad_token,
)

KEY = "reward_model.model.path"


def render_chat(tokenizer, prompt: Sequence[dict[str, str]], response: str) -> str:
    """The text a reward model reads: the chat with the response as the assistant's turn (its template), else the
    messages and the response one per line."""
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template([*prompt, {"role": "assistant", "content": response}], tokenize=False)
    return "\n".join(m["content"] for m in prompt) + "\n" + response


def scored_positions(input_ids: torch.Tensor, pad_token_id: int | None) -> torch.Tensor:
    """Each row's token whose logit a Hugging Face sequence classifier returns: the rightmost token that is not the
    pad token (the last position without a pad id)."""
    if pad_token_id is None:
        return torch.full((len(input_ids),), input_ids.shape[-1] - 1, device=input_ids.device)
    non_pad = (input_ids != pad_token_id).to(torch.int32)
    return (torch.arange(input_ids.shape[-1], device=input_ids.device, dtype=torch.int32) * non_pad).argmax(-1)


@dataclass
class _Pass:
    """One micro-batch's forward: its scores [n], the score head's input [n, T, H] (kept only for shared heads), the
    scored positions [n], and the features [n, H] where asked for."""

    scores: torch.Tensor
    hidden: torch.Tensor | None
    positions: torch.Tensor
    features: torch.Tensor | None


class ModelReward:
    """One reward model: a user's folder (`user`: `reward_model.model.*` applies), or a built-in learned RM's."""

    def __init__(self, config: Config, device: torch.device, folder: Path, *, user: bool, key: str = KEY) -> None:
        """`key`: the config key that named the folder, for errors."""
        rm = config.reward_model
        folder = check_model_folder(folder, key) if user else folder
        trust = rm.model.trust_remote_code and user
        self.tokenizer = set_pad_token(hf_load(AutoTokenizer.from_pretrained, folder, key, trust_remote_code=trust),
                                       key)
        self.tokenizer.padding_side, self.tokenizer.truncation_side = "right", "left"
        hf_cfg = hf_config(folder, rm.model.override_config if user else {}, trust, key)
        check_architecture(hf_cfg, ("ForSequenceClassification",), key, folder, "sequence-classification model")
        if hf_cfg.num_labels != 1:
            raise UserError(f"{key}={folder} has {hf_cfg.num_labels} labels; a reward model has one")
        if hf_cfg.pad_token_id is None:  # HF finds each sequence's last token through the pad id
            hf_cfg.pad_token_id = self.tokenizer.pad_token_id
        model = hf_load(AutoModelForSequenceClassification.from_pretrained, folder, key, config=hf_cfg,
                        dtype=torch.float32, trust_remote_code=trust)
        self.model = apply_precision(model.to(device).eval().requires_grad_(False),
                                     config.actor_rollout_ref.actor.fsdp_config.dtype, device)
        self.device = device
        self.pad_token_id = model.config.get_text_config().pad_token_id
        self.micro_batch = rm.micro_batch_size_per_gpu
        self.max_length = rm.max_length
        self.keep_hidden = False  # set by a SharedHead: keep the score head's input of the latest forward
        self._latest: tuple[list[str], list[_Pass]] | None = None  # (texts, passes) of the latest forward

    def render(self, prompt: Sequence[dict[str, str]], response: str) -> str:
        return render_chat(self.tokenizer, prompt, response)

    def __call__(self, prompts: Sequence[Sequence[dict[str, str]]], responses: Sequence[str]) -> torch.Tensor:
        """One float score per (prompt, response), on the CPU."""
        return self.score(prompts, responses)[0]

    @torch.no_grad()
    def score(self, prompts: Sequence[Sequence[dict[str, str]]], responses: Sequence[str], *,
              features: bool = False, head: torch.nn.Module | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The scores and, with `features`, each sequence's final hidden state [N, H] (float32, CPU) at the token the
        score is read from (klguard.reward.rm_outliers measures them); the scores are the same either way. `head`: a
        SharedHead's score head, read on this body's hidden states (those of the latest forward where it scored the
        same texts)."""
        texts = [self.render(p, r) for p, r in zip(prompts, responses, strict=True)]
        latest = self._latest
        if head is not None and not features and latest is not None and latest[0] == texts:
            passes = latest[1]
        else:
            passes = self._forward(texts, features=features)  # a SharedHead's body keeps its hidden states
            self._latest = (texts, passes) if self.keep_hidden else None
        if not passes:
            return torch.zeros(0), None
        if head is None:
            scores = [p.scores for p in passes]
        else:
            with precision_scope(self.model):
                scores = [head(p.hidden)[torch.arange(len(p.positions)), p.positions, 0].float().cpu()
                          for p in passes]
        return torch.cat(scores), torch.cat([p.features for p in passes]) if features else None

    def _forward(self, texts: list[str], *, features: bool) -> list[_Pass]:
        """The model over `texts` in micro-batches; with `keep_hidden`, each pass keeps its score-head input."""
        step = self.micro_batch or max(1, len(texts))
        # a chat template writes its own special tokens; plain text gets the tokenizer's (e.g. BOS)
        special = not self.tokenizer.chat_template
        captured: list[torch.Tensor] = []
        keep_hidden = self.keep_hidden
        hook = self.model.score.register_forward_hook(lambda _m, args, _out: captured.append(args[0])) \
            if keep_hidden else None
        passes = []
        try:
            for start in range(0, len(texts), step):
                enc = self.tokenizer(texts[start : start + step], padding=True, return_tensors="pt",
                                     add_special_tokens=special, truncation=self.max_length is not None,
                                     max_length=self.max_length)
                ids = enc["input_ids"].to(self.device)
                out = self.model(input_ids=ids, attention_mask=enc["attention_mask"].to(self.device),
                                 output_hidden_states=features)
                positions = scored_positions(ids, self.pad_token_id)
                rows = torch.arange(len(ids), device=ids.device)
                states = out.hidden_states[-1][rows, positions].float().cpu() if features else None
                passes.append(_Pass(out.logits[:, 0].float().cpu(), captured.pop() if keep_hidden else None,
                                    positions, states))
        finally:
            if hook is not None:
                hook.remove()
        return passes


class SharedHead:
    """A reward model that differs from `body` only in its score head: its scores are that head on the hidden states
    of `body`'s forward (the latest one where it scored the same texts), without a copy of the body."""

    def __init__(self, body: ModelReward, head: torch.nn.Module) -> None:
        self.body, self.head = body, head
        body.keep_hidden = True

    def __call__(self, prompts: Sequence[Sequence[dict[str, str]]], responses: Sequence[str]) -> torch.Tensor:
        return self.body.score(prompts, responses, head=self.head)[0]


def same_body(a: ModelReward, b: ModelReward) -> bool:
    """Whether `a` and `b` read the same text with the same weights but for their `score` head (a linear layer on
    the final hidden states, as Hugging Face's decoder sequence classifiers have)."""
    if type(a.model) is not type(b.model) or not isinstance(getattr(a.model, "score", None), torch.nn.Linear):
        return False
    if (a.max_length, a.micro_batch, a.pad_token_id, a.device) != (b.max_length, b.micro_batch, b.pad_token_id,
                                                                    b.device):
        return False
    if getattr(a.model, "klguard_autocast", None) != getattr(b.model, "klguard_autocast", None):
        return False
    ta, tb = a.tokenizer, b.tokenizer
    if (type(ta), ta.chat_template, ta.all_special_tokens) != (type(tb), tb.chat_template, tb.all_special_tokens) \
            or ta.get_vocab() != tb.get_vocab():
        return False
    sa, sb = a.model.state_dict(), b.model.state_dict()
    body = [k for k in sa if not k.startswith("score.")]
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in body)


def share_body(body: ModelReward, other: ModelReward) -> ModelReward | SharedHead:
    """`other` as a SharedHead on `body` where the two share their body (its own copy is then dropped), else
    `other` itself."""
    return SharedHead(body, other.model.score) if other is not body and same_body(body, other) else other
