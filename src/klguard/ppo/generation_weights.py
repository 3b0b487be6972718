"""The weights the rollout and validation generate with.

Data parallel only: the actor itself, unsharded once around generation (one all-gather per layer, none per
token; klguard.distributed.fsdp.unsharded). Under tensor parallelism two ways, chosen by
`actor_rollout_ref.rollout.tensor_model_parallel_size`:

- the actor's tp size: generation on the tp shards (the dp shards gathered as above), two all-reduces per layer
  and one all-gather of the logits per token, within each tp group; no second copy of the weights;
- 1: every rank holds a whole, frozen copy of the policy (a rollout replica, as verl's vLLM engine holds its own
  weights), refreshed from the actor's shards once per generation (one all-gather of the whole state); no
  collective per token, one more model in memory.

`benchmarks/tp_rollout.py` measures both. The time spent gathering weights is the yielded Resharding's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from klguard.distributed.fsdp import Resharding, unsharded

FULL = StateDictOptions(full_state_dict=True)


class GenerationWeights:
    """`with weights() as (model, resharding):` the model to generate with, its weights the actor's current ones,
    and the time spent gathering them (complete once the block is left)."""

    def __init__(self, actor: torch.nn.Module, reshard_after_forward: bool,
                 build_replica: Callable[[], torch.nn.Module] | None = None) -> None:
        self.actor = actor
        self.reshard_after_forward = reshard_after_forward
        self.replica = build_replica() if build_replica is not None else None

    @contextmanager
    def __call__(self) -> Iterator[tuple[torch.nn.Module, Resharding]]:
        if self.replica is None:
            with unsharded(self.actor, self.reshard_after_forward) as resharding:
                yield self.actor, resharding
            return
        start = time.perf_counter()
        self.replica.load_state_dict(get_model_state_dict(self.actor, options=FULL))
        yield self.replica, Resharding(time.perf_counter() - start, gathered=True)
