"""Load the policy, reference, critic and tokenizer from Hugging Face folders, as a real model loads."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer
from transformers.utils import logging as hf_logging

from klguard.config.schema import BUILTIN_MODEL, Config
from klguard.errors import UserError


def resolve_model_path(cfg: Config, *, log=print) -> Path:
    """The policy folder: the cached built-in SFT policy, or a checked local folder."""
    path = cfg.actor_rollout_ref.model.path
    if path == BUILTIN_MODEL:
        from klguard.sft import ensure_sft_policy

        return ensure_sft_policy(cfg.sft, form=cfg.data.builtin_form, log=log)
    return check_model_folder(path, "actor_rollout_ref.model.path")


def resolve_tokenizer_path(cfg: Config) -> Path:
    """The tokenizer folder; for the built-in policy a saved copy that needs no SFT run first."""
    model_cfg = cfg.actor_rollout_ref.model
    if model_cfg.tokenizer_path:
        return check_model_folder(model_cfg.tokenizer_path, "actor_rollout_ref.model.tokenizer_path", tokenizer=True)
    if model_cfg.path == BUILTIN_MODEL:
        from klguard.sft import ensure_builtin_tokenizer

        return ensure_builtin_tokenizer(cfg.sft)
    return check_model_folder(model_cfg.path, "actor_rollout_ref.model.path")


def check_model_folder(path: str | Path, key: str, *, tokenizer: bool = False) -> Path:
    folder = Path(path).expanduser()
    if not folder.exists():
        raise UserError(f"{key}={path} does not exist")
    marker = "tokenizer_config.json" if tokenizer else "config.json"
    if not folder.is_dir() or not (folder / marker).is_file():
        kind = "tokenizer" if tokenizer else "model"
        raise UserError(f"{key}={path} is not a Hugging Face {kind} folder (no {marker})")
    return folder


def load_tokenizer(path: Path, cfg: Config):
    model_cfg = cfg.actor_rollout_ref.model
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=model_cfg.trust_remote_code)
    if tokenizer.pad_token_id is None:  # common for Llama/GPT-2: reuse EOS, masks keep it out of the loss
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    if model_cfg.custom_chat_template:
        tokenizer.chat_template = model_cfg.custom_chat_template
    return tokenizer


def _hf_config(path: Path, override: dict, trust_remote_code: bool):
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    for key, value in (override or {}).items():
        setattr(config, key, value)
    return config


def load_policy(path: Path, cfg: Config, *, trainable: bool, device: torch.device) -> torch.nn.Module:
    """The actor (trainable) or the frozen reference, fp32 master weights."""
    model_cfg = cfg.actor_rollout_ref.model
    config = _hf_config(path, model_cfg.override_config, model_cfg.trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=torch.float32,
                                                 trust_remote_code=model_cfg.trust_remote_code).to(device)
    if trainable and model_cfg.enable_gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if not trainable:
        model.requires_grad_(False)
    model.train(trainable)
    return model


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
    config = _hf_config(path, cfg.critic.model.override_config, trust)
    config.num_labels = 1
    config.classifier_dropout = 0.0  # HF's token-classification head defaults to dropout 0.1; values need none
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the fresh value head is expected, not worth a warning
    try:
        critic = AutoModelForTokenClassification.from_pretrained(path, config=config, dtype=torch.float32,
                                                                 trust_remote_code=trust)
    finally:
        hf_logging.set_verbosity(level)
    if resume_path is None:  # a zero head starts every value at 0: no random advantages at step 1
        head = next(getattr(critic, n) for n in ("score", "classifier") if hasattr(critic, n))
        with torch.no_grad():
            head.weight.zero_()
            if getattr(head, "bias", None) is not None:
                head.bias.zero_()
    if cfg.critic.model.enable_gradient_checkpointing:
        critic.gradient_checkpointing_enable()
    return critic.to(device)
