"""The tiny Llama: config from the tokenizer, determinism, and an exact save/load round trip."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from klguard.builtin.char_tokenizer import build_char_tokenizer
from klguard.builtin.tiny import build_tiny_llama, save_hf_folder
from klguard.data.dataset import collate_left_pad
from tolerances import float32_tol, forward_terms


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _batch(tok):
    prompts = ["Q:23+45-7=?A:", "Q:1+2=?A:#### 3", "Q:99-10+1=?A:####"]
    return collate_left_pad([tok(p)["input_ids"] for p in prompts], tok.pad_token_id)


def test_config_comes_from_the_tokenizer(tok) -> None:
    model = build_tiny_llama(tok)
    cfg = model.config
    assert cfg.vocab_size == len(tok) == 23
    assert (cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id) == (0, 1, 2)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (128, 2, 4)
    assert model.generation_config.eos_token_id == 2 and model.generation_config.pad_token_id == 0
    n_params = sum(p.numel() for p in model.parameters())
    assert 300_000 < n_params < 360_000  # the prototype's 0.33M


def test_seed_fixes_the_weights_without_touching_global_rng(tok) -> None:
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a = build_tiny_llama(tok, seed=7)
    assert torch.equal(torch.rand(1), expected_next)
    b = build_tiny_llama(tok, seed=7)
    c = build_tiny_llama(tok, seed=8)
    wa, wb, wc = (m.model.embed_tokens.weight for m in (a, b, c))
    assert torch.equal(wa, wb)
    assert not torch.equal(wa, wc)


def test_sdpa_and_eager_agree_on_real_positions(tok) -> None:
    ids, mask = _batch(tok)
    model = build_tiny_llama(tok, seed=1)
    with torch.no_grad():
        fast = model(input_ids=ids, attention_mask=mask).logits
        model.set_attn_implementation("eager")
        slow = model(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    # two attention kernels: forward_terms x eps32 x |logit| (tests/tolerances.py), 4e-5 at |logit| <= 0.67, while
    # attending the padding moves these logits by up to 0.4
    torch.testing.assert_close(fast[real], slow[real], rtol=0, atol=float32_tol(slow[real], forward_terms(model)))


def test_saved_folder_loads_back_with_identical_logits(tok, tmp_path) -> None:
    model = build_tiny_llama(tok, seed=3)
    out = save_hf_folder(model, tok, tmp_path / "hf")
    names = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json"} <= names
    gen = json.loads((out / "generation_config.json").read_text())
    assert (gen["eos_token_id"], gen["pad_token_id"]) == (2, 0)

    loaded = AutoModelForCausalLM.from_pretrained(out).eval()
    loaded_tok = AutoTokenizer.from_pretrained(out)
    ids, mask = _batch(tok)
    ids2, mask2 = _batch(loaded_tok)
    assert torch.equal(ids, ids2) and torch.equal(mask, mask2)
    with torch.no_grad():
        before = model(input_ids=ids, attention_mask=mask).logits
        after = loaded(input_ids=ids2, attention_mask=mask2).logits
    assert torch.equal(before, after)


def test_greedy_generation_left_padded_matches_unpadded(tok) -> None:
    model = build_tiny_llama(tok, seed=5)
    ids, mask = _batch(tok)
    with torch.no_grad():
        batched = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
        single_ids = torch.tensor([tok("Q:23+45-7=?A:")["input_ids"]])
        single = model.generate(input_ids=single_ids, max_new_tokens=4, do_sample=False)
    new_single = single[0, single_ids.shape[1] :]
    new_batched = batched[0, ids.shape[1] :]
    # Left padding keeps the new tokens in the same columns as an unpadded run; after EOS the
    # batched run pads while the single run has already stopped.
    assert torch.equal(new_batched[: len(new_single)], new_single)
    assert torch.all(new_batched[len(new_single) :] == tok.pad_token_id)
    assert new_single[-1] == tok.eos_token_id or len(new_single) == 4
