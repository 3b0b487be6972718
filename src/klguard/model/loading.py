"""Load the policy, reference, critic and tokenizer from local Hugging Face folders (any causal LM that
AutoModelForCausalLM knows: Llama, Qwen2, Mistral, Gemma, GPT-2, ...) or GGUF files (klguard.model.gguf).
Weights are fp32 masters; `fsdp_config.dtype` runs the forward under bf16 autocast. Remote code runs only with
trust_remote_code."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer
from transformers.utils import logging as hf_logging

from klguard.config.schema import Config
from klguard.errors import UserError
from klguard.model.gguf import gguf_source, resolve_gguf
from klguard.model.hf_load import hf_load, one_line
from klguard.model.lora import add_lora, load_adapted, lora_settings, merged_model, saved_lora


def check_model_folder(path: str | Path, key: str, *, tokenizer: bool = False) -> Path:
    """The Hugging Face folder `path` names under `key`: the folder itself, or for a GGUF file (or a folder holding
    one) its de-quantised copy in the cache (klguard.model.gguf)."""
    folder = Path(path).expanduser()
    if not folder.exists():
        raise UserError(f"{key}={path} does not exist")
    gguf = gguf_source(folder, key)
    if gguf is not None:
        return resolve_gguf(gguf, key)
    marker = "tokenizer_config.json" if tokenizer else "config.json"
    if not folder.is_dir() or not (folder / marker).is_file():
        kind = "tokenizer" if tokenizer else "model"
        raise UserError(f"{key}={path} is not a Hugging Face {kind} folder (no {marker})")
    return folder


def set_pad_token(tokenizer, key: str):
    """No pad token (Llama, GPT-2): reuse EOS (or UNK); masks keep pad positions out of every loss."""
    if tokenizer.pad_token_id is None:
        fallback = tokenizer.eos_token if tokenizer.eos_token is not None else tokenizer.unk_token
        if fallback is None:
            raise UserError(f"{key}: the tokenizer has no pad, eos or unk token to pad with")
        tokenizer.pad_token = fallback
    return tokenizer


def load_tokenizer(path: Path, cfg: Config):
    model_cfg = cfg.actor_rollout_ref.model
    key = "actor_rollout_ref.model.tokenizer_path" if model_cfg.tokenizer_path else "actor_rollout_ref.model.path"
    tokenizer = hf_load(AutoTokenizer.from_pretrained, path, key, trust_remote_code=model_cfg.trust_remote_code)
    set_pad_token(tokenizer, key)
    tokenizer.padding_side = "left"
    if model_cfg.custom_chat_template:
        tokenizer.chat_template = model_cfg.custom_chat_template
    if not tokenizer.chat_template:
        raise UserError(f"{key}={path}: the tokenizer has no chat template (a base model?); "
                        "set actor_rollout_ref.model.custom_chat_template")
    return tokenizer


def hf_config(path: Path, override: dict, trust_remote_code: bool, key: str = "model path"):
    config = hf_load(AutoConfig.from_pretrained, path, key, trust_remote_code=trust_remote_code)
    for name, value in (override or {}).items():
        try:
            setattr(config, name, value)
        except (ValueError, TypeError) as exc:
            raise UserError(f"{key}: override_config.{name}={value!r} rejected: {one_line(exc)}") from None
    return config


def enable_checkpointing(model: torch.nn.Module) -> None:
    """Recompute activations in backward (transformers 5 renamed gradient_ to activation_checkpointing)."""
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()


CAUSAL_LM_HEADS = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


def check_architecture(config, heads: tuple[str, ...], key: str, path: Path, kind: str) -> None:
    """A folder whose saved architectures carry another head (e.g. a reward model given as the policy)
    would load with a freshly initialised head: refuse it in one line."""
    names = getattr(config, "architectures", None) or []
    if names and not any(n.endswith(heads) for n in names):
        raise UserError(f"{key}={path} is not a {kind} (architectures: {', '.join(names)})")


def compute_dtype(name: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for fsdp_config.dtype, or None for plain fp32."""
    if name in ("float32", "fp32"):
        return None
    if name == "auto":
        cuda_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if cuda_bf16 else None
    return torch.bfloat16


def apply_precision(model: torch.nn.Module, dtype_name: str, device: torch.device) -> torch.nn.Module:
    """Run `model`'s forward under bf16 autocast when asked; the weights (and the optimizer) stay fp32.
    Callers upcast logits to fp32 before log-softmax."""
    dtype = compute_dtype(dtype_name, device)
    if dtype is not None:
        model.forward = torch.autocast(device_type=device.type, dtype=dtype)(model.forward)
        model.klguard_autocast = (device.type, dtype)
    return model


def precision_scope(model: torch.nn.Module) -> AbstractContextManager:
    """One autocast region around many forwards of `model` (a decode loop): autocast then casts its trainable
    fp32 weights once and reuses them (its weight cache lives until the outermost region ends) instead of
    casting every weight at every step. The same numbers; a no-op for fp32 models."""
    found = getattr(model, "klguard_autocast", None)
    return torch.autocast(device_type=found[0], dtype=found[1]) if found else nullcontext()


def load_policy(path: Path, cfg: Config, *, trainable: bool, device: torch.device) -> torch.nn.Module:
    """The actor (trainable) or the frozen reference, fp32 master weights."""
    model_cfg = cfg.actor_rollout_ref.model
    key = "actor_rollout_ref.model.path"
    config = hf_config(path, model_cfg.override_config, model_cfg.trust_remote_code, key)
    check_architecture(config, CAUSAL_LM_HEADS, key, path, "causal language model")
    wanted = lora_settings(model_cfg) if trainable else None
    model = load_causal_lm(path, config, key, model_cfg.trust_remote_code, keep_adapters=wanted)
    if wanted is not None and saved_lora(model.config) is None:
        try:
            add_lora(model, wanted, seed=cfg.trainer.seed)
        except ValueError as exc:
            raise UserError(f"actor_rollout_ref.model.{exc}") from None
    model = model.to(device)
    if trainable and model_cfg.enable_gradient_checkpointing:
        enable_checkpointing(model)
        if wanted is not None:  # frozen embeddings: a reentrant checkpoint would give the adapters no gradient
            model.enable_input_require_grads()
    if not trainable:
        model.requires_grad_(False)
    model.train(trainable)
    return apply_precision(model, cfg.actor_rollout_ref.actor.fsdp_config.dtype, device)


def load_causal_lm(path: Path, config, key: str, trust_remote_code: bool, *,
                   keep_adapters: dict | None) -> torch.nn.Module:
    """The causal LM in `path`. A folder a LoRA run saved (klguard.model.lora) is rebuilt with its adapters when
    `keep_adapters` are the same settings (a resume or rollback), else merged into a plain model (`klguard
    export` and `eval` ask for that with None)."""
    saved = saved_lora(config)
    if saved is None:
        return hf_load(AutoModelForCausalLM.from_pretrained, path, key, config=config, dtype=torch.float32,
                       trust_remote_code=trust_remote_code)
    try:
        adapted = load_adapted(path, config, saved)
    except (ValueError, OSError) as exc:
        raise UserError(f"{key}={path}: {one_line(exc)}") from None
    return adapted if keep_adapters == saved else merged_model(adapted)


def load_critic(policy_path: Path, cfg: Config, *, device: torch.device,
                resume_path: Path | None = None) -> torch.nn.Module:
    """A token-classification model with one output (the value). A fresh critic takes its body from
    critic.model.path (or the policy) and a zeroed value head; a resumed one loads both."""
    if resume_path is not None:
        path = resume_path
    elif cfg.critic.model.path:
        path = check_model_folder(cfg.critic.model.path, "critic.model.path")
    else:
        path = policy_path
    trust = cfg.actor_rollout_ref.model.trust_remote_code
    key = "critic.model.path" if cfg.critic.model.path else "actor_rollout_ref.model.path"
    config = hf_config(path, cfg.critic.model.override_config, trust, key)
    config.num_labels = 1
    config.classifier_dropout = 0.0  # HF's token-classification head defaults to dropout 0.1; values need none
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the fresh value head is expected, not worth a warning
    try:
        critic = hf_load(AutoModelForTokenClassification.from_pretrained, path, key, config=config,
                         dtype=torch.float32, trust_remote_code=trust)
    finally:
        hf_logging.set_verbosity(level)
    if resume_path is None:  # a zero head starts every value at 0: no random advantages at step 1
        head = next(getattr(critic, n) for n in ("score", "classifier") if hasattr(critic, n))
        with torch.no_grad():
            head.weight.zero_()
            if getattr(head, "bias", None) is not None:
                head.bias.zero_()
    if cfg.critic.model.enable_gradient_checkpointing:
        enable_checkpointing(critic)
    return apply_precision(critic.to(device), cfg.critic.model.fsdp_config.dtype, device)
