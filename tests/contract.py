"""The contract every algorithm keeps, as checks a test can run against any of them.

``tests/test_contract.py`` runs them for every entry of ``jaxwm.algos.REGISTRY`` on its tiny
config (and shows that they fail on a deliberately broken algorithm). Each check takes a
config and the algorithm's registry entry (``jaxwm.algos.Entry``), so a new algorithm is
checked by registering it:

* ``check_exact_resume``: stopped by a signal inside every phase (mid-cycle where nothing is
  passed between hooks) and resumed each time through the trainer and its checkpoints, a
  run ends exactly where one that never stopped ends, given that both restart their envs at
  the same calls (envpool cannot save them: docs/user_guide.md, "Resuming and recovery"; a
  JAX env's are saved and never restart);
* ``check_loads_and_acts``: the finished run loads (``jaxwm.load``) with the policy's
  parameters it ended with, acts on an observation (twice, carrying its carry), evaluates
  an episode, imagines with its world model where it has one, and leaves the run directory
  as it was;
* ``check_donation``: every hook updates the state in place: any array of 4 KiB or more it
  changes was donated to it, not copied;
* ``check_devices_agree``: 1 and 4 (fake CPU) devices give the same state after a few calls;
* ``check_seeds_are_runs``: ``num_seeds=2`` trains each seed exactly as a one-seed run with
  that seed (``loop.seeds``);
* ``check_bad_config``: a size of 0 anywhere, or a capability the algorithm lacks, is a
  one-line ``ConfigError`` before anything is built.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np
from jax.experimental import multihost_utils

import jaxwm.config
from jaxwm import algos, parallel, runner
from jaxwm.config import ConfigError
from jaxwm.data.replay import TransitionReplay
from jaxwm.envs.acting import ActorState, split_groups
from jaxwm.loop import seeds
from jaxwm.loop.algorithm import EVALUATE, drop_unsaveable_actors, restore_actors
from jaxwm.loop.artifacts import Artifacts
from jaxwm.loop.phases import Scheduler, phases_from_config
from jaxwm.loop.trainer import Trainer, hook_inputs, route_outputs
from jaxwm.tools import make_dataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DONATION_MIN_BYTES = 4096


def load(spec: str, **overrides):
    """A config file's variant, quiet, never evaluating, with ``overrides`` applied."""
    return jaxwm.config.load(spec, {
        "log.progress": False, "eval.every": "never", "eval.at_end": False, **overrides})


# ----------------------------------------------------------------------------- driving


@dataclasses.dataclass
class Drive:
    """Hook calls made as ``loop.trainer.Trainer`` makes them (its key splitting, its
    scheduler, its early phase ends, its routing of inputs and outputs, phase artifacts in a
    scratch directory), without checkpoints or logs: ``state`` and ``key`` after ``calls``."""

    algorithm: object
    scheduler: Scheduler
    state: object
    key: jax.Array
    flow: dict
    artifacts: Artifacts

    @classmethod
    def start(cls, config, algorithm) -> Drive:
        key = seeds.loop_key(config.seed, config.num_seeds, config.env.num_envs)
        key, init_key = seeds.split(key)
        state = algorithm.init(init_key)
        phases = phases_from_config(config, algorithm.phase_hooks)
        artifacts = Artifacts(tempfile.mkdtemp(prefix="jaxwm-drive-"), algorithm.artifacts)
        artifacts.start(None)
        return cls(algorithm, Scheduler(phases, algorithm), state, key, {}, artifacts)

    def call(self) -> str:
        phase, name = self.scheduler.next_call()
        self.key, hook_key = seeds.split(self.key)
        if name != EVALUATE:
            hook = self.algorithm.hooks[name]
            data = hook_inputs(self.algorithm, hook, self.flow, self.artifacts, hook_key)
            self.state, outputs, _ = hook.fn(self.state, data, hook_key)
            route_outputs(self.algorithm, name, outputs, self.flow, self.artifacts)
        if self.scheduler.record(name) and phase.until and \
                bool(self.algorithm.predicates[phase.until](self.state)):
            self.scheduler.end_phase_early(phase)
        live = self.scheduler.live_inputs()
        self.flow = {k: v for k, v in self.flow.items() if k in live}
        return name

    def run(self, calls: int | None = None) -> Drive:
        while not self.scheduler.finished and (calls is None or self.scheduler.calls < calls):
            self.call()
        return self

    def stops_in_every_phase(self) -> list[int]:
        """A call count in every phase after which nothing is passed between hooks (where
        the trainer stops on a signal) and the phase goes on, preferring one inside a cycle:
        the stops of ``check_exact_resume``."""
        probe = Scheduler(self.scheduler.phases, self.algorithm)
        passed = {out for hook in self.algorithm.hooks.values() for out in hook.writes} \
            - set(self.algorithm.artifacts)
        chosen = {}
        while not probe.finished:
            phase, name = probe.next_call()
            probe.record(name)
            if probe.finished or probe.live_inputs() & passed or \
                    probe.current.name != phase.name:
                continue
            inside = probe.cycle is not None
            if phase.name not in chosen or (inside and not chosen[phase.name][0]):
                chosen[phase.name] = (inside, probe.calls)
        assert chosen, "the tiny config is too short to stop and resume in"
        return sorted(calls for _, calls in chosen.values())

    def calls_left_use(self, hooks: set) -> bool:
        """Whether a call still to come is one of ``hooks``."""
        probe = Scheduler(self.scheduler.phases, self.algorithm)
        probe.load_state_dict(self.scheduler.state_dict())
        while not probe.finished:
            _, name = probe.next_call()
            if name in hooks:
                return True
            probe.record(name)
        return False

    def restarted(self, algorithm, config) -> Drive:
        """This drive's position, key, state and artifacts in another instance of the
        algorithm, with its fresh envs (what a resume has)."""
        fresh = Drive.start(config, algorithm)
        fresh.scheduler.load_state_dict(self.scheduler.state_dict())
        # Envs whose state is outside the training state restart; a JAX env's goes on.
        fresh.key, fresh.state = self.key, restore_actors(fresh.state,
                                                          drop_unsaveable_actors(self.state))
        for name, file in fresh.artifacts.files.items():
            if algorithm.artifacts[name].source is None and not algorithm.artifacts[name].view_of:
                file.truncate(0)
                file.append(self.artifacts.files[name].whole())
        return fresh


def build(entry, config):
    runner.validate(config)
    make_dataset.make_missing_inputs(config)
    return entry.build(config)


def interrupting(algorithm, at_call: int):
    """``algorithm`` with hooks that send this process SIGTERM during call ``at_call``."""
    count = {"calls": 0}

    def wrap(fn):
        def hooked(state, data, key):
            count["calls"] += 1
            if count["calls"] == at_call:
                os.kill(os.getpid(), signal.SIGTERM)
            return fn(state, data, key)
        return hooked

    hooks = {name: dataclasses.replace(hook, fn=wrap(hook.fn))
             for name, hook in algorithm.hooks.items()}
    return dataclasses.replace(algorithm, hooks=hooks)


def watching(algorithm, touched: set):
    """``algorithm`` with hooks that add their name to ``touched`` when a call changes an
    ``ActorState`` (collects in an env)."""
    def is_actor(x):
        return isinstance(x, ActorState)

    def actor_leaves(state):
        actors = [x for x in jax.tree.leaves(state, is_leaf=is_actor) if is_actor(x)]
        return {id(leaf) for leaf in jax.tree.leaves(actors)}

    def wrap(name, fn):
        def hooked(state, data, key):
            before = actor_leaves(state)
            out = fn(state, data, key)
            if actor_leaves(out[0]) != before:
                touched.add(name)
            return out
        return hooked

    hooks = {name: dataclasses.replace(hook, fn=wrap(name, hook.fn))
             for name, hook in algorithm.hooks.items()}
    return dataclasses.replace(algorithm, hooks=hooks)


def persistent(algorithm, state):
    return jax.device_get(algorithm.persistent(state))


def persistent_of(trainer: Trainer):
    """What a finished trainer's checkpoint would hold."""
    return persistent(trainer.algorithm, trainer.state)


def entry_of_config(config):
    """The registry entry (``jaxwm.algos.Entry``) of ``config.algo``."""
    return algos.get(config.algo)


def assert_trees_equal(a, b, what: str, rtol: float = 0.0, atol: float = 0.0) -> None:
    flat_a, tree_a = jax.tree_util.tree_flatten_with_path(a)
    flat_b, tree_b = jax.tree_util.tree_flatten_with_path(b)
    assert tree_a == tree_b, f"{what}: the state trees differ"
    for (path, x), (_, y) in zip(flat_a, flat_b, strict=True):
        if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64),
                                   rtol=rtol, atol=atol,
                                   err_msg=f"{what}: {jax.tree_util.keystr(path)}")


# ----------------------------------------------------------------------------- checks


def check_exact_resume(entry, config, workdir: str) -> None:
    """Stopped by a signal inside every phase and resumed each time, through the trainer and
    its checkpoints, a run ends exactly where one that never stopped ends. Envpool cannot save
    its envs, so a resume restarts them (docs/user_guide.md, "Resuming and recovery"): where
    calls to come still act in an env, the run that never stopped gets fresh envs at the same
    call (another instance of the algorithm, as a resume does); where none does, it goes on
    in the same instance, so that state an instance keeps outside the checkpoint (an env
    pool's position, say) must survive the resume too."""
    probe = entry.build(config)
    try:
        stops = Drive.start(config, probe).stops_in_every_phase()
    finally:
        probe.close()

    touched, done = set(), 0  # hooks that act in an env; calls made so far
    for i, stop in enumerate([*stops, None]):
        run_config = config.copy_and_resolve_references()
        run_config.resume = i > 0
        algorithm = entry.build(run_config)
        try:
            hooked = watching(algorithm, touched)
            if stop is not None:
                hooked = interrupting(hooked, stop - done)
            trainer = Trainer(run_config, hooked, workdir)
            assert trainer.run()["interrupted"] == (stop is not None), f"stop at {stop}"
            got = persistent(algorithm, trainer.state)
            final_state = trainer.state
        finally:
            algorithm.close()
        if stop is not None:
            assert trainer.scheduler.calls == stop
            done = stop

    drive = Drive.start(config, entry.build(config))
    try:
        for stop in stops:
            drive.run(stop)
            if drive.calls_left_use(touched):
                fresh = drive.restarted(entry.build(config), config)
                drive.algorithm.close()
                drive = fresh
        expected = persistent(drive.algorithm, drive.run().state)
    finally:
        drive.algorithm.close()
    assert_trees_equal(got, expected, f"{config.algo}: resumed at calls {stops} != never "
                                      "stopped")
    return final_state


def _tree_of_files(workdir: str) -> dict:
    """Every file of a run directory with its size and modification time."""
    out = {}
    for root, _, files in os.walk(workdir):
        for name in files:
            path = os.path.join(root, name)
            out[os.path.relpath(path, workdir)] = (os.path.getsize(path), os.path.getmtime(path))
    return out


def check_loads_and_acts(entry, config, workdir: str, final_state) -> None:
    """``jaxwm.load`` of a finished run: the policy parameters it ended with, actions of the
    env's shape (twice, the second from the first's carry), an evaluated episode, the world
    model's predictions where the algorithm has one, and nothing in the run changed."""
    import jaxwm
    from jaxwm.envs import probe_spec

    before = _tree_of_files(workdir)
    agent = jaxwm.load(workdir)
    algorithm = entry.build(config)
    try:
        expected = algorithm.policy_params(final_state)
        has_model = algorithm.world_model is not None
    finally:
        algorithm.close()
    assert_trees_equal(agent._params, expected, f"{config.algo}: loaded policy parameters")
    spec = probe_spec(config.env)
    obs = np.zeros((2, *spec.obs_shape), spec.obs_dtype)
    action, carry = agent.act(obs)
    action, carry = agent.act(obs, carry, greedy=False)
    assert action.shape == (2, *spec.action_shape), action.shape
    single, _ = agent.act(obs[0])
    assert single.shape == tuple(spec.action_shape)
    result = agent.evaluate(1)
    assert np.isfinite(result["eval/episodic_return"]), result
    assert (agent.world_model is not None) == has_model
    if has_model:
        horizon = 3
        actions = (np.zeros((2, horizon), np.int32) if spec.discrete else
                   np.zeros((2, horizon, *spec.action_shape), np.float32))
        imagined = agent.world_model.imagine(obs, actions)
        assert imagined["rewards"].shape == (2, horizon), imagined["rewards"].shape
        assert np.isfinite(imagined["rewards"]).all() and np.isfinite(imagined["continues"]).all()
        assert imagined["features"].shape[:2] == (2, horizon)
        if agent.world_model.model.decodes:
            assert imagined["frames"].shape[:2] == (2, horizon)
    assert _tree_of_files(workdir) == before, f"{config.algo}: loading changed the run"


def check_donation(entry, config) -> None:
    """Every hook donates what it changes (arrays of ``DONATION_MIN_BYTES`` or more)."""
    algorithm = entry.build(config)
    try:
        drive = Drive.start(config, algorithm)
        seen = set()
        while not drive.scheduler.finished and len(seen) < len(algorithm.hooks):
            _, name = drive.scheduler.next_call()
            before = jax.tree.leaves(drive.state)
            jax.block_until_ready(before)
            drive.call()
            after = {id(x) for x in jax.tree.leaves(drive.state)}
            copied = [x.shape for x in before if isinstance(x, jax.Array)
                      and x.nbytes >= DONATION_MIN_BYTES and not x.is_deleted()
                      and id(x) not in after]
            assert not copied, f"{config.algo} hook {name!r} copied arrays {copied} " \
                               "instead of updating them in place (donate them)"
            seen.add(name)
    finally:
        algorithm.close()


def check_seeds_are_runs(entry, config, calls: int, rtol: float, atol: float) -> None:
    """``num_seeds=2`` for ``calls`` hook calls == two one-seed runs."""
    both_config = config.copy_and_resolve_references()
    both_config.num_seeds = 2
    algorithm = build(entry, both_config)
    try:
        both = persistent(algorithm, Drive.start(both_config, algorithm).run(calls).state)
    finally:
        algorithm.close()
    for k, seed in enumerate(seeds.run_seeds(both_config)):
        one_config = config.copy_and_resolve_references()
        one_config.seed = seed
        algorithm = build(entry, one_config)
        try:
            alone = persistent(algorithm, Drive.start(one_config, algorithm).run(calls).state)
        finally:
            algorithm.close()
        assert_trees_equal(jax.tree.map(lambda x, k=k: x[k], by_seed(both, 2)), alone,
                           f"{config.algo}: seed {k} of 2 != its own run", rtol, atol)


def by_seed(state, num_seeds: int):
    """``state`` with a leading seed axis on every leaf: a pool's rows (an ``ActorState``'s
    rows, statistics and env state, ``[seeds * envs, ...]``, the acting layer's ``grouped``
    order) split into ``[seeds, envs, ...]``; everything else has it already."""
    def split(x):
        if not isinstance(x, ActorState):
            return x
        return x.replace(**{name: split_groups(getattr(x, name), num_seeds)
                            for name in ("pending", "stats", "env")})

    return jax.tree.map(split, state, is_leaf=lambda x: isinstance(x, ActorState))


DEVICES_SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
    import jax, numpy as np
    import contract
    from jaxwm import algos
    from jaxwm.envs.acting import ActorState
    assert jax.device_count() == 4, jax.devices()
    entry = algos.get({name!r})
    out = {{}}
    for n in (1, 4):
        config = contract.load({spec!r}, num_devices=n, **{overrides!r})
        algorithm = contract.build(entry, config)
        state = contract.Drive.start(config, algorithm).run({calls}).state
        leaves = jax.tree.leaves(algorithm.persistent(state))
        actors = [x for x in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, ActorState))
                  if isinstance(x, ActorState) and not x.saveable]
        out[n] = dict(leaves=[np.asarray(x, np.float64).ravel().tolist() for x in leaves],
                      spread=max(len(x.devices()) for x in leaves),
                      actor_spread=max([len(x.devices()) for x in jax.tree.leaves(actors)],
                                       default=1))
        algorithm.close()
    print(json.dumps(out))
""")


def check_devices_agree(name: str, spec: str, overrides: dict, calls: int,
                        rtol: float, atol: float) -> None:
    """1 and 4 fake CPU devices (a fresh process: JAX fixes the count when it starts)."""
    script = DEVICES_SCRIPT.format(root=ROOT, tests=os.path.join(ROOT, "tests"),
                                   name=name, spec=spec, overrides=overrides,
                                   calls=calls)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["4"]["spread"] == 4, "nothing of the state is on all 4 devices"
    # A host-stepped env's state stays on one device: its programs run once, on the host's
    # envs (a JAX env's is replicated like the parameters, and compared with them).
    assert out["4"]["actor_spread"] == 1, "an actor's state is spread over devices"
    for i, (a, b) in enumerate(zip(out["1"]["leaves"], out["4"]["leaves"], strict=True)):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol,
                                   err_msg=f"{spec}: leaf {i} differs on 1 and 4 devices")


def check_bad_config(entry, config) -> None:
    """Sizes of 0, and capabilities the algorithm lacks, are refused in one line."""
    zero_means = {**jaxwm.config.ZERO_MEANS, **entry.zero_means}
    sizes = [name for name, value in jaxwm.config._leaves(config)
             if isinstance(value, int) and not isinstance(value, bool)
             and name not in zero_means and name not in jaxwm.config.NOT_SIZES]
    assert sizes
    for name in sizes:
        bad = config.copy_and_resolve_references()
        *parents, leaf = name.split(".")
        node = bad
        for part in parents:
            node = node[part]
        node[leaf] = 0
        _expect_one_line(lambda bad=bad: runner.validate(bad), name)
    for capability, why in entry.capabilities.cannot.items():
        bad = config.copy_and_resolve_references()
        if capability == "seeds":
            bad.num_seeds = 2
        elif capability == "async_pool":
            bad.env.num_envs, bad.env.batch_size = 4, 2
        else:
            continue  # several processes: tests/test_distributed.py
        _expect_one_line(lambda bad=bad: runner.validate(bad), why)


def _expect_one_line(validate, expected: str) -> None:
    try:
        validate()
    except ConfigError as e:
        message = str(e)
        assert "\n" not in message, f"a multi-line error: {message!r}"
        assert expected in message, f"{expected!r} not in {message!r}"
        return
    raise AssertionError(f"no ConfigError where {expected!r} should be refused")



# ------------------------------------------------------------------ several processes

PROCESSES_SCRIPT = textwrap.dedent("""
    import json, os, pickle, sys
    sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
    from jaxwm import parallel
    parallel.maybe_initialize_distributed()
    import jax, numpy as np
    import contract
    from jaxwm import algos
    entry = algos.get({name!r})
    config = contract.load({spec!r}, **{overrides!r})
    algorithm = contract.build(entry, config)
    drive = contract.Drive.start(config, algorithm).run(1)
    online = "collect" in algorithm.hooks
    first = contract.first_step_obs(drive, config.env.num_envs) if online else None
    flow = dict(drive.flow)  # what the first collect hands the update (PPO's rollout)
    # An algorithm whose phases write artifacts runs every phase (its tiny config is short),
    # so that every hook reads something.
    writes_artifacts = any(set(h.writes) & set(algorithm.artifacts)
                           for h in algorithm.hooks.values())
    state = drive.run(None if writes_artifacts else {calls}).state
    updated = {{}}
    if online:  # the 1-process run's state and inputs through every update hook once
        key = jax.random.PRNGKey(7)
        hooks = {{name: hook for name, hook in algorithm.hooks.items()  # reads artifacts, flow
                  if name not in ("collect", "iterate")
                  and set(hook.reads) <= set(algorithm.artifacts) | set(flow)}}
        path = {path!r}
        if jax.process_count() == 1:
            inputs = {{name: parallel.host_value(contract.hook_inputs(
                algorithm, hook, flow, drive.artifacts, key)) for name, hook in hooks.items()}}
            with open(path, "wb") as f:
                pickle.dump((contract.persistent(algorithm, state), inputs), f)
        else:
            with open(path, "rb") as f:
                saved, inputs = pickle.load(f)
            shared = {{name: {{k: v for k, v in read.items() if k not in flow}}
                      for name, read in inputs.items()}}
            saved, shared = parallel.replicate((saved, shared), parallel.data_mesh())
            inputs = {{name: {{**shared[name], **{{k: contract.process_share(v, config.env.num_envs)
                                               for k, v in read.items() if k in flow}}}}
                      for name, read in inputs.items()}}
            state = algorithm.on_restore(state, saved)
        for name, hook in hooks.items():
            state, _, _ = hook.fn(state, inputs[name], key)
            updated[name] = True
    local = parallel.local_replica(algorithm.persistent(state), jax.local_devices()[0])
    leaves = [np.asarray(x, np.float64).ravel().tolist() for x in jax.tree.leaves(local)]
    print("RESULT " + json.dumps(dict(
        leaves=leaves, first=None if first is None else np.asarray(first).tolist(),
        updated=sorted(updated), processes=jax.process_count(), devices=jax.device_count())))
    algorithm.close()
""")


def process_share(value, num_envs: int):
    """This process's share of a collect's output for every env (env axis first): its own
    envs' rows, as its collect hands them to the update in a run of several processes."""
    share, i = num_envs // jax.process_count(), jax.process_index()
    return jax.tree.map(lambda x: x[i * share:(i + 1) * share]
                        if np.ndim(x) and np.shape(x)[0] == num_envs else x, value)


def first_step_obs(drive: Drive, num_envs: int):
    """The observations every env started from after one collect (they depend on the envs'
    seeds alone, not on any action), wherever the collect put them: the replay (``obs``, or
    ``frame`` for a pixel world model's), a phase artifact (each env's first row: a collect
    writes its rows env by env), or an on-policy rollout passed to the update ([envs, steps])."""
    replay = getattr(drive.state, "replay", None)
    if replay is not None:
        data = replay.data["obs" if "obs" in replay.data else "frame"]
        obs = jax.device_get(parallel.local_replica(data, jax.local_devices()[0]))
        return obs[:num_envs] if isinstance(replay, TransitionReplay) else obs[0]
    (out,) = drive.algorithm.hooks["collect"].writes
    if out in drive.artifacts.files:
        rows = parallel.host_value(drive.artifacts.files[out].whole())
        frames = rows["obs"] if "obs" in rows else rows["frame"]
        return frames.reshape((num_envs, -1) + frames.shape[1:])[:, 0]
    first = parallel.host_value(drive.flow[out].obs)[:, 0]
    if len(first) < num_envs:  # each process holds its own envs' rollout, in process order
        first = np.asarray(multihost_utils.process_allgather(first, tiled=True))
    return first


def communicate_all(processes: list[subprocess.Popen], timeout: float) -> list:
    """Every process's ``communicate()``, read at once (one thread each) and killed after.

    Read one after another, a later process whose output outgrows its pipe (64 kB) blocks
    writing it, short of the shutdown barrier of JAX's distributed runtime, where the earlier
    process waits for it until the barrier times out."""
    try:
        with ThreadPoolExecutor(len(processes)) as pool:
            return list(pool.map(lambda p: p.communicate(timeout=timeout), processes))
    finally:
        for p in processes:
            p.kill()


def check_two_processes(name: str, spec: str, overrides: dict, calls: int, workdir: str,
                        rtol: float, atol: float) -> None:
    """2 processes x 2 CPU devices against 1 process x 4 (``jaxwm.launch.spawn``, gloo).

    Offline algorithms learn from the same dataset either way, so their states after
    ``calls`` calls must agree. Online ones collect from the same envs (``acting.make_pool``
    seeds each process's share as the one-process pool's) but draw each process's action
    noise apart, so their data differ from the one-process run's: checked instead are the
    first observations (env seeding and ``join_processes``' layout), the state after
    ``calls`` calls being the same on both processes, and every update hook applied to the
    one-process run's state giving its result."""
    from jaxwm import launch

    script = PROCESSES_SCRIPT.format(root=ROOT, tests=os.path.join(ROOT, "tests"), name=name,
                                     spec=spec, overrides=overrides, calls=calls,
                                     path=os.path.join(workdir, "state.pkl"))

    def results(processes):
        procs = launch.spawn(["-c", script], processes, devices_per_process=4 // processes,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        outputs = communicate_all(procs, timeout=900)
        for p, (_, err) in zip(procs, outputs, strict=True):
            assert p.returncode == 0, err[-3000:]
        return [json.loads(next(line[7:] for line in out.splitlines()
                                if line.startswith("RESULT "))) for out, _ in outputs]

    (one,), (p0, p1) = results(1), results(2)
    assert (one["devices"], p0["processes"], p0["devices"]) == (4, 2, 4)
    assert p0["leaves"] == p1["leaves"], f"{spec}: the 2 processes hold different states"
    if one["first"] is not None:
        np.testing.assert_array_equal(p0["first"], one["first"],
                                      err_msg=f"{spec}: the envs' first observations differ")
        assert p0["updated"], f"{spec}: no update hook was checked"
    for i, (a, b) in enumerate(zip(one["leaves"], p0["leaves"], strict=True)):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol,
                                   err_msg=f"{spec}: leaf {i} differs on 2 processes")
