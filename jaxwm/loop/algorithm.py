"""The contract between the loop and an algorithm (DESIGN.md, convention 2).

An algorithm is a frozen bundle of functions. The loop knows nothing else about it:

* ``init(key) -> state``: the whole training state, a pytree the loop checkpoints.
* ``hooks[name] = Hook(fn, env_steps, updates)``: ``fn(state, key) -> (state, metrics)``
  for ``collect``, ``update_model``, ``update_agent`` and ``imagine``; ``env_steps`` and
  ``updates`` are the static counts one call advances, which drive the phase scheduler
  without a host sync.
* ``policy``: what the evaluator needs to act in a separate env pool.
* ``on_restore(state) -> state``: re-attaches host resources after a checkpoint is loaded
  (envpool's C++ env state cannot be saved, so envs restart their episodes; everything in
  ``state`` — parameters, optimiser, RNG, counters — continues exactly).

Hook functions are normally jitted pure functions; an algorithm that steps envpool through
its XLA interface keeps the env handle in a small host-side holder, the one impurity.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax

# ``evaluate`` is served by the loop's evaluator; the others by the algorithm.
HOOK_NAMES = ("collect", "update_model", "update_agent", "imagine", "evaluate")

HookFn = Callable[[Any, jax.Array], tuple[Any, Mapping[str, Any]]]


@dataclasses.dataclass(frozen=True)
class Hook:
    fn: HookFn
    env_steps: int = 0
    updates: int = 0


@dataclasses.dataclass(frozen=True)
class Policy:
    """Acting for evaluation: ``init_carry(state, num_envs) -> carry`` and
    ``act(state, carry, obs, is_first, key, greedy) -> (carry, action)`` (jitted)."""

    init_carry: Callable[[Any, int], Any]
    act: Callable[..., tuple[Any, jax.Array]]


@dataclasses.dataclass(frozen=True)
class Algorithm:
    name: str
    init: Callable[[jax.Array], Any]
    hooks: Mapping[str, Hook]
    policy: Policy | None = None
    on_restore: Callable[[Any], Any] = lambda state: state
    close: Callable[[], None] = lambda: None
