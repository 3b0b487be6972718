"""How klguard runs a model over prompt + response rows, and the one place log-probs and entropy come from.

Rows are a left-padded prompt followed by a right-padded response; positions come from the attention mask, so a
padded row computes exactly what the same row alone would. `response_logits` is the plain forward (logits at the
positions that predict each response token); `klguard.ppo.shared_prefix` computes the same with a group's prompt
once. Both, and the rollout's sampling loop, turn logits into log-probs and entropy through `token_logprobs`,
which uses the chunked, -inf-safe `klguard.algo.loss` implementations.
"""

from __future__ import annotations

import torch
from torch import Tensor

from klguard.algo.loss import entropy_from_logits, logprobs_from_logits, token_logprobs_and_entropy
from klguard.model.forward_args import forward_args

__all__ = ["compute_logprobs", "critic_values", "forward_logits", "position_ids_from_mask", "prompt_runs",
           "response_logits", "run_rows", "token_logprobs"]


def position_ids_from_mask(mask: Tensor) -> Tensor:
    """Positions for left-padded rows: ``cumsum(mask) - 1`` clamped at 0."""
    return (mask.long().cumsum(-1) - 1).clamp_(min=0)


def prompt_runs(prompt_ids: Tensor, prompt_mask: Tensor) -> Tensor | None:
    """Lengths ``[G]`` (summing to ``B``) of the runs of identical consecutive prompts (ids and mask), as GRPO
    groups come; None when no two consecutive rows are equal (nothing to share)."""
    if prompt_ids.shape[0] < 2 or prompt_ids.shape[1] < 1:
        return None
    same = (prompt_ids[1:] == prompt_ids[:-1]).all(-1) & (prompt_mask[1:] == prompt_mask[:-1]).all(-1)
    if not bool(same.any()):
        return None
    starts = torch.cat([same.new_ones(1), ~same]).nonzero().squeeze(-1)
    return torch.diff(starts, append=starts.new_tensor([prompt_ids.shape[0]]))


def run_rows(lengths: Tensor) -> tuple[Tensor, Tensor]:
    """For run lengths ``[G]``: the first row of each run ``[G]`` and the run of each row ``[B]``."""
    starts = lengths.cumsum(0) - lengths
    return starts, torch.repeat_interleave(torch.arange(len(lengths), device=lengths.device), lengths,
                                           output_size=int(lengths.sum()))


def forward_logits(model: torch.nn.Module, ids: Tensor, mask: Tensor | None, pos: Tensor, keep: int,
                   cache: object | None = None) -> Tensor:
    """Logits of the last ``keep`` positions (only those go through the LM head when the model supports it)."""
    cache_kw, keep_kw, _ = forward_args(type(model))
    kwargs: dict = {"attention_mask": mask, "position_ids": pos, "use_cache": cache is not None}
    if cache is not None:
        kwargs[cache_kw] = cache
    if keep_kw is not None:
        kwargs[keep_kw] = keep
    logits = model(input_ids=ids, **kwargs).logits
    return logits[:, -keep:]


def response_logits(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, response_length: int
                    ) -> Tensor:
    """``[B, R, V]`` logits at positions ``-R-1 .. -2`` of ``input_ids``: those that predict the response tokens."""
    pos = position_ids_from_mask(attention_mask)
    return forward_logits(model, input_ids, attention_mask, pos, response_length + 1)[:, :-1]


def token_logprobs(logits: Tensor, tokens: Tensor, temperature: float = 1.0, *, return_entropy: bool = False,
                   entropy_grad: bool = True) -> Tensor | tuple[Tensor, Tensor]:
    """Log-probs of ``tokens`` under ``softmax(logits / temperature)`` (computed in fp32), and its entropy when
    ``return_entropy`` (``entropy_grad=False``: outside autograd). Unless the entropy needs its gradient, one
    chunked pass computes both (``klguard.algo.loss.token_logprobs_and_entropy``: the same numbers, without
    vocabulary-sized float32 temporaries)."""
    if not (return_entropy and entropy_grad and torch.is_grad_enabled() and logits.requires_grad):
        logprobs, entropy = token_logprobs_and_entropy(logits, tokens, temperature, entropy=return_entropy)
        return (logprobs, entropy) if return_entropy else logprobs
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    logprobs = logprobs_from_logits(logits, tokens)
    if not return_entropy:
        return logprobs
    return logprobs, entropy_from_logits(logits if entropy_grad else logits.detach())


def compute_logprobs(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, response_length: int,
                     temperature: float = 1.0, *, return_entropy: bool = False, entropy_grad: bool = True
                     ) -> Tensor | tuple[Tensor, Tensor]:
    """Log-probs ``[B, R]`` of the last ``R = response_length`` tokens of ``input_ids`` (and the entropy ``[B, R]``
    with ``return_entropy``) from one plain forward; grad follows the caller's mode."""
    logits = response_logits(model, input_ids, attention_mask, response_length)
    return token_logprobs(logits, input_ids[:, -response_length:], temperature, return_entropy=return_entropy,
                          entropy_grad=entropy_grad)


def critic_values(critic: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, response_length: int) -> Tensor:
    """Value of the state before each response token: the one-label outputs at positions -R-1 .. -2, as verl (one
    plain forward; ``klguard.ppo.shared_prefix.shared_prefix_values`` computes the same with a group's prompt
    once)."""
    out = critic(input_ids=input_ids, attention_mask=attention_mask,
                 position_ids=position_ids_from_mask(attention_mask), use_cache=False)
    return out.logits[:, -response_length - 1 : -1, 0].float()
