"""Every variant of every config file loads and passes validation as shipped (no run is
started): a config change that breaks a variant, or a validation change that refuses one,
fails here rather than on a user's first command."""

import os
import subprocess
import sys

import pytest

import jaxwm.config
import jaxwm.configs
from jaxwm import runner
from jaxwm.config import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def variants():
    for name in jaxwm.configs.names():
        for variant in jaxwm.configs.variants(name):
            yield f"{name}:{variant}"


@pytest.mark.parametrize("spec", list(variants()))
def test_every_config_variant_validates(spec, tmp_path):
    """... through ``--dry_run``'s code: validation, then the phase table from the
    algorithm's ``hook_counts``, with nothing written."""
    config = jaxwm.config.load(spec)
    try:
        printed = runner.dry_run(config, str(tmp_path / "run"))
    except ConfigError as e:  # the one environment-dependent refusal: dm_control's pixel
        # variants need an OpenGL renderer (EGL/OSMesa), which a headless machine may lack;
        # that is the machine's limit, not the config's, so it skips with the message
        if "OpenGL" not in str(e) and "dm_control" not in str(e):
            raise
        pytest.skip(f"{spec}: {e}")
    assert "| total |" in printed and "nothing was built" in printed
    assert os.listdir(tmp_path) == []


def test_dry_run_prints_the_phase_table_and_writes_nothing(tmp_path):
    """``python -m jaxwm.train --dry_run``: the resolved config (with the command line's
    overrides) and each phase's derived counts, and no file anywhere."""
    proc = subprocess.run(
        [sys.executable, "-m", "jaxwm.train", "--config=ppo:cartpole",
         "--config.total_env_steps=10000", "--config.ppo.num_steps=128", "--dry_run"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert '"total_env_steps": 10000' in proc.stdout
    config = jaxwm.config.load("ppo:cartpole",
                               {"total_env_steps": 10000, "ppo.num_steps": 128})
    per_rollout = config.env.num_envs * 128
    rollouts = -(-10000 // per_rollout)
    updates = rollouts * config.ppo.update_epochs * config.ppo.num_minibatches
    assert f"| total |  |  | {rollouts:,} | {updates:,} | {rollouts * per_rollout:,} |" \
        in proc.stdout, proc.stdout[-1500:]
    assert os.listdir(tmp_path) == []


def test_every_learning_rate_is_resumable_or_says_why_not():
    """Every learning rate of every config variant may change on resume (its algorithm's
    ``Entry.resumable``: what a NaN stop advises lowering) or its entry says why not
    (``Entry.fixed``). (That every setting an entry names exists: test_contract.py.)"""
    from jaxwm import algos
    from jaxwm.config import is_learning_rate
    from jaxwm.loop.checkpoint import config_to_json_dict, flatten

    for spec in variants():
        config = jaxwm.config.load(spec)
        entry = algos.get(config.algo)
        flat = flatten(config_to_json_dict(config))
        rates = {k for k, v in flat.items() if is_learning_rate(k) and isinstance(v, float)}
        unexplained = rates - set(entry.resumable) - set(entry.fixed)
        assert not unexplained, f"{spec}: learning rates {sorted(unexplained)} are neither " \
                                f"resumable nor fixed (with why) on the {config.algo} entry"


@pytest.mark.parametrize("spec", list(variants()))
def test_every_setting_is_described_with_its_range_beside_the_defaults(spec):
    """``jaxwm configs NAME:VARIANT`` describes every setting (one source: the FIELDS of the
    config module and of the blocks it composes), the defaults are in their ranges, and a
    negative learning rate, which once trained silently, is refused in one line."""
    from jaxwm.config import check_ranges, is_learning_rate, leaves

    config = jaxwm.config.load(spec)
    assert jaxwm.configs.undescribed(config) == [], spec
    fields = jaxwm.configs.fields(config.algo)
    check_ranges(config, fields)
    for key, value in leaves(config):
        if is_learning_rate(key) and isinstance(value, float):
            bad = jaxwm.config.load(spec, {key: -1.0})
            with pytest.raises(ConfigError, match=f"{key}=-1.0 is out of range"):
                check_ranges(bad, fields)


def test_every_variant_says_what_it_is_for():
    for name in jaxwm.configs.names():
        for variant in jaxwm.configs.variants(name):
            line = jaxwm.configs.summary(name, variant)
            assert 0 < len(line) <= 80 and "\n" not in line, (name, variant)


def test_a_batch_larger_than_the_dataset_is_refused(tmp_path):
    from jaxwm import algos
    from jaxwm.tools import make_dataset

    path = make_dataset.make("Pendulum-v1", "random", str(tmp_path / "d.hdf5"), size=200,
                             num_envs=2)
    for spec, key in (("mopo:tiny", "sac.batch_size"), ("diffusion:tiny", "diffusion.batch_size")):
        config = jaxwm.config.load(spec, {"dataset": path, key: 256})
        with pytest.raises(ConfigError, match=f"{key}=256 is larger than the dataset"):
            algos.get(config.algo).build(config)
