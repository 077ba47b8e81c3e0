"""Metric values that are not scalars, which a jitted hook can return like any metric: a
``Video`` (an animated GIF in TensorBoard and under ``videos/``, with an MP4 beside it where an
encoder is installed), an ``Image`` and a ``Histogram``. Pytrees, so they pass through ``jit``;
a base module, so that agents and models can return them without importing the loop that
writes them (``jaxwm.loop.metrics``).
"""

from __future__ import annotations

import jax
from flax import struct


@struct.dataclass
class Video:
    """``frames``: [T, H, W, C] with C in (1, 3), uint8 or float in [0, 1]."""

    frames: jax.Array
    fps: int = struct.field(pytree_node=False, default=15)


@struct.dataclass
class Image:
    """``pixels``: [H, W, C] with C in (1, 3), uint8 or float in [0, 1]."""

    pixels: jax.Array


@struct.dataclass
class Histogram:
    """``values``: any shape; a window's values are pooled."""

    values: jax.Array
