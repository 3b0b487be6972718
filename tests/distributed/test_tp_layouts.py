"""Each supported layout split over 2 tp ranks (gloo, spawned) gives one process's logits and gradients.

Llama (the built-in policy's layout), Qwen2 with its q/k/v biases, grouped kv heads and lm_head tied to the
embedding (kept whole), Mistral, and the critic's token-classification head. Tolerance: the split forward sums the
same products in another order (o and down add two partial sums), so outputs move by float32 rounding at the
model's depth and width (tests/tolerances.py forward_terms), and the gradients of one loss likewise.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForTokenClassification,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from tolerances import float32_tol, forward_terms

SIZES = dict(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=64)
LAYOUTS = {
    "llama": lambda: LlamaForCausalLM(LlamaConfig(**SIZES, num_key_value_heads=4, tie_word_embeddings=False)),
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**SIZES, num_key_value_heads=2, tie_word_embeddings=True)),
    "mistral": lambda: MistralForCausalLM(MistralConfig(**SIZES, num_key_value_heads=2, tie_word_embeddings=False)),
    "critic": lambda: LlamaForTokenClassification(LlamaConfig(**SIZES, num_key_value_heads=4, num_labels=1,
                                                              classifier_dropout=0.0)),  # as klguard loads it
}


def _outputs(model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    out = model(input_ids=ids).logits
    out.float().square().mean().backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    return out.detach(), {n: g.full_tensor() if hasattr(g, "full_tensor") else g for n, g in grads.items()}


def _worker(rank: int, init: str, queue) -> None:
    from klguard.distributed.context import DistContext
    from klguard.distributed.fsdp import shard_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        ctx = DistContext(rank=rank, world_size=2, tp_size=2)
        ids = torch.randint(0, SIZES["vocab_size"], (3, 10), generator=torch.Generator().manual_seed(1))
        for name, build in LAYOUTS.items():
            torch.manual_seed(0)
            plain = build()
            torch.manual_seed(0)
            split = shard_model(build(), ctx, strategy="fsdp_turbo", fsdp_size=-1, offload=False,
                                reshard_after_forward=True, param_dtype=None, tp=2)
            want, want_grads = _outputs(plain, ids)
            got, got_grads = _outputs(split, ids)
            local = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in split.parameters())
            grad_diff = {n: float((got_grads[n] - g).abs().max()) for n, g in want_grads.items()}
            grad_tol = {n: float32_tol(g, forward_terms(plain)) for n, g in want_grads.items()}
            queue.put((rank, name, float((got - want).abs().max()), float32_tol(want, forward_terms(plain)),
                       grad_diff, grad_tol, local, sum(p.numel() for p in plain.parameters())))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[tuple]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    store = tmp_path_factory.mktemp("tp-layouts") / "store"
    procs = [ctx.Process(target=_worker, args=(r, f"file://{store}", queue)) for r in range(2)]
    for proc in procs:
        proc.start()
    out = [queue.get(timeout=120) for _ in range(2 * len(LAYOUTS))]
    for proc in procs:
        proc.join(timeout=30)
    return out


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_tp_split_model_computes_what_the_whole_model_does(results, layout):
    mine = [r for r in results if r[1] == layout]
    assert len(mine) == 2
    for _, _, diff, tol, grad_diff, grad_tol, local, total in mine:
        assert diff <= tol
        for name, value in grad_diff.items():
            assert value <= grad_tol[name], name
        assert local < 0.75 * total  # the split weights are halves: the check ran on a split model
