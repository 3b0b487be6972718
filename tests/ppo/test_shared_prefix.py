"""Tests for klguard.ppo.shared_prefix: prompt computed once per group, same numbers (and gradients) as one forward."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaForCausalLM, LlamaForTokenClassification

from klguard.builtin.char_tokenizer import build_char_tokenizer
from klguard.builtin.tiny import build_tiny_llama, tiny_llama_config
from klguard.model.loading import enable_checkpointing
from klguard.ppo.forward import compute_logprobs, critic_values
from klguard.ppo.shared_prefix import (
    prompt_groups,
    shared_prefix_forward,
    shared_prefix_logprobs,
    shared_prefix_values,
    unsupported_reason,
)
from tolerances import float32_tol, forward_terms

ARCH = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "intermediate_size": 128, "max_position_embeddings": 128}
PAD = 0
# Gradients: the shared path sums a group's prompt gradients in another order than one full backward. Each entry
# of a parameter's gradient is a sum over the batch's B x (P + R) token positions; reordering a sum of n float32
# terms moves it by at most about n * eps32 * (the terms' scale), and the terms' scale is bounded by the largest
# entry of that parameter's gradient. So the tolerance is absolute, per parameter, at n * eps32 * max|grad|: a
# per-element relative tolerance would fail on entries that are small only through cancellation (seen: an entry
# of -0.0103 in a bias gradient whose largest entry is 20.2 moved by 3e-6 on one CPU, 1.2 eps32 x 20.2).
# Outputs (log-probs, entropies, values): the shared path runs the prompt and the responses as two forwards, so each
# output moves by at most about forward_terms(model) x eps32 x the outputs' scale (tests/tolerances.py): 1.1e-4
# (Llama) and 2.1e-4 (GPT-2) on log-probs of |lp| <= 3.6. The smallest bug effect seen is 8x that: responses placed
# one position off their prompt move Llama's log-probs by 9e-4 (RoPE sees only relative positions, and the random
# weights are small); GPT-2's by 0.57; another group's prompt moves them by 0.2 to 0.5.

# (run lengths, each group's prompt length, response lengths or None for full width); P = 9, R = 7
LAYOUTS = {
    "groups_of_4": ([4, 4, 4], [9, 5, 2], [7, 3, 1, 5, 7, 7, 2, 6, 4, 7, 1, 3]),
    "mixed_1_3_4": ([1, 3, 4], [4, 9, 6], [5, 7, 2, 1, 6, 7, 3, 4]),
    "no_padding": ([4, 4], [9, 9], None),
}
P, R = 9, 7


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def _llama(tokenizer, kv_heads: int = 4) -> LlamaForCausalLM:
    if kv_heads == ARCH["num_heads"]:
        return build_tiny_llama(tokenizer, seed=0, **ARCH)
    config = tiny_llama_config(tokenizer, **ARCH)
    config.num_key_value_heads = kv_heads
    torch.manual_seed(1)
    return LlamaForCausalLM(config)


def _gpt2(tokenizer) -> GPT2LMHeadModel:
    torch.manual_seed(2)
    return GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=64, n_layer=2, n_head=4, n_positions=128,
                                      pad_token_id=PAD, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


ACTORS = {"llama": _llama, "llama_gqa": lambda tok: _llama(tok, kv_heads=2), "gpt2": _gpt2}


@pytest.fixture(scope="module", params=list(ACTORS))
def actor(request, tokenizer):
    return ACTORS[request.param](tokenizer).train()


@pytest.fixture(scope="module")
def critic(tokenizer) -> LlamaForTokenClassification:
    config = tiny_llama_config(tokenizer, **ARCH)
    config.num_labels, config.classifier_dropout = 1, 0.0  # as klguard.model.loading.load_critic
    torch.manual_seed(3)
    return LlamaForTokenClassification(config).train()  # random (non-zero) value head


def make_batch(runs: list[int], prompt_lens: list[int], resp_lens: list[int] | None, seed: int = 0):
    """``[B, P + R]`` ids and mask: group g repeats one left-padded prompt of ``prompt_lens[g]`` tokens ``runs[g]``
    times; each row's response is right-padded after ``resp_lens[row]`` tokens (token ids 3..20)."""
    gen = torch.Generator().manual_seed(seed)
    bsz = sum(runs)
    ids = torch.full((bsz, P + R), PAD, dtype=torch.long)
    mask = torch.zeros(bsz, P + R, dtype=torch.long)
    row = 0
    for run, plen in zip(runs, prompt_lens, strict=True):
        prompt = torch.randint(3, 21, (plen,), generator=gen)
        for _ in range(run):
            ids[row, P - plen : P], mask[row, P - plen : P] = prompt, 1
            rlen = R if resp_lens is None else resp_lens[row]
            ids[row, P : P + rlen] = torch.randint(3, 21, (rlen,), generator=gen)
            mask[row, P : P + rlen] = 1
            row += 1
    return ids, mask


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def _assert_same_grads(model: torch.nn.Module, unshared: dict, shared: dict, positions: int) -> None:
    """Same gradients up to reordering a sum over `positions` token positions (see "Gradients" above)."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert sorted(unshared) == sorted(shared) == sorted(names)  # every parameter gets a gradient on both paths
    for name in names:
        torch.testing.assert_close(shared[name], unshared[name], rtol=0.0, atol=float32_tol(unshared[name], positions),
                                   msg=lambda m, n=name: f"{n}: {m}")


def _assert_same_outputs(shared: torch.Tensor, unshared: torch.Tensor, model: torch.nn.Module) -> None:
    """Same outputs up to the two paths' rounding (see "Outputs" above)."""
    torch.testing.assert_close(shared, unshared, rtol=0.0, atol=float32_tol(unshared, forward_terms(model)))


def test_prompt_groups():
    ids, mask = make_batch([4, 4, 4], [9, 5, 2], None)
    assert prompt_groups(ids, mask, P).tolist() == [4, 4, 4]
    ids, mask = make_batch([1, 3, 4], [4, 9, 6], None)
    assert prompt_groups(ids, mask, P).tolist() == [1, 3, 4]
    assert prompt_groups(ids, mask, 0) is None
    assert prompt_groups(ids[:1], mask[:1], P) is None
    ids, mask = make_batch([1, 1, 1], [3, 3, 3], None)
    assert prompt_groups(ids, mask, P) is None  # all distinct: nothing to share
    ids, mask = make_batch([2], [5], None)
    mask[1, 0] = 1  # same ids, different mask: not the same prompt
    assert prompt_groups(ids, mask, P) is None
    ids, mask = make_batch([2, 2], [5, 5], None, seed=1)
    ids[2:, :P] = ids[:2, :P]  # equal prompts in two runs that touch: one run
    assert prompt_groups(ids, mask, P).tolist() == [4]


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_logprobs_and_entropy_match(actor, layout):
    runs, prompt_lens, resp_lens = LAYOUTS[layout]
    ids, mask = make_batch(runs, prompt_lens, resp_lens)
    groups = prompt_groups(ids, mask, P)
    with torch.no_grad():
        ref_lp, ref_ent = compute_logprobs(actor, ids, mask, R, 0.7, return_entropy=True)
        lp, ent = shared_prefix_logprobs(actor, ids, mask, R, groups, 0.7, return_entropy=True)
        plain = shared_prefix_logprobs(actor, ids, mask, R, groups)
    assert lp.dtype == ent.dtype == torch.float32 and lp.shape == ent.shape == (sum(runs), R)
    _assert_same_outputs(lp, ref_lp, actor)
    _assert_same_outputs(ent, ref_ent, actor)
    _assert_same_outputs(plain, compute_logprobs(actor, ids, mask, R).detach(), actor)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_logprob_gradients_match(actor, layout):
    runs, prompt_lens, resp_lens = LAYOUTS[layout]
    ids, mask = make_batch(runs, prompt_lens, resp_lens)
    groups = prompt_groups(ids, mask, P)
    gen = torch.Generator().manual_seed(7)
    w_lp, w_ent = torch.randn(sum(runs), R, generator=gen), torch.randn(sum(runs), R, generator=gen)
    resp_mask = mask[:, P:].float()
    actor.zero_grad(set_to_none=True)
    results = []
    for fn in (lambda: compute_logprobs(actor, ids, mask, R, 0.7, return_entropy=True),
               lambda: shared_prefix_logprobs(actor, ids, mask, R, groups, 0.7, return_entropy=True)):
        lp, ent = fn()
        ((lp * w_lp + 0.1 * ent * w_ent) * resp_mask).sum().backward()
        results.append(_grads(actor))
    _assert_same_grads(actor, *results, positions=ids.numel())


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_critic_values_and_gradients_match(critic, layout):
    runs, prompt_lens, resp_lens = LAYOUTS[layout]
    ids, mask = make_batch(runs, prompt_lens, resp_lens)
    groups = prompt_groups(ids, mask, P)
    weights = torch.randn(sum(runs), R, generator=torch.Generator().manual_seed(8)) * mask[:, P:]
    critic.zero_grad(set_to_none=True)
    ref = critic_values(critic, ids, mask, R)
    (ref * weights).sum().backward()
    ref_grads = _grads(critic)
    values = shared_prefix_values(critic, ids, mask, R, groups)
    (values * weights).sum().backward()
    assert values.dtype == torch.float32 and values.shape == (sum(runs), R)
    _assert_same_outputs(values, ref, critic)
    _assert_same_grads(critic, ref_grads, _grads(critic), positions=ids.numel())


def test_entropy_grad_off_and_groups_none(tokenizer):
    model = _llama(tokenizer).train()
    ids, mask = make_batch([4, 4], [9, 3], [7, 2, 5, 1, 7, 7, 3, 6])
    groups = prompt_groups(ids, mask, P)
    lp, ent = shared_prefix_logprobs(model, ids, mask, R, groups, return_entropy=True, entropy_grad=False)
    assert lp.requires_grad and not ent.requires_grad
    ref = compute_logprobs(model, ids, mask, R)
    torch.testing.assert_close(shared_prefix_logprobs(model, ids, mask, R, None), ref)  # None: the unshared path
    _assert_same_outputs(lp, ref, model)


def test_response_length_one(tokenizer, critic):
    """R = 1: only the last prompt position's output, from the prompt pass alone."""
    model = _llama(tokenizer).eval()
    ids, mask = make_batch([3, 2], [9, 4], None)
    ids, mask = ids[:, : P + 1], mask[:, : P + 1]
    groups = prompt_groups(ids, mask, P)
    with torch.no_grad():
        _assert_same_outputs(shared_prefix_logprobs(model, ids, mask, 1, groups), compute_logprobs(model, ids, mask, 1),
                             model)
        _assert_same_outputs(shared_prefix_values(critic, ids, mask, 1, groups), critic_values(critic, ids, mask, 1),
                             critic)


def test_refusals(tokenizer):
    model = _llama(tokenizer).train()
    ids, mask = make_batch([2, 2], [9, 3], None)
    groups = prompt_groups(ids, mask, P)
    assert unsupported_reason(model) is None
    enable_checkpointing(model)
    assert "gradient checkpointing" in unsupported_reason(model)
    with torch.no_grad():  # transformers 5.10 drops the cache without grad too
        assert "gradient checkpointing" in unsupported_reason(model)
    with pytest.raises(ValueError, match="gradient checkpointing"):
        shared_prefix_logprobs(model, ids, mask, R, groups)
    model.eval()  # checkpointing acts in training mode only: in eval mode the shared path runs
    with torch.no_grad():
        _assert_same_outputs(shared_prefix_logprobs(model, ids, mask, R, groups), compute_logprobs(model, ids, mask, R),
                             model)
    assert "no cache argument" in unsupported_reason(torch.nn.Linear(2, 2))
    sliding = tiny_llama_config(tokenizer, **ARCH)
    sliding.layer_types = ["sliding_attention", "full_attention"]
    sliding.sliding_window = 4
    assert "DynamicSlidingWindowLayer" in unsupported_reason(LlamaForCausalLM(sliding))
    with pytest.raises(ValueError, match="summing to the batch size"):
        shared_prefix_forward(_llama(tokenizer), ids, mask, R, torch.tensor([2, 1]))
