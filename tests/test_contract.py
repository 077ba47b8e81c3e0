"""The contract suite: every registered algorithm, on its tiny config, keeps the contract
(``tests/contract.py``): exact resume mid-run, donation, 1 vs 4 devices, N seeds = N runs,
one-line errors for bad configs. A new algorithm gets these checks by registering in
``jaxwm.algos.REGISTRY``; the last test shows that the suite fails on a broken one."""

import dataclasses
import importlib
import types

import contract
import jax
import jax.numpy as jnp
import optax
import pytest
from flax import struct

from jaxwm.algos import REGISTRY, Capabilities
from jaxwm.config import base_config
from jaxwm.loop.algorithm import Algorithm, Hook
from jaxwm.tools import make_dataset

NAMES = sorted(REGISTRY)
OFFLINE = ("mopo", "gormpo", "diffusion")


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory):
    """The offline algorithms' tiny dataset, made once per test process."""
    path = str(tmp_path_factory.mktemp("data") / "pendulum-random-tiny.hdf5")
    return make_dataset.make("Pendulum-v1", "random", path, size=2_000, num_envs=2)


def tiny(name, dataset):
    return contract.load(REGISTRY[name].tiny, **({"dataset": dataset} if name in OFFLINE else {}))


def module_of(name):
    return importlib.import_module(REGISTRY[name].module)


@pytest.mark.parametrize("name", NAMES)
def test_an_interrupted_run_resumes_exactly(name, tiny_dataset, tmp_path):
    contract.check_exact_resume(module_of(name), tiny(name, tiny_dataset), str(tmp_path))


@pytest.mark.parametrize("name", NAMES)
def test_hooks_update_the_state_in_place(name, tiny_dataset):
    contract.check_donation(module_of(name), tiny(name, tiny_dataset))


@pytest.mark.parametrize("name", NAMES)
def test_one_and_four_devices_agree(name, tiny_dataset):
    overrides = {"dataset": tiny_dataset} if name in OFFLINE else {}
    contract.check_devices_agree(REGISTRY[name].module, REGISTRY[name].tiny, overrides,
                                 calls=6, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_two_seeds_train_as_two_runs(name, tiny_dataset):
    cannot = module_of(name).CAPABILITIES.cannot
    if "seeds" in cannot:
        pytest.skip(f"{name} declares it runs one seed per process ({cannot['seeds']}); "
                    "test_bad_settings_are_one_line_errors checks that num_seeds=2 is refused")
    contract.check_seeds_are_runs(module_of(name), tiny(name, tiny_dataset), calls=6,
                                  rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_bad_settings_are_one_line_errors(name, tiny_dataset):
    contract.check_bad_config(module_of(name), tiny(name, tiny_dataset))


# ------------------------------------------------------------- the suite catches a broken one


@struct.dataclass
class ToyState:
    params: jax.Array
    opt_state: object


def toy_module(drop_optimiser_on_restore: bool):
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

    return types.SimpleNamespace(CAPABILITIES=Capabilities(), build=build,
                                 validate=lambda config: None)


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
    contract.check_exact_resume(toy_module(False), toy_config(), str(tmp_path / "good"))
    with pytest.raises(AssertionError, match="resumed != never stopped"):
        contract.check_exact_resume(toy_module(True), toy_config(), str(tmp_path / "bad"))


def test_every_algorithm_declares_what_it_can_run():
    for name in NAMES:
        module = module_of(name)
        assert isinstance(module.CAPABILITIES, Capabilities), name
        assert callable(module.validate) and callable(module.build), name
        assert dataclasses.is_dataclass(module.CAPABILITIES)
