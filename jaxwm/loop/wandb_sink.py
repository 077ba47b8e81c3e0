"""Weights & Biases as an optional metric sink beside TensorBoard and ``metrics.jsonl``
(``--config.log.wandb.project=NAME``; ``pip install 'jaxwm[wandb]'``).

What the seed systems' users expect from their ``--track`` flags: one W&B run per agent, in
``project`` (and ``entity`` if set), grouped by algorithm (``group``, default
``config.algo``) and named after the run directory (``name``), with the resolved config
uploaded. Scalars are logged at the loop's x-axis (``log.x_axis``) as W&B's step, and that
counter (``counters/<x_axis>``) is declared every metric's x-axis (``define_metric``), so
W&B's charts plot against it (env steps by default); videos and images go as W&B media from
the GIF and PNG files the loop writes anyway.

With several seeds (``config.num_seeds`` N > 1, ``loop.seeds``) each agent is a W&B run of
its own, as N one-seed runs would be: ``<name>_seed_<k>`` in the same group, its config
saying which seed it is (``seed_index`` k, ``agent_seed`` the ``--config.seed`` a one-seed
run would have), its rows holding seed k's value of each per-seed metric under the metric's
plain name (``eval/episodic_return``, not ``eval/episodic_return/seed_<k>``; the mean and
spread over seeds are left to W&B's grouping), and the values all seeds share (the counters,
``charts/SPS``, timings) as they are. Media are seed 0's (``loop.compile``): seed 0's run.

Offline by default (``mode="offline"``: files under ``<workdir>/wandb``, uploaded later with
``wandb sync``); ``online`` once the user has logged in. The W&B run ids are kept in
``<workdir>/wandb_run_id``, one line per seed, so a resumed jaxwm run continues the same W&B
runs. The stretch between a checkpoint and an interruption is logged again by the resumed
run; W&B keeps the first rows at those steps and ignores the repeats (its steps only
increase), while ``metrics.jsonl`` and TensorBoard keep the resumed run's rows.
"""

from __future__ import annotations

import json
import os
import uuid

import numpy as np

from jaxwm.loop import seeds

MODES = ("offline", "online", "disabled")
ID_FILE = "wandb_run_id"
SEED = "/seed_"  # metrics.PerSeed's rows: <name>/seed_<k> and <name>/seed_std


def wandb_block(config):
    """``config.log.wandb`` or None when the sink is off (no project)."""
    block = config.log.get("wandb")
    return block if block is not None and block.project else None


def check_config(config) -> str | None:
    """What is wrong with ``config.log.wandb``, in one line, or None."""
    block = wandb_block(config)
    if block is None:
        return None
    if block.mode not in MODES:
        return f"log.wandb.mode must be one of {', '.join(MODES)}, got {block.mode!r}."
    try:
        import wandb  # noqa: F401
    except ImportError:
        return ("log.wandb.project is set but wandb is not installed: pip install "
                "'jaxwm[wandb]', or leave log.wandb.project empty to log to TensorBoard and "
                "metrics.jsonl only.")
    return None


def run_ids(workdir: str, resumed: bool, num_seeds: int) -> list[str]:
    """One W&B run id per seed: those in ``<workdir>/wandb_run_id`` when resuming, new ones
    (written there) otherwise or for seeds the file lacks."""
    path = os.path.join(workdir, ID_FILE)
    kept = []
    if resumed and os.path.exists(path):
        with open(path) as f:
            kept = [line.strip() for line in f if line.strip()][:num_seeds]
    # W&B ids: lowercase letters and digits
    ids = kept + [uuid.uuid4().hex[:8] for _ in range(num_seeds - len(kept))]
    if ids != kept:
        with open(path, "w") as f:
            f.writelines(run_id + "\n" for run_id in ids)
    return ids


def seed_row(row: dict, k: int, media: frozenset = frozenset()) -> dict:
    """Seed k's part of a log row: each per-seed metric (one with a ``<name>/seed_std``) as
    seed k's ``<name>/seed_<k>`` under ``<name>`` (nothing where seed k had no value), without
    the other seeds' values, the mean or the spread; shared values as they are; the names in
    ``media`` (seed 0's) in seed 0's row only."""
    per_seed = {name[:-len(SEED + "std")] for name in row if name.endswith(SEED + "std")}
    out = {}
    for name, value in row.items():
        base, sep, suffix = name.rpartition(SEED)
        if sep and base in per_seed and (suffix == "std" or suffix.isdigit()):
            if suffix == str(k):
                out[base] = value
        elif name not in per_seed and (k == 0 or name not in media):
            out[name] = value
    return out


class WandbSink:
    """One W&B run per seed of a jaxwm run directory (module docstring)."""

    def __init__(self, config, workdir: str, resumed: bool):
        import wandb

        block = wandb_block(config)
        num_seeds = int(config.num_seeds)
        name = block.name or os.path.basename(os.path.normpath(workdir))
        run_config = json.loads(config.to_json_best_effort())
        self.step_metric = f"counters/{config.log.x_axis}"  # in every row (loop.trainer)
        self._wandb, self.runs, one = wandb, [], num_seeds == 1
        try:
            for k, (run_id, seed) in enumerate(zip(run_ids(workdir, resumed, num_seeds),
                                                   seeds.run_seeds(config), strict=True)):
                # reinit="create_new": the N runs are open side by side, each finished alone.
                run = wandb.init(
                    project=block.project, entity=block.entity or None,
                    group=block.group or str(config.algo),
                    name=name if one else f"{name}_seed_{k}",
                    config=run_config if one else {**run_config, "seed_index": k,
                                                   "agent_seed": seed},
                    dir=workdir, mode=block.mode, id=run_id, resume="allow",
                    reinit="create_new")
                self.runs.append(run)
                run.define_metric(self.step_metric)
                run.define_metric("*", step_metric=self.step_metric)
        except BaseException:
            self.close()
            raise

    def write(self, step: int, row: dict, workdir: str, media: dict) -> None:
        """``row``: metrics.jsonl's row (scalars, and media as paths relative to ``workdir``);
        ``media``: the loop's Video / Image / Histogram values by name."""
        from jaxwm.media import Histogram, Image, Video

        wandb, out = self._wandb, {}
        for name, value in row.items():
            if name == "step":
                continue
            kind = media.get(name)
            if isinstance(kind, Video):
                out[name] = wandb.Video(os.path.join(workdir, value), format="gif")
            elif isinstance(kind, Image):
                out[name] = wandb.Image(os.path.join(workdir, value))
            else:
                out[name] = value
        for name, value in media.items():
            if isinstance(value, Histogram):
                out[name] = wandb.Histogram(np.asarray(value.values, np.float64).ravel())
        if len(self.runs) == 1:
            self.runs[0].log(out, step=int(step))
            return
        for k, run in enumerate(self.runs):
            run.log(seed_row(out, k, frozenset(media)), step=int(step))

    def close(self) -> None:
        """Finishes every run (each run made with ``reinit="create_new"`` must be)."""
        runs, self.runs = self.runs, []
        for run in runs:
            run.finish()
