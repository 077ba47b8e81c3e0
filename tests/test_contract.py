"""The contract suite: every registered algorithm, on its tiny config, keeps the contract
(``tests/contract.py``): exact resume mid-run, donation, 1 vs 4 devices, N seeds = N runs,
one-line errors for bad configs. A new algorithm gets these checks by registering in
``jaxwm.algos.REGISTRY``; the last test shows that the suite fails on a broken one.

The default suite runs every entry's first tiny config through every check, and each
mechanism beyond those once: a JAX env's state in the checkpoint on PPO (on-policy) and SAC
(replay), the one-program ``iterate`` on PPO, several processes on SAC. The rest (an entry's
other tiny configs, such as the pairings' and SimPLe's MinAtar one, and the other algorithms'
JAX-env and process cases) carry the ``slow`` marker: run them with
``python -m pytest -m '' tests/test_contract.py`` after a change to an algorithm they cover
(docs/user_guide.md, "Tests")."""


import dataclasses
import importlib.util

import contract
import jax
import jax.numpy as jnp
import optax
import pytest
from flax import struct

from jaxwm import algos
from jaxwm.algos import Capabilities, Entry
from jaxwm.config import base_config
from jaxwm.loop.algorithm import Algorithm, Hook, drop_actors

NAMES = algos.names()


def marks(name: str, spec: str) -> list:
    """An entry's other tiny configs are slow (see the module's docstring); one on MuJoCo
    Playground also needs the playground extra (MJX compiles for about a minute a build)."""
    if "playground" not in spec:
        return [] if spec == algos.get(name).tiny else [pytest.mark.slow]
    missing = importlib.util.find_spec("mujoco_playground") is None
    why = "needs MuJoCo Playground: pip install -e '.[dev]' (its playground extra)"
    return [pytest.mark.slow, pytest.mark.skipif(missing, reason=why)]


# Every tiny config of every entry (the pairings have one per pairing; some one on a JAX env),
# as (name, config).
CASES = [pytest.param(name, spec, id=name if spec == algos.get(name).tiny else
                      f"{name}-{spec.split(':')[-1]}", marks=marks(name, spec))
         for name in NAMES for spec in algos.get(name).tiny_configs]


def dataset_overrides(name, dataset) -> dict:
    return {"dataset": dataset} if algos.get(name).offline else {}


def tiny(name, spec, dataset):
    return contract.load(spec, **dataset_overrides(name, dataset))


@pytest.mark.parametrize("name, spec", CASES)
def test_an_interrupted_run_resumes_exactly_and_loads(name, spec, tiny_dataset, tmp_path):
    """... and the finished run loads, acts, evaluates and imagines (``jaxwm.load``)."""
    entry, config = algos.get(name), tiny(name, spec, tiny_dataset)
    final_state = contract.check_exact_resume(entry, config, str(tmp_path))
    contract.check_loads_and_acts(entry, config, str(tmp_path), final_state)


@pytest.mark.parametrize("name, spec", CASES)
def test_hooks_update_the_state_in_place(name, spec, tiny_dataset):
    contract.check_donation(algos.get(name), tiny(name, spec, tiny_dataset))


# SimPLe's MinAtar model: most of a binary 10 x 10 frame's channels are empty, so many of its
# gradients are 0 but for rounding, and Adafactor, which scales each update by the gradient's
# RMS, turns a rounding-sized gradient into a step of up to 1e-2 of either sign; a sum taken in
# another order (split over 4 devices, vmapped over seeds) flips some. Its parameters then part
# by up to 5e-3 within 6 calls (the Atari tiny model's by 6e-8), while its replay and env state
# (integers and frames, which any real difference would change) agree exactly.
ROUNDING_TOLERANCES = {"simple:minatar_tiny": dict(rtol=1e-2, atol=2e-2)}


@pytest.mark.parametrize("name, spec", CASES)
def test_one_and_four_devices_agree(name, spec, tiny_dataset):
    contract.check_devices_agree(name, spec, dataset_overrides(name, tiny_dataset), calls=6,
                                 **ROUNDING_TOLERANCES.get(spec, dict(rtol=1e-4, atol=1e-5)))


# Several processes (jaxwm.launch): every algorithm that runs in them, 2 processes x 2 CPU
# devices against 1 x 4. SAC (an online replay algorithm) in the default suite, the rest slow:
# three processes compiling on 2 cores take 1 to 4 min per algorithm.
DEFAULT_PROCESS_CASES = ("sac:tiny",)
PROCESS_CASES = [pytest.param(name, spec, id=name, marks=[] if spec in DEFAULT_PROCESS_CASES
                              else [pytest.mark.slow])
                 for name in NAMES if "processes" not in algos.get(name).capabilities.cannot
                 for spec in [algos.get(name).tiny]]


@pytest.mark.parametrize("name, spec", PROCESS_CASES)
def test_two_processes_train_as_one_process_of_the_same_devices(name, spec, tiny_dataset,
                                                                 tmp_path):
    contract.check_two_processes(name, spec, dataset_overrides(name, tiny_dataset), calls=6,
                                 workdir=str(tmp_path),
                                 **ROUNDING_TOLERANCES.get(spec, dict(rtol=1e-4, atol=1e-5)))


@pytest.mark.parametrize("name, spec", CASES)
def test_two_seeds_train_as_two_runs(name, spec, tiny_dataset):
    cannot = algos.get(name).capabilities.cannot
    if "seeds" in cannot:
        pytest.skip(f"{name} declares it runs one seed per process ({cannot['seeds']}); "
                    "test_bad_settings_are_one_line_errors checks that num_seeds=2 is refused")
    contract.check_seeds_are_runs(algos.get(name), tiny(name, spec, tiny_dataset), calls=6,
                                  **ROUNDING_TOLERANCES.get(spec, dict(rtol=1e-5, atol=1e-6)))


@pytest.mark.parametrize("name, spec", CASES)
def test_bad_settings_are_one_line_errors(name, spec, tiny_dataset):
    contract.check_bad_config(algos.get(name), tiny(name, spec, tiny_dataset))


# ------------------------------------------------------------- envs written in JAX

# Every algorithm that takes JAX envs (``jaxwm.envs.native``), on its tiny config with a
# gymnax env of its action space; several iterations per call where it can.
JAX_ENVS = {"discrete": "gymnax:CartPole-v1", "continuous": "gymnax:Pendulum-v1"}


def jax_env_overrides(entry) -> dict:
    capabilities = entry.capabilities
    overrides = {"env.id": JAX_ENVS[capabilities.actions[0]]}
    if "iterations" not in capabilities.cannot:
        overrides["iterations_per_call"] = 2
    return overrides


def runs_gymnax(entry) -> bool:
    """Whether one of the entry's tiny configs is on a gymnax env already (simple:minatar_tiny),
    so that the cases above check it there: exact resume, donation, devices, seeds, errors."""
    return any(contract.load(spec).env.id.startswith("gymnax:") for spec in entry.tiny_configs)


# Those that take JAX envs and have no tiny config on gymnax: their tiny config on gymnax.
DEFAULT_JAX_ENV_CASES = ("ppo", "sac")  # on-policy and replay; the others slow
JAX_ENV_CASES = [pytest.param(name, id=name, marks=[] if name in DEFAULT_JAX_ENV_CASES
                              else [pytest.mark.slow]) for name in NAMES
                 if "jax_envs" not in algos.get(name).capabilities.cannot
                 and not runs_gymnax(algos.get(name))]


@pytest.mark.parametrize("name", JAX_ENV_CASES)
def test_on_a_jax_env_an_interrupted_run_continues_its_episodes_exactly(name, tmp_path):
    """A JAX env's state is in the checkpoint: stopped in every phase and resumed, the run
    ends bit for bit where the run that never stopped (and never restarted its envs) ends."""
    pytest.importorskip("gymnax", reason="the gymnax extra (pip install -e '.[dev]')")
    entry = algos.get(name)
    config = contract.load(entry.tiny, **jax_env_overrides(entry))
    contract.check_exact_resume(entry, config, str(tmp_path))


def test_the_resume_check_fails_when_the_jax_env_state_is_dropped(tmp_path):
    """The case above fails on an algorithm whose checkpoint leaves the env state out (its
    envs restart on resume, as envpool's must)."""
    pytest.importorskip("gymnax", reason="the gymnax extra (pip install -e '.[dev]')")
    entry = algos.get("ppo")
    forgets = dataclasses.replace(entry, build=lambda config: dataclasses.replace(
        entry.build(config), persistent=drop_actors))
    config = contract.load(entry.tiny, **jax_env_overrides(entry))
    with pytest.raises(AssertionError, match="resumed at calls .* != never stopped"):
        contract.check_exact_resume(forgets, config, str(tmp_path))


# The tiny configs reach their train phase's ``iterate`` after 8 collects (PPO's has no
# earlier phase; TD-MPC2's runs 32 pretraining updates after them, DreamerV3's none).
@pytest.mark.parametrize("name, calls", [("ppo", 2),
                                         pytest.param("tdmpc2", 42, marks=pytest.mark.slow),
                                         pytest.param("dreamer", 10, marks=pytest.mark.slow)])
def test_one_program_on_a_jax_env_agrees_on_four_devices_and_trains_seeds_as_runs(name, calls):
    """PPO's, TD-MPC2's and DreamerV3's ``iterate`` (collection and updates in one program,
    two rounds a call): the same on 1 and 4 devices, and N vmapped seeds are N runs."""
    pytest.importorskip("gymnax", reason="the gymnax extra (pip install -e '.[dev]')")
    entry = algos.get(name)
    overrides = jax_env_overrides(entry)
    # vmapped seeds reorder the updates' reductions as a mesh does: float rounding, no more
    tolerance = dict(rtol=1e-4, atol=1e-5)
    contract.check_devices_agree(name, entry.tiny, overrides, calls=calls, **tolerance)
    contract.check_seeds_are_runs(entry, contract.load(entry.tiny, **overrides), calls=calls,
                                  **tolerance)


# ------------------------------------------------------------- the suite catches a broken one


@struct.dataclass
class ToyState:
    params: jax.Array
    opt_state: object


def toy_entry(drop_optimiser_on_restore: bool) -> Entry:
    """An offline learner (Adam on a noisy quadratic) whose ``on_restore`` may forget the
    optimiser's state: a resume that looks fine until the next update."""
    optimizer = optax.adam(0.1)

    def build(config):
        del config

        def init(key):
            params = jax.random.normal(key, (8,))
            return ToyState(params, optimizer.init(params))

        def update(state, data, key):
            target = jax.random.normal(key, (8,))
            grads = jax.grad(lambda p: jnp.sum((p - target) ** 2))(state.params)
            updates, opt_state = optimizer.update(grads, state.opt_state)
            return ToyState(state.params + updates, opt_state), {}, {"losses/l": jnp.sum(grads)}

        restore = (lambda fresh, saved: saved.replace(opt_state=fresh.opt_state)) \
            if drop_optimiser_on_restore else (lambda fresh, saved: saved)
        return Algorithm(name="toy", init=init,
                         hooks={"update_agent": Hook(jax.jit(update, donate_argnums=0),
                                                     counts={"agent_updates": 1})},
                         on_restore=restore)

    return Entry(name="toy", build=build, validate=lambda config: None,
                 hook_counts=lambda config: {"update_agent": {"agent_updates": 1}}, tiny="")


def toy_config():
    c = base_config()
    c.algo = "toy"
    c.log.progress = False
    c.eval.every, c.eval.at_end = "never", False
    c.checkpoint.every = "never"
    c.log.every = "4 agent_updates"
    c.log.x_axis = "agent_updates"
    c.phases.train = dict(unit="agent_updates", duration=8, hooks=("update_agent",))
    return c


def test_the_resume_check_fails_on_an_algorithm_that_forgets_its_optimiser(tmp_path):
    contract.check_exact_resume(toy_entry(False), toy_config(), str(tmp_path / "good"))
    with pytest.raises(AssertionError, match="resumed at calls .* != never stopped"):
        contract.check_exact_resume(toy_entry(True), toy_config(), str(tmp_path / "bad"))


def test_every_algorithm_has_one_registry_entry():
    """Everything the rest of jaxwm asks of an algorithm is on its ``Entry``: what it can
    run, its checks, its hook counts and tiny config; the settings it names exist."""
    from jaxwm.loop.checkpoint import config_to_json_dict, flatten

    for name in NAMES:
        entry = algos.get(name)
        assert isinstance(entry, Entry) and entry.name == name, name
        assert isinstance(entry.capabilities, Capabilities), name
        assert callable(entry.validate) and callable(entry.build), name
        keys = set().union(*(flatten(config_to_json_dict(contract.load(spec)))
                               for spec in entry.tiny_configs))
        named = set(entry.resumable) | set(entry.fixed) | set(entry.zero_means)
        assert named <= keys, (name, named - keys)
