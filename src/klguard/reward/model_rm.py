"""A reward model RM(q, o): an `AutoModelForSequenceClassification` (one label) from a local folder.

As verl does when the RM's tokenizer differs from the policy's, each prompt (its chat messages) and
decoded response are re-rendered with the RM's own chat template (`[*prompt, {assistant: response}]`)
and re-tokenised; an RM tokenizer without a template reads `prompt text + response`. Sequences are
right-padded and scored in micro-batches of `reward_model.micro_batch_size_per_gpu`; longer than
`reward_model.max_length` keeps the end (the score sits on the last token). `ModelReward.score` can also return the
final hidden state at that token (`output_hidden_states`), the features klguard.reward.rm_outliers measures.
"""

from __future__ import annotations

from collections.abc import Sequence
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

    def render(self, prompt: Sequence[dict[str, str]], response: str) -> str:
        return render_chat(self.tokenizer, prompt, response)

    def __call__(self, prompts: Sequence[Sequence[dict[str, str]]], responses: Sequence[str]) -> torch.Tensor:
        """One float score per (prompt, response), on the CPU."""
        return self.score(prompts, responses)[0]

    @torch.no_grad()
    def score(self, prompts: Sequence[Sequence[dict[str, str]]], responses: Sequence[str], *,
              features: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The scores and, with `features`, each sequence's final hidden state [N, H] (float32, CPU) at the token the
        score is read from (klguard.reward.rm_outliers measures them); the scores are the same either way."""
        texts = [self.render(p, r) for p, r in zip(prompts, responses, strict=True)]
        step = self.micro_batch or max(1, len(texts))
        # a chat template writes its own special tokens; plain text gets the tokenizer's (e.g. BOS)
        special = not self.tokenizer.chat_template
        scores, states = [], []
        for start in range(0, len(texts), step):
            enc = self.tokenizer(texts[start : start + step], padding=True, return_tensors="pt",
                                 add_special_tokens=special, truncation=self.max_length is not None,
                                 max_length=self.max_length)
            ids = enc["input_ids"].to(self.device)
            out = self.model(input_ids=ids, attention_mask=enc["attention_mask"].to(self.device),
                             output_hidden_states=features)
            scores.append(out.logits[:, 0].float().cpu())
            if features:
                rows = torch.arange(len(ids), device=ids.device)
                states.append(out.hidden_states[-1][rows, scored_positions(ids, self.pad_token_id)].float().cpu())
        if not scores:
            return torch.zeros(0), None
        return torch.cat(scores), torch.cat(states) if features else None
