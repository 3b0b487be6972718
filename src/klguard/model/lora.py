"""LoRA adapters on the actor (verl's `actor_rollout_ref.model.lora_rank`, `lora_alpha`, `target_modules`,
`exclude_modules`), through PEFT's in-place injection: the model keeps its class and its Hugging Face forward, the
adapted linears become PEFT LoRA layers over frozen base weights, and only the adapters train.

A checkpoint's actor folder holds the adapted model as it trains (base weights and adapters by their PEFT names)
and its config.json carries the adapter settings (`klguard_lora`), so a resume or rollback rebuilds the same
layers; `klguard export` and a re-anchored reference take the merged weights (W + alpha/r B A), a plain model."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

LORA_CONFIG_KEY = "klguard_lora"
"""The HF config attribute (saved in config.json) that marks a folder's weights as LoRA-adapted."""
ADAPTER = "default"


def lora_settings(model_cfg) -> dict | None:
    """The adapter settings of `actor_rollout_ref.model` (None: full fine-tuning)."""
    if model_cfg.lora_rank <= 0:
        return None
    return {"r": model_cfg.lora_rank, "lora_alpha": model_cfg.lora_alpha, "target_modules": model_cfg.target_modules,
            "exclude_modules": model_cfg.exclude_modules}


def add_lora(model: torch.nn.Module, settings: dict, seed: int = 0) -> torch.nn.Module:
    """Inject LoRA adapters (A random from `seed`, B = 0: the adapted model starts equal to the base), freeze every
    other weight and record the settings in the model's config. The seed makes A the same on every rank and at
    every world size, whatever the global RNG has drawn before, and leaves the global RNG as it was."""
    from peft import LoraConfig, inject_adapter_in_model

    config = LoraConfig(r=settings["r"], lora_alpha=settings["lora_alpha"], lora_dropout=0.0, bias="none",
                        target_modules=settings["target_modules"], exclude_modules=settings["exclude_modules"],
                        task_type="CAUSAL_LM")
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    except ValueError:  # PEFT: none of the target modules found
        raise ValueError(f"target_modules={settings['target_modules']!r} matched no linear layer of the model "
                         "(all-linear, or names such as q_proj)") from None
    for name, param in model.named_parameters():
        param.requires_grad_(".lora_" in name)
    setattr(model.config, LORA_CONFIG_KEY, dict(settings))
    return model


@contextmanager
def adapters_off(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """`model` as its base model for the block: every LoRA layer bypassed, in eval mode; then as it was. The base
    weights never train, so a LoRA actor with its adapters off is the initial policy (the reference verl and TRL
    use with LoRA, no second copy in memory)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    training = model.training
    for layer in layers:
        layer.enable_adapters(False)
    model.eval()
    try:
        yield model
    finally:
        for layer in layers:
            layer.enable_adapters(True)
        model.train(training)


def saved_lora(config) -> dict | None:
    """The adapter settings a saved folder's config carries (None: a plain model)."""
    found = getattr(config, LORA_CONFIG_KEY, None)
    return dict(found) if found else None


def load_adapted(path: Path, config, settings: dict) -> torch.nn.Module:
    """A LoRA-adapted model from a folder its own run saved: the architecture from `config`, the adapters injected,
    then every tensor (base and adapters) from the folder's safetensors."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    add_lora(model, settings)
    state: dict[str, torch.Tensor] = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        state |= load_file(file)
    load_exact(model, state, str(path))
    return model


def load_exact(model: torch.nn.Module, state: dict[str, torch.Tensor], where: str) -> None:
    """Every tensor of `model` from `state` (a tied copy of a loaded one counts as loaded), nothing else."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    tensors = model.state_dict()
    loaded = {tensors[k].data_ptr() for k in state if k in tensors}
    lacking = [k for k in missing if tensors[k].data_ptr() not in loaded]
    if unexpected or lacking:
        raise ValueError(f"{where} does not hold this model's tensors (e.g. {(unexpected or lacking)[0]})")


def merged_state_dict(state: dict[str, torch.Tensor], settings: dict) -> dict[str, torch.Tensor]:
    """A LoRA model's full state dict as the plain model's: each adapted `X.base_layer.weight` becomes `X.weight`
    + alpha/r lora_B @ lora_A (fp32), the adapters dropped."""
    scale = settings["lora_alpha"] / settings["r"]
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if ".lora_" in key:
            continue
        if ".base_layer." not in key:
            out[key] = value
            continue
        prefix, _, leaf = key.partition(".base_layer.")
        name = f"{prefix}.{leaf}"
        if leaf == "weight":
            a = state[f"{prefix}.lora_A.{ADAPTER}.weight"].float()
            b = state[f"{prefix}.lora_B.{ADAPTER}.weight"].float()
            value = (value.float() + scale * (b @ a)).to(value.dtype)
        out[name] = value
    return out


def merged_model(model: torch.nn.Module) -> torch.nn.Module:
    """A plain model of `model`'s architecture with its merged weights (`model` is left as it is)."""
    from transformers import AutoModelForCausalLM

    settings = saved_lora(model.config)
    config = model.config.__class__.from_dict(model.config.to_dict())
    if hasattr(config, LORA_CONFIG_KEY):
        delattr(config, LORA_CONFIG_KEY)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    load_exact(plain, merged_state_dict(model.state_dict(), settings), "the merged LoRA model")
    return plain
