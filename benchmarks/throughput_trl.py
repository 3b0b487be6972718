"""TRL's contender in the throughput benchmark, run in benchmarks/.venv-trl (trl==1.12.0) by
benchmarks/throughput.py; not run by hand.

PPO is `trl.experimental.ppo.PPOTrainer` (policy, reference, a value model initialised from the
policy's body and a sequence-classification reward model of the same size); GRPO is
`trl.GRPOTrainer` with `beta=0.04` (so it loads a reference model) and a rule reward. Both run
their own `train()` loop; a callback reports each step to the driver at `on_step_end` and blocks
there until the next release (throughput_common.Gate).

Equal work with klguard: 64 rollouts a step, one PPO epoch, one mini-batch without micro-batches,
exactly `response_length` sampled tokens (PPO: `stop_token=None`, so generation ignores EOS; GRPO:
`min_new_tokens` = `max_completion_length`), no gradient checkpointing (TRL's default is on; klguard's
off), fp32 unless `bf16` is asked (then TRL's own `bf16=True`, whatever that autocasts).

Phases are timed by wrapping what TRL calls (outermost wrapper wins, nothing counted twice):
- PPO: `batch_generation` = gen (its logits give the old log-probs, as klguard's sampling loop does);
  `forward` without grad = ref; `get_reward` = values (value model) or reward (reward model);
  `forward` with grad, `accelerator.backward` and `optimizer.step` = update.
- GRPO: `_generate` = gen (includes TRL's per-step prompt templating and tokenising);
  `_calculate_rewards` = reward; `_get_per_token_logps_and_entropies` without grad = ref (reference
  model) or old_logprob (policy); `compute_loss`, `accelerator.backward`, `accelerator.clip_grad_norm_`
  and `optimizer.step` = update.
The rest of the step (GAE, whitening, metrics, gc.collect, data loading) is reported as `other`.
"""

from __future__ import annotations

import functools
import re
import time
from collections import defaultdict
from collections.abc import Callable

import pyarrow.parquet as pq
import torch
from datasets import Dataset
from throughput_common import Gate, read_spec
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback


class PhaseTimer:
    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self._active = False

    def wrap(self, fn: Callable, phase: str | Callable[..., str | None]) -> Callable:
        """`fn` with its time added to `phase` (or to what `phase(*args)` names; None: not timed)."""

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            name = phase(*args, **kwargs) if callable(phase) else phase
            if name is None or self._active:
                return fn(*args, **kwargs)
            self._active = True
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.totals[name] += time.perf_counter() - started
                self._active = False

        return timed

    def take(self) -> dict[str, float]:
        out, self.totals = dict(self.totals), defaultdict(float)
        return out


class GateCallback(TrainerCallback):
    """Blocks at the start of training and after every step; wraps the optimizer once it exists."""

    def __init__(self, gate: Gate, timer: PhaseTimer, **info: object) -> None:
        self.gate, self.timer = gate, timer
        self.info = {"contender": "trl", **info}  # sent with the ready event (library versions)

    def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
        optimizer.step = self.timer.wrap(optimizer.step, "update")
        self.gate.ready(**self.info)
        self.timer.take()

    def on_step_end(self, args, state, control, **kwargs):
        self.gate.step_done(self.timer.take())


def read_rows(path: str) -> list[dict]:
    return pq.read_table(path).to_pylist()


def last_answer(text: str) -> str | None:
    found = re.findall(r"####\s*(-?\d+)", text)
    return found[-1] if found else None


def arith_reward(completions, ground_truth, **kwargs) -> list[float]:
    """The arithmetic task's rule (the number after the last `####` equals the answer), as klguard's."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [float(last_answer(t) == gt) for t, gt in zip(texts, ground_truth, strict=True)]


def common_args(spec: dict) -> dict:
    return dict(output_dir=spec["run_dir"], report_to="none", save_strategy="no", disable_tqdm=True, use_cpu=True,
                bf16=spec["dtype"] == "bf16", gradient_checkpointing=False, seed=spec["seed"],
                dataloader_num_workers=0, per_device_train_batch_size=spec["rollouts"], gradient_accumulation_steps=1)


def build_ppo(spec: dict, tokenizer, callback: GateCallback, timer: PhaseTimer):
    from trl.experimental.ppo import PPOConfig, PPOTrainer, ppo_trainer

    def ids(row: dict) -> dict:
        text = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        return {"input_ids": tokenizer(text, add_special_tokens=False)["input_ids"]}

    data = Dataset.from_list([ids(r) for r in read_rows(spec["train"])])
    micro = spec.get("micro_batch") or spec["rollouts"]  # rollouts per forward (and backward): all unless asked
    batches = {"per_device_train_batch_size": micro, "gradient_accumulation_steps": spec["rollouts"] // micro}
    config = PPOConfig(**{**common_args(spec), **batches}, num_mini_batches=1, num_ppo_epochs=1,
                       local_rollout_forward_batch_size=micro, response_length=spec["response_length"],
                       total_episodes=spec["rollouts"] * spec["max_steps"], num_sample_generations=0, stop_token=None,
                       missing_eos_penalty=None, kl_estimator="k1")
    load = functools.partial(AutoModelForCausalLM.from_pretrained, spec["policy"], dtype=torch.float32)
    value = AutoModelForSequenceClassification.from_pretrained(spec["policy"], num_labels=1, dtype=torch.float32)
    reward = AutoModelForSequenceClassification.from_pretrained(spec["rm"], num_labels=1, dtype=torch.float32)
    trainer = PPOTrainer(args=config, processing_class=tokenizer, model=load(), ref_model=load(), reward_model=reward,
                         value_model=value, train_dataset=data, eval_dataset=data.select(range(8)),
                         callbacks=[callback])
    ppo_trainer.batch_generation = timer.wrap(ppo_trainer.batch_generation, "gen")
    ppo_trainer.forward = timer.wrap(ppo_trainer.forward, lambda *a, **k: (
        "update" if torch.is_grad_enabled() else "ref"))
    ppo_trainer.get_reward = timer.wrap(ppo_trainer.get_reward, lambda model, *a, **k: (
        "reward" if model is trainer.reward_model else "values"))
    trainer.accelerator.backward = timer.wrap(trainer.accelerator.backward, "update")
    return trainer


def build_grpo(spec: dict, tokenizer, callback: GateCallback, timer: PhaseTimer):
    from trl import GRPOConfig, GRPOTrainer

    rows = [{"prompt": r["prompt"], "ground_truth": r["reward_model"]["ground_truth"]}
            for r in read_rows(spec["train"])]
    length = spec["response_length"]
    config = GRPOConfig(**common_args(spec), num_generations=spec["n"], max_completion_length=length,
                        generation_kwargs={"min_new_tokens": length}, beta=0.04, num_iterations=1,
                        max_steps=spec["max_steps"], model_init_kwargs={"dtype": torch.float32})
    trainer = GRPOTrainer(model=spec["policy"], reward_funcs=arith_reward, args=config,
                          train_dataset=Dataset.from_list(rows), processing_class=tokenizer, callbacks=[callback])

    return time_grpo_phases(trainer, timer)


def time_grpo_phases(trainer, timer: PhaseTimer, *, adapter_reference: bool = False):
    """Times a GRPOTrainer's phases: `_generate` gen, `_calculate_rewards` reward, the log-prob passes outside the
    loss ref or old_logprob (with `adapter_reference` every such pass is the reference: the policy with its LoRA
    adapter off, one iteration taking no old log-probs), the loss, backward and clipping update."""

    def logps_phase(model, *args, **kwargs) -> str | None:
        if torch.is_grad_enabled():
            return None  # inside compute_loss: update
        return "ref" if adapter_reference or model is trainer.ref_model else "old_logprob"

    trainer._generate = timer.wrap(trainer._generate, "gen")
    trainer._calculate_rewards = timer.wrap(trainer._calculate_rewards, "reward")
    trainer._get_per_token_logps_and_entropies = timer.wrap(trainer._get_per_token_logps_and_entropies, logps_phase)
    trainer.compute_loss = timer.wrap(trainer.compute_loss, "update")
    trainer.accelerator.backward = timer.wrap(trainer.accelerator.backward, "update")
    trainer.accelerator.clip_grad_norm_ = timer.wrap(trainer.accelerator.clip_grad_norm_, "update")
    return trainer


def start_worker() -> tuple[dict, GateCallback, PhaseTimer, object]:
    """A TRL worker's start: its spec, its torch threads, the gate callback that reports its libraries' versions,
    the phase timer and the policy's tokenizer."""
    spec = read_spec()
    torch.set_num_threads(spec["threads"])
    import transformers
    import trl

    timer = PhaseTimer()
    callback = GateCallback(Gate(), timer, trl=trl.__version__, transformers=transformers.__version__,
                            torch=torch.__version__)
    return spec, callback, timer, AutoTokenizer.from_pretrained(spec["policy"])


def main() -> None:
    spec, callback, timer, tokenizer = start_worker()
    build = build_ppo if spec["algo"] == "ppo" else build_grpo
    build(spec, tokenizer, callback, timer).train()


if __name__ == "__main__":
    main()
