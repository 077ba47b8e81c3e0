"""Weights & Biases as an optional metric sink beside TensorBoard and ``metrics.jsonl``
(``--config.log.wandb.project=NAME``; ``pip install 'jaxwm[wandb]'``).

What the seed systems' users expect from their ``--track`` flags: one W&B run per jaxwm run,
in ``project`` (and ``entity`` if set), grouped by algorithm (``group``, default
``config.algo``) and named after the run directory (``name``), with the resolved config
uploaded. Scalars are logged at the loop's x-axis (``log.x_axis``) as W&B's step; videos and
images as W&B media from the GIF and PNG files the loop writes anyway.

Offline by default (``mode="offline"``: files under ``<workdir>/wandb``, uploaded later with
``wandb sync``); ``online`` once the user has logged in. The W&B run id is kept in
``<workdir>/wandb_run_id``, so a resumed jaxwm run continues the same W&B run. The stretch
between a checkpoint and an interruption is logged again by the resumed run; W&B keeps the
first rows at those steps and ignores the repeats (its steps only increase), while
``metrics.jsonl`` and TensorBoard keep the resumed run's rows.
"""

from __future__ import annotations

import json
import os
import uuid

import numpy as np

MODES = ("offline", "online", "disabled")
ID_FILE = "wandb_run_id"


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


class WandbSink:
    """One W&B run for one jaxwm run directory (module docstring)."""

    def __init__(self, config, workdir: str, resumed: bool):
        import wandb

        block = wandb_block(config)
        id_path = os.path.join(workdir, ID_FILE)
        if resumed and os.path.exists(id_path):
            with open(id_path) as f:
                run_id = f.read().strip()
        else:
            run_id = uuid.uuid4().hex[:8]  # W&B ids: lowercase letters and digits
            with open(id_path, "w") as f:
                f.write(run_id + "\n")
        self._wandb = wandb
        self.run = wandb.init(
            project=block.project, entity=block.entity or None,
            group=block.group or str(config.algo),
            name=block.name or os.path.basename(os.path.normpath(workdir)),
            config=json.loads(config.to_json_best_effort()), dir=workdir, mode=block.mode,
            id=run_id, resume="allow", reinit="create_new")

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
        self.run.log(out, step=int(step))

    def close(self) -> None:
        self.run.finish()
