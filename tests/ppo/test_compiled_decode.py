"""The compiled decode step (rollout.enforce_eager=false) samples what the eager loop samples."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import klguard.ppo.compiled_decode as cd
import klguard.ppo.rollout as ro
from klguard.builtin.char_tokenizer import build_char_tokenizer
from klguard.builtin.tiny import build_tiny_llama
from tolerances import float32_tol, forward_terms

PAD, EOS_SET = 0, [2, 5, 9, 14]
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module", autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()  # other tests' graphs do not count towards this module's recompile limit
    yield
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def llama() -> LlamaForCausalLM:
    return build_tiny_llama(build_char_tokenizer(), seed=0, hidden_size=64, num_layers=2, num_heads=4,
                            intermediate_size=128, max_position_embeddings=256).eval()


def prompts(groups: int, group: int, lengths: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts, each of ``groups`` random prompts repeated ``group`` times."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((groups * group, width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i in range(groups):
        n = lengths[i % len(lengths)]
        p = torch.randint(3, 23, (n,), generator=g)
        ids[i * group:(i + 1) * group, width - n:], mask[i * group:(i + 1) * group, width - n:] = p, 1
    return ids, mask


def both(model, ids, mask, **kw) -> tuple[ro.RolloutBatch, ro.RolloutBatch]:
    def run(compiled: bool) -> ro.RolloutBatch:
        gen = torch.Generator().manual_seed(7)
        params = ro.SamplingParams(pad_token_id=PAD, eos_token_id=EOS_SET, compile_step=compiled, **kw)
        return ro.generate(model, ids, mask, params, generator=gen)

    return run(False), run(True)


def assert_same(eager: ro.RolloutBatch, compiled: ro.RolloutBatch, model: torch.nn.Module) -> None:
    """Same tokens; log-probs up to the rounding of two paths (inductor's fused kernels, a static cache):
    forward_terms(model) x eps32 x |log-prob| (tests/tolerances.py), 1.1e-4 at |lp| ~ 3.5 here, while positions
    one off for the generated tokens move them by 2.4e-3 and attending the padding by 0.28."""
    assert torch.equal(eager.response_ids, compiled.response_ids)
    assert torch.equal(eager.response_mask, compiled.response_mask)
    torch.testing.assert_close(compiled.old_logprobs, eager.old_logprobs, rtol=0,
                               atol=float32_tol(eager.old_logprobs, forward_terms(model)))


@pytest.mark.parametrize("kw", [dict(do_sample=False, ignore_eos=True, max_new_tokens=12),
                                dict(temperature=1.0, max_new_tokens=16),
                                dict(temperature=0.7, top_k=8, top_p=0.9, max_new_tokens=10)],
                         ids=["greedy", "sampled_eos", "top_k_p"])
def test_compiled_step_samples_the_eager_tokens(llama, kw):
    ids, mask = prompts(4, 4, [3, 9, 6, 1], seed=0)  # GRPO-style groups, padded
    eager, compiled = both(llama, ids, mask, **kw)
    assert_same(eager, compiled, llama)
    decoder = cd.compiled_decoder(llama)
    assert decoder is not None and decoder.eager_reason is None  # it compiled and ran the compiled step
    assert decoder._caches  # the static cache the decode loop used


def test_other_shapes_and_reused_caches(llama):
    """New batch sizes and prompt lengths compile (or reuse) their own graph and cache; results still match."""
    for groups, group, lengths, seed in ((3, 1, [5, 2, 7], 1), (2, 4, [30, 4], 2), (3, 1, [5, 2, 7], 3)):
        ids, mask = prompts(groups, group, lengths, seed)
        assert_same(*both(llama, ids, mask, temperature=1.0, max_new_tokens=8), llama)
    shapes = [key[:2] for key in cd.compiled_decoder(llama)._caches]  # the last two shapes, most recent last
    assert shapes == [(8, cd.capacity_for(30, 8)), (3, cd.capacity_for(7, 8))]


def test_capacity_is_bucketed_and_the_window_doubles():
    assert cd.capacity_for(13, 32) == 64 and cd.capacity_for(1, 1) == cd.LENGTH_BUCKET
    assert cd.capacity_for(33, 31) == 64 and cd.capacity_for(33, 32) == 96
    assert [cd.window_for(n, 96) for n in (1, 32, 33, 64, 65, 96)] == [32, 32, 64, 64, 96, 96]
    assert cd.window_for(129, 1024) == 256 and cd.window_for(600, 640) == 640


def test_a_long_rollout_crosses_windows(llama):
    """Prompt 20 + 50 tokens: the window grows 32 -> 64 -> 96 (the capacity) within one rollout."""
    ids, mask = prompts(2, 2, [20, 11], seed=6)
    assert_same(*both(llama, ids, mask, do_sample=False, ignore_eos=True, max_new_tokens=50), llama)


def test_failed_compile_falls_back_to_the_eager_step(monkeypatch, caplog):
    model = build_tiny_llama(build_char_tokenizer(), seed=3, hidden_size=32, num_layers=1, num_heads=2,
                             intermediate_size=64, max_position_embeddings=128).eval()

    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler\nmore detail")

    monkeypatch.setattr(cd, "_compiled_step", lambda: broken)
    ids, mask = prompts(2, 2, [4, 6], seed=4)
    with caplog.at_level(logging.WARNING, logger="klguard.ppo.compiled_decode"):
        eager, fallback = both(model, ids, mask, temperature=1.0, max_new_tokens=6)
    assert_same(eager, fallback, model)
    assert cd.compiled_decoder(model).eager_reason == "RuntimeError: no C++ compiler"
    assert sum("decoding eagerly" in r.message for r in caplog.records) == 1


def test_unsupported_model_decodes_eagerly(caplog):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=23, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=128, pad_token_id=PAD, eos_token_id=2)
    model = LlamaForCausalLM(cfg).eval()
    model._can_compile_fullgraph = False
    ids, mask = prompts(2, 1, [4, 6], seed=5)
    with caplog.at_level(logging.WARNING, logger="klguard.ppo.compiled_decode"):
        eager, compiled = both(model, ids, mask, temperature=1.0, max_new_tokens=6)
    assert_same(eager, compiled, model)
    assert cd.compiled_decoder(model) is None
    assert sum("no effect" in r.message for r in caplog.records) == 1
