"""Keys of verl v0.9.0's own example lines: SAPO's temperatures where verl's SAPO example puts them
(`+actor_rollout_ref.actor.policy_loss.tau_pos`), verl's free-form maps (`ray_kwargs.ray_init`: ray.init's keyword
arguments, its runtime_env and env_vars) taking any key below them, Hydra's config-group choices
(`actor@actor_rollout_ref.actor=mlite_actor`: another engine, the plugin's command) and Qwen3.5 (a vision-language
model)."""

from __future__ import annotations

import pytest

from klguard.config import ConfigError, load_config
from klguard.config.foreign import PluginFallback

A = "actor_rollout_ref.actor."
SAPO = [f"{A}policy_loss.loss_mode=sapo", f"+{A}policy_loss.tau_pos=1.5", f"+{A}policy_loss.tau_neg=2.5"]
ENV_VAR = "ray_kwargs.ray_init.runtime_env.env_vars.TRANSFER_QUEUE_ENABLE"


def test_sapo_temperatures_under_policy_loss_are_the_actors():
    actor = load_config(None, SAPO).config.actor_rollout_ref.actor
    assert (actor.policy_loss.loss_mode, actor.tau_pos, actor.tau_neg) == ("sapo", 1.5, 2.5)


def test_sapo_example_line_keys_as_verl_writes_them():
    """examples/sapo_trainer/run_qwen3_30b_a3b_fsdp.sh at v0.9.0: TAU_POS/TAU_NEG default to 1.0 and 1.05."""
    actor = load_config(None, [f"{A}policy_loss.loss_mode=sapo", f"+{A}policy_loss.tau_pos=1.0",
                               f"+{A}policy_loss.tau_neg=1.05"]).config.actor_rollout_ref.actor
    assert (actor.tau_pos, actor.tau_neg) == (1.0, 1.05)


def test_both_spellings_with_two_values_are_refused_in_one_line():
    with pytest.raises(ConfigError) as info:
        load_config(None, [*SAPO, f"{A}tau_pos=1.0"])
    message = str(info.value)
    assert "\n" not in message and "policy_loss.tau_pos" in message and f"{A}tau_pos" in message


def test_a_bad_temperature_names_the_key():
    with pytest.raises(ConfigError, match="tau_pos"):
        load_config(None, [f"+{A}policy_loss.tau_pos=-1"])


def test_env_vars_of_rays_runtime_env_take_any_name():
    """examples/remax_trainer/run_qwen2.5_math_7b_sync_fsdp.sh at v0.9.0."""
    loaded = load_config(None, [f"+{ENV_VAR}=1", "+ray_kwargs.ray_init.runtime_env.env_vars.MY_FLAG=x",
                                "+ray_kwargs.ray_init.include_dashboard=false"])
    assert loaded.ignored_verl_keys == ["ray_kwargs.ray_init.include_dashboard",
                                        "ray_kwargs.ray_init.runtime_env.env_vars.MY_FLAG", ENV_VAR]


def test_a_map_given_whole_is_taken_too():
    loaded = load_config(None, ["+ray_kwargs.ray_init.runtime_env={env_vars: {A: '1'}, working_dir: .}"])
    assert loaded.ignored_verl_keys == ["ray_kwargs.ray_init.runtime_env.env_vars.A",
                                        "ray_kwargs.ray_init.runtime_env.working_dir"]


def test_outside_the_free_form_map_a_typo_is_still_refused():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["ray_kwargs.ray_inti.num_cpus=4"])
    assert str(info.value).startswith("unknown config key ray_kwargs.ray_inti.num_cpus")


def test_a_config_group_choice_of_another_engine_gives_the_plugin_command():
    """examples/grpo_trainer/run_qwen3_5_35b_megatron_lite.sh at v0.9.0: `actor@actor_rollout_ref.actor=mlite_actor`."""
    with pytest.raises(PluginFallback) as info:
        load_config(None, ["actor@actor_rollout_ref.actor=mlite_actor", f"{A}optim.lr=1e-6"])
    assert "Megatron Lite engine" in str(info.value) and "\n" not in str(info.value)
    assert info.value.command.endswith(
        f"main_ppo actor@actor_rollout_ref.actor=mlite_actor {A}optim.lr=1e-6 trainer.v1.trainer_mode=klguard")


def test_the_fsdp_choice_is_taken_and_another_refused_in_one_line():
    assert load_config(None, ["actor@actor_rollout_ref.actor=dp_actor"]).ignored_verl_keys == [
        "actor@actor_rollout_ref.actor"]
    with pytest.raises(ConfigError) as info:
        load_config(None, ["critic@critic=my_critic"])
    assert str(info.value).startswith("critic@critic=my_critic chooses a verl config that klguard does not read")


def test_a_qwen3_5_checkpoint_is_a_vision_language_model():
    with pytest.raises(PluginFallback, match="multimodal"):
        load_config(None, ["actor_rollout_ref.model.path=Qwen/Qwen3.5-27B"])
