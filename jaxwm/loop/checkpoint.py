"""Checkpoints with orbax's CheckpointManager, and the guards that keep them safe.

A run directory holds ``config.json`` (the resolved config) and ``checkpoints/<step>/``.
Rules (DESIGN.md, convention 10):
* a new run refuses a directory that already has checkpoints (pass ``resume=True`` or pick
  another ``--workdir``);
* a resumed run first compares its config with the saved one and refuses changes to
  anything but the settings listed in ``RESUMABLE_KEYS``;
* a checkpoint whose tree does not match the freshly built state raises
  ``IncompatibleCheckpointError`` before anything is written.
"""

from __future__ import annotations

import json
import os

import jax
import orbax.checkpoint as ocp

# Settings that may change between a run and its resumption.
RESUMABLE_KEYS = ("resume", "checkpoint", "eval", "log", "total_env_steps", "phases")


class IncompatibleCheckpointError(RuntimeError):
    pass


def _flatten(d, prefix=""):
    out = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def config_differences(saved: dict, current: dict) -> list[str]:
    saved_flat, current_flat = _flatten(saved), _flatten(current)
    diffs = []
    for key in sorted(set(saved_flat) | set(current_flat)):
        if key.split(".")[0] in RESUMABLE_KEYS:
            continue
        a, b = saved_flat.get(key, "<absent>"), current_flat.get(key, "<absent>")
        if json.dumps(a, default=str) != json.dumps(b, default=str):
            diffs.append(f"{key}: saved {a!r}, now {b!r}")
    return diffs


def config_to_json_dict(config) -> dict:
    return json.loads(config.to_json_best_effort())


class Checkpointer:
    def __init__(self, workdir: str, keep: int):
        self.directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
        self.config_path = os.path.join(workdir, "config.json")
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def check_can_start(self, config, resume: bool) -> None:
        """Raises before anything is written if this run would clobber or misuse a run dir."""
        has_checkpoint = self.latest_step() is not None
        if has_checkpoint and not resume:
            raise IncompatibleCheckpointError(
                f"{self.directory} already holds checkpoints (latest step {self.latest_step()}). "
                "Pass --config.resume=True to continue that run, or choose another --workdir; "
                "nothing was changed.")
        if has_checkpoint and os.path.exists(self.config_path):
            with open(self.config_path) as f:
                saved = json.load(f)
            diffs = config_differences(saved, config_to_json_dict(config))
            if diffs:
                raise IncompatibleCheckpointError(
                    "Cannot resume: the config differs from the one this run was started with "
                    f"({self.config_path}):\n  " + "\n  ".join(diffs) +
                    "\nRestore those values, or start a new run in another --workdir; "
                    "nothing was changed.")

    def write_config(self, config) -> None:
        with open(self.config_path, "w") as f:
            f.write(config.to_json_best_effort(indent=2))

    def save(self, step: int, tree, force: bool = False) -> None:
        self._manager.save(step, args=ocp.args.StandardSave(tree), force=force)

    def restore(self, template):
        """Restores the latest checkpoint into the structure (and shardings) of ``template``."""
        step = self.latest_step()
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
        try:
            return self._manager.restore(step, args=ocp.args.StandardRestore(abstract))
        except (ValueError, KeyError, TypeError) as e:
            raise IncompatibleCheckpointError(
                f"Checkpoint {self.directory}/{step} does not match the state this config builds "
                f"({type(e).__name__}: {str(e)[:500]}). It was left untouched; resume with the "
                "config it was written with, or use another --workdir.") from None

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.close()
