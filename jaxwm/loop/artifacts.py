"""Phase artifacts: data one phase writes and later phases read, too large for a checkpoint,
kept in the run directory as HDF5 (``<workdir>/artifacts/<name>.h5``).

The contract's fourth kind of data (beside the state, passed outputs and read-only data). An
algorithm declares ``Algorithm.artifacts[name] = Artifact(example, ...)``; the loop owns the
files and hooks stay pure:

* **Writing.** A hook that lists ``name`` in ``Hook.writes`` returns rows under it, a pytree
  whose leaves have a leading row axis (optionally ``{"rows": ..., "mask": bool[n]}`` to keep
  only some), and the loop appends them to the file. World Models' random rollouts are
  written this way: ~120 GB of frames for the paper's 10k rollouts, which neither memory nor
  a checkpoint could hold.
* **Importing.** ``source() -> rows`` fills the artifact when a run first starts: the run keeps
  its own copy of data that came from outside (MOPO's dataset), so a resume trains on exactly
  the rows the run began with. A resume checks that the source still has the same rows (a
  digest kept in the file) and refuses, in one line, one that changed.
* **Reading.** A hook that lists ``name`` in ``Hook.reads`` receives, per call, either every
  row (``batch=0``; loaded on the device once and kept while the artifact does not grow) or
  ``batch`` rows drawn uniformly, or with ``length`` > 0 ``batch`` windows of ``length``
  consecutive rows (sequences), streamed from the file. The rows drawn follow from the hook's
  key alone, so a resumed run draws the same ones. With ``after`` set to another artifact's
  name, reads go in order instead: the ``batch`` rows that follow the last row ``after``
  holds, as ``{"rows": ..., "mask": bool[batch]}`` (zeros and False past the end): a pass
  that turns each row of this artifact into a row of that one (World Models encodes its
  frames into latents this way) and so resumes where its checkpoint left it. One file read
  two ways is two artifacts, the second a ``view_of`` the first (World Models reads its
  frames in random batches for the VAE and in order to encode them).
* **Resume.** Each checkpoint records every artifact's row count (the files are flushed
  first). A resumed run truncates the files to those counts, so rows written after the
  checkpoint (before a crash) are written again, not twice. Files are never part of a
  checkpoint.
* **Several processes.** Every process keeps its own copy of every artifact, under
  ``artifacts/process-<i>``, and writes every row to it: a hook's rows are the whole run's
  (its outputs are global arrays, fetched whole with ``parallel.host_value``, or rows the
  algorithm gathered from every process), so the copies hold the same rows and a read, drawn
  from the call's key, is the same batch on every process. HDF5 allows one writer per file
  (h5py locks it), and a copy per process also serves hosts that do not share a disk.

Why HDF5 through h5py (already the dataset loader's dependency) rather than flashbax's Vault:
Vault stores a buffer state as tensorstore arrays and reads back contiguous time ranges only
(random rows need its private handles), while h5py reads single rows quickly and windows as
contiguous slices. Rows are chunked ``CHUNK_BYTES`` at a time; reads go row by row (sorted),
which h5py serves far faster than one fancy-indexed read.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

from jaxwm import parallel
from jaxwm.config import ConfigError

CHUNK_BYTES = 1 << 20  # about a MiB of rows per HDF5 chunk
DIGEST = "source_digest"


@dataclasses.dataclass(frozen=True)
class Artifact:
    """``example``: one row (a pytree of arrays without the row axis). ``batch``: rows per
    read (0: all of them); ``length`` > 0: reads are ``batch`` windows of that many
    consecutive rows. ``source``: rows to import when the run first starts. ``place``: puts
    what a hook reads on the device (e.g. ``parallel.put_readonly`` over a mesh)."""

    example: Any
    batch: int = 0
    length: int = 0
    source: Callable[[], Any] | None = None
    place: Callable[[Any], Any] = jax.device_put
    after: str = ""  # ordered reads: the rows after the last row of this artifact
    view_of: str = ""  # another artifact's file, read this way (never written or cut here)


def digest(rows) -> str:
    """A content hash of host rows (every leaf's bytes, in tree order)."""
    h = hashlib.sha1()
    for path, leaf in jax.tree_util.tree_flatten_with_path(rows)[0]:
        h.update(jax.tree_util.keystr(path).encode())
        h.update(np.ascontiguousarray(leaf).tobytes())
    return h.hexdigest()


def _names(example) -> list[str]:
    return [jax.tree_util.keystr(path) for path, _ in
            jax.tree_util.tree_flatten_with_path(example)[0]]


class ArtifactFile:
    """One artifact's HDF5 file: a resizable dataset per leaf, rows on axis 0."""

    def __init__(self, path: str, artifact: Artifact):
        import h5py  # the dataset loader's dependency

        self.path, self.artifact = path, artifact
        self._leaves, self._tree = jax.tree.flatten(artifact.example)
        self._names = _names(artifact.example)
        exists = os.path.exists(path)
        self._file = h5py.File(path, "a")
        for name, leaf in zip(self._names, self._leaves, strict=True):
            leaf = np.asarray(leaf)
            if name in self._file:
                shape, dtype = self._file[name].shape[1:], self._file[name].dtype
                if shape != leaf.shape or dtype != leaf.dtype:
                    self._file.close()
                    raise ConfigError(
                        f"{path}: {name} holds rows of {shape} {dtype}, this run writes "
                        f"{leaf.shape} {leaf.dtype}; it was written by another config: resume "
                        "with that config or use another --workdir; nothing was changed.")
                continue
            if exists and self._names[0] in self._file:
                self._file.close()
                raise ConfigError(f"{path} lacks {name}; it was written by another config.")
            row_bytes = max(leaf.nbytes, 1)
            self._file.create_dataset(name, shape=(0,) + leaf.shape, dtype=leaf.dtype,
                                      maxshape=(None,) + leaf.shape,
                                      chunks=(max(1, CHUNK_BYTES // row_bytes),) + leaf.shape)
        self._cache = None  # (rows, the whole artifact on the device)

    def view(self, artifact: Artifact) -> ArtifactFile:
        """This file read as ``artifact`` says (its batch, length, order), same rows."""
        if jax.tree.structure(artifact.example) != self._tree:
            raise ValueError(f"A view of {self.path} must have its rows' layout.")
        view = object.__new__(ArtifactFile)
        view.__dict__.update(self.__dict__, artifact=artifact, _cache=None)
        return view

    @property
    def rows(self) -> int:
        return int(self._file[self._names[0]].shape[0])

    def append(self, rows) -> None:
        """Appends host (or device) rows: a tree like ``example`` with a leading row axis, or
        ``{"rows": tree, "mask": bool[n]}``."""
        mask = None
        if isinstance(rows, Mapping) and set(rows) == {"rows", "mask"}:
            rows, mask = rows["rows"], parallel.host_value(rows["mask"]).astype(bool)
        leaves = jax.tree.leaves(parallel.host_value(rows))
        if mask is not None:
            leaves = [x[mask] for x in leaves]
        n, start = leaves[0].shape[0], self.rows
        for name, leaf in zip(self._names, leaves, strict=True):
            dataset = self._file[name]
            dataset.resize(start + n, axis=0)
            dataset[start:start + n] = leaf

    def truncate(self, rows: int) -> None:
        if rows > self.rows:
            raise ConfigError(f"{self.path} holds {self.rows} rows but the checkpoint "
                              f"recorded {rows}: the file was replaced or damaged.")
        for name in self._names:
            self._file[name].resize(rows, axis=0)

    def flush(self) -> None:
        self._file.flush()

    def whole(self):
        """Every row, on the device (loaded once while the artifact does not grow)."""
        if self._cache is None or self._cache[0] != self.rows:
            leaves = [self._file[name][...] for name in self._names]
            self._cache = (self.rows, self.artifact.place(jax.tree.unflatten(self._tree,
                                                                              leaves)))
        return self._cache[1]

    def read(self, seed: np.ndarray):
        """What a hook reading this artifact gets, rows drawn from ``seed`` (module
        docstring)."""
        a = self.artifact
        if a.batch == 0:
            return self.whole()
        rows = self.rows
        span = max(a.length, 1)
        if rows < span:
            raise RuntimeError(f"{self.path} holds {rows} rows; a read needs {span}.")
        rng = np.random.default_rng([int(x) for x in seed])
        starts = np.sort(rng.integers(0, rows - span + 1, size=a.batch))
        leaves = []
        for name in self._names:
            dataset = self._file[name]
            if a.length:
                leaves.append(np.stack([dataset[s:s + a.length] for s in starts]))
            else:
                leaves.append(np.stack([dataset[s] for s in starts]))
        # Sorted for the file's sake; shuffled back so the batch order follows the key too.
        order = rng.permutation(a.batch)
        return a.place(jax.tree.unflatten(self._tree, [x[order] for x in leaves]))

    def read_from(self, start: int):
        """The ``batch`` rows from ``start`` on, padded with zeros past the last row, and
        which of them exist: ``{"rows": ..., "mask": bool[batch]}``."""
        a = self.artifact
        stop = min(start + a.batch, self.rows)
        mask = np.arange(a.batch) < stop - start
        leaves = []
        for name, leaf in zip(self._names, self._leaves, strict=True):
            rows = np.zeros((a.batch,) + np.shape(leaf), np.asarray(leaf).dtype)
            rows[: stop - start] = self._file[name][start:stop]
            leaves.append(rows)
        return a.place({"rows": jax.tree.unflatten(self._tree, leaves), "mask": mask})

    def source_digest(self) -> str | None:
        return self._file.attrs.get(DIGEST)

    def set_source_digest(self, content: str) -> None:
        self._file.attrs[DIGEST] = content

    def close(self) -> None:
        self._file.close()


class Artifacts:
    """The artifacts of a run, under ``<workdir>/artifacts`` (``artifacts/process-<i>`` in
    each process of several): ``start`` brings them to a fresh run's state or a checkpoint's,
    ``state_dict`` records them in a checkpoint."""

    def __init__(self, workdir: str, declared: Mapping[str, Artifact]):
        self.directory = os.path.join(workdir, "artifacts")
        if jax.process_count() > 1:
            self.directory = os.path.join(self.directory, f"process-{jax.process_index()}")
        self.declared = dict(declared)
        self.files: dict[str, ArtifactFile] = {}
        if declared:
            os.makedirs(self.directory, exist_ok=True)
        self.reimported: set[str] = set()
        for name, artifact in declared.items():
            if not artifact.view_of:
                self.files[name] = self._open(name, artifact)
        self.views = {name: self.files[a.view_of].view(a) for name, a in declared.items()
                      if a.view_of}

    def _open(self, name: str, artifact: Artifact) -> ArtifactFile:
        """The artifact's file. One h5py cannot open (cut short by a kill or a full disk,
        damaged) is imported again where the run imported it (moved aside, never deleted,
        and its source checked against the checkpoint's digest in ``start``), and refused in
        one line where the run's own phases wrote it."""
        path = os.path.join(self.directory, f"{name}.h5")
        try:
            return ArtifactFile(path, artifact)
        except OSError as e:
            reason = str(e).splitlines()[0]
            if artifact.source is None:
                raise ConfigError(
                    f"{path} cannot be read ({reason}): it was cut short or damaged, and its "
                    "rows, written by this run's phases, cannot be recovered from it. Start "
                    "the run again in another --workdir; nothing was changed.") from None
            aside = path + ".unreadable"
            os.replace(path, aside)
            tqdm.write(f"{path} cannot be read ({reason}): moved to {aside}; importing its "
                       "data again.")
            self.reimported.add(name)
            return ArtifactFile(path, artifact)

    def start(self, saved_rows: Mapping[str, int] | None,
              saved_digests: Mapping[str, str] | None = None) -> None:
        """A fresh run (``saved_rows`` None): every file emptied (rows of a run that never
        checkpointed), sources imported. A resume: every file back to the checkpoint's row
        count (rows written after it are written again), sources checked for changes against
        the digest the file keeps, or the checkpoint's (``saved_digests``) for a file imported
        again."""
        for name, file in self.files.items():
            source = self.declared[name].source
            fresh = saved_rows is None or name in self.reimported
            file.truncate(0 if fresh else int(saved_rows.get(name, 0)))
            if source is None:
                continue
            rows = source()
            content = digest(rows)
            # What the run imported: the file's record, or the checkpoint's for a file
            # imported again (a checkpoint older than that record cannot tell).
            before = (saved_digests or {}).get(name) if fresh else file.source_digest()
            if saved_rows is not None and before is not None and before != content:
                raise ConfigError(
                    f"The data imported into {file.path} when this run started has changed at "
                    f"its source since (digest {before}, now {content}): resume with the "
                    "original data, or start a new run in another --workdir; nothing was "
                    "changed.")
            if fresh:
                file.append(rows)
                file.set_source_digest(content)
        self.flush()

    def digests(self) -> dict[str, str]:
        """The digest of every imported artifact's source, for a checkpoint."""
        return {name: file.source_digest() for name, file in self.files.items()
                if self.declared[name].source is not None}

    def __contains__(self, name: str) -> bool:
        return name in self.files or name in self.views

    def read(self, name: str, hook_key):
        """What a hook reading ``name`` gets, from the key of the call (``read_key``), or in
        order after the rows of ``Artifact.after``."""
        file = self.views[name] if name in self.views else self.files[name]
        after = self.declared[name].after
        if after:
            return file.read_from(self.files[after].rows)
        return file.read(read_key(hook_key, name))

    def append(self, name: str, rows) -> None:
        if name in self.views:
            raise RuntimeError(f"Artifact {name!r} is a view of "
                               f"{self.declared[name].view_of!r}: write to that one.")
        self.files[name].append(rows)

    def flush(self) -> None:
        for file in self.files.values():
            file.flush()

    def state_dict(self) -> dict[str, int]:
        """Row counts, for a checkpoint (the files are flushed first)."""
        self.flush()
        return {name: file.rows for name, file in self.files.items()}

    def close(self) -> None:
        for file in self.files.values():
            file.close()


def read_key(hook_key, name: str) -> np.ndarray:
    """The seed a read draws its rows from: the hook call's key and the artifact's name, so
    reads repeat exactly on resume and two artifacts never draw alike."""
    name_code = int.from_bytes(hashlib.sha1(name.encode()).digest()[:4], "little")
    return np.append(np.asarray(jax.device_get(hook_key), np.uint64).ravel(), name_code)
