"""Validate, build and train from a config, in this process (no flags): what
``python -m jaxwm.train`` runs after parsing its command line (and making missing inputs,
``jaxwm.tools.make_dataset.make_missing_inputs``), and what tests, benchmarks and
``jaxwm.tools.make_dataset`` call directly."""

from __future__ import annotations

import os

from jaxwm import algos, configs
from jaxwm.config import ConfigError, check_ranges, validate_common


def default_workdir(config) -> str:
    env = str(config.env.id).replace("/", "_").replace(":", "-")  # gymnax:CartPole-v1
    return f"runs/{config.algo}_{env}_s{config.seed}"


def validate(config):
    """Every check of a config, in one place, before anything is built, written or compiled
    (each failure a one-line ``ConfigError``): the shared settings and every size
    (``config.validate_common``), the clocks' and phases' syntax, the algorithm's own
    settings, every setting's range (``config.check_ranges`` with ``jaxwm.configs.fields``),
    then the env (its id, and its spaces, probed with one env) against what the algorithm can run
    (``algos.check_capabilities``, and its ``validate_env`` where it has one). Returns the
    env's ``EnvSpec``."""
    from jaxwm.envs import probe_spec
    from jaxwm.loop.phases import Clock, phases_from_config
    from jaxwm.loop.wandb_sink import check_config as check_wandb

    entry = algos.get(config.algo)
    validate_common(config, entry.zero_means)
    wandb_problem = check_wandb(config)
    if wandb_problem:
        raise ConfigError(wandb_problem)
    for name in ("log.every", "checkpoint.every", "eval.every"):  # units: when the loop starts
        section, field = name.split(".")
        Clock.parse(config[section][field], name)
    entry.validate(config)  # its own messages first: they say more than a range can
    check_ranges(config, configs.fields(config.algo))
    phases_from_config(config, entry.phase_hooks(config))  # syntax; hooks: when the loop starts
    spec = probe_spec(config.env)
    algos.check_capabilities(config, entry.capabilities, spec, offline=entry.offline)
    entry.validate_env(config, spec)
    return spec


def dry_run(config, workdir: str) -> str:
    """What ``python -m jaxwm.train --dry_run`` prints: the resolved config, validated, and
    the phase table (hooks per cycle, cycles, and what each phase adds to every counter),
    with the run directory and any input that would be made first. Builds nothing, compiles
    nothing and touches nothing on disk (one env is made in memory to read its spaces)."""
    from jaxwm.loop.phases import check_hook_names, phases_from_config, plan

    spec = validate(config)
    entry = algos.get(config.algo)
    phases = phases_from_config(config, entry.phase_hooks(config))
    counts = entry.hook_counts(config)
    check_hook_names(phases, counts, config.algo)
    rows = plan(phases, counts)
    counters = sorted({k for row in rows for k in row["counts"] if k != "iterations"})
    header = ["phase", "hooks per cycle", "duration", "cycles", *counters]
    table = [header, ["---"] * len(header)]
    for row in rows:
        phase = row["phase"]
        hooks = " ".join(name if calls == 1 else f"{name}:{calls}" for name, calls in phase.hooks)
        table.append([phase.name, hooks, f"{phase.duration:,} {phase.unit}"
                      + (f" (until {phase.until})" if phase.until else ""), f"{row['cycles']:,}",
                      *(f"{row['counts'].get(k, 0):,}" for k in counters)])
    table.append(["total", "", "", f"{sum(r['cycles'] for r in rows):,}",
                  *(f"{sum(r['counts'].get(k, 0) for r in rows):,}" for k in counters)])
    lines = ["| " + " | ".join(cells) + " |" for cells in table]
    dataset = os.path.expanduser(str(config.get("dataset", "") or ""))
    make = config.get("dataset_make")
    notes = [f"Run directory: {workdir}"
             + (" (exists: --config.resume=True continues it)" if os.path.exists(workdir) else ""),
             f"Env: {spec.env_id} ({spec.family}), observations {spec.obs_shape}, "
             + (f"{spec.num_actions} discrete actions" if spec.discrete
                else f"actions {spec.action_shape}")]
    if dataset and not os.path.exists(dataset) and make is not None and make.level:
        notes.append(f"{dataset} is missing: the run would first make it "
                     f"(jaxwm.tools.make_dataset, {make.level}, {make.size:,} transitions).")
    return "\n".join(["# Resolved config (validated)", config.to_json_best_effort(indent=2), "",
                      "# Phases", *lines, "", *notes,
                      "Dry run: nothing was built, compiled or written."])


def run(config, workdir: str):
    """Validates, builds and trains; returns the trainer's final metrics. Inputs a config
    says how to make (a dataset) must exist: ``jaxwm.train.run`` makes them first."""
    from jaxwm.loop.evaluate import Evaluator
    from jaxwm.loop.trainer import Trainer

    validate(config)
    entry = algos.get(config.algo)
    algorithm = entry.build(config)
    evaluator = None
    try:
        if algorithm.policy is not None:
            evaluator = Evaluator.for_algorithm(config, algorithm)
        return Trainer(config, algorithm, workdir, evaluator, resumable=entry.resumable).run()
    finally:
        algorithm.close()
        if evaluator is not None:
            evaluator.close()
