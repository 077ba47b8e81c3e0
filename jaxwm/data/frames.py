"""Frame stacks for pixel world models, rebuilt from a ``SequenceReplay`` of single frames.

A pixel world model that predicts the next frame from the last F (SimPLe's, and the ones
that will follow it: DIAMOND, IRIS, STORM) keeps each env step's newest frame once, ``[3,
H, W]`` uint8 in envpool's channel-first layout, with its step's ``is_first`` flag, and
rebuilds stacks when it samples. Here, shared by every such model:

* ``stack_rows``: the rows of the stacks ending at given rows, an episode's first frame
  repeated before it, as envpool's own frame stack repeats it;
* ``stacks_at``: the stacks ``[n, F * C, H, W]`` (envpool's observation layout) at flat
  replay indices, and ``window_stack``, the first stack of each sampled window;
* ``to_hwc`` / ``frame_hwc``: envpool's channel-first stacks and frames as the NHWC tensors
  the networks take; ``as_rgb``: a frame of any channel count as RGB, to look at;
* ``start_indices``: where imagined rollouts start (SimPLe's: uniformly among the executed
  steps, one rollout from an episode's first frame);
* ``median_noise``: SimPLe's input noise (an element replaced by its frame's median).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxwm.data.replay import SequenceReplay

CHANNELS = 3  # RGB (Atari's frames; a MinAtar frame has one channel per kind of object)
# Colours of a frame's object channels (MinAtar's), channel 0 first: tab10's.
PALETTE = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
           (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207))


def stack_rows(is_first: jax.Array, row: jax.Array, frames: int) -> jax.Array:
    """``[n, frames]``: the rows, oldest first, of the frame stacks that end at ``row`` [n] in
    ``is_first`` [T, n] (time first, one column per stack): each earlier row, except before an
    episode's first row (or row 0), which repeats, as envpool's stack repeats a first frame."""
    rows = [row]
    for _ in range(frames - 1):
        newest = rows[0]
        starts = jnp.take_along_axis(is_first, newest[None], 0)[0]
        rows.insert(0, jnp.where(starts | (newest == 0), newest, newest - 1))
    return jnp.stack(rows, -1)


def to_hwc(stack_chw: jax.Array) -> jax.Array:
    """``[B, F * 3, H, W]`` (envpool) or ``[B, F, 3, H, W]`` -> ``[B, H, W, F * 3]``."""
    if stack_chw.ndim == 5:
        stack_chw = stack_chw.reshape((stack_chw.shape[0], -1) + stack_chw.shape[3:])
    return jnp.moveaxis(stack_chw, 1, -1)


def frame_hwc(frame_chw: jax.Array) -> jax.Array:
    """Frames ``[..., 3, H, W]`` -> ``[..., H, W, 3]``."""
    return jnp.moveaxis(frame_chw, -3, -1)


def as_rgb(frame_hwc: jax.Array) -> jax.Array:
    """uint8 frames ``[..., H, W, C]`` as ``[..., H, W, 3]``: RGB as it is; object channels
    (each cell 0 or 255) each in its ``PALETTE`` colour, the highest channel on in a cell
    drawn (as MinAtar's own display), black where none is."""
    channels = frame_hwc.shape[-1]
    if channels == CHANNELS:
        return frame_hwc
    if channels > len(PALETTE):
        raise ValueError(f"as_rgb colours up to {len(PALETTE)} object channels, not {channels}")
    on = frame_hwc > 127
    top = jnp.max(jnp.where(on, jnp.arange(1, channels + 1), 0), -1)  # 0: none on
    colours = jnp.asarray(((0, 0, 0),) + PALETTE[:channels], jnp.uint8)
    return colours[top]


def rows_at(replay: SequenceReplay, flat_index: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(row, env) of flat ``[steps * envs]`` replay indices."""
    return flat_index // replay.num_envs, flat_index % replay.num_envs


def stacks_at(replay: SequenceReplay, flat_index: jax.Array, frames: int) -> jax.Array:
    """Frame stacks ``[n, F * 3, H, W]`` ending at flat replay indices [n] (its ``frame`` and
    ``is_first``)."""
    row, env = rows_at(replay, flat_index)
    rows = stack_rows(replay.data["is_first"][:, env], row, frames)  # [n, F]
    stack = replay.data["frame"][rows, env[:, None]]  # [n, F, 3, H, W]
    return stack.reshape((stack.shape[0], -1) + stack.shape[3:])


def window_stack(window: dict, frames: int) -> jax.Array:
    """The stack ``[B, H, W, F * 3]`` ending at row ``frames - 1`` of sampled windows
    ``{frame [B, T, 3, H, W], is_first [B, T]}``."""
    rows = stack_rows(window["is_first"].T, jnp.full((window["frame"].shape[0],), frames - 1),
                      frames)  # [B, F]
    return to_hwc(jnp.take_along_axis(window["frame"], rows[:, :, None, None, None], 1))


def start_indices(key, valid: jax.Array, first: jax.Array, num: int) -> jax.Array:
    """``num`` flat indices of steps to start imagined rollouts from: uniformly among the
    ``valid`` ones [T, n], the first at an episode's ``first`` step (any valid one while
    none is in)."""
    first = valid & first
    first = jnp.where(jnp.any(first), first, valid)
    k_any, k_first = jax.random.split(key)
    logits = lambda mask: jnp.log(mask.reshape(-1).astype(jnp.float32))  # noqa: E731
    index = jax.random.categorical(k_any, logits(valid), shape=(num,))
    return index.at[0].set(jax.random.categorical(k_first, logits(first)))


def median_noise(key, frames_u8: jax.Array, rate: float) -> jax.Array:
    """SimPLe's input noise: each element replaced by its sample's median with prob ``rate``."""
    flat = frames_u8.reshape(frames_u8.shape[0], -1)
    median = jnp.sort(flat, axis=1)[:, (flat.shape[1] - 1) // 2]  # the lower median (torch)
    noisy = jax.random.uniform(key, flat.shape) < rate
    return jnp.where(noisy, median[:, None], flat).reshape(frames_u8.shape)
