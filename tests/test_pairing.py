"""Pairings of world models and agents (jaxwm/configs/pairing.py, jaxwm/agents/components.py): the
ones that cannot work are refused in one line, each pairing's tiny form trains (its contract
runs in tests/test_contract.py), and (slow) each learns on a small env, beating a uniformly
random policy."""

import os

import pytest

from jaxwm import runner, train
from jaxwm.config import ConfigError, load

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pairing(variant, **overrides):
    return load(f"pairing:{variant}",
                {"log.progress": False, **overrides})


@pytest.mark.parametrize("overrides, message", [
    ({"components.world_model": "nextframe", "components.agent": "imagination"},
     "nextframe with the imagination actor-critic cannot work: for continuous actions"),
    # REINFORCE needs no gradient through the model: the next rule answers instead.
    ({"components.world_model": "nextframe", "components.agent": "imagination",
      "dreamer.actor_grad_cont": "reinforce"}, "nextframe.* is trained by its own system's"),
    ({"components.world_model": "vae_mdnrnn"}, "trained by its own system's phases"),
    ({"components.world_model": "rsm"}, "components.world_model='rsm'; choose one of"),
    ({"components.agent": "ppo"}, "components.agent='ppo'; choose one of"),
    ({"env.id": "CartPole-v1"}, "mppi samples action sequences in a box"),
])
def test_pairings_that_cannot_work_are_refused_in_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message) as error:
        runner.validate(pairing("tiny_rssm_mppi", **overrides))
    assert "\n" not in str(error.value)


def test_tdmpc2s_latent_model_takes_a_box_of_actions():
    with pytest.raises(ConfigError, match="tdmpc2 takes vector observations and a box"):
        runner.validate(pairing("tiny_tdmpc2_imagination", **{"env.id": "CartPole-v1"}))


def test_any_other_pairing_is_a_command_line_away_from_a_pairing_config(tmp_path):
    config = pairing("tiny_tdmpc2_imagination", **{"components.agent": "cmaes"})
    summary = train.run(config, str(tmp_path))
    assert summary["generations"] > 0 and "cma/return_best" in summary


def test_a_config_without_a_components_block_is_refused_in_one_line():
    config = load("dreamer:tiny",
                  {"components.agent": "cmaes", "log.progress": False})
    with pytest.raises(ConfigError, match="takes its settings from config.cmaes, which this "
                                          "config lacks; start from a jaxwm/configs/pairing.py"):
        runner.validate(config)


@pytest.mark.parametrize("variant", ["tiny_rssm_mppi", "tiny_tdmpc2_imagination",
                                     "tiny_rssm_cmaes"])
def test_each_pairing_trains_and_evaluates(variant, tmp_path):
    summary = train.run(pairing(variant, **{"eval.at_end": True}), str(tmp_path))
    assert summary["env_steps"] == 40 and summary["model_updates"] > 0
    assert "eval/episodic_return" in summary
    if variant.endswith("cmaes"):
        assert summary["generations"] > 0 and "cma/return_best" in summary


# Uniformly random policies on the learning checks' envs (eval.num_episodes episodes each):
# Pendulum-v1 about -1200 per episode, CartPole-v1 about 22.
RANDOM = {"Pendulum-v1": -1200.0, "CartPole-v1": 22.0}


@pytest.mark.slow
@pytest.mark.parametrize("variant, margin", [("rssm_mppi", 300.0),
                                             ("tdmpc2_imagination", 300.0),
                                             ("rssm_cmaes", 50.0)])
def test_each_pairing_learns_more_than_a_random_policy_earns(variant, margin, tmp_path):
    """The pairing's config at its budget (20k-30k env steps; minutes on 2 cores): the final
    evaluation return beats a uniformly random policy's by ``margin``."""
    config = pairing(variant)
    summary = train.run(config, str(tmp_path))
    ret = summary["eval/episodic_return"]
    print(f"{variant}: final eval return {ret:.1f} (random {RANDOM[config.env.id]:.1f})")
    assert ret > RANDOM[config.env.id] + margin, ret
