"""The ``jaxwm`` command: one entry point for every tool, each also a module of its own.

    jaxwm configs [NAME[:VARIANT]]   list the configs, or one config's settings
    jaxwm train --config=ppo:cartpole [--config.KEY=VALUE ...]
    jaxwm eval --workdir=runs/... [--episodes N] [--video] [--step S]
    jaxwm report RUNS... --out report/
    jaxwm launch --num_processes=2 -- --config=ppo:cartpole
    jaxwm make-dataset --env Pendulum-v1 --level medium --out data/pendulum.hdf5

``python -m jaxwm.train`` (and ``jaxwm.report``, ``jaxwm.launch``,
``jaxwm.tools.make_dataset``) run the same code. Subcommands import only what they need, so
``jaxwm --help`` and ``jaxwm configs`` answer before JAX has compiled anything.
"""

from __future__ import annotations

import importlib
import signal
import sys

# name -> (module with main(argv, prog), one line)
COMMANDS = {
    "configs": ("jaxwm.cli", "list the configs (NAME:VARIANT), or every setting of one"),
    "train": ("jaxwm.train", "train a config; --help with --config lists its settings"),
    "eval": ("jaxwm.trained", "evaluate a trained run again from its checkpoint (read-only)"),
    "report": ("jaxwm.report", "tables and figures (rliable aggregates) from run directories"),
    "launch": ("jaxwm.launch", "run `jaxwm train` in several processes (JAX distributed)"),
    "make-dataset": ("jaxwm.tools.make_dataset", "write a D4RL-style dataset from a SAC run"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    return "\n".join(["usage: jaxwm <command> [options]   (jaxwm <command> --help for its own)",
                      "", "World-model reinforcement learning in JAX.", "", "commands:",
                      *(f"  {name:<{width}}  {line}" for name, (_, line) in COMMANDS.items())])


def configs_main(argv: list[str], prog: str = "jaxwm configs") -> int:
    """``jaxwm configs``: every packaged config's variants; ``jaxwm configs ppo:cartpole``:
    that variant's settings, values, ranges and descriptions."""
    from jaxwm import configs
    from jaxwm.config import ConfigError, load_or_refuse

    if any(arg in ("-h", "--help") for arg in argv) or len(argv) > 1:
        print(f"usage: {prog} [NAME[:VARIANT] | PATH.py[:VARIANT]]\n\nWithout an argument: "
              "every packaged config, its variants and what each is for. With one: every "
              "setting of that config (KEY  VALUE  description (valid range)).")
        return 0 if len(argv) <= 1 or "-h" in argv or "--help" in argv else 2
    if not argv:
        print(configs.listing())
        return 0
    spec = argv[0]
    try:
        if ":" not in spec and spec in configs.names():  # a name alone: its variants
            print("\n".join(f"{spec}:{v}  {configs.summary(spec, v)}"
                            for v in configs.variants(spec)))
            return 0
        print(configs.describe(load_or_refuse(spec)))
    except ConfigError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    if argv is None and hasattr(signal, "SIGPIPE"):  # `jaxwm configs | head`: exit quietly
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"jaxwm: unknown command {command!r}\n\n{usage()}", file=sys.stderr)
        return 2
    prog = f"jaxwm {command}"
    if command == "configs":
        return configs_main(rest, prog)
    module = importlib.import_module(COMMANDS[command][0])
    if command == "train":
        return module.main([prog, *rest])
    try:
        return module.main(rest, prog=prog)
    except SystemExit as e:  # argparse's exit for --help (0) and usage errors (2)
        return e.code if isinstance(e.code, int) else 1


if __name__ == "__main__":
    sys.exit(main())
