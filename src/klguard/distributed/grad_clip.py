"""Gradient-norm clipping over parameters that live on different device meshes.

Under tensor parallelism the split weights are DTensors on the (dp, tp) mesh while the norms and a value head
are DTensors on the data-parallel mesh only; torch's `clip_grad_norm_` stacks the per-tensor norms and refuses
two meshes. Here each mesh's norm is taken apart (a DTensor norm made whole over its mesh) and they are
combined as sqrt(sum of squares). With one mesh (or none) it is torch's `clip_grad_norm_`, unchanged.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor


def _whole(norm: Tensor) -> float:
    return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)


def clip_grad_norm(params: list[Tensor], max_norm: float) -> float:
    """Clip the gradients of `params` to a total 2-norm of `max_norm` (inf: none); returns the pre-clip norm."""
    groups: dict[object, list[Tensor]] = {}
    for p in params:
        if p.grad is not None:
            groups.setdefault(p.grad.device_mesh if isinstance(p.grad, DTensor) else None, []).append(p.grad)
    if len(groups) <= 1:
        return _whole(torch.nn.utils.clip_grad_norm_(params, max_norm))
    total = math.sqrt(math.fsum(_whole(torch.nn.utils.get_total_norm(grads)) ** 2 for grads in groups.values()))
    coef = max_norm / (total + 1e-6)  # torch's clip_grads_with_norm_ rule
    if coef < 1.0:
        for grads in groups.values():
            for grad in grads:
                grad.mul_(coef)
    return total
