"""verl launch lines that klguard's own trainer cannot run, and the same line for verl with klguard's plugin.

klguard trains text models with its FSDP engine on torch. A line that asks for another engine (Megatron-LM, VeOmni,
TorchTitan), a multimodal model, multi-turn tool rollouts, an Ascend NPU or on-policy distillation stops with one
line naming the feature and the key that asked for it, and prints the command that runs the same line in verl
with the guard inside it (`trainer.v1.trainer_mode=klguard`, klguard.integrations.verl).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from klguard.errors import ConfigError

PLUGIN_MODE = "trainer.v1.trainer_mode=klguard"
VERL_MAIN = "python -m verl.trainer.main_ppo"
# verl's own Hydra config names (verl/trainer/config/): what each one asks for (None: what klguard runs)
VERL_CONFIG_NAMES = {"ppo_trainer": None, "ppo_megatron_trainer": "the Megatron-LM engine",
                     "ppo_veomni_trainer": "the VeOmni engine", "ppo_torchtitan_trainer": "the TorchTitan engine"}
_ENGINES = {"megatron": "the Megatron-LM engine", "veomni": "the VeOmni engine", "torchtitan": "the TorchTitan engine",
            "automodel": "the NeMo AutoModel engine", "mindspeed": "the MindSpeed engine",
            "mlite": "the Megatron Lite engine"}
_OWN_ENGINES = {"fsdp", "fsdp2", "dp", "fsdp_turbo", "none"}


def _truthy(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.strip().lower() in ("true", "1", "yes"))


# hub names of vision-language models (Qwen2.5-VL, Qwen3-VL, GLM-4.1V, MiniCPM-o, LLaVA, InternVL, ...; Qwen3.5,
# whose transformers config, Qwen3_5Config, holds a vision tower)
_VISION_NAME = re.compile(
    r"(?i)((^|[-_.])vl([-_.]|$)|glm-4\.\dv|minicpm-[ov]|llava|internvl|idefics|pixtral|qwen3[._]5)")


def _vision_model(path: Any) -> bool:
    """A model path that names a vision-language model, or a local folder whose config has a vision tower."""
    if not isinstance(path, str):
        return False
    config = Path(path).expanduser() / "config.json"
    if config.is_file():
        try:
            return "vision_config" in json.loads(config.read_text())
        except (OSError, ValueError):
            return False
    return bool(_VISION_NAME.search(path.rstrip("/").rsplit("/", 1)[-1]))


def _feature(key: str, value: Any) -> str | None:
    """What a (key, value) asks for that klguard's trainer does not run, or None."""
    parts = key.split(".")
    text = str(value).strip().lower() if isinstance(value, (str, bool, int, float)) else ""
    if "@" in key:  # a Hydra config-group choice, `actor@actor_rollout_ref.actor=mlite_actor`
        engine = next((name for name in _ENGINES if name in text), None)
        return None if engine is None else _ENGINES[engine]
    if key == "model_engine" and text not in _OWN_ENGINES:
        return _ENGINES.get(text, f"the {value} engine")
    if parts[-1] == "strategy" and text in _ENGINES:
        return _ENGINES[text]
    engine = next((p for p in parts[:-1] if p in _ENGINES), None)
    if engine is not None:
        return _ENGINES[engine]
    if key == "defaults" and isinstance(value, list):
        names = {str(v).removesuffix(".yaml") for v in value if isinstance(v, str)}
        return next((VERL_CONFIG_NAMES[n] for n in sorted(names) if VERL_CONFIG_NAMES.get(n)), None)
    if (key.endswith("model.path") and _vision_model(value)) or (key.endswith(".freeze_vision_tower") and
                                                                  _truthy(value)):
        return "a multimodal (vision-language) model"
    if key == "actor_rollout_ref.rollout.multi_turn.enable" and _truthy(value):
        return "multi-turn rollouts with tools and interactions"
    if key == "actor_rollout_ref.model.mtp.enable" and _truthy(value):
        return "multi-token prediction (MTP)"
    if key == "trainer.device" and text == "npu":
        return "Ascend NPUs"
    if parts[-1] == "tool" and any("profiler" in p for p in parts[:-1]) and text in ("npu", "nsys"):
        return "NPU profiling" if text == "npu" else "Nsight Systems profiling (CUDA GPUs)"
    if key == "distillation.enabled" and _truthy(value):
        return "on-policy distillation"
    return None


def find_foreign(pairs: Iterable[tuple[str, Any]]) -> tuple[str, str, Any] | None:
    """The first (feature, key, value) among the layers' flattened pairs that klguard's trainer cannot run."""
    for key, value in pairs:
        feature = _feature(key, value)
        if feature is not None:
            return feature, key, value
    return None


def plugin_command(overrides: Sequence[str], config_file: str | Path | None = None,
                   config_name: str | None = None, config_path: str | None = None) -> str:
    """The user's line for verl with klguard's plugin: verl's entry point, the same config and overrides (klguard's
    own `guard.*` keys under `+klguard.`; a `trainer.use_v1` or `trainer.v1.trainer_mode` of the line's left out,
    since the plugin is a mode of verl's v1 trainer), and `trainer.v1.trainer_mode=klguard`."""
    words = VERL_MAIN.split()
    if config_file is not None:
        path = Path(config_file).expanduser().resolve()
        words += [f"--config-path={path.parent}", f"--config-name={path.stem}"]
    elif config_name is not None:
        words += ([f"--config-path={config_path}"] if config_path else []) + [f"--config-name={config_name}"]
    for item in overrides:
        key = item.lstrip("+").split("=", 1)[0]
        if key in ("trainer.v1.trainer_mode", "trainer.use_v1"):
            continue
        words.append(f"+klguard.{item.lstrip('+')}" if key.startswith("guard.") else item)
    return shlex.join([*words, PLUGIN_MODE])


class PluginFallback(ConfigError):
    """A launch line klguard's trainer cannot run; `command` runs it in verl with the guard (one line)."""

    def __init__(self, feature: str, key: str, value: Any, command: str) -> None:
        shown = f"{key}={value}" if key != "defaults" else f"config {value}"
        super().__init__(f"{shown} asks for {feature}, which klguard's trainer does not run; the guard runs inside "
                         f"verl for this line: {command}")
        self.feature, self.key, self.command = feature, key, command
