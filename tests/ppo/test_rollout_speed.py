"""The rollout's shared prompt prefill (identical consecutive prompts prefilled once) keeps results as they were."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

import klguard.ppo.rollout as ro
from klguard.builtin.char_tokenizer import build_char_tokenizer
from klguard.builtin.tiny import build_tiny_llama
from klguard.ppo.forward import prompt_runs, run_rows
from tolerances import float32_tol, forward_terms

PAD, EOS = 0, 2
EOS_SET = [2, 5, 9, 14]  # several EOS ids so rows of a random model finish early


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def llama() -> LlamaForCausalLM:
    return build_tiny_llama(build_char_tokenizer(), seed=0, hidden_size=64, num_layers=2, num_heads=4,
                            intermediate_size=128, max_position_embeddings=256).eval()


@pytest.fixture(scope="module")
def gqa_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=23, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256,
                      pad_token_id=PAD, eos_token_id=EOS, bos_token_id=1, attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(1)
    cfg = GPT2Config(vocab_size=23, n_embd=64, n_layer=2, n_head=4, n_positions=128, pad_token_id=PAD,
                     eos_token_id=EOS, bos_token_id=1)
    return GPT2LMHeadModel(cfg).eval()


def batch(runs: list[int], lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts: run ``i`` repeats one random prompt of ``lengths[i]`` tokens ``runs[i]`` times."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 23, (n,), generator=g) for n in lengths]
    width = max(lengths)
    rows = [p for p, k in zip(prompts, runs, strict=True) for _ in range(k)]
    ids = torch.full((len(rows), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(rows):
        ids[i, width - len(p):], mask[i, width - len(p):] = p, 1
    return ids, mask


GROUPS_OF_4 = batch([4, 4, 4, 4], [3, 9, 6, 1])
MIXED_RUNS = batch([1, 3, 4, 1, 3, 4], [5, 2, 8, 5, 7, 4], seed=1)
UNPADDED = batch([4, 1, 3], [6, 6, 6], seed=2)
SETTINGS = {
    "greedy": dict(do_sample=False, ignore_eos=True),
    "sampled": dict(temperature=0.9, top_k=12, top_p=0.95, ignore_eos=True),
    "eos": dict(temperature=1.2, eos_token_id=EOS_SET),
}


def generate(model, ids, mask, *, fast: bool, seed: int = 0, **kw) -> ro.RolloutBatch:
    kw = {"max_new_tokens": 12, "eos_token_id": EOS, **kw}
    rows = kw.pop("sample_rows", None)
    params = ro.SamplingParams(pad_token_id=PAD, share_prefill=fast, **kw)
    return ro.generate(model, ids, mask, params, generator=torch.Generator().manual_seed(seed), sample_rows=rows)


def assert_same(a: ro.RolloutBatch, b: ro.RolloutBatch, model: torch.nn.Module) -> None:
    """Same tokens; log-probs up to the two paths' rounding (a shared or per-row prefill, another batch):
    forward_terms(model) x eps32 x |log-prob| (tests/tolerances.py), about 1e-4 at |lp| ~ 3.5 here."""
    assert torch.equal(a.response_ids, b.response_ids)
    assert torch.equal(a.response_mask, b.response_mask)
    torch.testing.assert_close(a.old_logprobs, b.old_logprobs, rtol=0,
                               atol=float32_tol(b.old_logprobs, forward_terms(model)))


def prefill_rows(model, ids, mask, **kw) -> int:
    """Rows of the first (prefill) forward of the optimised ``generate``."""
    seen: list[int] = []
    handle = model.register_forward_pre_hook(lambda _, args, kwargs: seen.append(len(kwargs["input_ids"])),
                                             with_kwargs=True)
    try:
        generate(model, ids, mask, fast=True, **kw)
    finally:
        handle.remove()
    return seen[0]


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("prompts", [GROUPS_OF_4, MIXED_RUNS, UNPADDED], ids=["groups_of_4", "mixed_runs", "unpadded"])
def test_optimised_generate_matches_unoptimised(llama, prompts, setting) -> None:
    ids, mask = prompts
    fast = generate(llama, ids, mask, fast=True, **SETTINGS[setting])
    assert_same(fast, generate(llama, ids, mask, fast=False, **SETTINGS[setting]), llama)
    if setting == "eos":
        assert (fast.response_lengths < 12).any()  # rows did stop at an EOS
    runs = int((torch.diff(ids, dim=0).abs().sum(-1) + torch.diff(mask, dim=0).abs().sum(-1)).ne(0).sum()) + 1
    assert prefill_rows(llama, ids, mask) == runs


@pytest.mark.parametrize("model_name", ["gqa_llama", "gpt2"])
def test_other_architectures_match_unoptimised(model_name, request) -> None:
    """Fewer key/value heads than query heads (Llama GQA), and GPT-2's learned positions."""
    model = request.getfixturevalue(model_name)
    ids, mask = MIXED_RUNS
    for setting in ("greedy", "sampled"):
        assert_same(generate(model, ids, mask, fast=True, **SETTINGS[setting]),
                    generate(model, ids, mask, fast=False, **SETTINGS[setting]), model)
    assert prefill_rows(model, ids, mask) == 6


def test_sample_rows_match_the_whole_batch(llama) -> None:
    ids, mask = MIXED_RUNS
    idx = torch.arange(2, 12)  # cuts the runs at both ends
    whole = generate(llama, ids, mask, fast=True, **SETTINGS["eos"])
    part = generate(llama, ids[idx], mask[idx], fast=True, sample_rows=(idx, len(ids)), **SETTINGS["eos"])
    part_ref = generate(llama, ids[idx], mask[idx], fast=False, sample_rows=(idx, len(ids)), **SETTINGS["eos"])
    assert_same(part, part_ref, llama)
    assert torch.equal(part.response_ids, whole.response_ids[idx])
    torch.testing.assert_close(part.old_logprobs, whole.old_logprobs[idx], rtol=0,
                               atol=float32_tol(whole.old_logprobs[idx], forward_terms(llama)))


def test_no_sharing_without_repeats_or_without_preallocated_cache(llama, monkeypatch) -> None:
    ids, mask = batch([1] * 5, [4, 2, 7, 4, 3])
    assert prompt_runs(ids, mask) is None
    assert prefill_rows(llama, ids, mask) == 5
    ids, mask = GROUPS_OF_4
    ref = generate(llama, ids, mask, fast=False, **SETTINGS["sampled"])
    monkeypatch.setattr(ro, "_new_cache", lambda model, capacity: DynamicCache(config=model.config))
    assert prefill_rows(llama, ids, mask) == 16  # a cache that is not all PreallocLayers is left as it is
    assert_same(generate(llama, ids, mask, fast=True, **SETTINGS["sampled"]), ref, llama)


def test_prompt_runs_need_equal_ids_and_mask() -> None:
    ids = torch.tensor([[0, 5, 6], [0, 5, 6], [0, 5, 6], [7, 5, 6], [7, 5, 6]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 1]])
    lengths = prompt_runs(ids, mask)
    first, run = run_rows(lengths)
    assert lengths.tolist() == [2, 1, 2] and first.tolist() == [0, 2, 3] and run.tolist() == [0, 0, 1, 2, 2]


def test_preallocated_layer_reorder_keeps_writing_into_its_buffer() -> None:
    layer = ro._prealloc_layer_cls()(capacity=5)
    k, v = torch.randn(2, 3, 2, 4), torch.randn(2, 3, 2, 4)
    layer.update(k, v)
    layer.reorder_cache(torch.tensor([0, 0, 1]))
    k1, v1 = torch.randn(3, 3, 1, 4), torch.randn(3, 3, 1, 4)
    keys, values = layer.update(k1, v1)
    idx = torch.tensor([0, 0, 1])
    assert torch.equal(keys, torch.cat([k[idx], k1], dim=2)) and torch.equal(values, torch.cat([v[idx], v1], dim=2))
    assert layer._k.shape == (3, 3, 5, 4) and layer.get_seq_length() == 3


def test_preallocated_layer_row_and_length_edits_keep_its_buffer_in_step() -> None:
    layer = ro._prealloc_layer_cls()(capacity=6)
    k, v = torch.randn(2, 3, 3, 4), torch.randn(2, 3, 3, 4)
    layer.update(k, v)
    layer.batch_repeat_interleave(2)
    assert torch.equal(layer.keys, k.repeat_interleave(2, 0)) and layer._k.shape[0] == 4
    layer.batch_select_indices(torch.tensor([3, 0]))
    assert torch.equal(layer.values, v[[1, 0]])
    layer.crop(-1)
    assert layer.get_seq_length() == 2
    k1, v1 = torch.randn(2, 3, 1, 4), torch.randn(2, 3, 1, 4)
    keys, _ = layer.update(k1, v1)  # written right after the kept tokens, into the layer's own buffer
    assert torch.equal(keys, torch.cat([k[[1, 0], :, :2], k1], dim=2))
    assert keys.data_ptr() == layer._k.data_ptr()
