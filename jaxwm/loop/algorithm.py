"""The contract between the loop and an algorithm (docs/architecture.md, "The loop contract").

An algorithm is a frozen bundle of functions. The loop knows nothing else about it:

* ``init(key) -> state``: the whole training state (parameters, optimiser, replay, per-env
  actor state, the algorithm's own counters), one pytree.
* ``hooks[name] = Hook(fn, counts, reads, writes)``, with names the algorithm chooses.
  ``fn(state, data, key) -> (state, outputs, metrics)`` is normally a jitted pure function
  that donates ``state``. ``counts`` says what one call advances in named counters
  (``{"env_steps": 512}``, ``{"model_updates": 100}``), static so that the scheduler needs
  no host sync; phases and clocks may be measured in any declared counter. ``reads`` names
  the inputs ``data`` holds: outputs written by an earlier hook of the same cycle (PPO's
  ``rollout``, mbrs's ``elites``) or read-only data (below). ``writes`` names the
  ``outputs`` it returns. Passed data lives for one cycle and is never checkpointed.
* ``data``: read-only inputs (demonstrations, a dataset's derived splits), loaded once and
  put on device by the algorithm (``parallel.put_readonly`` shards the large ones), handed to
  the hooks that read them as arguments, so they are neither checkpointed nor baked into a
  compiled program as constants.
* ``artifacts``: phase artifacts (``loop.artifacts``), data one phase writes and later ones
  read, or that a run imports when it starts (MOPO's dataset), kept in the run directory and
  never checkpointed; a hook writes one by returning rows under its name and reads one like
  any input (every row, or a streamed batch per call).
* ``phase_hooks``: hooks derived from the config for phases whose ``hooks`` the config
  leaves empty (DreamerV3's ``collect:M, update_model:K`` from its train ratio); the config
  itself is never rewritten.
* ``predicates[name](state) -> bool``: conditions a phase may end on early
  (``until=name``: ensemble early stopping, a density model's patience); read on the host
  once per cycle of such a phase.
* ``policy`` and ``policy_params(state)``: what the evaluator acts with in a separate env
  pool, the ``jaxwm.envs.acting.Policy`` that training collection uses too, and its
  parameters in a state (by default ``state.learner``). It is one seed's policy: with
  ``config.num_seeds`` N > 1 the state holds N independent agents (``loop.seeds``) and the
  evaluator groups the policy (``acting.grouped``). ``score_reference``
  (min, max) returns, where known, make the evaluator report D4RL's normalised score.
* ``world_model`` and ``world_model_params(state)``: for a model-based algorithm, its learned
  model (``models.protocol.WorldModel``) and that model's parameters in a state, so that a
  trained run can imagine (``jaxwm.load(...).world_model.imagine``); ``None`` for model-free
  algorithms.
* ``persistent(state)``: the part of the state a checkpoint holds. The default drops every
  ``acting.ActorState`` in it (per-env observations, policy carries, episode statistics)
  whose envs live outside the state: envpool's C++ env state cannot be saved, so those envs
  restart their episodes on resume. A JAX env's ``ActorState`` holds the env state itself
  (``ActorState.saveable``) and is kept, so its episodes continue.
* ``on_restore(fresh, saved) -> state``: the state to continue from, given a freshly
  initialised one (its envs just reset) and the restored ``persistent`` part; the default puts
  ``fresh``'s actor states where ``saved`` has none. Everything saved continues exactly.

Hook names are free. RL Lab's conventional ones, used by the configs in this repository, are
``collect``, ``update_model``, ``update_agent`` and ``imagine``; ``evaluate`` is reserved for
the loop's evaluator and ``iterations`` (cycles through a phase's hooks) is a unit every phase
has. Conventional counter names: ``env_steps`` (real environment steps; SPS and the default
x-axis), ``model_updates``, ``agent_updates``.

The one impurity allowed: envpool's XLA handle, an opaque pointer to C++ env state, lives in
its ``acting.Actor`` on the host, outside the state (see docs/architecture.md); a JAX env's
state is an ordinary part of the state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax

from jaxwm.envs.acting import ActorState, Policy
from jaxwm.loop.artifacts import Artifact

CONVENTIONAL_HOOKS = ("collect", "update_model", "update_agent", "imagine")
EVALUATE = "evaluate"  # served by the loop's evaluator
ITERATIONS = "iterations"  # the unit every phase has: cycles through its hooks

HookFn = Callable[[Any, Mapping[str, Any], jax.Array],
                  tuple[Any, Mapping[str, Any], Mapping[str, Any]]]


def _check_name(name: str, what: str) -> None:
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"{what} {name!r} must be a Python identifier.")


@dataclasses.dataclass(frozen=True)
class Hook:
    """One step of an algorithm: ``fn(state, data, key) -> (state, outputs, metrics)``."""

    fn: HookFn
    counts: Mapping[str, int] = dataclasses.field(default_factory=dict)
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()

    def __post_init__(self):
        for counter, amount in self.counts.items():
            _check_name(counter, "Counter")
            if counter == ITERATIONS:
                raise ValueError(f"'{ITERATIONS}' is the loop's own unit; a hook cannot count it.")
            if int(amount) != amount or amount < 0:
                raise ValueError(f"Hook counts must be integers >= 0, got {counter}={amount!r}.")
        for name in self.reads + self.writes:
            _check_name(name, "Hook input/output")


def _is_actor(x) -> bool:
    return isinstance(x, ActorState)


def drop_actors(state):
    """``state`` without its ``ActorState``s (``None`` in their place): the per-seed part
    of a state that a hook's program sees (``loop.compile``)."""
    return jax.tree.map(lambda x: None if _is_actor(x) else x, state, is_leaf=_is_actor)


def drop_unsaveable_actors(state):
    """``state`` without the ``ActorState``s whose envs live outside it (envpool's, a host
    env's: ``ActorState.saveable`` is False): what a checkpoint holds by default. A JAX env's
    ``ActorState`` stays, so a resume continues its episodes."""
    return jax.tree.map(lambda x: None if _is_actor(x) and not x.saveable else x, state,
                        is_leaf=_is_actor)


def restore_actors(fresh, saved):
    """``saved`` (a ``drop_actors`` or ``drop_unsaveable_actors`` tree) with ``fresh``'s
    ``ActorState``s put where it has none."""
    return jax.tree.map(lambda f, s: s if _is_actor(s) else f if _is_actor(f) else s, fresh,
                        saved, is_leaf=lambda x: _is_actor(x) or x is None)


@dataclasses.dataclass(frozen=True)
class Algorithm:
    name: str
    init: Callable[[jax.Array], Any]
    hooks: Mapping[str, Hook]
    policy: Policy | None = None
    policy_params: Callable[[Any], Any] = lambda state: state.learner
    score_reference: tuple[float, float] | None = None
    world_model: Any = None  # a models.protocol.WorldModel
    world_model_params: Callable[[Any], Any] = lambda state: None
    data: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    artifacts: Mapping[str, Artifact] = dataclasses.field(default_factory=dict)
    predicates: Mapping[str, Callable[[Any], Any]] = dataclasses.field(default_factory=dict)
    phase_hooks: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    persistent: Callable[[Any], Any] = drop_unsaveable_actors
    on_restore: Callable[[Any, Any], Any] = restore_actors
    close: Callable[[], None] = lambda: None

    def __post_init__(self):
        for name in self.hooks:
            _check_name(name, "Hook name")
        if EVALUATE in self.hooks:
            raise ValueError(f"'{EVALUATE}' is the loop's evaluator; name the hook otherwise.")
        clash = set(self.data) & set(self.artifacts)
        if clash:
            raise ValueError(f"{sorted(clash)} are both read-only data and phase artifacts.")
        for name, hook in self.hooks.items():
            shadowed = set(hook.writes) & set(self.data)
            if shadowed:
                raise ValueError(f"Hook {name!r} writes {sorted(shadowed)}, which are read-only "
                                 "data of the algorithm.")

    @property
    def counters(self) -> tuple[str, ...]:
        """Every counter some hook advances: env_steps first, then by name."""
        names = {c for hook in self.hooks.values() for c in hook.counts}
        return tuple(sorted(names, key=lambda name: (name != "env_steps", name)))
