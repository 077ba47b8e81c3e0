"""Checkpoints with orbax's CheckpointManager, verified by a manifest, and the guards that keep
them safe.

A run directory holds ``config.json`` (the resolved config) and ``checkpoints/<step>/``,
where ``step`` counts hook calls (a counter that always increases, whether or not a phase
steps an env). Each checkpoint has two items: ``algo``, the algorithm's state pytree, and
``loop``, a small JSON document (the loop's RNG key and the scheduler: counters, per-phase
progress, the position inside the current cycle).

Verification: once orbax has finalised a checkpoint this run wrote, ``<step>/jaxwm_manifest.json``
records the size and CRC-32 of every file in it (orbax keeps no checksum of the data itself:
its zarr3 codecs checksum only the shard index, and a file truncated by 3 kB restored without
complaint). A resume checks the manifest before restoring; a checkpoint without one (written
by an older jaxwm, or killed between orbax's finalisation and the manifest) is tried as it is.

Rules (docs/architecture.md, "Clocks, checkpoints and signals"):
* the run directory must be writable, or the run stops with a one-line error;
* a new run refuses a directory that already has checkpoints or logs (pass ``resume=True`` or
  pick another ``--workdir``), and ``resume=True`` refuses a directory without a checkpoint;
* a resumed run first compares its config with the saved one and refuses changes to
  anything but the settings listed in ``RESUMABLE_KEYS`` and the algorithm's resumable
  settings (``algos.Entry.resumable``: learning rates and clip norms); the
  changes it accepts are appended to ``config_history.jsonl``;
* a checkpoint whose tree does not match the freshly built state raises
  ``IncompatibleCheckpointError`` before anything is written;
* a checkpoint that fails its manifest, or (without one) fails to restore with a damaged-file
  error, and a numbered
  directory that is not a checkpoint at all, is moved, not deleted, to
  ``unreadable_checkpoints/<step>/`` and the run resumes from the newest readable one, saying
  which and why; if none can be read, nothing is touched and the refusal says so. A
  checkpoint whose files match its manifest but that still cannot be restored, one without a
  manifest whose restore fails in another way, and files that cannot be opened
  (permissions), stop the resume with nothing moved: that is not known to be damage.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import tempfile
import zlib

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from jaxwm import parallel
from jaxwm.config import ConfigError

# Version of the checkpoint's layout ("algo" pytree + "loop" JSON), stored in "loop". 3: the
# acting layer (states hold acting.ActorState, replays are TransitionReplay/SequenceReplay).
LAYOUT_VERSION = 3
# The last commit that wrote each older layout, for the message that refuses it.
WRITTEN_UNTIL = {2: "d78b67a"}

# Settings that may change between a run and its resumption: whole groups. An algorithm adds
# single settings of its own (``algos.Entry.resumable``: learning rates and clip norms, each a
# constant of the jitted update or a schedule of the optimiser's step count, never a value
# stored in the state, so the resumed run uses the new value).
RESUMABLE_KEYS = ("resume", "checkpoint", "eval", "log", "total_env_steps", "phases")

MANIFEST = "jaxwm_manifest.json"
# Written by orbax in every step directory it finalises; a numbered directory with neither this
# nor a manifest is not a checkpoint.
ORBAX_METADATA = "_CHECKPOINT_METADATA"


class IncompatibleCheckpointError(RuntimeError):
    pass


class WriteError(RuntimeError):
    """The run could not write a checkpoint or a log (a full disk, say); the checkpoints
    already finished are kept."""


# What a full disk, a quota, a file-size limit or a read-only mount make a write raise.
WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)


def write_failed(what: str, error: Exception, checkpointed: bool) -> WriteError:
    then = ("the checkpoints finished before it were kept: once it can write again (a full "
            "disk freed, the directory fixed), run again with --config.resume=True") \
        if checkpointed else ("no checkpoint had been finished, so once it can write again "
                              "start the run in another --workdir")
    return WriteError(f"Writing {what} failed ({_first_line(error)}); {then}.")


def flatten(d, prefix=""):
    out = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
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


def resumable(key: str, settings: tuple[str, ...] = ()) -> bool:
    """Whether ``key`` may change on resume: a group of ``RESUMABLE_KEYS`` or one of the
    algorithm's resumable ``settings``."""
    return key.split(".")[0] in RESUMABLE_KEYS or key in settings


def config_differences(saved: dict, current: dict,
                       linked: dict[str, list[str]] | None = None,
                       settings: tuple[str, ...] = ()) -> list[str]:
    """``"key: saved a, now b"`` for every setting that differs. A key the run's saved config
    lacks is no difference when it holds ``base_config()``'s default or the network block's
    (the library added it after the run started, and the default keeps the old behaviour,
    e.g. ``env.batch_size``, ``network.rnn.head_hidden``),
    or when it is another name (``linked``, from ``linked_keys``) of a setting the saved config
    holds with the same value (e.g. ``model_size``, added as a name of ``dreamer.model_size``).
    Settings that may change on resume (``resumable``, with the algorithm's ``settings``) are
    left out."""
    from jaxwm.config import base_config
    from jaxwm.nets import actor_critic

    saved_flat, current_flat = flatten(saved), flatten(current)
    # The shared blocks' defaults: base_config's and the actor-critic's network block (e.g.
    # network.rnn.head_hidden, added later; its default () keeps the old heads).
    added_later = {**flatten(config_to_json_dict(base_config())),
                   **flatten({"network": config_to_json_dict(actor_critic.config_block())})}
    linked = linked or {}
    diffs = []
    for key in sorted(set(saved_flat) | set(current_flat)):
        if resumable(key, settings):
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


def _is_empty(leaf) -> bool:
    return 0 in tuple(getattr(leaf, "shape", None) or ())


def _without_empty(tree):
    """``tree`` with its zero-size arrays as ``None``: orbax refuses to save an array with no
    elements (MJX's ``Data`` has some, e.g. ``act`` of a model without activations), and they
    hold nothing to save. ``_with_empty`` puts them back from the template on restore."""
    return jax.tree.map(lambda leaf: None if _is_empty(leaf) else leaf, tree)


def _with_empty(restored, template):
    """``restored`` (saved ``_without_empty``) with the template's zero-size arrays back."""
    def refill(model, leaf):
        if not _is_empty(model):
            return leaf
        return jax.device_put(np.zeros(model.shape, model.dtype), getattr(model, "sharding", None))
    return jax.tree.map(refill, template, restored)


def _shapes(tree) -> dict[str, tuple]:
    """``{path: (shape, dtype)}`` of a pytree of arrays or of orbax's metadata of one (which
    stores dataclass fields and tuple items as dict entries, hence names, not key types)."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {"/".join(_key_name(k) for k in path): _signature(leaf) for path, leaf in flat}


class _Damaged(Exception):
    pass


def _digest(path: str) -> list[int]:
    """``[size, CRC-32]`` of a file (zlib's CRC: made to catch accidental damage, and fast)."""
    size, crc = 0, 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            size, crc = size + len(chunk), zlib.crc32(chunk, crc)
    return [size, crc]


def _files(step_dir: str) -> list[str]:
    found = []
    for root, _, names in os.walk(step_dir):
        found += [os.path.relpath(os.path.join(root, name), step_dir) for name in names]
    return sorted(f for f in found if f != MANIFEST)


def write_manifest(step_dir: str) -> None:
    """Records every file of a finalised checkpoint (atomically: a crash leaves none)."""
    manifest = {"files": {f: _digest(os.path.join(step_dir, f)) for f in _files(step_dir)}}
    temporary = os.path.join(step_dir, MANIFEST + ".tmp")
    with open(temporary, "w") as f:
        json.dump(manifest, f)
    os.replace(temporary, os.path.join(step_dir, MANIFEST))


def verify(step_dir: str, contents: bool = True) -> bool:
    """True if the checkpoint matches its manifest, False if it has none; raises ``_Damaged``
    saying what differs. ``contents=False`` compares sizes only (no reading). Files added
    beside the recorded ones are ignored (orbax reads only its own); files that cannot be
    opened raise ``PermissionError``, which is not damage."""
    if not os.access(step_dir, os.R_OK | os.X_OK):
        raise PermissionError(f"{step_dir} cannot be listed (permission denied)")
    path = os.path.join(step_dir, MANIFEST)
    if not os.path.exists(path):
        if not os.path.exists(os.path.join(step_dir, ORBAX_METADATA)):
            raise _Damaged("not a checkpoint: it has neither a manifest nor orbax's metadata")
        return False
    try:
        with open(path) as f:
            recorded = json.load(f)["files"]
    except (ValueError, KeyError, TypeError) as e:
        raise _Damaged(f"its manifest cannot be read ({_first_line(e)})") from None
    for name, (size, crc) in recorded.items():
        full = os.path.join(step_dir, name)
        if not os.path.exists(full):
            raise _Damaged(f"{name} is missing")
        if not os.access(full, os.R_OK):
            raise PermissionError(f"{full} cannot be opened (permission denied)")
        got_size, got_crc = _digest(full) if contents else (os.path.getsize(full), crc)
        if got_size != size:
            raise _Damaged(f"{name} has {got_size} bytes instead of {size}")
        if got_crc != crc:
            raise _Damaged(f"{name}: its contents changed (CRC-32 differs)")
    return True


# How tensorstore, orbax and the JSON reader word a damaged file (truncated, corrupted or
# missing); for a checkpoint without a manifest, other failures are not taken as damage.
_DAMAGE_MARKERS = ("DATA_LOSS", "OUT_OF_RANGE", "NOT_FOUND", "INVALID_ARGUMENT",
                   "FAILED_PRECONDITION", "corrupt", "Truncated", "Unpack failed")


def _is_damage(error: Exception) -> bool:
    return isinstance(error, (_Damaged, json.JSONDecodeError, FileNotFoundError)) or \
        any(marker in str(error) for marker in _DAMAGE_MARKERS)


def _first_line(error: Exception) -> str:
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:160]}"


def saved_steps(workdir: str) -> list[int]:
    """The steps of the checkpoints in a run directory (orbax's listing; none if it has none)."""
    return sorted(ocp.path.step.checkpoint_steps(os.path.join(workdir, "checkpoints")))


class Checkpointer:
    def __init__(self, workdir: str, keep: int, primary: bool = True, read_only: bool = False):
        self.workdir = workdir
        self.directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
        self.quarantine = os.path.abspath(os.path.join(workdir, "unreadable_checkpoints"))
        self.config_path = os.path.join(workdir, "config.json")
        self.history_path = os.path.join(workdir, "config_history.jsonl")
        self._keep = keep
        self._primary = primary  # several processes: the first writes the manifests
        self._unsealed = []  # steps this run saved that have no manifest yet
        self._read_only = read_only  # jaxwm.load: restores, never saves, creates or deletes
        self._manager = self._open()

    def _open(self) -> ocp.CheckpointManager:
        handlers = {"algo": ocp.StandardCheckpointHandler(), "loop": ocp.JsonCheckpointHandler()}
        if not self._read_only:
            options = ocp.CheckpointManagerOptions(max_to_keep=self._keep, create=True)
            return ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)
        # Read-only: nothing saved, rotated or created. orbax logs a warning that it is so
        # (three lines per load); that is what was asked, so they are held back.
        options = ocp.CheckpointManagerOptions(read_only=True, create=False, max_to_keep=None,
                                               save_interval_steps=0)
        absl_logger = logging.getLogger("absl")
        level = absl_logger.level
        absl_logger.setLevel(logging.ERROR)
        try:
            return ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)
        finally:
            absl_logger.setLevel(level)

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def check_can_start(self, config, resume: bool,
                        settings: tuple[str, ...] = ()) -> dict[str, tuple]:
        """Raises before anything is written if this run would clobber or misuse a run dir.
        Returns the settings a resume changes (``{key: (saved, now)}``), which are allowed:
        ``RESUMABLE_KEYS`` and the algorithm's resumable ``settings``."""
        latest = self.latest_step()
        if latest is not None and not resume:
            self._refuse_another_algorithm(self._saved_algo(), config)
            raise IncompatibleCheckpointError(
                f"{self.directory} already holds checkpoints (latest step {latest}). "
                "Pass --config.resume=True to continue that run, or choose another --workdir; "
                "nothing was changed.")
        logs = [name for name in ("metrics.jsonl", "eval.csv")
                if os.path.exists(os.path.join(self.workdir, name))]
        if latest is None and resume:
            raise IncompatibleCheckpointError(
                f"--config.resume=True, but {self.directory} holds no checkpoint"
                + (f" ({', '.join(logs)} of a run that saved none is there)" if logs else "")
                + ". To start a new run, leave out --config.resume"
                + (" and choose another --workdir" if logs else "") + "; nothing was changed.")
        if latest is None and logs:
            raise IncompatibleCheckpointError(
                f"{self.workdir} holds {', '.join(logs)} of an earlier run but no checkpoint, so "
                "a new run there would mix its rows with that run's. Choose another --workdir "
                "(or remove those files); nothing was changed.")
        if latest is None or not os.path.exists(self.config_path):
            return {}
        try:
            with open(self.config_path) as f:
                saved = json.load(f)
        except (OSError, ValueError) as e:
            raise IncompatibleCheckpointError(
                f"Cannot read {self.config_path} ({_first_line(e)}), so this config cannot be "
                "compared with the run's; remove the file to resume without the comparison, "
                "or start a new run in another --workdir; nothing was changed.") from None
        self._refuse_another_algorithm(saved.get("algo"), config)
        current = config_to_json_dict(config)
        diffs = config_differences(saved, current, linked_keys(config), settings)
        if diffs:
            raise IncompatibleCheckpointError(
                "Cannot resume: the config differs from the one this run was started with "
                f"({self.config_path}):\n  " + "\n  ".join(diffs) +
                "\nRestore those values (--config.<key>=<saved value>; this also pins a "
                "value that follows total_env_steps by default), or start a new run in "
                "another --workdir; nothing was changed. Settings that may change on resume: "
                f"{', '.join(RESUMABLE_KEYS + tuple(settings))}.")
        saved_flat, current_flat = flatten(saved), flatten(current)
        return {key: (saved_flat.get(key), current_flat.get(key))
                for key in sorted(set(saved_flat) | set(current_flat))
                if resumable(key, settings) and key != "resume"
                and json.dumps(saved_flat.get(key), default=str)
                != json.dumps(current_flat.get(key), default=str)}

    def _saved_algo(self) -> str | None:
        """The algorithm of the run saved here, or None where ``config.json`` cannot say (the
        resume path reports an unreadable one)."""
        try:
            with open(self.config_path) as f:
                return json.load(f).get("algo")
        except (OSError, ValueError, AttributeError):
            return None

    def _refuse_another_algorithm(self, saved_algo, config) -> None:
        """One line when the saved run is another algorithm's: their configs differ in nearly
        every key, and listing them all would bury the one difference that matters."""
        algo = config.get("algo")
        if saved_algo is None or saved_algo == algo:
            return
        raise IncompatibleCheckpointError(
            f"{self.workdir} holds a {saved_algo} run; this config is {algo}'s. Pick another "
            f"--workdir for it, or continue that run with a {saved_algo} config and "
            "--config.resume=True; nothing was changed.")

    def write_config(self, config, changed: dict | None = None, at: dict | None = None) -> None:
        """Writes ``config.json`` atomically (a crash mid-write leaves the old one), and
        appends the settings a resume changed to ``config_history.jsonl``."""
        if changed:
            with open(self.history_path, "a") as f:
                f.write(json.dumps({"resumed_at": at or {}, "changed": {
                    key: {"saved": old, "now": new} for key, (old, new) in changed.items()}},
                    default=str) + "\n")
        temporary = self.config_path + ".tmp"
        with open(temporary, "w") as f:
            f.write(config.to_json_best_effort(indent=2))
        os.replace(temporary, self.config_path)

    def save(self, step: int, state, loop: dict, force: bool = False) -> None:
        """Saves asynchronously; the device arrays are copied before this returns, so the
        caller may donate ``state`` to its next jitted call right away. The previous save is
        finished (orbax would wait for it here anyway) and its manifest written first."""
        self._seal()
        loop = {"layout": LAYOUT_VERSION, **loop}
        args = ocp.args.Composite(algo=ocp.args.StandardSave(_without_empty(state)),
                                 loop=ocp.args.JsonSave(loop))
        try:
            saving = self._manager.save(step, args=args, force=force)
        except Exception as e:  # noqa: BLE001 -- reported with what is left
            self._failed([step], e)
        if saving:
            self._unsealed.append(step)

    def _failed(self, steps: list[int], error: Exception):
        finished = [s for s in self._manager.all_steps() if s not in steps]
        raise write_failed(f"checkpoint {', '.join(map(str, steps))} in {self.directory}",
                           error, checkpointed=bool(finished)) from error

    def _seal(self) -> None:
        """Waits for the saves in flight, then writes the manifests of those now finalised
        (a step orbax's rotation already removed needs none)."""
        try:
            self._manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001
            self._failed(self._unsealed, e)
        for step in self._unsealed:
            step_dir = os.path.join(self.directory, str(step))
            if self._primary and os.path.isdir(step_dir):
                write_manifest(step_dir)
        self._unsealed = []

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
        ``unreadable`` lists as ``(step, error)`` the newer checkpoints found damaged and the
        numbered directories that are not checkpoints. Nothing is moved here: the caller calls
        ``set_aside(unreadable)`` once it has accepted the restored state."""
        try:
            expected = _shapes(_without_empty(template))
        except (TypeError, ValueError) as e:
            raise IncompatibleCheckpointError(f"The state holds a leaf a checkpoint cannot compare "
                                              f"({_first_line(e)}).") from None
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, _without_empty(template))
        steps = sorted(self._manager.all_steps(), reverse=True)
        # Numbered directories that are not checkpoints at all (no manifest, no orbax
        # metadata): set aside, never left for orbax's rotation to delete.
        unreadable = []
        for candidate in steps:
            try:
                self._check_on_every_process(candidate, contents=False)
            except _Damaged as e:
                unreadable.append((candidate, e))
        junk = {s for s, _ in unreadable}
        candidates = [s for s in steps if s not in junk] if step is None else [step]
        unreadable = [(s, e) for s, e in unreadable if s not in candidates]
        for step in candidates:
            try:
                verified = self._check_on_every_process(step, contents=True)
            except _Damaged as e:
                unreadable.append((step, e))
                continue
            if not os.path.isdir(os.path.join(self.directory, str(step), "algo")):
                self._refuse_layout(step, 1)  # one unnamed pytree, before "algo" and "loop"
            try:
                layout = self._manager.restore(step, args=ocp.args.Composite(
                    loop=ocp.args.JsonRestore()))["loop"].get("layout")
                metadata = self._manager.item_metadata(step)["algo"]
                if metadata is None:
                    raise _Damaged("its metadata (algo/_METADATA) is missing")
                saved = _shapes(metadata)
            except Exception as e:  # noqa: BLE001 -- damage unless the files were verified
                unreadable.append((step, self._damage_or_raise(step, e, verified)))
                continue
            if layout != LAYOUT_VERSION:
                self._refuse_layout(step, layout)
            if saved != expected:
                self._refuse_mismatch(step, saved, expected)
            try:
                restored = self._manager.restore(step, args=ocp.args.Composite(
                    algo=ocp.args.StandardRestore(abstract), loop=ocp.args.JsonRestore()))
            except Exception as e:  # noqa: BLE001
                unreadable.append((step, self._damage_or_raise(step, e, verified)))
                continue
            return _with_empty(restored["algo"], template), restored["loop"], step, unreadable
        raise IncompatibleCheckpointError(
            f"No checkpoint in {self.directory} can be read: " + "; ".join(
                f"{step}: {_first_line(e)}" for step, e in unreadable) +
            ". Nothing was moved or changed; start a new run in another --workdir.")

    def _check_files(self, step: int, contents: bool) -> bool:
        """``verify``, with permission problems as a refusal that moves nothing."""
        step_dir = os.path.join(self.directory, str(step))
        try:
            return verify(step_dir, contents)
        except PermissionError as e:
            raise IncompatibleCheckpointError(
                f"Checkpoint {step_dir} cannot be read ({_first_line(e)}); fix the permissions "
                "and resume again; nothing was moved or changed.") from None

    def _check_on_every_process(self, step: int, contents: bool) -> bool:
        """``_check_files``, agreed by every process of the run: raises ``_Damaged`` where any
        process found the checkpoint damaged, so that all go on to the same older one (a
        process reading a stale or partly synced copy on a shared filesystem can see damage
        the others do not, and orbax's restore waits for every process at each checkpoint it
        reads); else whether every process verified it against its manifest."""
        try:
            verified, damage = self._check_files(step, contents), None
        except _Damaged as e:
            verified, damage = False, e
        if jax.process_count() > 1:
            found = parallel.allgather(np.array([damage is not None, verified]))
            damaged = [i for i, (bad, _) in enumerate(found) if bad]
            if damaged and damage is None:
                damage = _Damaged(f"process(es) {damaged} of this run found it damaged")
            verified = bool(found[:, 1].all())
        if damage is not None:
            raise damage
        return verified

    def _refuse_layout(self, step: int, layout) -> None:
        if layout == 1:
            raise IncompatibleCheckpointError(
                f"Checkpoint {self.directory}/{step} was written by an older jaxwm (before "
                f"checkpoint layout {LAYOUT_VERSION}); resume it with that version, or start "
                "a new run in another --workdir; nothing was changed.")
        written_by = f"jaxwm up to commit {WRITTEN_UNTIL[layout]}" if layout in WRITTEN_UNTIL \
            else "another jaxwm"
        raise IncompatibleCheckpointError(
            f"Checkpoint {self.directory}/{step} has layout {layout}, written by {written_by}; "
            f"this jaxwm reads layout {LAYOUT_VERSION}. Continue that run with the jaxwm that "
            "wrote it (git checkout "
            f"{WRITTEN_UNTIL.get(layout, '<its commit>')}), or start a new run in another "
            "--workdir; nothing was changed.")

    def _damage_or_raise(self, step: int, error: Exception, verified: bool) -> Exception:
        """An unverified checkpoint that cannot be restored is damaged; one whose files match
        its manifest is not (moving it aside would lose a good checkpoint), so that stops."""
        if isinstance(error, PermissionError):
            raise IncompatibleCheckpointError(
                f"Checkpoint {self.directory}/{step} cannot be read ({_first_line(error)}); fix "
                "the permissions and resume again; nothing was moved or changed.") from None
        if verified:
            raise IncompatibleCheckpointError(
                f"Checkpoint {self.directory}/{step} matches its manifest but could not be "
                f"restored ({_first_line(error)}); this is not damage to its files (check the "
                "installed orbax and jax versions against the ones that wrote it); nothing was "
                "moved or changed.") from error
        if not _is_damage(error):  # no manifest to tell: a failure of another kind moves nothing
            raise IncompatibleCheckpointError(
                f"Checkpoint {self.directory}/{step} has no manifest and could not be restored "
                f"({_first_line(error)}). If it is damaged, move it into {self.quarantine}/ and "
                "resume again to start from the next older one; nothing was moved or "
                "changed.") from error
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
        and frees their steps for the resumed run); returns what to tell the user. Call
        ``reopen`` after it (on every process, once this one has moved them)."""
        if not unreadable:
            return None
        os.makedirs(self.quarantine, exist_ok=True)
        for step, _ in unreadable:
            target = os.path.join(self.quarantine, str(step))
            suffix = 1
            while os.path.exists(target):  # set aside before, by an earlier resume
                target, suffix = os.path.join(self.quarantine, f"{step}.{suffix}"), suffix + 1
            shutil.move(os.path.join(self.directory, str(step)), target)
        reasons = "; ".join(f"{step} ({_first_line(e)})" for step, e in unreadable)
        return (f"Checkpoint(s) {reasons} could not be read; moved to {self.quarantine} (not "
                f"deleted) and resumed from the newest readable one, step {restored_step}.")

    def reopen(self) -> None:
        """Lists the steps again (another process moved some aside)."""
        self._manager.close()
        self._manager = self._open()

    def wait(self) -> None:
        """Finishes the saves in flight and writes their manifests."""
        self._seal()

    def close(self) -> None:
        self._manager.close()
