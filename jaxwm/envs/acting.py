"""The acting layer: one policy interface and one env-stepping scan for every algorithm.

In the spirit of brax's ``acting.py`` (one ``generate_unroll`` shared by PPO and SAC) and
dreamerv3's driver (one loop steps the envs with the agent's carry-passing policy):

* **Policy.** ``act(params, carry, obs, is_first, key, temperature=1.0) -> (carry, action,
  extras)`` and ``init_carry(params, num_envs) -> carry`` are the only way anything in jaxwm
  acts, in training collection and in evaluation alike. ``carry`` is whatever the policy
  keeps between steps (a recurrent state, an RSSM posterior and the last action, a planner's
  warm start, running observation statistics); ``is_first`` marks where an episode starts, so
  the policy resets it there. ``extras`` is what a learner keeps from acting besides the
  action (PPO: the log-probability and value), ``{}`` for most. Departure from the plain
  ``(carry, action)`` form: without ``extras`` PPO would run its network twice per step.
  ``temperature`` (0: the mode, 1: the policy as trained) matters only to evaluation.
  Random warm-up is a policy (``uniform``, switched in by ``warmup``), and so is a pool split
  into groups that act with different parameters (``grouped``: several seeds, CMA-ES
  candidates).
* **Env.** ``EnvStep`` is how the scan talks to an environment: ``recv`` hands it the rows
  to act on next, ``send`` their actions. ``sync(step)`` wraps any ``step(env_state, action)
  -> (env_state, StepResult)``: envpool's XLA step (``envpool``), a host env's io_callback step
  (Crafter, dm_control pixels: the same interface), or a learned model (MOPO's dynamics
  ensemble, SimPLe's simulator, a World Models dream: a pure function of its own state).
  ``envpool(env)`` of an asynchronous pool is envpool's recv/send instead, where each step's
  rows are the ``batch_size`` envs that finished first, with their ids.
* **The scan.** ``rollout`` is the one ``lax.scan`` over env steps in the library: recv ->
  bookkeeping -> act -> send, ``num_steps`` times. It returns the final ``ActorState`` and a
  ``Steps`` record per step, time-major ``[T, B]``: the rows acted on (observation and what
  arrived with it: reward, flags, ``is_first``), the action and the extras. A transition's own
  reward and next observation arrive with the *next* row of its env (``successors`` for
  synchronous pools, ``stream_transitions`` for asynchronous ones).
* **ActorState** is everything that belongs to the live envs between two collects: the rows
  received but not yet acted on (synchronous pools), the policy carry, episode statistics,
  and for an env written in JAX (``envs.native``) the env state itself. envpool cannot save
  its C++ state, so such an ``ActorState`` is not checkpointed: ``loop.algorithm``'s default
  ``persistent``/``on_restore`` drop it and put a fresh one back (envs restart their
  episodes on resume); one that holds its env (``ActorState.saveable``) is checkpointed
  whole, and a resume continues its episodes.
* **Actor** owns what is not a pure function: the env pool (``make_pool(config)``), its XLA
  handle (an opaque pointer to C++ state, so kept out of the state pytree in this one
  host-side slot), the device the pool's programs run on (a process's own first device:
  envpool's custom call runs on the host, and a replicated program would step the envs once
  per device), and the jitted collect, donating the ``ActorState``, with the algorithm's
  post-processing (``finish``) compiled in. ``collect_into`` feeds a replay the state holds,
  after a warm-up of random actions (``replay_hook`` is that as a ``collect`` hook).

Auto-reset (envpool's, ``envs.types``): the row after an episode's final observation is the
first observation of the next episode (reward 0, flags False), and the action taken at the
final observation is ignored: such a transition is invalid (``Steps.valid``). The first rows
of a fresh pool are its reset observations; the statistics skip them (``EpisodeStats``
starts ``after_done``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxwm import backend, parallel
from jaxwm.envs.factory import make_env
from jaxwm.envs.stats import EpisodeStats, episode_metrics, merge_episode_metrics
from jaxwm.envs.types import EnvSpec, StepResult

# ----------------------------------------------------------------------------- policies


@dataclasses.dataclass(frozen=True)
class Policy:
    """``init_carry(params, num_envs) -> carry``; ``act(params, carry, obs [n, ...], is_first
    [n], key, temperature=1.0) -> (carry, action [n, ...], extras)`` (module docstring)."""

    init_carry: Callable[[Any, int], Any]
    act: Callable[..., tuple[Any, jax.Array, dict]]


def stateless(act: Callable[[Any, jax.Array, jax.Array, Any], jax.Array]) -> Policy:
    """A policy without memory from ``act(params, obs, key, temperature) -> action``."""
    def act_with_carry(params, carry, obs, is_first, key, temperature=1.0):
        del is_first
        return carry, act(params, obs, key, temperature), {}

    return Policy(init_carry=lambda params, n: (), act=act_with_carry)


def without_extras(policy: Policy) -> Policy:
    """``policy`` with its extras dropped: acting for data that no on-policy learner reads
    (SimPLe's real-env collection with PPO's policy, which ``warmup`` can then wrap)."""
    def act(params, carry, obs, is_first, key, temperature=1.0):
        carry, action, _ = policy.act(params, carry, obs, is_first, key, temperature)
        return carry, action, {}

    return Policy(init_carry=policy.init_carry, act=act)


def uniform_action(spec: EnvSpec, key: jax.Array, num_envs: int) -> jax.Array:
    """Uniform random actions: over the discrete actions, or over the env's box."""
    if spec.discrete:
        return jax.random.randint(key, (num_envs,), 0, spec.num_actions)
    low, high = jnp.asarray(spec.action_low), jnp.asarray(spec.action_high)
    return jax.random.uniform(key, (num_envs,) + tuple(spec.action_shape), minval=low,
                              maxval=high)


def uniform(spec: EnvSpec) -> Policy:
    """Acts uniformly at random (``params`` unused): D4RL's random level, warm-up."""
    return stateless(lambda params, obs, key, temperature: uniform_action(spec, key,
                                                                          obs.shape[0]))


def warmup(policy: Policy, spec: EnvSpec) -> Policy:
    """``policy`` or uniformly random actions in ``spec``'s space, switched by a device flag:
    params are ``(random, policy_params)`` with ``random`` a bool scalar, so the switch never
    recompiles.

    While random, the carry is left as it is: the policy takes over with the carry it would
    have started from (dreamerv3's driver resets to the agent's initial carry after its
    random prefill the same way). The key is split ``(random, policy)``; the policy's extras
    must be empty (a learner that keeps extras learns on-policy and has no warm-up).
    """

    def act(params, carry, obs, is_first, key, temperature=1.0):
        random, inner = params
        k_random, k_policy = jax.random.split(key)

        def by_policy():
            new_carry, action, extras = policy.act(inner, carry, obs, is_first, k_policy,
                                                   temperature)
            if extras:
                raise ValueError("warmup() wraps policies without extras.")
            return new_carry, action

        def at_random():
            action = uniform_action(spec, k_random, obs.shape[0])
            return carry, action.astype(action_type.dtype)

        action_type = jax.eval_shape(by_policy)[1]
        new_carry, action = jax.lax.cond(random, at_random, by_policy)
        return new_carry, action, {}

    return Policy(init_carry=lambda params, n: policy.init_carry(params[1], n), act=act)


def grouped(policy: Policy, groups: int, params_axes: Any = 0) -> Policy:
    """``policy`` acting in one pool split into ``groups`` equal, contiguous groups of envs,
    each with its own parameters, carry and key: ``params``, ``carry`` and ``key`` get a
    leading group axis, observations, ``is_first``, actions and extras stay pool-wide
    ``[groups * n]`` (group-major, the pool's order). ``groups == 1`` is ``policy`` itself.
    ``params_axes``, a ``vmap`` ``in_axes`` prefix of ``params``, marks parameters the groups
    share with ``None`` (World Models: one VAE and MDN-RNN, a controller per candidate).

    Used for several seeds in one process (``--config.num_seeds``: group k acts exactly as a
    one-seed run with the same parameters and key would) and for evaluating a population
    (CMA-ES candidates)."""
    if groups == 1:
        return policy

    def init_carry(params, num_envs):
        if num_envs % groups:
            raise ValueError(f"{num_envs} envs do not split into {groups} equal groups.")
        return jax.vmap(lambda p: policy.init_carry(p, num_envs // groups),
                        in_axes=(params_axes,), axis_size=groups)(params)

    def act(params, carry, obs, is_first, key, temperature=1.0):
        carry, action, extras = jax.vmap(
            lambda p, c, o, f, k: policy.act(p, c, o, f, k, temperature),
            in_axes=(params_axes, 0, 0, 0, 0))(
            params, carry, split_groups(obs, groups), split_groups(is_first, groups), key)
        return carry, merge_groups(action), merge_groups(extras)

    return Policy(init_carry=init_carry, act=act)


def split_groups(tree, groups: int):
    """Leaves ``[groups * n, ...]`` (the pool's order) -> ``[groups, n, ...]``. Sizes are
    spelled out, not ``-1``: a zero-size leaf (MJX's ``Data`` has some) has no inferable one."""
    return jax.tree.map(lambda x: x.reshape((groups, x.shape[0] // groups) + x.shape[1:]), tree)


def merge_groups(tree):
    """Leaves ``[groups, n, ...]`` -> ``[groups * n, ...]``."""
    return jax.tree.map(lambda x: x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:]), tree)


# ----------------------------------------------------------------------------- envs


@dataclasses.dataclass(frozen=True)
class EnvStep:
    """How ``rollout`` talks to an environment (module docstring).

    * ``start() -> (env_state, pending)``, on the host: a fresh pool and its first rows
      (``None`` where ``recv`` fetches them);
    * ``recv(env_state, pending) -> (env_state, ids, StepResult)``: the rows to act on next;
      ``ids`` are the envs they belong to, ``None`` for all envs in order;
    * ``send(env_state, ids, action) -> (env_state, pending)``: their actions.

    ``spec``: the env's ``EnvSpec`` (``num_envs`` at least), where an ``Actor`` steps it.
    ``in_state``: the env state is a pytree of its own (a JAX env, ``envs.native``) that the
    ``Actor`` keeps in the ``ActorState`` (``ActorState.env``), so it is checkpointed and
    vmapped like any training state, rather than a handle to state outside the program.
    """

    start: Callable[[], tuple[Any, StepResult | None]] | None
    recv: Callable[[Any, StepResult | None], tuple[Any, jax.Array | None, StepResult]]
    send: Callable[[Any, jax.Array | None, jax.Array], tuple[Any, StepResult | None]]
    is_async: bool = False
    spec: Any = None
    in_state: bool = False


def sync(step: Callable[[Any, jax.Array], tuple[Any, StepResult]],
         start: Callable[[], tuple[Any, StepResult]] | None = None, spec=None,
         in_state: bool = False) -> EnvStep:
    """Every env steps at once: ``step(env_state, action) -> (env_state, StepResult)``, the
    result received by the next ``recv``. ``start() -> (env_state, first StepResult)``, where
    an ``Actor`` starts it; ``None`` for an env a program starts itself (a learned model
    rolled out from start states inside a jitted update, as MOPO's ``branch_rollout``)."""
    return EnvStep(start=start, recv=lambda env_state, pending: (env_state, None, pending),
                   send=lambda env_state, ids, action: step(env_state, action), spec=spec,
                   in_state=in_state)


def envpool(env) -> EnvStep:
    """An ``EnvPoolEnv`` (or ``HostEnv``, or JAX ``NativeEnv``) pool: its XLA step and reset,
    synchronous or, for a pool built with ``batch_size`` < ``num_envs``, asynchronous."""
    if not getattr(env, "is_async", False):
        return sync(env.xla_step, env.xla_reset, env.spec,
                    in_state=getattr(env, "in_state", False))

    def recv(handle, pending):
        del pending
        return env.xla_recv(handle)

    return EnvStep(start=lambda: (env.xla_async_reset(), None), recv=recv,
                   send=lambda handle, ids, action: (env.xla_send(handle, action, ids), None),
                   is_async=True, spec=env.spec)


# ----------------------------------------------------------------------------- the scan


@struct.dataclass
class ActorState:
    """The live envs between collects: ``pending``, the rows received and not yet acted on
    (synchronous pools; ``None`` otherwise), the policy's ``carry``, per-env ``stats``
    (whose ``after_done`` is each env's "the next observation starts an episode") and, for
    JAX envs (``EnvStep.in_state``), the ``env`` state itself (``None`` otherwise).

    With the env in it, an ``ActorState`` is the whole of the live envs and is checkpointed
    (``saveable``): a resume continues the same episodes. Without it the envs' state is
    outside (envpool's C++, a host env's Python), so a checkpoint drops it and a resume
    restarts the envs."""

    pending: StepResult | None
    carry: Any
    stats: EpisodeStats
    env: Any = None

    @classmethod
    def start(cls, pending: StepResult | None, carry: Any, num_envs: int,
              env: Any = None) -> ActorState:
        return cls(pending, carry, EpisodeStats.create(num_envs, awaiting_reset=True), env)

    @property
    def saveable(self) -> bool:
        """Whether this is the whole state of its envs (a JAX env's), so a checkpoint keeps
        it."""
        return self.env is not None


@struct.dataclass
class Steps:
    """What ``rollout`` records, time-major ``[T, B, ...]``: the rows acted on (``obs`` and
    what arrived with it: the ``reward`` and flags of the env's previous action, ``is_first``),
    then ``action`` and the policy's ``extras``. ``ids``: the envs of each row (asynchronous
    pools), ``None`` when every row is its env."""

    obs: jax.Array
    is_first: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    action: jax.Array
    extras: Any
    ids: jax.Array | None

    @property
    def done(self) -> jax.Array:
        """The row's observation is an episode's last: its action is ignored (reset step)."""
        return self.terminated | self.truncated

    @property
    def valid(self) -> jax.Array:
        """The row's action was executed: not envpool's reset transition."""
        return ~self.done


def _take(tree, ids):
    return jax.tree.map(lambda x: x[ids], tree)


def _put(tree, ids, rows):
    return jax.tree.map(lambda every, these: every.at[ids].set(these), tree, rows)


def step_keys(key: jax.Array, num_steps: int) -> jax.Array:
    """``num_steps`` keys, one per step: ``split(key, num_steps)``, per group where ``key``
    has a group axis (``[T, groups, 2]``), as each group's own run would split it."""
    typed = jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)  # jax.random.key's
    if key.ndim == (0 if typed else 1):
        return jax.random.split(key, num_steps)
    return jnp.swapaxes(jax.vmap(lambda k: jax.random.split(k, num_steps))(key), 0, 1)


def rollout(policy: Policy, env: EnvStep, params, actor: ActorState, env_state, key,
            num_steps: int, temperature=1.0):
    """``num_steps`` steps of ``env`` under ``policy``, as one ``lax.scan``. Returns
    ``(actor, env_state, steps, completed)``: the final ``ActorState``, the ``Steps`` record
    ``[T, B]`` and ``EpisodeStats.update``'s record of the episodes each row finished
    ``[T, B]`` (for ``episode_metrics``)."""

    def step(carry, step_key):
        actor, env_state = carry
        env_state, ids, rows = env.recv(env_state, actor.pending)
        stats = actor.stats if ids is None else _take(actor.stats, ids)
        is_first = stats.after_done
        stats, completed = stats.update(rows)
        if ids is not None:
            stats = _put(actor.stats, ids, stats)
        policy_carry, action, extras = policy.act(params, actor.carry, rows.obs, is_first,
                                                  step_key, temperature)
        env_state, pending = env.send(env_state, ids, action)
        record = Steps(obs=rows.obs, is_first=is_first, reward=rows.reward,
                       terminated=rows.terminated, truncated=rows.truncated, action=action,
                       extras=extras, ids=ids)
        return (ActorState(pending, policy_carry, stats), env_state), (record, completed)

    (actor, env_state), (steps, completed) = jax.lax.scan(
        step, (actor, env_state), step_keys(key, num_steps))
    return actor, env_state, steps, completed


def successors(steps: Steps, final: ActorState) -> dict[str, jax.Array]:
    """Synchronous pools: what each step's action led to, ``[T, B]``: the next row's
    ``obs``, ``reward``, ``terminated``, ``truncated`` and ``is_first``, the last step's from
    the rows ``final`` holds."""
    last = final.pending
    nxt = {"obs": last.obs, "reward": last.reward, "terminated": last.terminated,
           "truncated": last.truncated, "is_first": final.stats.after_done}
    return {name: jnp.concatenate([getattr(steps, name)[1:], value[None]])
            for name, value in nxt.items()}


def transitions(steps: Steps, final: ActorState) -> tuple[dict[str, jax.Array], jax.Array]:
    """Synchronous pools: off-policy transitions ``{obs, action, reward, next_obs,
    terminated}`` flattened to ``[T * B]`` (time-major), and ``valid``, False for envpool's
    reset transitions, which a replay or dataset must skip. A truncated step is valid and not
    terminated, so learners bootstrap it."""
    nxt = successors(steps, final)
    batch = {"obs": steps.obs, "action": steps.action, "reward": nxt["reward"],
             "next_obs": nxt["obs"], "terminated": nxt["terminated"]}
    flat = lambda x: x.reshape((-1,) + x.shape[2:])  # noqa: E731
    return jax.tree.map(flat, batch), flat(steps.valid)


def stream_transitions(records: dict[str, jax.Array], ids: jax.Array, done: jax.Array,
                       reward: jax.Array, terminated: jax.Array, truncated: jax.Array,
                       carried: tuple[str, ...]):
    """An asynchronous pool's stream ``[T, B]`` -> per-env transitions ``[B, T]`` in each
    env's time order, for on-policy learners.

    The rows are sorted by env id (stable, so each env's stay in time order); a row's
    transition takes its ``reward`` and flags from the env's next row, and ``next_<name>`` of
    every name in ``carried`` (e.g. a value) too. It is valid when that row is in the stream and
    the row was not an episode's last observation (the reset transition). ``truncated`` is
    also set where the env's stream ends or the next row has no successor, and at the end of
    each of the ``B`` rows of ``T`` the sorted stream is cut into, so that a return
    recursion is cut (and bootstrapped) there. Returns ``(transitions, valid)``."""
    steps, rows = ids.shape
    flat = lambda x: x.reshape((steps * rows,) + x.shape[2:])  # noqa: E731
    order = jnp.argsort(flat(ids), stable=True)
    sort = lambda x: flat(x)[order]  # noqa: E731
    env = sort(ids)

    def following(x, fill):  # the next sorted row's x; ``fill`` after the last
        return jnp.concatenate([x[1:], jnp.full((1,) + x.shape[1:], fill, x.dtype)])

    has_result = following(env, -1) == env
    cut = ~has_result | ~following(has_result, False)
    out = {name: sort(x) for name, x in records.items()}
    out.update(
        reward=jnp.where(has_result, following(sort(reward), 0), 0.0),
        terminated=has_result & following(sort(terminated), False),
        truncated=(has_result & following(sort(truncated), False)) | cut)
    for name in carried:
        out[f"next_{name}"] = jnp.where(has_result, following(out[name], 0), 0.0)
    valid = has_result & ~sort(done)
    back = lambda x: x.reshape((rows, steps) + x.shape[1:])  # noqa: E731
    return jax.tree.map(back, out), back(valid)


def episode_metrics_by_group(completed, groups: int):
    """``episode_metrics`` of each group (``[groups]`` per metric); of the pool for 1."""
    if groups == 1:
        return episode_metrics(completed)
    per_group = jax.tree.map(lambda x: jnp.moveaxis(split_groups(jnp.moveaxis(x, -1, 0),
                                                                 groups), 0, -1), completed)
    return jax.vmap(episode_metrics)(jax.tree.map(lambda x: jnp.moveaxis(x, -2, 0), per_group))


# ----------------------------------------------------------------------------- the actor


def make_pool(config):
    """The training env pool a config asks for: this process's share of ``env.num_envs``
    (several processes each step their own, seeded so that together they are the
    one-process pool: envpool seeds env i with seed + i), for each of ``num_seeds`` seeds in
    turn (the groups of ``grouped``), synchronous or asynchronous (``env.batch_size``)."""
    processes, process = jax.process_count(), jax.process_index()
    num_envs = config.env.num_envs // processes
    return make_env(config.env, num_envs=config.num_seeds * num_envs,
                    seed=config.seed + process * num_envs, batch_size=config.env.batch_size,
                    num_threads=config.env.num_threads)



def gather_processes(rows, metrics, join: Callable):
    """Every process's ``rows`` and episode ``metrics`` of a collect as one process stepping
    all their envs would have them: gathered (``parallel.allgather``, leaves ``[processes,
    ...]``), the rows laid out by ``join`` (e.g. ``replay.join_processes``), the episodes
    merged; both as they are with one process."""
    if jax.process_count() == 1:
        return rows, metrics
    rows, metrics = parallel.allgather((rows, metrics))
    return join(rows), merge_episode_metrics(metrics)


def process_key(key):
    """``key`` for this process's envs: independent action noise in each process of a
    multi-process run (every process is given the loop's one key); ``key`` itself in one."""
    return jax.random.fold_in(key, jax.process_index()) if jax.process_count() > 1 else key


def _by_group(groups: int, start: ActorState, steps: Steps, final: ActorState, completed):
    """The rollout of a grouped pool as ``groups`` rollouts: every pool-wide leaf split into a
    leading group axis (``steps`` and ``completed`` ``[T, groups * n]`` -> ``[groups, T, n]``);
    carries have it already."""
    def actor(state):
        return state.replace(pending=split_groups(state.pending, groups),
                             stats=split_groups(state.stats, groups))

    def time_major(tree):
        return jax.tree.map(lambda x: jnp.swapaxes(
            x.reshape((x.shape[0], groups, -1) + x.shape[2:]), 0, 1), tree)

    return actor(start), time_major(steps), actor(final), time_major(completed)


def _keep_all(params, start, steps, final, completed):
    return final.carry, (steps, completed)


class Actor:
    """An env pool (or any ``EnvStep`` with a ``spec``) acting under a policy:
    ``init(params)`` starts the pool and returns its ``ActorState``; ``collect(params, actor,
    key)`` runs ``rollout`` in one jitted call (donating ``actor``) on the pool's device and
    returns ``(actor, outputs)``.

    ``finish(params, start, steps, final, completed) -> (carry, outputs)`` is the
    algorithm's post-processing of a rollout (by default the ``steps`` and ``completed``
    records themselves), compiled into the same program; it may update the policy carry (PPO
    keeps its reward-normalisation state there). With ``groups`` > 1 the policy is
    ``grouped`` and ``finish`` is written for one group and vmapped over them: every argument
    has a leading group axis (``steps`` ``[groups, T, n]``).

    ``collect_function(params, actor, handle, key) -> (handle, (actor, outputs))`` is that
    rollout and ``finish`` as a pure function, for an algorithm that compiles them into a
    larger program (PPO's ``iterate`` on a JAX env, whose state travels in ``actor``, the
    handle ``None``).

    ``background=True`` overlaps collection with learning (Sebulba-style; Hessel et al. 2021,
    "Podracer architectures"): ``collect`` returns ``(params the rollout was collected with,
    (actor, outputs))`` of the rollout a second thread collected during the previous learner
    step; ``start_next`` starts the next one at once with the params passed (copied: the
    learner step donates them). The lag is one update; the first collect after a start runs
    in the foreground.
    """

    def __init__(self, env, policy: Policy, num_steps: int, *, mesh=None, groups: int = 1,
                 finish: Callable | None = None, background: bool = False,
                 warmup_transitions: int = 0):
        self.env = env
        self.env_step = env if isinstance(env, EnvStep) else envpool(env)
        if groups > 1 and self.env_step.is_async:
            raise ValueError("An asynchronous pool's rows are whichever envs are ready; it "
                             "cannot be split into groups.")
        self.spec = self.env_step.spec
        self.warmup_transitions = warmup_transitions
        if warmup_transitions:
            policy = warmup(policy, self.spec)
        self.policy = grouped(policy, groups)
        self.groups = groups
        self.num_steps = num_steps
        self.mesh = mesh
        # A JAX env is no host custom call: its state is replicated over the mesh like the
        # parameters, so one program holds the env, the policy and any update.
        self.device = parallel.local_device(mesh) if mesh is not None and mesh.size > 1 \
            and not self.env_step.in_state else None
        self._handle = None
        finish = finish or _keep_all
        if groups > 1:
            finish = jax.vmap(finish)

        in_state = self.env_step.in_state

        def collect(params, actor, handle, key):
            if in_state:  # a JAX env's state travels in the ActorState
                handle, actor = actor.env, actor.replace(env=None)
            final, handle, steps, completed = rollout(self.policy, self.env_step, params,
                                                      actor, handle, key, num_steps)
            views = (actor, steps, final, completed) if groups == 1 else \
                _by_group(groups, actor, steps, final, completed)
            carry, out = finish(params, *views)
            final = final.replace(carry=carry)
            if in_state:
                final, handle = final.replace(env=handle), None
            return handle, (final, out)

        self.collect_function = collect

        self._collect = backend.jit(collect, donate_argnums=1)
        # The background program keeps its input ActorState: the state still refers to it.
        self._background = _Background(backend.jit(collect)) if background else None

        def add(replay, rows):
            add_one = lambda replay, rows: replay.add(*rows)  # noqa: E731
            replay = (jax.vmap(add_one) if groups > 1 else add_one)(replay, rows)
            # Buffers of their own (float), not the replay's counters, which are donated.
            return replay, replay.transitions.astype(jnp.float32)

        self._add_function = add
        self._add = backend.jit(add, donate_argnums=0)

    @property
    def num_envs(self) -> int:
        return self.spec.num_envs

    def init(self, params) -> ActorState:
        """Starts (or restarts) the pool: every env reset, a fresh carry from ``params``."""
        if self._background is not None:
            self._background.drop()
        if self.warmup_transitions:  # the warm-up flag, per group
            params = (jnp.zeros((self.groups,) if self.groups > 1 else (), bool), params)
        self._handle, pending = self.env_step.start()
        env = None
        if self.env_step.in_state:
            self._handle, env = None, self._handle
        actor = ActorState.start(pending, self.policy.init_carry(self.local(params),
                                                                 self.num_envs), self.num_envs,
                                 env)
        # Buffers of its own: collection donates the actor state, and an env's first rows or
        # a carry may share a buffer (one zeros array for two flags, say).
        actor = jax.tree.map(jnp.copy, actor)
        if self.env_step.in_state and self.mesh is not None and self.mesh.size > 1:
            return parallel.replicate(actor, self.mesh)
        # One device: left uncommitted, like everything else, so every jitted hook sees the
        # same placement on every call and compiles once.
        return jax.device_put(actor, self.device) if self.device is not None else actor

    def local(self, tree):
        """``tree``'s replica on the pool's device (no copy), e.g. replicated parameters."""
        return parallel.local_replica(tree, self.device) if self.device is not None else tree

    def collect(self, params, actor: ActorState, key):
        """``(actor, outputs)`` after ``num_steps`` steps from ``actor`` (donated); with
        ``background``, ``(params used, (actor, outputs))``."""
        params, key = self.local(params), process_key(key)
        if self._background is None:
            self._handle, out = self._collect(params, actor, self._handle, key)
            return out
        used, (self._handle, out) = self._background.result(self._collect, params, actor,
                                                            self._handle, key)
        return used, out

    def collect_into(self, replay, params, actor: ActorState, key):
        """``collect``, then ``replay.add(*rows)`` for the ``(rows, metrics)`` that ``finish``
        returns: off-policy collection into a replay the state holds (one per group, and
        replicated over the mesh), donated, so it is written in place. With
        ``warmup_transitions`` N the actions are uniformly random until the replay has been
        given N transitions (``warmup``; ``params`` are then ``(flag, params)``). Returns
        ``(actor, replay, metrics)``, with ``replay/size`` (transitions held) and
        ``charts/random_actions`` among the metrics. Several processes: each collects from its
        own envs, and the rows of all are gathered and joined (``replay.join_processes``)
        into the replay every process holds whole, with the episode metrics merged, so the
        replay and the updates are those of one process stepping every env."""
        random = replay.added < self.warmup_transitions  # a device bool: no host sync
        if self.warmup_transitions:
            params = (random, params)
        actor, (rows, metrics) = self.collect(params, actor, key)
        rows, metrics = gather_processes(
            rows, metrics, lambda rows: replay.join_processes(rows, self.num_steps))
        if self.mesh is not None:
            rows = parallel.replicate(rows, self.mesh)
        replay, size = self._add(replay, rows)
        return actor, replay, {**metrics, "replay/size": size,
                               "charts/random_actions": random.astype(jnp.float32)}

    def replay_hook(self, params_of: Callable = lambda state: state.learner):
        """The ``collect`` hook of an off-policy algorithm whose state holds ``replay`` and
        ``actor``: ``collect_into`` with the policy parameters ``params_of(state)``."""

        def collect(state, data, key):
            del data
            actor, replay, metrics = self.collect_into(state.replay, params_of(state),
                                                       state.actor, key)
            return state.replace(actor=actor, replay=replay), {}, metrics

        return collect

    def replay_iterations(self, update: Callable, iterations: int, collects: int = 1,
                          params_of: Callable = lambda state: state.learner) -> Callable:
        """With a JAX env (``EnvStep.in_state``), off-policy collection and learning as one
        program: ``iterate(state, key) -> (state, metrics)`` runs ``iterations`` rounds, each
        ``collects`` of ``collect_into``'s rollouts into ``state.replay`` (policy
        ``params_of(state)``, the env in ``state.actor``) then ``update(state, key) ->
        (state, metrics)``, as one ``lax.scan`` (PPO's ``make_iterations`` for learners with
        a replay). Keys: ``key`` split into one per round (per group where it has a group
        axis), each into the collects' and the update's. Metrics: the episodes of every
        collect merged (``stats.merge_episode_metrics``), ``replay/size`` the last one's, the
        rest averaged."""
        if not self.env_step.in_state:
            raise ValueError("replay_iterations needs an env written in JAX, whose state "
                             "travels in the ActorState; a host-stepped pool acts per call.")

        def collect(state, key):
            random = state.replay.added < self.warmup_transitions
            params = (random, params_of(state)) if self.warmup_transitions else params_of(state)
            _, (actor, (rows, metrics)) = self.collect_function(params, state.actor, None, key)
            replay, size = self._add_function(state.replay, rows)
            return state.replace(actor=actor, replay=replay), {
                **metrics, "replay/size": size,
                "charts/random_actions": random.astype(jnp.float32)}

        def one(state, key):
            keys = step_keys(key, collects + 1)
            state, metrics = jax.lax.scan(collect, state, keys[:collects])
            state, update_metrics = update(state, keys[collects])
            return state, {**metrics, **jax.tree.map(
                lambda x: jnp.broadcast_to(x, (collects,) + x.shape), update_metrics)}

        def iterate(state, key):
            state, metrics = jax.lax.scan(one, state, step_keys(key, iterations))
            flat = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), metrics)
            return state, {**merge_episode_metrics(flat), "replay/size": flat["replay/size"][-1]}

        return iterate

    def start_next(self, params, actor: ActorState, key) -> None:
        """``background`` only: starts the next rollout from ``actor`` with ``params``."""
        self._background.start(self.local(params), actor, self._handle, process_key(key))

    def close(self) -> None:
        if self._background is not None:
            self._background.close()
        if hasattr(self.env, "close"):  # a pool (an EnvStep of pure functions has none)
            self.env.close()


class _Background:
    """One rollout collected on a second thread while the learner updates. JAX releases the
    GIL while a program runs, so both run at once."""

    def __init__(self, collect):
        self._collect = collect
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="jaxwm-collect")
        self._pending = None

    def result(self, foreground, params, actor, handle, key):
        if self._pending is None:
            return params, foreground(params, actor, handle, key)
        pending, self._pending = self._pending, None
        return pending.result()

    def start(self, params, actor, handle, key):
        snapshot = jax.tree.map(jnp.copy, params)
        self._pending = self._pool.submit(lambda: (snapshot, jax.block_until_ready(
            self._collect(snapshot, actor, handle, key))))

    def drop(self):
        if self._pending is not None:
            self._pending.result()
            self._pending = None

    def close(self):
        self.drop()
        self._pool.shutdown()


class NumberedResets:
    """A pool whose n-th start (``start(n)``: every env reset) gives the same episodes in
    any run, for a pool reset once per round (CMA-ES generations). envpool cannot reseed a
    pool and each reset continues every env's random stream, so start n is the pool's
    (n + 1)-th reset: a fresh pool (a resumed run's) first makes the resets an uninterrupted
    run made before it, so that a resume sees the same episodes."""

    def __init__(self, pool):
        self.pool = pool
        self.env = envpool(pool)
        self.resets = 0

    def start(self, n: int):
        """``(handle, first rows)`` of start ``n``."""
        while self.resets < n:
            self.pool.reset()
            self.resets += 1
        self.resets += 1
        return self.env.start()

    def close(self) -> None:
        self.pool.close()
