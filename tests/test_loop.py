"""The loop with a toy algorithm: phase scheduling, checkpoints, resume, signals, guards."""

import dataclasses
import json
import os
import signal
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwm.config import base_config
from jaxwm.loop.algorithm import Algorithm, Hook
from jaxwm.loop.checkpoint import IncompatibleCheckpointError
from jaxwm.loop.metrics import read_jsonl
from jaxwm.loop.phases import Scheduler, phases_from_config
from jaxwm.loop.trainer import Trainer


def toy_config(**phase_overrides):
    c = base_config()
    c.algo = "toy"
    c.eval.every_env_steps = 0
    c.eval.at_end = False
    c.log.progress = False
    c.log.every_env_steps = 10
    c.checkpoint.every_env_steps = 1000
    c.phase_order = ("warmup", "train")
    c.phases.warmup = dict(unit="env_steps", duration=20, hooks=("collect",))
    c.phases.train = dict(unit="iterations", duration=3, hooks=("collect", "update_agent:2"))
    for name, value in phase_overrides.items():
        c.phases[name] = value
    return c


def toy_algorithm(calls=None, interrupt_at=None, nan_at=None, width=3):
    """Deterministic given keys: collect adds noise, update shrinks. Records call order."""
    calls = [] if calls is None else calls

    def collect(state, key):
        calls.append("collect")
        if interrupt_at is not None and len(calls) == interrupt_at:
            os.kill(os.getpid(), signal.SIGINT)
        w = state["w"] + jax.random.normal(key, state["w"].shape)
        return {"w": w, "n": state["n"] + 1}, {"charts/episodic_return": jnp.sum(w)}

    def update(state, key):
        calls.append("update_agent")
        loss = jnp.sum(state["w"] ** 2)
        if nan_at is not None and len(calls) >= nan_at:
            loss = jnp.nan
        return {"w": 0.9 * state["w"], "n": state["n"]}, {"losses/loss": loss}

    return Algorithm(
        name="toy",
        init=lambda key: {"w": jax.random.normal(key, (width,)), "n": jnp.zeros((), jnp.int32)},
        hooks={"collect": Hook(collect, env_steps=10), "update_agent": Hook(update, updates=1)},
    )


def test_scheduler_walks_phases_in_order():
    calls = []
    trainer = Trainer(toy_config(), toy_algorithm(calls), "/tmp/unused-not-created")
    del trainer  # constructing validates; run below uses a real tmp dir
    phases = phases_from_config(toy_config())
    assert [p.name for p in phases] == ["warmup", "train"]
    assert phases[1].hooks == (("collect", 1), ("update_agent", 2))
    sched = Scheduler(phases)
    assert sched.begin_cycle().name == "warmup"
    sched.record(10, 0)
    assert not sched.end_cycle()
    sched.begin_cycle()
    sched.record(10, 0)
    assert sched.end_cycle() and sched.current.name == "train"
    for _ in range(3):
        assert sched.begin_cycle().name == "train"
        sched.record(10, 2)
        sched.end_cycle()
    assert sched.finished and sched.env_steps == 50
    assert sched.total_env_steps_planned() is None
    # Lengthening a finished phase (a resumed run with a bigger budget) reopens it.
    sched.phases[1] = dataclasses.replace(sched.phases[1], duration=4)
    assert not sched.finished and sched.current.name == "train"


def test_loop_runs_phases_and_writes_outputs(tmp_path):
    calls = []
    summary = Trainer(toy_config(), toy_algorithm(calls), str(tmp_path)).run()
    # warmup: 2 collects (20 env steps); train: 3 x (collect, update, update).
    assert calls == ["collect"] * 2 + ["collect", "update_agent", "update_agent"] * 3
    assert summary["env_steps"] == 50 and not summary["interrupted"]
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [10, 20, 30, 40, 50]
    assert all("charts/SPS" in r for r in rows) and "losses/loss" in rows[-1]
    assert json.loads((tmp_path / "config.json").read_text())["algo"] == "toy"
    assert os.path.exists(tmp_path / "learning_curve.png")
    assert os.listdir(tmp_path / "checkpoints") == ["50"]


class StateReadingEvaluator:
    """Stands in for ``loop.evaluate.Evaluator``: reading the state waits for queued work."""

    def run(self, state, key, video_path=None):
        return {"eval/episodic_return": float(np.asarray(state["w"])[0, 0])}


def test_sps_counts_finished_work_not_dispatched_work(tmp_path):
    """JAX dispatches asynchronously: a hook returns before its computation ends. SPS must
    count that work, not leave it to be waited for (and excluded from SPS) in evaluation."""
    m = jnp.eye(512) * 0.5

    @jax.jit
    def slow(w):  # ~0.05-0.1 s of matmuls on 2 cores
        return jax.lax.fori_loop(0, 60, lambda i, x: jnp.tanh(x @ m), w)

    w0 = jnp.ones((512, 512))
    slow(w0).block_until_ready()
    start = time.perf_counter()
    slow(w0).block_until_ready()
    per_call = time.perf_counter() - start

    def collect(state, key):
        return {"w": slow(state["w"])}, {}

    algo = Algorithm(name="slow", init=lambda key: {"w": w0},
                     hooks={"collect": Hook(collect, env_steps=10)})
    c = toy_config()
    c.phase_order = ("warmup",)
    c.phases.warmup = dict(unit="env_steps", duration=60, hooks=("collect",))
    c.eval.every_env_steps = 10
    Trainer(c, algo, str(tmp_path), evaluator=StateReadingEvaluator()).run()
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [10, 20, 30, 40, 50, 60]
    true_sps = 10 / per_call  # one 10-step collect per window
    assert max(r["charts/SPS"] for r in rows) < 2.5 * true_sps, (rows, true_sps)


def test_sigint_saves_and_resume_matches_uninterrupted(tmp_path):
    straight = Trainer(toy_config(), toy_algorithm(), str(tmp_path / "a"))
    straight.run()

    interrupted = Trainer(toy_config(), toy_algorithm(interrupt_at=3), str(tmp_path / "b"))
    summary = interrupted.run()
    assert summary["interrupted"] and summary["env_steps"] == 30
    assert os.listdir(tmp_path / "b" / "checkpoints") == ["30"]

    config = toy_config()
    config.resume = True
    resumed = Trainer(config, toy_algorithm(), str(tmp_path / "b"))
    summary = resumed.run()
    assert summary["env_steps"] == 50 and not summary["interrupted"]
    np.testing.assert_array_equal(resumed.state["w"], straight.state["w"])
    assert int(resumed.state["n"]) == int(straight.state["n"]) == 5


def test_refuses_to_start_over_existing_checkpoints(tmp_path):
    Trainer(toy_config(), toy_algorithm(), str(tmp_path)).run()
    before = sorted(os.listdir(tmp_path / "checkpoints"))
    with pytest.raises(IncompatibleCheckpointError, match="resume=True"):
        Trainer(toy_config(), toy_algorithm(), str(tmp_path))
    assert sorted(os.listdir(tmp_path / "checkpoints")) == before


def test_resume_with_changed_config_is_refused(tmp_path):
    Trainer(toy_config(), toy_algorithm(), str(tmp_path)).run()
    config = toy_config()
    config.resume = True
    config.seed = 7
    with pytest.raises(IncompatibleCheckpointError, match="seed: saved 1, now 7"):
        Trainer(config, toy_algorithm(), str(tmp_path))


def test_resume_with_mismatched_state_is_refused_and_kept(tmp_path):
    Trainer(toy_config(), toy_algorithm(width=3), str(tmp_path)).run()
    config = toy_config()
    config.resume = True
    config.phases.train.duration = 5  # extending a run is allowed; the state shape is not
    trainer = Trainer(config, toy_algorithm(width=4), str(tmp_path))
    with pytest.raises(IncompatibleCheckpointError, match="does not match"):
        trainer.run()
    assert os.listdir(tmp_path / "checkpoints") == ["50"]


def test_nan_loss_stops_without_saving_bad_state(tmp_path):
    config = toy_config()
    config.checkpoint.every_env_steps = 20
    with pytest.raises(FloatingPointError, match="losses/loss"):
        Trainer(config, toy_algorithm(nan_at=4), str(tmp_path)).run()
    assert os.listdir(tmp_path / "checkpoints") == ["20"]


@pytest.mark.parametrize(
    "phases, message",
    [
        (dict(train=dict(unit="iterations", duration=1, hooks=("colect",))), "not one of"),
        (dict(train=dict(unit="steps", duration=1, hooks=("collect",))), "unit"),
        (dict(train=dict(unit="iterations", duration=0, hooks=("collect",))), "> 0"),
        (dict(train=dict(unit="updates", duration=5, hooks=("collect",))), "advance updates"),
        (dict(train=dict(unit="iterations", duration=1, hooks=("imagine",))), "does not provide"),
    ],
)
def test_bad_phase_config_fails_early(tmp_path, phases, message):
    with pytest.raises(ValueError, match=message):
        Trainer(toy_config(**phases), toy_algorithm(), str(tmp_path))
    assert not os.path.exists(tmp_path / "checkpoints")
