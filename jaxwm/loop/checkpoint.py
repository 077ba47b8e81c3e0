"""Checkpoints with orbax's CheckpointManager, and the guards that keep them safe.

A run directory holds ``config.json`` (the resolved config) and ``checkpoints/<step>/``,
where ``step`` counts hook calls (a counter that always increases, whether or not a phase
steps an env). Each checkpoint has two items: ``algo``, the algorithm's state pytree, and
``loop``, a small JSON document (the loop's RNG key and the scheduler: counters, per-phase
progress, the position inside the current cycle).

Rules (docs/architecture.md, "Clocks, checkpoints and signals"):
* the run directory must be writable, or the run stops with a one-line error;
* a new run refuses a directory that already has checkpoints (pass ``resume=True`` or pick
  another ``--workdir``);
* a resumed run first compares its config with the saved one and refuses changes to
  anything but the settings listed in ``RESUMABLE_KEYS``;
* a checkpoint whose tree does not match the freshly built state raises
  ``IncompatibleCheckpointError`` before anything is written;
* a checkpoint that cannot be read (a truncated or corrupted file) is moved, not deleted, to
  ``unreadable_checkpoints/<step>/`` and the run resumes from the newest readable one, saying
  which and why; if none can be read, nothing is touched.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from jaxwm.config import ConfigError

# Version of the checkpoint's layout ("algo" pytree + "loop" JSON), stored in "loop". 3: the
# acting layer (states hold acting.ActorState, replays are TransitionReplay/SequenceReplay).
LAYOUT_VERSION = 3
# The last commit that wrote each older layout, for the message that refuses it.
WRITTEN_UNTIL = {2: "d78b67a"}

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


def linked_keys(config) -> dict[str, list[str]]:
    """``{key: the other keys linked to it}``: dotted keys of ``config`` that hold one shared
    ``FieldReference`` (``a = c.get_ref("b")``), i.e. one setting under several names, such as
    DreamerV3's ``model_size`` and ``dreamer.model_size``. Derived values (a reference times
    something) are new references and not linked."""
    groups: dict[int, list[str]] = {}

    def walk(node, prefix):
        for name, field in node._fields.items():  # the stored fields, references unresolved
            if isinstance(field, ml_collections.ConfigDict):
                walk(field, f"{prefix}{name}.")
            elif isinstance(field, ml_collections.FieldReference):
                groups.setdefault(id(field), []).append(prefix + name)

    walk(config, "")
    return {key: [other for other in keys if other != key]
            for keys in groups.values() if len(keys) > 1 for key in keys}


def config_differences(saved: dict, current: dict,
                       linked: dict[str, list[str]] | None = None) -> list[str]:
    """``"key: saved a, now b"`` for every setting that differs. A key the run's saved config
    lacks is no difference when it holds ``base_config()``'s default (the library added it
    after the run started, and the default keeps the old behaviour, e.g. ``env.batch_size``),
    or when it is another name (``linked``, from ``linked_keys``) of a setting the saved config
    holds with the same value (e.g. ``model_size``, added as a name of ``dreamer.model_size``)."""
    from jaxwm.config import base_config

    saved_flat, current_flat = _flatten(saved), _flatten(current)
    added_later = _flatten(config_to_json_dict(base_config()))
    linked = linked or {}
    diffs = []
    for key in sorted(set(saved_flat) | set(current_flat)):
        if key.split(".")[0] in RESUMABLE_KEYS:
            continue
        if key not in saved_flat and key in added_later and \
                json.dumps(current_flat[key]) == json.dumps(added_later[key]):
            continue
        if key not in saved_flat and any(
                other in saved_flat and json.dumps(saved_flat[other]) == json.dumps(current_flat[key])
                for other in linked.get(key, ())):
            continue
        a, b = saved_flat.get(key, "<absent>"), current_flat.get(key, "<absent>")
        if json.dumps(a, default=str) != json.dumps(b, default=str):
            diffs.append(f"{key}: saved {a!r}, now {b!r}")
    return diffs


def config_to_json_dict(config) -> dict:
    return json.loads(config.to_json_best_effort())


def prepare_workdir(workdir: str) -> None:
    """Creates ``workdir`` and proves it writable, or raises a one-line ConfigError. The probe
    file has a name of its own: the processes of a multi-process run all prepare the same
    workdir at once, and with one shared name one could delete another's probe."""
    try:
        os.makedirs(workdir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=workdir, prefix=".jaxwm_write_test") as f:
            f.write(b"ok")
    except OSError as e:
        raise ConfigError(f"--workdir={workdir} cannot be written ({type(e).__name__}: "
                          f"{e.strerror or e}); choose a directory you can write to.") from None


def _key_name(key) -> str:
    for attr in ("key", "name", "idx"):  # DictKey, GetAttrKey, SequenceKey
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def _signature(leaf) -> tuple:
    """(shape, dtype) as a checkpoint stores it: typed PRNG keys as their key data, Python
    scalars as 0-d arrays."""
    if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        leaf = jax.random.key_data(leaf)
    if not hasattr(leaf, "dtype"):
        leaf = np.asarray(leaf)
    return tuple(leaf.shape), np.dtype(leaf.dtype).name


def _shapes(tree) -> dict[str, tuple]:
    """``{path: (shape, dtype)}`` of a pytree of arrays or of orbax's metadata of one (which
    stores dataclass fields and tuple items as dict entries, hence names, not key types)."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {"/".join(_key_name(k) for k in path): _signature(leaf) for path, leaf in flat}


class _Damaged(Exception):
    pass


# How tensorstore and the JSON reader word a damaged file (truncated, corrupted or missing).
# Any other failure (a transient I/O error, say) stops the resume rather than roll back.
_DAMAGE_MARKERS = ("DATA_LOSS", "OUT_OF_RANGE", "NOT_FOUND", "INVALID_ARGUMENT")


def _is_damage(error: Exception) -> bool:
    return isinstance(error, (_Damaged, json.JSONDecodeError, FileNotFoundError)) or \
        any(marker in str(error) for marker in _DAMAGE_MARKERS)


def _first_line(error: Exception) -> str:
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:160]}"


class Checkpointer:
    def __init__(self, workdir: str, keep: int):
        self.workdir = workdir
        self.directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
        self.quarantine = os.path.abspath(os.path.join(workdir, "unreadable_checkpoints"))
        self.config_path = os.path.join(workdir, "config.json")
        self._keep = keep
        self._manager = self._open()

    def _open(self) -> ocp.CheckpointManager:
        options = ocp.CheckpointManagerOptions(max_to_keep=self._keep, create=True)
        handlers = {"algo": ocp.StandardCheckpointHandler(), "loop": ocp.JsonCheckpointHandler()}
        return ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)

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
            try:
                with open(self.config_path) as f:
                    saved = json.load(f)
            except (OSError, ValueError) as e:
                raise IncompatibleCheckpointError(
                    f"Cannot read {self.config_path} ({_first_line(e)}), so this config cannot be "
                    "compared with the run's; remove the file to resume without the comparison, "
                    "or start a new run in another --workdir; nothing was changed.") from None
            diffs = config_differences(saved, config_to_json_dict(config), linked_keys(config))
            if diffs:
                raise IncompatibleCheckpointError(
                    "Cannot resume: the config differs from the one this run was started with "
                    f"({self.config_path}):\n  " + "\n  ".join(diffs) +
                    "\nRestore those values (--config.<key>=<saved value>; this also pins a "
                    "value that follows total_env_steps by default), or start a new run in "
                    "another --workdir; nothing was changed.")

    def write_config(self, config) -> None:
        """Writes ``config.json`` atomically (a crash mid-write leaves the old one)."""
        temporary = self.config_path + ".tmp"
        with open(temporary, "w") as f:
            f.write(config.to_json_best_effort(indent=2))
        os.replace(temporary, self.config_path)

    def save(self, step: int, state, loop: dict, force: bool = False) -> None:
        """Saves asynchronously; the device arrays are copied before this returns, so the
        caller may donate ``state`` to its next jitted call right away."""
        loop = {"layout": LAYOUT_VERSION, **loop}
        args = ocp.args.Composite(algo=ocp.args.StandardSave(state), loop=ocp.args.JsonSave(loop))
        self._manager.save(step, args=args, force=force)

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def step_at(self, counter: str, value: int) -> int:
        """The last checkpoint saved when the run's ``counter`` total was ``value`` (a
        checkpoint's step is the loop's call count, not a counter)."""
        found = None
        for step in self.all_steps():
            loop = self._manager.restore(step, args=ocp.args.Composite(
                loop=ocp.args.JsonRestore()))["loop"]
            if loop.get("scheduler", {}).get("totals", {}).get(counter) == value:
                found = step
        if found is None:
            raise IncompatibleCheckpointError(f"No checkpoint in {self.directory} was saved at "
                                              f"{counter} = {value}.")
        return found

    def restore(self, template, step: int | None = None) -> tuple[object, dict, int, list]:
        """Restores the newest readable checkpoint (or the one at ``step``) into the structure
        (and shardings) of ``template``: ``(state, loop, step, unreadable)``, where
        ``unreadable`` lists the newer checkpoints found damaged as ``(step, error)``. Nothing
        is moved here: the caller calls ``set_aside(unreadable)`` once it has accepted the
        restored state."""
        try:
            expected = _shapes(template)
        except (TypeError, ValueError) as e:
            raise IncompatibleCheckpointError(f"The state holds a leaf a checkpoint cannot compare "
                                              f"({_first_line(e)}).") from None
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
        unreadable = []
        candidates = sorted(self._manager.all_steps(), reverse=True) if step is None else [step]
        for step in candidates:
            if not os.path.isdir(os.path.join(self.directory, str(step), "algo")):
                raise IncompatibleCheckpointError(
                    f"Checkpoint {self.directory}/{step} was written by an older jaxwm (before "
                    f"checkpoint layout {LAYOUT_VERSION}); resume it with that version, or start "
                    "a new run in another --workdir; nothing was changed.")
            try:
                layout = self._manager.restore(step, args=ocp.args.Composite(
                    loop=ocp.args.JsonRestore()))["loop"].get("layout")
                metadata = self._manager.item_metadata(step)["algo"]
                if metadata is None:
                    raise _Damaged("its metadata (algo/_METADATA) is missing")
                saved = _shapes(metadata)
            except Exception as e:  # noqa: BLE001 -- classified just below
                unreadable.append((step, self._damage_or_raise(step, e)))
                continue
            if layout != LAYOUT_VERSION:
                self._refuse_layout(step, layout)
            if saved != expected:
                self._refuse_mismatch(step, saved, expected)
            try:
                restored = self._manager.restore(step, args=ocp.args.Composite(
                    algo=ocp.args.StandardRestore(abstract), loop=ocp.args.JsonRestore()))
            except Exception as e:  # noqa: BLE001
                unreadable.append((step, self._damage_or_raise(step, e)))
                continue
            return restored["algo"], restored["loop"], step, unreadable
        raise IncompatibleCheckpointError(
            f"No checkpoint in {self.directory} can be read: " + "; ".join(
                f"{step}: {_first_line(e)}" for step, e in unreadable) +
            ". Nothing was changed; start a new run in another --workdir.")

    def _refuse_layout(self, step: int, layout) -> None:
        written_by = f"jaxwm up to commit {WRITTEN_UNTIL[layout]}" if layout in WRITTEN_UNTIL \
            else "another jaxwm"
        raise IncompatibleCheckpointError(
            f"Checkpoint {self.directory}/{step} has layout {layout}, written by {written_by}; "
            f"this jaxwm reads layout {LAYOUT_VERSION}. Continue that run with the jaxwm that "
            "wrote it (git checkout "
            f"{WRITTEN_UNTIL.get(layout, '<its commit>')}), or start a new run in another "
            "--workdir; nothing was changed.")

    def _damage_or_raise(self, step: int, error: Exception) -> Exception:
        if not _is_damage(error):
            raise IncompatibleCheckpointError(
                f"Could not read checkpoint {self.directory}/{step} ({_first_line(error)}). It "
                "does not look damaged, so nothing was moved or changed; retry the resume.") \
                from error
        return error

    def _refuse_mismatch(self, step: int, saved: dict, expected: dict) -> None:
        diffs = [f"{path}: saved {saved.get(path, '<absent>')}, now {expected.get(path, '<absent>')}"
                 for path in sorted(set(saved) | set(expected))
                 if saved.get(path) != expected.get(path)]
        raise IncompatibleCheckpointError(
            f"Checkpoint {self.directory}/{step} does not match the state this config builds "
            f"({len(diffs)} differences; {'; '.join(diffs[:3])}). It was left untouched; resume "
            "with the config it was written with, or use another --workdir.")

    def set_aside(self, unreadable, restored_step: int) -> str | None:
        """Moves the unreadable checkpoints to ``unreadable_checkpoints/`` (never deletes them,
        and frees their steps for the resumed run); returns what to tell the user."""
        if not unreadable:
            return None
        self._manager.close()
        os.makedirs(self.quarantine, exist_ok=True)
        for step, _ in unreadable:
            shutil.move(os.path.join(self.directory, str(step)),
                        os.path.join(self.quarantine, str(step)))
        self._manager = self._open()
        reasons = "; ".join(f"{step} ({_first_line(e)})" for step, e in unreadable)
        return (f"Checkpoint(s) {reasons} could not be read; moved to {self.quarantine} (not "
                f"deleted) and resumed from the newest readable one, step {restored_step}.")

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.close()
