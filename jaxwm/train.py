"""Launcher: ``python -m jaxwm.train --config=configs/<algo>.py:<variant> [--config.x=y]``.

Builds the env, the algorithm and the loop from the config, and nothing else. Bad flags and
invalid configs are reported in one line, before anything compiles or is written.
"""

from __future__ import annotations

import re
import sys

from absl import flags
from ml_collections import config_flags

from jaxwm import parallel, runner
from jaxwm.config import ConfigError
from jaxwm.envs import UnknownEnvError
from jaxwm.loop.checkpoint import IncompatibleCheckpointError, WriteError

# The flag-free entry points, re-exported: code that trains in-process (tests, benchmarks,
# make_dataset) imports jaxwm.runner, never this module, whose flags exist once per process.
from jaxwm.runner import default_workdir, dry_run, validate  # noqa: F401
from jaxwm.tools.make_dataset import make_missing_inputs

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/ppo.py:cartpole")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default runs/<algo>_<env>_s<seed>)")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Validate, print the resolved config and the "
                             "phase table, and exit without building or writing anything")


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


def main(argv=None) -> int:
    argv = list(sys.argv if argv is None else argv)
    try:
        flags.FLAGS(argv)
    except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as e:
        print(f"jaxwm.train: bad command line: {explain_flag_error(e)}", file=sys.stderr)
        return 2
    config = _CONFIG.value
    if config is None:
        print("jaxwm.train: pass --config=configs/<algo>.py:<variant>", file=sys.stderr)
        return 2
    try:
        config.algo  # noqa: B018 -- ml_collections defers a missing file's error to first use
    except OSError as e:
        print(f"jaxwm.train: cannot load the config file: {str(e).splitlines()[-1].strip()}",
              file=sys.stderr)
        return 2
    try:
        parallel.maybe_initialize_distributed()
    except parallel.DistributedError as e:
        print(f"jaxwm.train: {e}", file=sys.stderr)
        return 2
    workdir = _WORKDIR.value or default_workdir(config)
    try:
        if _DRY_RUN.value:
            print(dry_run(config, workdir))
            return 0
        summary = run(config, workdir)
    except (ConfigError, UnknownEnvError, IncompatibleCheckpointError, WriteError,
            FloatingPointError) as e:
        print(f"jaxwm.train: {e}", file=sys.stderr)
        return 1
    if not parallel.is_primary():
        return 0
    ret = summary.get("eval/episodic_return")
    done = ", ".join(f"{n:,} {unit.replace('_', ' ')}" for unit, n in summary["counters"].items()
                     if unit != "iterations")
    per_seed = [summary[f"eval/episodic_return/seed_{k}"] for k in range(config.num_seeds)
                if f"eval/episodic_return/seed_{k}" in summary]
    print(f"Finished {done} in {workdir}"
          + (f"; final eval return {ret:.1f}" if ret is not None else "")
          + (f" (seeds: {', '.join(f'{r:.1f}' for r in per_seed)})" if len(per_seed) > 1 else "")
          + (" (interrupted; resume with --config.resume=True)" if summary["interrupted"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
