"""Choice fields: one Literal per field is the list of its values, for the registries, OmegaConf, the checks and
the descriptions alike; a refused value is one line naming the key and what it may be."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from typing import get_args

import pytest

from klguard.algo.advantage import ADV_ESTIMATORS, GROUP_ESTIMATORS, AdvEstimator
from klguard.algo.kl import KL_CONTROLLERS, KL_ESTIMATORS, BaseKLEstimator, KLCtrlType
from klguard.algo.loss import LOSS_AGG_MODES, LossAggMode
from klguard.config import Config, ConfigError, load_config
from klguard.config.schema import PROFILER_CONTENTS, BuiltinForm, CalibrateController, ProfilerContent
from klguard.config.validate import validate
from klguard.fields import check_tree, choice_fields, choices
from klguard.guard.config import HACKING_ACTIONS, HackingAction

CHOICE_FIELDS = {path: (f, allowed) for path, f, allowed in choice_fields(Config)}


def test_registries_are_the_literals() -> None:
    assert tuple(KL_CONTROLLERS) == get_args(KLCtrlType)
    assert tuple(ADV_ESTIMATORS) == get_args(AdvEstimator)
    assert set(ADV_ESTIMATORS) > GROUP_ESTIMATORS
    assert get_args(LossAggMode) == LOSS_AGG_MODES
    assert set(get_args(CalibrateController)) < set(get_args(KLCtrlType))
    assert get_args(HackingAction) == HACKING_ACTIONS
    assert get_args(ProfilerContent) == PROFILER_CONTENTS


def test_every_base_estimator_has_its_plus_form_and_full_is_gone() -> None:
    bases = get_args(BaseKLEstimator)
    assert set(KL_ESTIMATORS) == {*bases, *(f"{b}+" for b in bases)}
    assert "full" not in KL_ESTIMATORS


def test_choice_lists_elsewhere_agree_with_the_schema() -> None:
    """Modules outside config/ that keep their own copy (data, the built-in task, profiling) hold the same values."""
    from klguard.builtin.arith import FORMS
    from klguard.data.dataset import TRUNCATIONS, Truncation
    from klguard.runtime.profiling import CONTENTS

    assert set(TRUNCATIONS) == set(get_args(Truncation))
    assert set(FORMS) == set(get_args(BuiltinForm))
    assert CONTENTS == PROFILER_CONTENTS


def test_choice_fields_cover_the_known_ones() -> None:
    assert {"algorithm.kl_ctrl.type", "algorithm.kl_penalty", "algorithm.adv_estimator", "data.truncation",
            "actor_rollout_ref.actor.strategy", "critic.strategy", "actor_rollout_ref.actor.fsdp_config.dtype",
            "critic.loss_agg_mode", "global_profiler.tool", "calibrate.controller", "guard.hacking_action",
            "trainer.device", "actor_rollout_ref.rollout.name"} <= set(CHOICE_FIELDS)
    assert CHOICE_FIELDS["global_profiler.tool"][1] == ("torch", None)


def test_choices_writes_the_values_with_notes() -> None:
    assert choices(KLCtrlType) == "fixed | adaptive | pid"
    assert choices(KLCtrlType, pid="ours") == "fixed | adaptive | pid (ours)"
    with pytest.raises(ValueError, match="pidd"):
        choices(KLCtrlType, pidd="a note on a value the type lacks")
    with pytest.raises(ValueError):
        choices(int)


@pytest.mark.parametrize("key", sorted(CHOICE_FIELDS))
def test_a_value_outside_the_literal_is_one_line_naming_the_key(key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"{key}=zq_nope"])
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{key}='zq_nope' "), message
    f, allowed = CHOICE_FIELDS[key]
    if "invalid" not in f.metadata:
        assert message.endswith("is not one of: " + ", ".join(sorted("null" if a is None else a for a in allowed)))


@pytest.mark.parametrize("key", sorted(CHOICE_FIELDS))
def test_every_listed_value_is_accepted(key: str) -> None:
    """Each value of a choice field loads on its own, except where a rule across keys needs more (gdpo: its keys)."""
    _, allowed = CHOICE_FIELDS[key]
    extra = {"algorithm.adv_estimator": ["algorithm.gdpo_reward_keys=[acc]"],
             "trainer.resume_mode": ["trainer.resume_from_path=/tmp/x"],
             "global_profiler.tool": ["global_profiler.steps=[1]"]}.get(key, [])
    for value in allowed:
        load_config(None, [f"{key}={'null' if value is None else value}", *extra])


@pytest.mark.parametrize("key", ["algorithm.kl_penalty", "actor_rollout_ref.actor.kl_loss_type"])
def test_full_vocabulary_kl_is_refused_by_name(key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"{key}=full"])
    message = str(info.value)
    assert message.startswith(f"{key}='full' ") and "\n" not in message
    assert "does not implement the full-vocabulary KL" in message and "use low_var_kl or kl" in message


def test_a_config_built_in_python_gets_the_same_checks() -> None:
    """validate() on a Config made without OmegaConf refuses the same values, with the same messages."""
    cfg = load_config().config
    cfg.algorithm.kl_ctrl.type = "pidd"
    with pytest.raises(ConfigError, match=r"^algorithm.kl_ctrl.type='pidd' is not one of: adaptive, fixed, pid$"):
        validate(cfg)
    cfg = load_config().config
    cfg.actor_rollout_ref.actor.kl_loss_type = "full"
    with pytest.raises(ConfigError, match="full-vocabulary"):
        validate(cfg)
    cfg = load_config().config
    cfg.guard.ppo_kl_max = 0.0
    with pytest.raises(ConfigError, match=r"^guard.ppo_kl_max=0.0 must be > 0$"):
        validate(cfg)


def test_list_valued_choices_are_checked_per_item() -> None:
    with pytest.raises(ConfigError, match=r"^trainer.logger='slack' is not one of: console, file, jsonl"):
        load_config(None, ["trainer.logger=[console,slack]"])
    key = "actor_rollout_ref.actor.profiler.tool_config.torch.contents"
    with pytest.raises(ConfigError, match=rf"^{key}='gpu' is not one of: cpu, cuda, memory, shapes, stack$"):
        load_config(None, [f"{key}=[cpu,gpu]"])


def test_sections_check_in_check_not_post_init() -> None:
    """OmegaConf.to_object runs __post_init__ before validation and a default may be an unresolved ${...}:
    sections define none, and a default Config (interpolations as strings) builds without a check."""
    def sections(cls: type):
        yield cls
        for f in dataclasses.fields(cls):
            if isinstance(f.default_factory, type) and dataclasses.is_dataclass(f.default_factory):
                yield from sections(f.default_factory)

    assert not [cls for cls in sections(Config) if hasattr(cls, "__post_init__")]
    assert Config().critic.ppo_mini_batch_size == "${actor_rollout_ref.actor.ppo_mini_batch_size}"
    check_tree(load_config().config)


def test_fields_is_a_leaf() -> None:
    """klguard.guard imports it: it must pull in neither the config package (a cycle) nor torch."""
    code = ("import sys, klguard.fields; bad = [m for m in ('torch', 'klguard.config', 'klguard.config.schema', "
            "'klguard.config.loader') if m in sys.modules]; print(bad)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr
