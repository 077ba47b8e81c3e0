"""The one way a pure per-seed function becomes what the loop calls.

An algorithm writes each hook for ONE seed, as a pure function ``fn(state, data, key) ->
(state, outputs, metrics)`` of its state (without the acting layer's ``ActorState``s, which
belong to the env pool, not to a seed), and ``HookCompiler.hook`` makes it the hook the loop
calls: vmapped over ``config.num_seeds`` seeds (``loop.seeds``; the read-only data named
``shared`` is the same for every seed), jitted through ``backend.jit`` with the state donated
(updated in place: the contract suite's donation check), the actor states left out of the
program and put back after it, and, with several seeds, seed 0's media (videos, images,
histograms) kept once while every number keeps its seed axis. ``init`` is the same for the
state's creation: vmapped over seeds, then replicated over the mesh, so that every hook's
program reads its parameters where they already are and splits only its batches over the
``data`` axis (``parallel.constrain_batch`` inside the function).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import jax
from jax.sharding import Mesh

from jaxwm import backend, parallel
from jaxwm.envs import acting
from jaxwm.loop import seeds
from jaxwm.loop.algorithm import Hook, drop_actors, restore_actors
from jaxwm.media import Histogram, Image, Video

MEDIA = (Video, Image, Histogram)


def first_seed_media(metrics: Mapping) -> dict:
    """``metrics`` with each media value cut to seed 0's (a leading seed axis)."""
    return {k: jax.tree.map(lambda x: x[0], v) if isinstance(v, MEDIA) else v
            for k, v in metrics.items()}


def free_donated(donated, result) -> None:
    """Frees the buffers of ``donated`` that a donating program could not reuse, once its
    ``result`` is ready. XLA writes an output in place of a donated input only where their
    buffers match; an op that allocates its own (LAPACK's eigendecomposition, which
    evosax's CMA-ES runs every generation) leaves the donated buffers alive beside the new
    until Python lets go of the old state. (Deleting an input the dispatched program may
    still be reading crashed a worker once: wait first.)"""
    jax.block_until_ready(result)
    for x in jax.tree.leaves(donated):
        if isinstance(x, jax.Array) and not x.is_deleted():
            x.delete()


@dataclasses.dataclass(frozen=True)
class HookCompiler:
    """Turns per-seed pure functions into compiled hooks (module docstring)."""

    num_seeds: int
    mesh: Mesh

    @classmethod
    def for_config(cls, config) -> HookCompiler:
        return cls(config.num_seeds, parallel.data_mesh(config.num_devices or None))

    def vmap(self, fn: Callable, in_axes=0) -> Callable:
        """``fn`` over the seed axis (itself for one seed)."""
        return seeds.vmap(fn, self.num_seeds, in_axes=in_axes)

    def init(self, init_one: Callable, jit: bool = False) -> Callable:
        """``(key, *per_seed) -> state``: ``init_one`` per seed (its arguments with a seed
        axis), replicated over the mesh. ``jit`` compiles it once (flax's eager
        initialisation compiles dozens of small ops)."""
        init = self.vmap(init_one)
        if jit:
            init = backend.jit(init)
        return lambda *args: parallel.replicate(init(*args), self.mesh)

    def function(self, fn: Callable, in_axes=0, donate_argnums=()) -> Callable:
        """``fn`` vmapped over seeds (``in_axes`` per argument, ``None`` for one shared by
        every seed) and jitted, donating ``donate_argnums``."""
        return backend.jit(self.vmap(fn, in_axes), donate_argnums=donate_argnums)

    def step(self, fn: Callable, shared: tuple[str, ...] = (), donate: bool = True) -> Callable:
        """``fn(state, data, key) -> (state, outputs, metrics)`` per seed, compiled over the
        seeds: the data named in ``shared`` is every seed's; seed 0's media are kept."""

        def over_seeds(state, data, key):
            axes = {name: None if name in shared else 0 for name in data}
            state, outputs, metrics = self.vmap(fn, in_axes=(0, axes, 0))(state, data, key)
            if self.num_seeds > 1:
                metrics = first_seed_media(metrics)
            return state, outputs, metrics

        return backend.jit(over_seeds, donate_argnums=(0,) if donate else ())

    def hook(self, fn: Callable, *, counts: Mapping[str, int] | None = None,
             reads: tuple[str, ...] = (), writes: tuple[str, ...] = (),
             shared: tuple[str, ...] = (), place: Callable | None = None,
             frees_donated: bool = False) -> Hook:
        """The loop's ``Hook`` of a per-seed pure ``fn`` (``step``); ``place(data)`` puts
        its inputs where the program reads them first (a rollout sharded over the devices);
        ``frees_donated``: ``free_donated`` after every call."""
        compiled = self.step(fn, shared)

        def hook(state, data, key):
            if place is not None:
                data = place(data)
            old = drop_actors(state)
            new, outputs, metrics = compiled(old, data, key)
            if frees_donated:
                free_donated(old, new)
            return restore_actors(state, new), outputs, metrics

        return Hook(hook, counts=dict(counts or {}), reads=tuple(reads), writes=tuple(writes))

    def replay_iterations_hook(self, actor, fn: Callable, iterations: int,
                               counts: Mapping[str, int], collects: int = 1, updates: int = 1,
                               params_of: Callable = lambda state: state.learner) -> Hook:
        """With a JAX env: the hook of ``iterations`` rounds, each ``collects`` rollouts of
        ``actor`` into the state's replay then ``updates`` calls of the per-seed update
        ``fn(state, data, key)`` (vmapped over seeds, the pool's actor states left out of it),
        as one compiled program donating the state (``acting.Actor.replay_iterations``)."""
        update_seeds = self.vmap(fn)

        def update(state, key):
            def once(learning, k):
                learned, _, metrics = update_seeds(learning, {}, k)
                return learned, metrics

            learned, metrics = jax.lax.scan(once, drop_actors(state),
                                            acting.step_keys(key, updates))
            return restore_actors(state, learned), jax.tree.map(lambda x: x.mean(0), metrics)

        iterate = actor.replay_iterations(update, iterations, collects, params_of)

        def hook(state, data, key):
            del data
            state, metrics = iterate(state, key)
            return state, {}, first_seed_media(metrics) if self.num_seeds > 1 else metrics

        return Hook(backend.jit(hook, donate_argnums=0), counts=dict(counts))
