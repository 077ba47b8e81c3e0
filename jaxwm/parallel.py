"""Device mesh and shardings for data parallelism (DESIGN.md, convention 7).

One mesh axis, ``data``, over all devices (all local devices on one host; all global ones
after ``jax.distributed.initialize`` on several). Training batches are sharded on their
leading axis, parameters and optimiser state are replicated, and XLA inserts the gradient
all-reduce. The same code runs on 1 CPU, N GPUs, or
``XLA_FLAGS=--xla_force_host_platform_device_count=4`` fake CPU devices.
"""

from __future__ import annotations

import os

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA_AXIS = "data"


def maybe_initialize_distributed() -> None:
    """Joins a multi-host job when the launcher set JAX's coordinator variables."""
    if os.environ.get("JAX_COORDINATOR_ADDRESS") and jax.process_count() == 1:
        jax.distributed.initialize()


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


def put_readonly(tree, mesh: Mesh, shard_min_bytes: int = 16 << 20):
    """Puts read-only data (an offline dataset, demonstrations) on the mesh once, for
    ``Algorithm.data``: each leaf of at least ``shard_min_bytes`` whose leading axis splits
    evenly over the ``data`` axis is sharded over it (every device holds 1/N of it; a jitted
    gather reads across devices), and the rest is replicated. Hooks receive it as an argument,
    so it is never a compile-time constant."""

    def place(x):
        x = x if isinstance(x, jax.Array) else np.asarray(x)
        large = x.nbytes >= shard_min_bytes and x.ndim > 0 and x.shape[0] % mesh.size == 0
        return jax.device_put(x, batch_sharding(mesh) if large else replicated(mesh))

    return jax.tree.map(place, tree)
