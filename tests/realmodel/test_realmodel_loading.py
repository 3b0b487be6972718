"""Loading a real HF causal LM and tokenizer: pad token, left padding, chat template, truncation, precision,
gradient checkpointing and override_config."""

from __future__ import annotations

import copy

import pytest
import torch

from klguard.config import load_config
from klguard.data.dataset import DatasetError, collate_left_pad, load_rl_dataset
from klguard.model.loading import load_critic, load_policy, load_tokenizer, set_pad_token

CPU = torch.device("cpu")


def _config(assets, *overrides: str):
    return load_config(None, [f"actor_rollout_ref.model.path={assets.policy}", f"data.train_files={assets.train}",
                              f"data.val_files={assets.val}", *overrides]).config


def test_tokenizer_without_pad_gets_eos_and_prompts_follow_the_chat_template(assets):
    bare = copy.deepcopy(assets.policy_tok)  # a tokenizer with no pad token, as Llama's and GPT-2's
    assert bare.pad_token_id is None
    assert set_pad_token(bare, "k").pad_token_id == bare.eos_token_id == bare.convert_tokens_to_ids("<|im_end|>")
    tok = load_tokenizer(assets.policy, _config(assets))  # loaded as Qwen2Tokenizer: its own pad token
    assert tok.pad_token_id is not None and tok.padding_side == "left"
    ds = load_rl_dataset(str(assets.train), tok, max_prompt_length=128)
    row = ds[0]
    text = tok.apply_chat_template(row.raw_prompt, add_generation_prompt=True, tokenize=False)
    assert row.prompt_text == text and text.endswith("<|im_start|>assistant\n")
    assert row.input_ids == tok(text, add_special_tokens=False)["input_ids"]
    ids, mask = collate_left_pad([ds[0], ds[7]], tok.pad_token_id)
    assert mask[:, -1].all() and (ids[mask == 0] == tok.pad_token_id).all()


def test_truncation_and_filtering_as_verl_defines_them(assets):
    tok = load_tokenizer(assets.policy, _config(assets))
    full = load_rl_dataset(str(assets.train), tok, max_prompt_length=512)[0].input_ids
    n = len(full) - 5
    assert load_rl_dataset(str(assets.train), tok, max_prompt_length=n, truncation="left")[0].input_ids == full[-n:]
    assert load_rl_dataset(str(assets.train), tok, max_prompt_length=n, truncation="right")[0].input_ids == full[:n]
    with pytest.raises(DatasetError, match="row 0: prompt has"):
        load_rl_dataset(str(assets.train), tok, max_prompt_length=n)
    lengths = [len(r.input_ids) for r in load_rl_dataset(str(assets.train), tok, max_prompt_length=512).rows]
    kept = load_rl_dataset(str(assets.train), tok, max_prompt_length=sorted(lengths)[3], filter_overlong_prompts=True)
    assert len(kept) == sum(n <= sorted(lengths)[3] for n in lengths)


def test_bf16_autocast_keeps_fp32_master_weights(assets):
    cfg = _config(assets, "actor_rollout_ref.actor.fsdp_config.dtype=bfloat16",
                  "actor_rollout_ref.model.enable_gradient_checkpointing=true",
                  "actor_rollout_ref.model.override_config={attention_dropout: 0.0, rms_norm_eps: 0.00001}")
    model = load_policy(assets.policy, cfg, trainable=True, device=CPU)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    flag = next(f for f in ("is_activation_checkpointing", "is_gradient_checkpointing") if hasattr(model, f))
    assert getattr(model, flag) and model.config.rms_norm_eps == 1e-5
    seen = []
    model.model.layers[0].mlp.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    logits = model(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert seen == [torch.bfloat16] and logits.requires_grad
    plain = load_policy(assets.policy, _config(assets), trainable=False, device=CPU)  # auto on CPU: exact fp32
    plain.model.layers[0].mlp.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    plain(input_ids=torch.tensor([[1, 2, 3]]))
    assert seen[-1] == torch.float32
    critic = load_critic(assets.policy, _config(assets, "critic.model.fsdp_config.dtype=bf16"), device=CPU)
    assert critic(input_ids=torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 1)
