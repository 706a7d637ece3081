"""`rlft`: the command line.

    rlft train algo=<name> [key=value ...]     train one stage (Hydra overrides)
    rlft train -m algo=rm train.lr=1e-4,3e-4   Hydra multirun: one job per combination
    rlft eval model.path=stage:sft run.name=demo
    rlft plot runs/demo                        PNG training curves of every stage of a run
    rlft list [group | keys [prefix]]          algorithms, config groups and options, keys with docs

Overrides are checked before anything heavy is imported; a mistake is one line naming the
valid choices. The resolved config is written to the stage directory before training starts.
"""
from __future__ import annotations

import sys

from rlft.errors import USER_ERRORS

USAGE = """usage: rlft <command> [options] [key=value ...]

commands:
  train [-m] [overrides]   train a stage: rlft train algo=sft run.name=demo
                           -m / --multirun sweeps comma-separated values (Hydra multirun)
  eval [overrides]         accuracy, pass@k, maj@k, reward, RM score, KL to the SFT model:
                           rlft eval model.path=stage:sft run.name=demo
                           rlft eval eval.models=[stage:sft,stage:grpo] run.name=demo
  plot RUN [--out DIR]     PNG curves (reward, KL, accuracy, length, losses) of every stage:
                           rlft plot runs/demo
  list [what]              what: algo | groups | <group> | keys [prefix]
  --help                   this message

Examples:
  rlft train algo=sft run.name=demo train.max_steps=300
  rlft train algo=rm run.name=demo deepspeed=zero2 deepspeed.nproc_per_node=2
  rlft train -m algo=rm run.name=demo train.lr=1e-4,3e-4
  rlft list keys train

Outputs: runs/<run.name>/<algo>/{config.yaml,metrics.jsonl,manifest.json,final/}.
Hydra flags (--cfg job, --info, hydra.* keys) pass through to Hydra; --config-dir <folder> adds your own
recipes and presets (<folder>/experiment/<name>.yaml, used as experiment=<name>)."""


def fail(message: str, code: int = 2) -> None:
    """The one `rlft: error:` line (exit `code`); under RLFT_DEBUG=1 the traceback of the error being handled
    comes first."""
    from rlft.errors import debugging

    if debugging() and sys.exc_info()[0] is not None:
        import traceback

        traceback.print_exc()
    print(f"rlft: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def _train_job(cfg) -> float | None:
    """One training job; returns run.objective from its summary (what a search sweeper optimises)."""
    from rlft.config.defaults import header_lines
    from rlft.config.validate import validate
    from rlft.files import handoff
    from rlft.files.checkpoints import recorded_config
    from rlft.launch import job_dir, launch_train
    from rlft.overrides import set_dicts_as_given
    from rlft.sweep import objective_value

    try:
        overrides, choices = hydra_choices()
        set_dicts_as_given(cfg, overrides)
        filled = validate(cfg, recorded_config(job_dir(cfg)) if cfg.resume else None, overrides)
        launch_train(cfg, header_lines(cfg, overrides, choices, filled))
    except USER_ERRORS as exc:
        fail(str(exc))
    manifest = handoff.read_manifest(job_dir(cfg)) or {}
    return objective_value(manifest.get("summary") or {}, cfg.run.objective)


def hydra_choices() -> tuple[list[str], dict]:
    """This job's command-line overrides and the config-group options Hydra chose (empty outside Hydra)."""
    from hydra.core.hydra_config import HydraConfig

    try:
        hydra_cfg = HydraConfig.get()
    except ValueError:
        return [], {}
    return list(hydra_cfg.overrides.task), {str(k): str(v) for k, v in hydra_cfg.runtime.choices.items()}


def _eval_job(cfg) -> None:
    from rlft.config.validate import validate
    from rlft.overrides import set_dicts_as_given

    try:
        overrides = hydra_choices()[0]
        set_dicts_as_given(cfg, overrides)
        validate(cfg, given=overrides)
        from rlft.eval.evaluate import run_eval

        run_eval(cfg)
    except USER_ERRORS as exc:
        fail(str(exc))


def run_hydra(task, args: list[str]) -> None:
    """Hand the overrides to Hydra, which composes the config and calls task (once per job)."""
    import hydra

    from rlft.config.schema import register_schemas
    from rlft.overrides import conf_dir, replace_dicts

    register_schemas()
    saved = sys.argv
    sys.argv = ["rlft"] + replace_dicts(args)
    try:
        hydra.main(config_path=str(conf_dir()), config_name="config", version_base="1.3")(task)()
    finally:
        sys.argv = saved


HYDRA_FLAGS_WITH_VALUE = ("--cfg", "-c", "--package", "-p", "--config-name", "-cn", "--config-path", "-cp",
                          "--config-dir", "-cd", "--experimental-rerun", "--info", "-i")


def hydra_overrides(args: list[str]) -> list[str]:
    """The key=value overrides among the arguments, without Hydra's flags and their values."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
            if "=" not in arg:
                continue
        if arg.startswith("-"):
            skip = arg in HYDRA_FLAGS_WITH_VALUE
            continue
        out.append(arg)
    return out


def _check(args: list[str]) -> None:
    from rlft.errors import ConfigError
    from rlft.overrides import USER_CONFIG_DIRS, check_overrides, user_config_dirs

    overrides = hydra_overrides(args)
    USER_CONFIG_DIRS[:] = user_config_dirs(args)
    missing = [d for d in USER_CONFIG_DIRS if not d.is_dir()]
    if missing:
        fail(f"config folder not found: {missing[0]} (named by --config-dir or hydra.searchpath)")
    try:
        check_overrides(overrides)
    except ConfigError as exc:
        fail(str(exc))


def cmd_list(args: list[str]) -> None:
    from rlft.config.algorithms import ALGO_SCHEMAS
    from rlft.config.docs import describe_keys
    from rlft.overrides import GROUP_KEYS, algo_kind, group_options, option_description

    what = args[0] if args else "groups"
    if what == "keys":
        prefix = args[1] if len(args) > 1 else None
        preset = args[2] if len(args) > 2 else None
        if prefix and prefix.startswith("algo.") and algo_kind(prefix.split(".")[1]):  # algo.<preset>
            prefix, preset = "algo", prefix.split(".")[1]
        kind = algo_kind(preset) if preset else "sft"
        rows = describe_keys(prefix, kind or "sft")
        if prefix and (prefix == "algo" or prefix.startswith("algo.")) and not preset:
            rows = []
            for name in ALGO_SCHEMAS:
                rows += [(k.replace("algo.", f"algo({name}).", 1), d, doc) for k, d, doc in describe_keys(prefix, name)]
        if not rows:
            fail(f"no config keys under '{prefix}'; try `rlft list keys`")
        width = max(len(r[0]) for r in rows)
        for key, default, doc in rows:
            print(f"{key:<{width}}  {default:<16} {doc}")
        return
    if what == "groups":
        for group in GROUP_KEYS:
            options = group_options(group)
            if options:
                print(f"{group}: {', '.join(options)}")
        print("\n`rlft list <group>` describes the options; `rlft list keys [prefix]` every key.")
        return
    if what not in GROUP_KEYS:
        fail(f"unknown list target '{what}'; valid: groups, keys, {', '.join(GROUP_KEYS)}")
    options = group_options(what)
    width = max((len(o) for o in options), default=0)
    for option in options:
        print(f"{option:<{width}}  {option_description(what, option)}")


def main(argv: list[str] | None = None) -> None:
    try:
        _main(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:  # `rlft list keys | head`
        sys.stderr.close()
    except KeyboardInterrupt:  # a second Ctrl-C (the first one checkpoints and stops with its own line)
        fail("interrupted at once by a second signal; resume=true continues from the last checkpoint", 130)


def _main(args: list[str]) -> None:
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return
    command, rest = args[0], args[1:]
    if command in ("train", "eval") and any(a in ("-h", "--help") for a in rest):
        print(USAGE)
        return
    if command == "train":
        _check(rest)
        run_hydra(_train_job, rest)
    elif command == "eval":
        if any(a in ("-m", "--multirun") for a in rest):
            fail("rlft eval runs one checkpoint at a time; drop -m")
        _check(rest)
        run_hydra(_eval_job, rest)
    elif command == "list":
        cmd_list(rest)
    elif command == "plot":
        from rlft.plot import PlotError, main as plot_main

        try:
            plot_main(rest)
        except PlotError as exc:
            fail(str(exc))
    else:
        fail(f"unknown command '{command}'; valid: train, eval, plot, list (rlft --help)")


if __name__ == "__main__":
    main()
