"""A tiny GGUF written in the test, as llama.cpp's converter writes a Llama: a random 2-layer LlamaForCausalLM (fp32,
untied head) with a byte-level BPE tokenizer and a ChatML template, its tensors under GGUF's names with the query and
key rows permuted as llama.cpp permutes them. Needs the `gguf` package (klguard's `real` extra)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2: unk, bos, eos (and pad), as SmolLM2's
CORPUS = ["What is 17 + 25? The answer is 42.", "Write a one-sentence review of a movie.", "hello world"] * 4
LAYER_NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
               "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
               "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down"}


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=SPECIAL[1], eos_token=SPECIAL[2],
                                   unk_token=SPECIAL[0], pad_token=SPECIAL[2], chat_template=CHATML)


def tiny_llama(vocab_size: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # norms away from 1, so a norm written in the wrong place shows in the logits
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    return model


def _permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's order of the rotary halves in the query and key rows."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(
        weight.shape)


def gguf_tensors(model: LlamaForCausalLM) -> dict[str, np.ndarray]:
    cfg = model.config
    out = {"token_embd.weight": model.model.embed_tokens.weight, "output_norm.weight": model.model.norm.weight,
           "output.weight": model.lm_head.weight}
    for i, layer in enumerate(model.model.layers):
        for hf_name, gguf_name in LAYER_NAMES.items():
            out[f"blk.{i}.{gguf_name}.weight"] = layer.get_submodule(hf_name).weight
    arrays = {name: t.detach().numpy().astype(np.float32) for name, t in out.items()}
    for i in range(cfg.num_hidden_layers):
        arrays[f"blk.{i}.attn_q.weight"] = _permute(arrays[f"blk.{i}.attn_q.weight"], cfg.num_attention_heads)
        arrays[f"blk.{i}.attn_k.weight"] = _permute(arrays[f"blk.{i}.attn_k.weight"], cfg.num_key_value_heads)
    return arrays


def _add_tokenizer(writer, tokenizer: PreTrainedTokenizerFast) -> None:
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([token for token, _ in vocab])
    writer.add_token_types([3 if token in SPECIAL else 1 for token, _ in vocab])  # 3: control, 1: normal
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in merges])
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML)


def write_tiny_gguf(path: Path) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """Write the GGUF to `path`; returns the model and tokenizer it was written from."""
    from gguf import GGUFWriter

    tokenizer = tiny_tokenizer()
    model = tiny_llama(len(tokenizer))
    cfg = model.config
    writer = GGUFWriter(path, "llama")
    writer.add_name("tiny-llama")
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    writer.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    _add_tokenizer(writer, tokenizer)
    for name, array in gguf_tensors(model).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model, tokenizer
