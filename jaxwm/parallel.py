"""Device mesh and shardings for data parallelism (docs/architecture.md, "Conventions worth knowing").

One mesh axis, ``data``, over all devices (all local devices on one host; all global ones
after ``jax.distributed.initialize`` on several). Training batches are sharded on their
leading axis, parameters and optimiser state are replicated, and XLA inserts the gradient
all-reduce. The same code runs on 1 CPU, N GPUs, or
``XLA_FLAGS=--xla_force_host_platform_device_count=4`` fake CPU devices.

Several processes (``jaxwm.launch``, or a Slurm job): each process owns its env pool and its
local devices; a batch it collected becomes its slice of one global array
(``global_batch``), so the update's all-reduce spans every process's devices (over gloo on
CPU, NCCL on GPU). Values every process must agree on (normalisation statistics, episode
metrics) are gathered with ``allgather`` and combined identically on each.
"""

from __future__ import annotations

import hashlib
import os

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA_AXIS = "data"


class DistributedError(RuntimeError):
    """The multi-process variables are inconsistent (raised before joining the job)."""


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise DistributedError(f"{name}={value!r} is not an integer.") from None


def maybe_initialize_distributed() -> bool:
    """Joins a multi-process job, if this process was started as part of one; returns whether
    it did. Call it before anything touches a JAX backend (``jax.devices()``,
    ``jax.process_count()``, any array): the backend is created once, and only a backend
    created after ``jax.distributed.initialize`` sees the other processes' devices.

    ``jaxwm.launch`` sets ``JAX_COORDINATOR_ADDRESS`` (read by JAX), ``JAX_NUM_PROCESSES`` and
    ``JAX_PROCESS_ID``; under Slurm (``SLURM_NTASKS`` > 1, one task per process) JAX reads all
    three from Slurm's own variables.
    """
    address = os.environ.get("JAX_COORDINATOR_ADDRESS") or None
    under_slurm = (_env_int("SLURM_NTASKS") or 1) > 1
    if not (address or under_slurm) or jax.distributed.is_initialized():
        return False
    num_processes, process_id = _env_int("JAX_NUM_PROCESSES"), _env_int("JAX_PROCESS_ID")
    if num_processes is not None and process_id is not None and \
            not 0 <= process_id < num_processes:
        raise DistributedError(
            f"JAX_PROCESS_ID={process_id}, but the coordinator expects JAX_NUM_PROCESSES="
            f"{num_processes} processes (ids 0..{num_processes - 1}): start exactly "
            f"{num_processes} processes, or raise JAX_NUM_PROCESSES.")
    jax.distributed.initialize(coordinator_address=address, num_processes=num_processes,
                               process_id=process_id)
    return True


def is_primary() -> bool:
    """Process 0: the one that writes logs, progress and files beside the checkpoints."""
    return jax.process_index() == 0


def local_device(mesh: Mesh):
    """This process's first device of ``mesh`` (where its env pool's programs run)."""
    return next(d for d in mesh.devices.flat if d.process_index == jax.process_index())


def global_batch(tree, sharding: NamedSharding):
    """Each process's batch -> one global array split over ``sharding``'s mesh: this process's
    rows are its slice (in process order). With one process, a plain ``device_put``."""
    if jax.process_count() == 1:
        return jax.device_put(tree, sharding)
    return jax.tree.map(
        lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), tree)


def replicate(tree, mesh: Mesh):
    """Puts a value every process holds identically on every device of ``mesh``. On a
    one-device mesh the value is left as it is (uncommitted, like everything else, so that
    every jitted hook sees one placement and compiles once)."""
    if mesh.size == 1:
        return tree
    return global_batch(tree, replicated(mesh))


def constrain_batch(tree, mesh: Mesh):
    """Inside jit: ``tree``'s leading (batch) axis split over the ``data`` axis of ``mesh``,
    so XLA computes per-device gradients and all-reduces them; nothing on one device."""
    if mesh.size == 1:
        return tree
    return jax.lax.with_sharding_constraint(tree, batch_sharding(mesh))


def batch_on_axis(mesh: Mesh, axis: int):
    """Inside jit: a function putting a tree's ``axis`` (a batch behind other axes, such as an
    ensemble's members) over the ``data`` axis of ``mesh``; identity on one device."""
    if mesh.size == 1:
        return lambda tree: tree
    sharding = NamedSharding(mesh, PartitionSpec(*([None] * axis), DATA_AXIS))
    return lambda tree: jax.lax.with_sharding_constraint(tree, sharding)


def allgather(tree):
    """Every process's value of ``tree`` (numpy, leading axis = process index)."""
    return multihost_utils.process_allgather(tree)


def host_value(tree):
    """``tree`` on the host (numpy), whole: a global array split over several processes'
    devices (a batch a hook computed over the mesh) is gathered from all of them, so every
    process of the run must call this with the same tree; anything else is fetched as
    ``jax.device_get`` fetches it."""
    def fetch(x):
        if isinstance(x, jax.Array) and not (x.is_fully_addressable or x.is_fully_replicated):
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(jax.device_get(x))

    return jax.tree.map(fetch, tree)


def wait_for_every_process(name: str) -> None:
    """A barrier over the run's processes (nothing with one): what one process did to shared
    files before it is seen by all after it."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


class ProcessesDivergedError(RuntimeError):
    """Values every process must hold identically (the replicated parameters) differ."""


def check_same_on_every_process(tree, what: str) -> None:
    """Raises ``ProcessesDivergedError`` unless every process holds the same ``tree`` (its
    local replicas of replicated arrays, compared by a digest of their bytes): a cheap guard
    that the processes of a run still train one model. Nothing with one process."""
    if jax.process_count() == 1:
        return
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(local_replica(tree, jax.local_devices()[0])):
        digest.update(np.ascontiguousarray(jax.device_get(leaf)).tobytes())
    digests = allgather(np.frombuffer(digest.digest(), np.uint8))
    differ = [i for i, d in enumerate(digests) if not np.array_equal(d, digests[0])]
    if differ:
        raise ProcessesDivergedError(
            f"The {what} of process(es) {differ} differ from process 0's: the processes no "
            "longer train one model. This is a bug in jaxwm; please report it with the config.")


def data_mesh(num_devices: int | None = None) -> Mesh:
    devices = jax.devices()
    if num_devices is not None:
        if num_devices > len(devices):
            raise ValueError(f"Asked for {num_devices} devices but JAX sees {len(devices)}.")
        devices = devices[:num_devices]
    return Mesh(np.asarray(devices), (DATA_AXIS,))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def local_replica(tree, device):
    """The copy on ``device`` of each replicated leaf (no transfer); leaves that are not
    spread over several devices are returned as they are."""
    def pick(x):
        if not isinstance(x, jax.Array) or len(x.devices()) == 1:
            return x
        return next(s.data for s in x.addressable_shards if s.device == device)

    return jax.tree.map(pick, tree)


def on_local_device(fn, mesh: Mesh):
    """``fn`` of values replicated over ``mesh`` run on this process's device alone (a program
    with host calls of one device, such as envpool's steps), on its replicas, its first result
    replicated over ``mesh`` again: every process runs the whole of ``fn`` and, from the same
    inputs, reaches the same value. ``(result, rest)`` -> the same, ``result`` replicated."""
    device = local_device(mesh)

    def run(*args):
        result, rest = fn(*local_replica(args, device))
        return replicate(result, mesh), rest

    return run


def put_readonly(tree, mesh: Mesh, shard_min_bytes: int = 16 << 20):
    """Puts read-only data (an offline dataset, demonstrations) on the mesh once, for
    ``Algorithm.data``: each leaf of at least ``shard_min_bytes`` whose leading axis splits
    evenly over the ``data`` axis is sharded over it (every device holds 1/N of it; a jitted
    gather reads across devices), and the rest is replicated. Hooks receive it as an argument,
    so it is never a compile-time constant. On a one-device mesh it is put on the default
    device uncommitted, as ``replicate`` leaves state, so the hooks compile once."""
    if mesh.size == 1:
        return jax.tree.map(lambda x: jax.device_put(np.asarray(x) if not isinstance(
            x, jax.Array) else x), tree)

    def place(x):
        x = x if isinstance(x, jax.Array) else np.asarray(x)
        large = x.nbytes >= shard_min_bytes and x.ndim > 0 and x.shape[0] % mesh.size == 0
        return jax.device_put(x, batch_sharding(mesh) if large else replicated(mesh))

    return jax.tree.map(place, tree)
