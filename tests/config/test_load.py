"""Config layering: defaults < YAML file < dotted overrides; verl-only keys warned about, not fatal."""

from __future__ import annotations

import yaml

from klguard.commands.cli import main
from klguard.config import config_to_yaml, load_config
from klguard.config.schema import BUILTIN_MODEL


def test_defaults_resolve_interpolations():
    cfg = load_config().config
    assert cfg.actor_rollout_ref.model.path == BUILTIN_MODEL
    assert cfg.critic.ppo_mini_batch_size == cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    assert cfg.trainer.default_local_dir == "checkpoints/klguard/arith_demo"


def test_layers_in_order(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump({"algorithm": {"kl_ctrl": {"kl_coef": 0.2, "horizon": 500}}}))
    cfg = load_config(f, ["algorithm.kl_ctrl.kl_coef=0.05"]).config
    assert cfg.algorithm.kl_ctrl.kl_coef == 0.05  # command line beats the file
    assert cfg.algorithm.kl_ctrl.horizon == 500  # the file beats the default


def test_list_override_and_hydra_plus_prefix():
    loaded = load_config(None, ['trainer.logger=["console","tensorboard"]', "++trainer.seed=7"])
    assert loaded.config.trainer.logger == ["console", "tensorboard"]
    assert loaded.config.trainer.seed == 7


def test_free_form_dict_keys_accepted():
    cfg = load_config(None, ["actor_rollout_ref.model.override_config.num_hidden_layers=1"]).config
    assert cfg.actor_rollout_ref.model.override_config == {"num_hidden_layers": 1}


def test_verl_only_keys_are_collected_not_fatal():
    loaded = load_config(None, [
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4",
        "trainer.n_gpus_per_node=8",
    ])
    assert loaded.ignored_verl_keys == [
        "actor_rollout_ref.model.use_remove_padding",
        "actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space",
        "actor_rollout_ref.rollout.gpu_memory_utilization",
        "trainer.n_gpus_per_node",
    ]


def test_verl_keys_warned_once_in_one_line(capsys):
    code = main(["train", "--print-config", "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
                 "actor_rollout_ref.rollout.max_num_seqs=2"])
    captured = capsys.readouterr()
    assert code == 0
    warnings = [line for line in captured.err.splitlines() if "warning" in line]
    assert len(warnings) == 1
    assert "gpu_memory_utilization" in warnings[0] and "max_num_seqs" in warnings[0]


def test_print_config_round_trips(tmp_path, capsys):
    assert main(["train", "--print-config", "algorithm.gamma=0.99"]) == 0
    text = capsys.readouterr().out
    f = tmp_path / "resolved.yaml"
    f.write_text(text)
    cfg = load_config(f).config
    assert cfg.algorithm.gamma == 0.99
    assert config_to_yaml(cfg) == text


def test_every_key_has_a_one_line_description(capsys):
    from klguard.config.loader import schema_fields

    paths = [path for path, _ in schema_fields()]
    for path, f in schema_fields():
        help_text = f.metadata.get("help", "")
        assert help_text and "\n" not in help_text, path
    assert len(paths) == len(set(paths)) and paths.count("guard.enable") == 1
    assert {"guard.enable", "guard.ppo_kl_max", "guard.hacking_action"} <= set(paths)
    assert main(["train", "--describe-config", "algorithm.gamma=0.99"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "algorithm.gamma = 0.99  # Discount factor" in out
    assert len(out) == len(list(schema_fields()))


def test_a_real_model_gets_the_guard_defaults_measured_on_real_models(tmp_path):
    from klguard.guard.config import EXTERNAL_HOST_DEFAULTS, GuardConfig

    assert EXTERNAL_HOST_DEFAULTS["kl_hard_limit"] != GuardConfig().kl_hard_limit  # else this test shows nothing
    builtin = load_config().config.guard
    assert builtin.kl_hard_limit == GuardConfig().kl_hard_limit
    real = load_config(None, ["actor_rollout_ref.model.path=/models/SmolLM2"]).config.guard
    for key, value in EXTERNAL_HOST_DEFAULTS.items():
        assert getattr(real, key) == value, key
    assert load_config(None, ["data.builtin_task=constraints"]).config.guard == real  # SmolLM2 by the task
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump({"guard": {"kl_hard_patience": 7}}))
    mine = load_config(f, ["actor_rollout_ref.model.path=/models/SmolLM2", "guard.kl_hard_limit=0.2"]).config.guard
    assert (mine.kl_hard_limit, mine.kl_hard_patience) == (0.2, 7)  # the user's file and overrides still win
