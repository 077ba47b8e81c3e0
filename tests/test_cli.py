"""The ``jaxwm`` command and the Python surface as a new user meets them: every subcommand's
``--help``, bad input as one line and a non-zero exit (nothing written), ``jaxwm configs``,
and a trained run loaded, evaluated again and refused where it must be (``jaxwm.trained``)."""

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import jaxwm
from jaxwm import cli, trained
from jaxwm.loop import checkpoint

SUBCOMMANDS = tuple(cli.COMMANDS)


def jaxwm_cli(*args, cwd=None, timeout=300):
    """``jaxwm ARGS`` as the console script runs it (``jaxwm.cli:main``)."""
    return subprocess.run([sys.executable, "-c", "import sys; from jaxwm.cli import main; "
                           "sys.exit(main())", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout)


def test_jaxwm_help_lists_every_subcommand():
    result = jaxwm_cli("--help")
    assert result.returncode == 0, result.stderr
    for name in SUBCOMMANDS:
        assert f"  {name} " in result.stdout


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_every_subcommand_has_help(name):
    result = jaxwm_cli(name, "--help")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage: jaxwm " + name in result.stdout
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("args, message", [
    (("bogus",), "unknown command 'bogus'"),
    (("train", "--config=ppo:cartpol"), "no variant 'cartpol'"),
    (("train", "--config=nope:x"), "Unknown config 'nope'"),
    (("train", "--config=ppo:tiny", "--config.ppo.lerning_rate=1"), "lerning_rate"),
    (("train", "--config=ppo:tiny", "--config.ppo.learning_rate=-1"), "out of range"),
    (("train", "--config=ppo:tiny", "--workdr=x"), "workdr"),
    (("eval", "--workdir=run", "--nope"), "unrecognized arguments"),
    (("eval",), "--workdir"),
    (("configs", "ppo:nope"), "no variant 'nope'"),
    (("report",), "paths"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, args, message):
    result = jaxwm_cli(*args, cwd=tmp_path)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert os.listdir(tmp_path) == []


def test_configs_lists_every_variant_and_describes_a_config():
    listing = jaxwm_cli("configs")
    assert listing.returncode == 0, listing.stderr
    for name in jaxwm.configs.names():
        for variant in jaxwm.configs.variants(name):
            assert f"  {name}:{variant} " in listing.stdout
    described = jaxwm_cli("configs", "ppo:cartpole")
    assert described.returncode == 0
    assert "ppo.learning_rate" in described.stdout and "(> 0)" in described.stdout
    assert "(undescribed)" not in described.stdout
    train_help = jaxwm_cli("train", "--config=ppo:cartpole", "--help")
    assert train_help.returncode == 0 and "ppo.learning_rate" in train_help.stdout


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A finished ``ppo:tiny`` run, trained through the Python API."""
    workdir = str(tmp_path_factory.mktemp("runs") / "ppo")
    config = jaxwm.configs.get("ppo:tiny", {"log.progress": False})
    summary = jaxwm.train(config, workdir)
    assert summary["counters"]["env_steps"] > 0
    return workdir


def files_of(workdir):
    return sorted((os.path.relpath(os.path.join(root, f), workdir),
                   os.path.getmtime(os.path.join(root, f)))
                  for root, _, files in os.walk(workdir) for f in files)


def test_eval_writes_a_new_folder_and_changes_nothing_else(tiny_run, capsys):
    before = files_of(tiny_run)
    assert trained.main(["--workdir", tiny_run, "--episodes", "2"]) == 0
    assert trained.main(["--workdir", tiny_run, "--episodes", "2"]) == 0
    step = jaxwm.load(tiny_run).step
    folders = sorted(os.listdir(os.path.join(tiny_run, "eval")))
    assert folders == [str(step), f"{step}-2"]  # the first evaluation is kept
    with open(os.path.join(tiny_run, "eval", str(step), "results.json")) as f:
        result = json.load(f)
    assert result["eval/episodes"] == 2 and np.isfinite(result["eval/episodic_return"])
    assert [f for f in files_of(tiny_run) if not f[0].startswith("eval" + os.sep)] == before
    assert "2 episodes on CartPole-v1" in capsys.readouterr().out


def test_an_agent_acts_with_its_carry_and_evaluates_on_another_env(tiny_run):
    agent = jaxwm.load(tiny_run)
    action, carry = agent.act(np.zeros(4, np.float32))
    assert action.shape == ()
    actions, _ = agent.act(np.zeros((3, 4), np.float32), greedy=False)
    assert actions.shape == (3,)
    assert agent.evaluate(1, env_id="CartPole-v0")["eval/episodes"] == 1
    with pytest.raises(trained.LoadError, match="other spaces"):
        agent.evaluate(1, env_id="Acrobot-v1")
    box = dataclasses.replace(agent.spec, discrete=False, num_actions=None, action_shape=(1,),
                              action_low=np.array([-1.0]), action_high=np.array([1.0]))
    agent.spec = box
    with pytest.raises(trained.LoadError, match="action bounds"):  # same shapes, other box
        agent._check_same_spaces(dataclasses.replace(box, action_high=np.array([2.0])))


def test_eval_on_another_env_records_that_env(tiny_run):
    assert trained.main(["--workdir", tiny_run, "--episodes", "1", "--env_id", "CartPole-v0"]) == 0
    newest = max(os.listdir(os.path.join(tiny_run, "eval")), key=lambda name: os.path.getmtime(
        os.path.join(tiny_run, "eval", name)))
    with open(os.path.join(tiny_run, "eval", newest, "results.json")) as f:
        assert json.load(f)["env"] == "CartPole-v0"


def refusal(tmp_path, workdir, *args):
    before = files_of(workdir) if os.path.isdir(workdir) else None
    code = trained.main(["--workdir", workdir, *args])
    assert code != 0
    if before is not None:
        assert files_of(workdir) == before


def test_bad_runs_are_refused_in_one_line(tiny_run, tmp_path, capsys, monkeypatch):
    refusal(tmp_path, str(tmp_path / "missing"))
    assert "no config.json" in capsys.readouterr().err
    empty = tmp_path / "no_checkpoint"
    empty.mkdir()
    with open(os.path.join(tiny_run, "config.json")) as f:
        (empty / "config.json").write_text(f.read())
    refusal(tmp_path, str(empty))
    assert "has no checkpoint" in capsys.readouterr().err
    refusal(tmp_path, tiny_run, "--env_id", "Acrobot-v1")
    err = capsys.readouterr().err
    assert "other spaces" in err and len(err.strip().splitlines()) == 1
    refusal(tmp_path, tiny_run, "--step", "12345")
    assert "no checkpoint 12345" in capsys.readouterr().err
    monkeypatch.setattr(checkpoint, "LAYOUT_VERSION", checkpoint.LAYOUT_VERSION + 1)
    refusal(tmp_path, tiny_run)
    err = capsys.readouterr().err
    assert "layout" in err and len(err.strip().splitlines()) == 1


def test_each_seed_of_a_num_seeds_run_loads_as_its_own_agent(tmp_path):
    import jax

    workdir = str(tmp_path / "two")
    jaxwm.train(jaxwm.configs.get("ppo:tiny", {"log.progress": False, "num_seeds": 2}), workdir)
    first, second = jaxwm.load(workdir, seed=0), jaxwm.load(workdir, seed=1)
    leaves = [jax.tree.leaves(agent._params) for agent in (first, second)]
    assert [a.shape for a in leaves[0]] == [b.shape for b in leaves[1]]
    assert any(not np.array_equal(a, b) for a, b in zip(*leaves, strict=True))
    assert np.isfinite(second.evaluate(1)["eval/episodic_return"])
    with pytest.raises(trained.LoadError, match="trained 2 seed"):
        jaxwm.load(workdir, seed=2)
