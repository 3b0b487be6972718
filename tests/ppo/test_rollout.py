"""Tests for klguard.ppo.rollout: KV-cache sampling loop and log-prob recomputation."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

import klguard.ppo.rollout as ro
from klguard.ppo.forward import compute_logprobs, position_ids_from_mask, response_logits
from klguard.ppo.rollout import RolloutBatch, SamplingParams, filter_logits, generate
from tolerances import float32_tol, forward_terms

VOCAB, PAD, EOS = 24, 0, 2
EOS_SET = [2, 5, 7, 11]  # several EOS ids so a random model finishes rows early
# Log-probs of one row computed by two paths (in a batch or alone, KV-cache decode or one forward, another cache)
# agree up to forward_terms(model) x eps32 x |log-prob| (tests/tolerances.py): 1e-4 (Llama) and 2e-4 (GPT-2) at
# |lp| <= 3.6, while attending a padded key moves them by 0.09 to 0.2, GPT-2 positions that ignore the padding by
# 0.4 and a temperature off by 1% by 6e-3.


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=4, intermediate_size=128, max_position_embeddings=128,
                      pad_token_id=PAD, eos_token_id=EOS, bos_token_id=1)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(1)
    cfg = GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128,
                     pad_token_id=PAD, eos_token_id=EOS, bos_token_id=1)
    return GPT2LMHeadModel(cfg).eval()


def left_pad(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    return ids, mask


PROMPTS = [[3, 4, 8], [9, 10, 12, 13, 14, 15, 16], [17, 18, 19, 20, 21], [6, 3]]


def run(model, prompts=PROMPTS, seed: int | None = 0, **kw) -> RolloutBatch:
    ids, mask = left_pad(prompts)
    kw.setdefault("max_new_tokens", 12)
    kw.setdefault("eos_token_id", EOS_SET)
    gen = None if seed is None else torch.Generator().manual_seed(seed)
    return generate(model, ids, mask, SamplingParams(pad_token_id=PAD, **kw), generator=gen)


def check_invariants(b: RolloutBatch, R: int, eos: list[int]) -> None:
    B = b.prompt_ids.shape[0]
    assert b.response_ids.shape == b.response_mask.shape == b.old_logprobs.shape == (B, R)
    assert torch.equal(b.response_lengths, b.response_mask.sum(-1))
    for i in range(B):
        n = int(b.response_lengths[i])
        assert n >= 1
        assert b.response_mask[i, :n].all() and not b.response_mask[i, n:].any()
        assert (b.response_ids[i, n:] == PAD).all() and (b.old_logprobs[i, n:] == 0).all()
        body = b.response_ids[i, : n - 1].tolist()
        assert not set(body) & set(eos), "generation continued past an EOS"
        assert n == R or int(b.response_ids[i, n - 1]) in eos
    assert (b.old_logprobs <= 0).all()
    assert b.input_ids.shape == b.attention_mask.shape == (B, b.prompt_ids.shape[1] + R)


def test_shapes_masks_and_early_stop(llama) -> None:
    calls = []
    handle = llama.register_forward_hook(lambda *_: calls.append(1))
    try:
        b = run(llama, max_new_tokens=40)
    finally:
        handle.remove()
    check_invariants(b, 40, EOS_SET)
    assert b.response_lengths.max() < 40  # every row hit EOS ...
    assert len(calls) == int(b.response_lengths.max())  # ... and the loop stopped right there (prefill + steps)
    for t in (b.prompt_ids, b.response_ids, b.response_mask, b.old_logprobs, b.response_lengths):
        assert not t.is_inference()  # usable by the (grad-enabled) PPO update


def test_ignore_eos_covers_all_tokens(llama) -> None:
    b = run(llama, ignore_eos=True)
    assert b.response_mask.all() and (b.response_lengths == 12).all()
    assert torch.isin(b.response_ids, torch.tensor(EOS_SET)).any()  # EOS was sampled but did not stop rows


def test_reproducible_with_generator(llama) -> None:
    kw = dict(temperature=0.8, top_k=10, top_p=0.9)
    a, b, c = run(llama, seed=7, **kw), run(llama, seed=7, **kw), run(llama, seed=8, **kw)
    for x, y in zip((a.response_ids, a.old_logprobs), (b.response_ids, b.old_logprobs), strict=True):
        assert torch.equal(x, y)
    assert not torch.equal(a.response_ids, c.response_ids)


@pytest.mark.parametrize("model_name", ["llama", "gpt2"])
def test_left_padding_matches_unpadded(model_name, request) -> None:
    model = request.getfixturevalue(model_name)
    batch = run(model, do_sample=False, eos_token_id=EOS)
    check_invariants(batch, 12, [EOS])
    for i, p in enumerate(PROMPTS):
        alone = run(model, prompts=[p], do_sample=False, eos_token_id=EOS)
        assert torch.equal(batch.response_ids[i], alone.response_ids[0])
        torch.testing.assert_close(batch.old_logprobs[i], alone.old_logprobs[0], rtol=0,
                                   atol=float32_tol(alone.old_logprobs[0], forward_terms(model)))


@pytest.mark.parametrize("model_name", ["llama", "gpt2"])
def test_greedy_matches_hf_generate(model_name, request) -> None:
    model = request.getfixturevalue(model_name)
    ours = run(model, do_sample=False, eos_token_id=EOS, max_new_tokens=8)
    assert torch.equal(ours.response_ids, run(model, temperature=0.0, eos_token_id=EOS, max_new_tokens=8).response_ids)
    ids, mask = left_pad(PROMPTS)
    with torch.no_grad():
        hf = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=8,
                            pad_token_id=PAD, eos_token_id=EOS)[:, ids.shape[1]:]
    assert torch.equal(ours.response_ids[:, : hf.shape[1]], hf)


def test_top_k1_is_greedy_but_logprobs_are_unfiltered(llama) -> None:
    greedy = run(llama, do_sample=False)
    topk1 = run(llama, top_k=1, seed=3)
    assert torch.equal(greedy.response_ids, topk1.response_ids)
    # verl convention: log-prob under the distribution before top-k/top-p filtering, so not 0. Same forwards, same
    # logits, same token_logprobs: equal by construction (1e-6 is a few eps32 at |lp| ~ 3).
    torch.testing.assert_close(greedy.old_logprobs, topk1.old_logprobs, atol=1e-6, rtol=0)
    assert (topk1.old_logprobs[topk1.response_mask.bool()] < -1e-3).all()


@pytest.mark.parametrize("model_name", ["llama", "gpt2"])
@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, -1, 1.0), (0.7, 8, 0.9)])
def test_compute_logprobs_matches_rollout(model_name, temperature, top_k, top_p, request) -> None:
    model = request.getfixturevalue(model_name)
    b = run(model, temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=10)
    with torch.no_grad():
        lp = compute_logprobs(model, b.input_ids, b.attention_mask, 10, temperature)
        lp_part, ent = compute_logprobs(model, b.input_ids[:3], b.attention_mask[:3], 10, temperature,
                                        return_entropy=True)
        logits = response_logits(model, b.input_ids, b.attention_mask, 10).float() / temperature
    m = b.response_mask.bool()
    terms = forward_terms(model)
    torch.testing.assert_close(lp[m], b.old_logprobs[m], atol=float32_tol(b.old_logprobs[m], terms), rtol=0)
    # a row's log-probs do not depend on the batch
    torch.testing.assert_close(lp_part, lp[:3], atol=float32_tol(lp[:3], terms), rtol=0)
    assert logits.shape == (4, 10, VOCAB)
    ref_ent = torch.distributions.Categorical(logits=logits[:3]).entropy()
    torch.testing.assert_close(ent, ref_ent, atol=float32_tol(ref_ent, terms), rtol=0)
    # entropy = logsumexp - sum(p x), both sums of VOCAB terms: rounding can put a near-uniform one just above log V
    slack = float32_tol(torch.logsumexp(logits[:3], -1), VOCAB)
    assert ((ent >= 0) & (ent <= torch.log(torch.tensor(float(VOCAB))) + slack)).all()


def test_compute_logprobs_backprop(llama) -> None:
    b = run(llama, max_new_tokens=6)
    lp = compute_logprobs(llama, b.input_ids, b.attention_mask, 6)
    ratio = torch.exp(lp - b.old_logprobs) * b.response_mask
    ratio.sum().backward()
    grads = [p.grad for p in llama.parameters()]
    assert all(g is not None for g in grads) and any(g.abs().sum() > 0 for g in grads)
    llama.zero_grad(set_to_none=True)


def test_entropy_outside_autograd_has_the_same_values(llama) -> None:
    b = run(llama, max_new_tokens=6)
    _, tracked = compute_logprobs(llama, b.input_ids, b.attention_mask, 6, return_entropy=True)
    lp, free = compute_logprobs(llama, b.input_ids, b.attention_mask, 6, return_entropy=True, entropy_grad=False)
    assert tracked.requires_grad and not free.requires_grad and lp.requires_grad
    assert torch.equal(tracked.detach(), free)


def test_preallocated_cache_matches_plain_dynamic_cache(llama, monkeypatch) -> None:
    if not hasattr(DynamicCache(config=llama.config), "layers"):
        pytest.skip("transformers without per-layer caches: plain DynamicCache is used anyway")
    assert type(ro._new_cache(llama, 8).layers[0]).__name__ == "PreallocLayer"
    ours = run(llama, temperature=0.9, max_new_tokens=20)
    monkeypatch.setattr(ro, "_new_cache", lambda model, capacity: DynamicCache(config=model.config))
    plain = run(llama, temperature=0.9, max_new_tokens=20)
    assert torch.equal(ours.response_ids, plain.response_ids)
    torch.testing.assert_close(ours.old_logprobs, plain.old_logprobs, rtol=0,
                               atol=float32_tol(plain.old_logprobs, forward_terms(llama)))


def test_sampler_frequencies_and_zero_prob_tokens() -> None:
    probs = torch.tensor([0.1, 0.0, 0.6, 0.0, 0.3]).expand(40_000, 5)
    tok = ro._sample(probs, torch.Generator().manual_seed(0))
    freq = torch.bincount(tok, minlength=5).double() / tok.numel()
    # statistical, not rounding: 5 standard errors sqrt(p (1 - p) / n) of the largest (0.012 at p = 0.6)
    stderr = (probs[0].double() * (1 - probs[0].double()) / tok.numel()).sqrt()
    torch.testing.assert_close(freq, probs[0].double(), atol=5 * float(stderr.max()), rtol=0)
    assert freq[1] == 0 and freq[3] == 0


def test_position_ids_from_mask() -> None:
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]


def test_filter_logits_examples() -> None:
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    kept = lambda **kw: torch.isfinite(filter_logits(logits, **kw))[0].tolist()  # noqa: E731
    assert kept(top_k=2) == [True, True, False, False]
    assert kept(top_k=-1) == kept(top_k=0) == [True] * 4
    assert kept(top_p=0.75) == [True, True, False, False]
    assert kept(top_p=0.85) == [True, True, True, False]
    assert kept(top_p=0.1) == [True, False, False, False]
    assert kept(top_k=3, top_p=0.75) == [True, True, False, False]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-5, 5), min_size=2, max_size=12), st.floats(0.05, 0.99))
def test_filter_logits_top_p_is_minimal_nucleus(values, top_p) -> None:
    logits = torch.tensor([values], dtype=torch.float64)
    keep = torch.isfinite(filter_logits(logits, top_p=top_p))[0]
    probs = logits.softmax(-1)[0]
    # float64 rounding: four sums of len(values) probabilities (<= 1) each (the filter's and this softmax's
    # normalisers, the filter's cumsum and the sums below) round by at most len(values) x eps64 each
    slack = 4 * len(values) * torch.finfo(torch.float64).eps
    assert keep.any()
    assert probs[keep].min() >= probs[~keep].max() if (~keep).any() else True  # kept set is a top set
    assert probs[keep].sum() >= top_p - slack or keep.all()  # ... that reaches top_p
    if keep.sum() > 1:  # ... and is minimal: dropping its least likely member falls short of top_p
        assert probs[keep].sum() - probs[keep].min() < top_p + slack
