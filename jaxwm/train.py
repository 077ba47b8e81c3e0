"""``jaxwm train --config=ALGO:VARIANT [--config.KEY=VALUE]`` (also ``python -m jaxwm.train``).

Builds the env, the algorithm and the loop from the config, and nothing else. Bad flags and
invalid configs are reported in one line, before anything compiles or is written.

Exit status: 0 when the run finished, ``EXIT_INTERRUPTED`` (75, sysexits' ``EX_TEMPFAIL``:
try again later) when SIGINT or SIGTERM stopped it after its checkpoint was saved, so that a
scheduler can requeue it with ``--config.resume=True`` (``examples/slurm.sbatch``), 1 for a
run that failed (a bad config, an incompatible checkpoint, NaN), 2 for bad flags.
"""

from __future__ import annotations

import re
import sys
import types

from absl import flags
from ml_collections import config_flags

import jaxwm.config
from jaxwm import parallel, runner
from jaxwm.config import ConfigError
from jaxwm.envs import UnknownEnvError
from jaxwm.loop.checkpoint import IncompatibleCheckpointError, WriteError

# The flag-free entry points, re-exported: code that trains in-process (tests, benchmarks,
# make_dataset) imports jaxwm.runner, never this module, whose flags exist once per process.
from jaxwm.runner import default_workdir, dry_run, validate  # noqa: F401
from jaxwm.tools.make_dataset import make_missing_inputs

EXIT_INTERRUPTED = 75  # stopped by a signal, checkpoint saved: resume with --config.resume=True

USAGE = """usage: jaxwm train --config=ALGO:VARIANT [--config.KEY=VALUE ...] [--workdir=DIR]
                   [--dry_run]

Trains a config: a packaged one by name (ppo:cartpole; `jaxwm configs` lists them) or a
file of yours (my_ppo.py:cartpole), with any setting overridden by its dotted key. The run
directory (default runs/<algo>_<env>_s<seed>) gets config.json, metrics.jsonl, TensorBoard
logs, checkpoints and evaluation videos; --config.resume=True continues it.

options:
  --config=SPEC         the config: ALGO:VARIANT or PATH.py[:VARIANT]
  --config.KEY=VALUE    override one setting (`jaxwm configs ALGO:VARIANT` lists them)
  --workdir=DIR         the run directory
  --dry_run             validate, print the resolved config and the phase table, write nothing
  -h, --help            this message; with --config, also every setting of that config"""


def _config_spec(argv: list[str]) -> tuple[str | None, list[str]]:
    """The ``--config=SPEC`` (or ``--config SPEC``) argument, and argv without it."""
    rest, spec = [], None
    args = iter(argv)
    for arg in args:
        if arg.startswith("--config="):
            spec = arg.split("=", 1)[1]
        elif arg == "--config":
            spec = next(args, None)
        else:
            rest.append(arg)
    return spec, rest


def _flags(config, argv: list[str]) -> tuple[flags.FlagValues, dict]:
    """Fresh flags for one command line (no process-wide state): the config's overrides
    (``--config.KEY=VALUE``, typed and checked by ml_collections), ``--workdir``, ``--dry_run``."""
    values = flags.FlagValues()
    holders = {
        "config": config_flags.DEFINE_config_dict("config", config, flag_values=values,
                                                   sys_argv=argv),
        "workdir": flags.DEFINE_string("workdir", None, "Run directory", flag_values=values),
        "dry_run": flags.DEFINE_bool("dry_run", False, "Validate and print", flag_values=values),
    }
    return values, holders


def explain_flag_error(error: Exception) -> str:
    """One readable line from absl/ml_collections' nested, escaped flag errors."""
    text = str(error).replace("\\n", "\n").replace("\\'", "'")
    lines = [line.strip(" '\"") for line in text.splitlines() if line.strip(" '\"")]
    raised = [line for line in lines if re.match(r"^\w*(Error|Exception): ", line)]
    if raised:  # a traceback from inside the config file: keep what it raised
        return raised[-1].split(": ", 1)[1]
    key = re.search(r"'([^']+)'", text)
    if isinstance(error, (AttributeError, KeyError)) and key:
        hint = re.search(r'Did you mean "[^"]+" instead of "[^"]+"\?', text)
        return f"unknown config key {key.group(1)!r}." + (f" {hint.group(0)}" if hint else "")
    return " ".join(lines)


def run(config, workdir: str) -> dict:
    """Makes the inputs the config says how to make (a dataset), then validates, builds and
    trains (``runner.run``); returns the trainer's final metrics."""
    runner.validate(config)  # before making anything the config's own errors could refuse
    make_missing_inputs(config)
    return runner.run(config, workdir)


HELP_FLAGS = ("-h", "--help", "-help", "--helpfull")


def _parse(argv: list[str]):
    """``(config, workdir or None, dry_run)`` from a command line, or the exit code after
    saying in one line what was wrong (or printing the help)."""
    spec, rest = _config_spec(argv[1:])
    wants_help = any(arg in HELP_FLAGS for arg in rest)
    rest = [arg for arg in rest if arg not in HELP_FLAGS]
    if spec is None:
        if wants_help:
            print(USAGE)
            return 0
        print("jaxwm train: pass --config=ALGO:VARIANT (e.g. ppo:cartpole; `jaxwm configs` "
              "lists them)", file=sys.stderr)
        return 2
    try:
        config = jaxwm.config.load_or_refuse(spec)
    except ConfigError as e:
        print(f"jaxwm train: {e}", file=sys.stderr)
        return 2
    try:  # ml_collections defines a flag per override, so a typo'd key fails here already
        values, holders = _flags(config, [argv[0], *rest])
        extra = values([argv[0], *rest])[1:]
        config = holders["config"].value
    except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as e:
        print(f"jaxwm train: bad command line: {explain_flag_error(e)}", file=sys.stderr)
        return 2
    if extra:
        print(f"jaxwm train: unexpected arguments {' '.join(extra)} (settings are "
              "--config.KEY=VALUE)", file=sys.stderr)
        return 2
    if wants_help:
        from jaxwm import configs

        try:
            settings = configs.describe(config)
        except (ConfigError, AttributeError, KeyError) as e:
            print(f"jaxwm train: cannot describe {spec!r}: its algo is not a registered one "
                  f"({e})", file=sys.stderr)
            return 2
        print(USAGE + f"\n\nsettings of {spec} (KEY  VALUE  description (valid range)):\n"
              + settings)
        return 0
    return config, holders["workdir"].value, holders["dry_run"].value


def main(argv=None) -> int:
    parsed = _parse(list(sys.argv if argv is None else argv))
    if isinstance(parsed, int):
        return parsed
    config, workdir, dry_run_only = parsed
    try:
        parallel.maybe_initialize_distributed()
    except parallel.DistributedError as e:
        print(f"jaxwm train: {e}", file=sys.stderr)
        return 2
    try:
        workdir = workdir or default_workdir(config)
    except (AttributeError, KeyError) as e:
        print(f"jaxwm train: the config lacks {e} (a config needs algo, env.id and seed; start "
              "from a packaged one: `jaxwm configs`)", file=sys.stderr)
        return 2
    try:
        if dry_run_only:
            print(dry_run(config, workdir))
            return 0
        summary = run(config, workdir)
    except (ConfigError, UnknownEnvError, IncompatibleCheckpointError, WriteError,
            FloatingPointError) as e:
        print(f"jaxwm train: {e}", file=sys.stderr)
        return 1
    status = EXIT_INTERRUPTED if summary["interrupted"] else 0
    if not parallel.is_primary():
        return status
    ret = summary.get("eval/episodic_return")
    done = ", ".join(f"{n:,} {unit.replace('_', ' ')}" for unit, n in summary["counters"].items()
                     if unit != "iterations")
    per_seed = [summary[f"eval/episodic_return/seed_{k}"] for k in range(config.num_seeds)
                if f"eval/episodic_return/seed_{k}" in summary]
    print(f"Finished {done} in {workdir}"
          + (f"; final eval return {ret:.1f}" if ret is not None else "")
          + (f" (seeds: {', '.join(f'{r:.1f}' for r in per_seed)})" if len(per_seed) > 1 else "")
          + (" (interrupted; resume with --config.resume=True)" if summary["interrupted"] else ""))
    return status


class _CallableModule(types.ModuleType):
    """``jaxwm.train(config, workdir)`` from Python: this module is callable, so the public
    function and ``python -m jaxwm.train`` share one name."""

    def __call__(self, config, workdir: str | None = None) -> dict:
        return run(config, workdir or default_workdir(config))


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    sys.exit(main())
