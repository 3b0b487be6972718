"""Tensor-parallel pieces without torchrun: which models can be split, and clipping across device meshes."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, distribute_tensor
from transformers import GPT2Config, GPT2LMHeadModel

from klguard.builtin.char_tokenizer import build_char_tokenizer
from klguard.builtin.tiny import build_tiny_llama
from klguard.distributed.grad_clip import clip_grad_norm
from klguard.distributed.tensor_parallel import check_tensor_parallel
from klguard.errors import ConfigError
from tolerances import float32_tol

KEY = "actor_rollout_ref.actor.fsdp_config.turbo_config.distributed.tensor_parallel_size"


def test_only_splittable_models_pass_the_check():
    tok = build_char_tokenizer()
    check_tensor_parallel(build_tiny_llama(tok).config, 2, KEY)  # 4 heads, 4 kv heads, 256 intermediate
    check_tensor_parallel(build_tiny_llama(tok).config, 4, KEY)
    with pytest.raises(ConfigError, match=f"^{KEY}=3 must divide the model's num_attention_heads=4$"):
        check_tensor_parallel(build_tiny_llama(tok).config, 3, KEY)
    model = build_tiny_llama(tok, intermediate_size=255, num_heads=2)
    with pytest.raises(ConfigError, match="must divide the model's intermediate_size=255"):
        check_tensor_parallel(model.config, 2, KEY)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=30))
    with pytest.raises(ConfigError, match=f"^{KEY}=2: tensor parallelism supports the llama, qwen2, mistral "
                                          "layouts, not model_type 'gpt2'; set it to 1$"):
        check_tensor_parallel(gpt2.config, 2, KEY)


def test_clipping_over_two_meshes_equals_clipping_the_plain_tensors(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        one = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
        two = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
        gen = torch.Generator().manual_seed(0)
        grads = [torch.randn(5, 3, generator=gen) * 4, torch.randn(7, generator=gen), torch.randn(2, 2, generator=gen)]
        plain = [torch.zeros_like(g, requires_grad=True) for g in grads]
        split = [torch.nn.Parameter(distribute_tensor(torch.zeros_like(g), mesh, [Replicate()] * mesh.ndim))
                 for g, mesh in zip(grads[:2], (one, two), strict=True)] + [torch.zeros_like(grads[2],
                                                                                         requires_grad=True)]
        for params in (plain, split):
            for p, g in zip(params, grads, strict=True):
                p.grad = distribute_tensor(g.clone(), p.device_mesh, p.placements) if hasattr(p, "placements") \
                    else g.clone()
        want = float(torch.nn.utils.clip_grad_norm_(plain, 1.0))
        got = clip_grad_norm(split, 1.0)
        assert got == pytest.approx(want, rel=0, abs=float32_tol(want, 3 * 15))
        for p, q in zip(split, plain, strict=True):
            clipped = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            assert torch.allclose(clipped, q.grad, rtol=0, atol=float32_tol(q.grad, 3 * 15))
        assert clip_grad_norm(split, float("inf")) == pytest.approx(1.0, abs=1e-5)  # clipped to 1 above
    finally:
        dist.destroy_process_group()
