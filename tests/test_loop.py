"""The loop with toy algorithms: phases, named counters, passed data, clocks, checkpoints,
resume (also mid-cycle), signals, early phase ends, media metrics, timing and guards."""

import glob
import os
import signal
import struct
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwm.config import ConfigError, base_config
from jaxwm.loop import metrics as metrics_module
from jaxwm.loop.algorithm import Algorithm, Hook
from jaxwm.loop.checkpoint import IncompatibleCheckpointError, config_differences
from jaxwm.loop.metrics import Histogram, Image, MetricWindow, Video, read_jsonl
from jaxwm.loop.phases import Clock, Scheduler, phases_from_config
from jaxwm.loop.trainer import Trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def toy_config(**phase_overrides):
    c = base_config()
    c.algo = "toy"
    c.eval.every = "never"
    c.eval.at_end = False
    c.log.progress = False
    c.log.every = "10 env_steps"
    c.checkpoint.every = "1000 env_steps"
    c.phase_order = ("warmup", "train")
    c.phases.warmup = dict(unit="env_steps", duration=20, hooks=("collect",))
    c.phases.train = dict(unit="iterations", duration=3, hooks=("collect", "update_agent:2"))
    for name, value in phase_overrides.items():
        c.phases[name] = value
    return c


def toy_algorithm(calls=None, interrupt_at=None, nan_at=None, fail_at=None, width=3):
    """Deterministic given keys. ``collect`` draws noise and passes it on as ``batch``;
    ``update_agent`` folds the batch in and shrinks. Records the call order."""
    calls = [] if calls is None else calls

    def collect(state, data, key):
        calls.append("collect")
        if interrupt_at is not None and len(calls) == interrupt_at:
            os.kill(os.getpid(), signal.SIGINT)
        if fail_at is not None and len(calls) == fail_at:
            raise RuntimeError("a crash")
        noise = jax.random.normal(key, state["w"].shape)
        w = state["w"] + noise
        return ({"w": w, "n": state["n"] + 1}, {"batch": noise},
                {"charts/episodic_return": jnp.sum(w)})

    def update(state, data, key):
        calls.append("update_agent")
        if interrupt_at is not None and len(calls) == interrupt_at:
            os.kill(os.getpid(), signal.SIGINT)
        loss = jnp.sum(state["w"] ** 2)
        if nan_at is not None and len(calls) >= nan_at:
            loss = jnp.nan
        w = 0.9 * state["w"] + 0.01 * data["batch"] + 0.001 * jax.random.normal(key, (width,))
        return {"w": w, "n": state["n"]}, {}, {"losses/loss": loss}

    return Algorithm(
        name="toy",
        init=lambda key: {"w": jax.random.normal(key, (width,)), "n": jnp.zeros((), jnp.int32)},
        hooks={"collect": Hook(collect, counts={"env_steps": 10}, writes=("batch",)),
               "update_agent": Hook(update, counts={"agent_updates": 1}, reads=("batch",))},
    )


def updates_only_algorithm(calls=None, interrupt_at=None, width=3):
    """An offline toy: no env steps, three self-contained update hooks."""
    calls = [] if calls is None else calls

    def make(name, scale):
        def fn(state, data, key):
            calls.append(name)
            if interrupt_at is not None and len(calls) == interrupt_at:
                os.kill(os.getpid(), signal.SIGTERM)
            rng, noise_key = jax.random.split(state["rng"])
            w = scale * state["w"] + jax.random.normal(key, state["w"].shape) \
                + 0.1 * jax.random.normal(noise_key, state["w"].shape)
            return ({"w": w, "n": state["n"] + 1, "rng": rng}, {},
                    {f"losses/{name}": jnp.sum(w ** 2)})
        return fn

    return Algorithm(
        name="offline-toy",
        init=lambda key: {"w": jax.random.normal(key, (width,)), "n": jnp.zeros((), jnp.int32),
                          "rng": jax.random.key(7)},  # a typed key in the checkpointed state
        hooks={"update_model": Hook(make("update_model", 0.5), counts={"model_updates": 1}),
               "update_agent": Hook(make("update_agent", 0.7), counts={"agent_updates": 1})},
        predicates={"n_at_least_4": lambda state: state["n"] >= 4},
    )


def offline_config(**overrides):
    c = toy_config()
    c.log.every = "5 model_updates, 5 agent_updates"
    c.log.x_axis = "iterations"
    c.checkpoint.every = "4 model_updates, 4 agent_updates"
    c.checkpoint.keep = 100
    c.phase_order = ("models", "agent")
    c.phases = dict(models=dict(unit="model_updates", duration=12, hooks=("update_model:3",)),
                    agent=dict(unit="agent_updates", duration=10, hooks=("update_agent",)))
    for name, value in overrides.items():
        c.phases[name] = value
    return c


def steps_of(path):
    return sorted(int(s) for s in os.listdir(path))


def test_scheduler_walks_phases_and_keeps_its_position():
    phases = phases_from_config(toy_config())
    assert [p.name for p in phases] == ["warmup", "train"]
    assert phases[1].hooks == (("collect", 1), ("update_agent", 2))
    sched = Scheduler(phases, toy_algorithm())
    assert sched.units == ("env_steps", "agent_updates", "iterations")
    assert sched.planned_total("env_steps") == 50 and sched.planned_total("agent_updates") == 6
    order = []
    while not sched.finished:
        phase, hook = sched.next_call()
        order.append((phase.name, hook))
        sched.record(hook)
        if len(order) == 3:  # inside the first train cycle: a copy resumes at the same position
            saved = sched.state_dict()
            assert saved["cycle"] == {"phase": "train", "position": 1, "done": [("collect", 1)]}
            assert sched.live_inputs() == {"batch"}
    assert order == [("warmup", "collect")] * 2 + [("train", "collect"), ("train", "update_agent"),
                                                   ("train", "update_agent")] * 3
    assert sched.totals == {"env_steps": 50, "agent_updates": 6, "iterations": 5}
    assert sched.calls == 11
    # The trainer never saves there: the rest of the cycle reads the collect's batch.
    with pytest.raises(ConfigError, match=r"reads \['batch'\], written before the stop"):
        Scheduler(phases_from_config(toy_config()), toy_algorithm()).load_state_dict(saved)
    # Where nothing is passed, a copy continues mid-cycle at the same position.
    offline = Scheduler(phases_from_config(offline_config()), updates_only_algorithm())
    for _ in range(4):
        offline.record(offline.next_call()[1])
    copy = Scheduler(phases_from_config(offline_config()), updates_only_algorithm())
    copy.load_state_dict(offline.state_dict())
    assert copy.cycle == (0, 1) and copy.calls == 4 and copy.totals["model_updates"] == 4
    assert copy.planned_total("model_updates") == 12 and copy.planned_total("agent_updates") == 10
    # Lengthening a finished phase (a resumed run with a bigger budget) reopens it.
    sched.phases[1] = phases_from_config(toy_config(
        train=dict(unit="iterations", duration=4, hooks=("collect", "update_agent:2"))))[1]
    assert not sched.finished and sched.current.name == "train"


def test_clock_parsing_and_marks():
    clock = Clock.parse("10_000 env_steps, 5 model_updates", "log.every")
    assert clock.every == ((10_000, "env_steps"), (5, "model_updates"))
    assert clock.marks({"env_steps": 25_000, "model_updates": 7}) == (2, 1)
    assert Clock.parse("never", "eval.every").every == ()
    for bad in ("10000", "ten env_steps", "0 env_steps", "5 env_steps; 3 x"):
        with pytest.raises(ConfigError, match="N unit"):
            Clock.parse(bad, "log.every")


def test_loop_runs_phases_and_writes_outputs(tmp_path):
    calls = []
    summary = Trainer(toy_config(), toy_algorithm(calls), str(tmp_path)).run()
    # warmup: 2 collects (20 env steps); train: 3 x (collect, update, update).
    assert calls == ["collect"] * 2 + ["collect", "update_agent", "update_agent"] * 3
    assert summary["env_steps"] == 50 and summary["agent_updates"] == 6
    assert not summary["interrupted"]
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [10, 20, 30, 40, 50]
    assert all("charts/SPS" in r for r in rows) and "losses/loss" in rows[-1]
    assert rows[-1]["counters/agent_updates"] == 6 and rows[-1]["counters/iterations"] == 5
    assert (tmp_path / "config.json").exists()
    assert os.path.exists(tmp_path / "learning_curve.png")
    assert steps_of(tmp_path / "checkpoints") == [11]  # 11 hook calls


def test_hook_timing_reports_each_hook_and_its_share(tmp_path):
    Trainer(toy_config(), toy_algorithm(), str(tmp_path)).run()
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    first = {k for r in rows for k in r if k.startswith("time/first_call/")}
    assert first == {"time/first_call/collect", "time/first_call/update_agent"}
    timed = [r for r in rows if "time/update_agent" in r]
    assert timed and all(r["time/update_agent"] > 0 for r in timed)
    for r in rows:
        shares = [v for k, v in r.items() if k.endswith("_fraction")]
        assert all(0 < s for s in shares) and sum(shares) <= 1.0 + 1e-9, r


class StateReadingEvaluator:
    """Stands in for ``loop.evaluate.Evaluator``: reading the state waits for queued work."""

    def run(self, state, key):
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

    def collect(state, data, key):
        return {"w": slow(state["w"])}, {}, {}

    algo = Algorithm(name="slow", init=lambda key: {"w": w0},
                     hooks={"collect": Hook(collect, counts={"env_steps": 10})})
    c = toy_config()
    c.phase_order = ("warmup",)
    c.phases.warmup = dict(unit="env_steps", duration=60, hooks=("collect",))
    c.eval.every = "10 env_steps"
    Trainer(c, algo, str(tmp_path), evaluator=StateReadingEvaluator()).run()
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [10, 20, 30, 40, 50, 60]
    true_sps = 10 / per_call  # one 10-step collect per window
    assert max(r["charts/SPS"] for r in rows) < 2.5 * true_sps, (rows, true_sps)


def test_sigint_waits_for_passed_data_then_resume_matches_uninterrupted(tmp_path):
    straight = Trainer(toy_config(), toy_algorithm(), str(tmp_path / "a"))
    straight.run()

    # Call 3 is the first train collect: its batch is still to be read by both updates, so
    # the loop runs them before saving (a checkpoint cannot hold passed data).
    calls = []
    interrupted = Trainer(toy_config(), toy_algorithm(calls, interrupt_at=3), str(tmp_path / "b"))
    summary = interrupted.run()
    assert summary["interrupted"] and summary["env_steps"] == 30
    assert calls == ["collect"] * 3 + ["update_agent"] * 2
    assert steps_of(tmp_path / "b" / "checkpoints") == [5]

    config = toy_config()
    config.resume = True
    resumed = Trainer(config, toy_algorithm(), str(tmp_path / "b"))
    summary = resumed.run()
    assert summary["env_steps"] == 50 and not summary["interrupted"]
    np.testing.assert_array_equal(resumed.state["w"], straight.state["w"])
    assert int(resumed.state["n"]) == int(straight.state["n"]) == 5


def test_offline_phases_log_checkpoint_and_stop_mid_cycle_then_resume_exactly(tmp_path):
    straight_calls = []
    straight = Trainer(offline_config(), updates_only_algorithm(straight_calls), str(tmp_path / "a"))
    summary = straight.run()
    assert summary["model_updates"] == 12 and summary["agent_updates"] == 10
    assert "env_steps" not in summary["counters"]
    rows = read_jsonl(tmp_path / "a" / "metrics.jsonl")
    # Logs every 5 updates of either kind, and at the end of each phase; x-axis: iterations.
    assert [(r["counters/model_updates"], r["counters/agent_updates"]) for r in rows] == [
        (5, 0), (10, 0), (12, 0), (12, 5), (12, 10)]
    assert [r["step"] for r in rows] == [1, 3, 4, 9, 14]
    assert "charts/model_updates_per_s" in rows[0] and "charts/SPS" not in rows[0]
    # A rate only where its counter moved in the window (not a misleading 0).
    assert "charts/agent_updates_per_s" in rows[3] and "charts/model_updates_per_s" not in rows[3]
    # Periodic checkpoints in an offline phase (every 4 updates; step = hook calls).
    assert steps_of(tmp_path / "a" / "checkpoints") == [4, 8, 12, 16, 20, 22]

    # SIGTERM at call 5: the second call of the second 3-call model cycle. Nothing is
    # passed between these hooks, so the loop saves right there, mid-cycle.
    calls = []
    first = Trainer(offline_config(), updates_only_algorithm(calls, interrupt_at=5),
                    str(tmp_path / "b"))
    assert first.run()["interrupted"]
    assert steps_of(tmp_path / "b" / "checkpoints")[-1] == 5
    config = offline_config()
    config.resume = True
    resumed = Trainer(config, updates_only_algorithm(calls), str(tmp_path / "b"))
    resumed.run()
    assert calls == straight_calls
    np.testing.assert_array_equal(resumed.state["w"], straight.state["w"])


def test_resume_continues_a_cycle_only_with_the_hooks_it_began_with(tmp_path):
    Trainer(offline_config(), updates_only_algorithm(interrupt_at=5), str(tmp_path)).run()
    before = steps_of(tmp_path / "checkpoints")
    config = offline_config(models=dict(unit="model_updates", duration=12,
                                        hooks=("update_agent", "update_model:3")))
    config.resume = True
    with pytest.raises(ConfigError, match=r"after \['update_model:2'\].*would "
                                          r"have begun \['update_agent', 'update_model'\]"):
        Trainer(config, updates_only_algorithm(), str(tmp_path)).run()
    assert steps_of(tmp_path / "checkpoints") == before
    # Hooks appended after the saved position are fine: the cycle goes on with them.
    config = offline_config(models=dict(unit="model_updates", duration=12,
                                        hooks=("update_model:3", "update_agent")))
    config.resume = True
    calls = []
    Trainer(config, updates_only_algorithm(calls), str(tmp_path)).run()
    assert calls[:2] == ["update_model", "update_agent"]


def test_a_phase_the_run_has_moved_past_does_not_reopen(tmp_path):
    Trainer(offline_config(), updates_only_algorithm(), str(tmp_path)).run()
    config = offline_config(models=dict(unit="model_updates", duration=30, hooks=("update_model:3",)),
                            agent=dict(unit="agent_updates", duration=12, hooks=("update_agent",)))
    config.resume = True
    calls = []
    summary = Trainer(config, updates_only_algorithm(calls), str(tmp_path)).run()
    assert calls == ["update_agent"] * 2 and summary["model_updates"] == 12


def test_a_signal_during_the_last_call_still_finishes_the_run(tmp_path):
    summary = Trainer(offline_config(), updates_only_algorithm(interrupt_at=22),
                      str(tmp_path)).run()
    assert not summary["interrupted"] and summary["agent_updates"] == 10


def test_a_stop_does_not_wait_for_a_due_evaluation(tmp_path):
    runs = []

    class CountingEvaluator:
        def run(self, state, key):
            runs.append(1)
            return {}

    config = toy_config()
    config.eval.every = "10 env_steps"
    config.eval.at_end = True
    trainer = Trainer(config, toy_algorithm(interrupt_at=1), str(tmp_path),
                      evaluator=CountingEvaluator())
    assert trainer.run()["interrupted"] and runs == []


def test_rows_logged_after_the_last_checkpoint_are_not_repeated_on_resume(tmp_path):
    config = toy_config()
    config.checkpoint.every = "30 env_steps"
    with pytest.raises(RuntimeError, match="a crash"):  # at call 9, after the row at step 40
        Trainer(config, toy_algorithm(fail_at=9), str(tmp_path)).run()
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [10, 20, 30, 40]
    config.resume = True
    Trainer(config, toy_algorithm(), str(tmp_path)).run()  # from the checkpoint at step 30
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [10, 20, 30, 40, 50]


def test_unreadable_config_json_and_old_checkpoints_are_one_line_errors(tmp_path):
    Trainer(toy_config(), toy_algorithm(), str(tmp_path / "a")).run()
    with open(tmp_path / "a" / "config.json", "r+") as f:
        f.truncate(20)
    config = toy_config()
    config.resume = True
    with pytest.raises(IncompatibleCheckpointError, match="Cannot read .*config.json"):
        Trainer(config, toy_algorithm(), str(tmp_path / "a"))

    import orbax.checkpoint as ocp  # a checkpoint in the first layout: one unnamed pytree

    manager = ocp.CheckpointManager(str(tmp_path / "b" / "checkpoints"))
    manager.save(50, args=ocp.args.StandardSave({"w": jnp.zeros(3)}))
    manager.wait_until_finished()
    with pytest.raises(IncompatibleCheckpointError, match="written by an older jaxwm"):
        Trainer(config, toy_algorithm(), str(tmp_path / "b")).run()


def test_a_checkpoint_of_the_layout_before_the_acting_layer_says_how_to_continue(
        tmp_path, monkeypatch):
    from jaxwm.loop import checkpoint

    monkeypatch.setattr(checkpoint, "LAYOUT_VERSION", 2)  # as jaxwm wrote them until d78b67a
    Trainer(toy_config(), toy_algorithm(), str(tmp_path)).run()
    monkeypatch.undo()
    config = toy_config()
    config.resume = True
    with pytest.raises(IncompatibleCheckpointError) as error:
        Trainer(config, toy_algorithm(), str(tmp_path)).run()
    message = str(error.value)
    assert "layout 2, written by jaxwm up to commit d78b67a" in message
    assert "git checkout d78b67a" in message and "nothing was changed" in message
    assert "\n" not in message


def test_phase_ends_early_when_the_algorithm_says_so_and_stays_ended(tmp_path):
    config = offline_config(models=dict(unit="model_updates", duration=300,
                                        hooks=("update_model:3",), until="n_at_least_4"))
    calls = []
    summary = Trainer(config, updates_only_algorithm(calls), str(tmp_path)).run()
    # Read once per cycle: after cycle 2 (n = 6 >= 4), not after call 4.
    assert calls == ["update_model"] * 6 + ["update_agent"] * 10
    assert summary["model_updates"] == 6
    config.resume = True
    again = Trainer(config, updates_only_algorithm(calls), str(tmp_path)).run()
    assert again["model_updates"] == 6 and len(calls) == 16  # the ended phase did not reopen


# Restoring a damaged checkpoint leaves an orbax/tensorstore background callback that reports
# "Event loop is closed" at garbage collection; the resume itself is what this test checks.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_unreadable_latest_checkpoints_fall_back_and_are_kept(tmp_path, capsys):
    straight = Trainer(offline_config(), updates_only_algorithm(), str(tmp_path / "a"))
    straight.run()

    first = Trainer(offline_config(), updates_only_algorithm(interrupt_at=13), str(tmp_path / "b"))
    first.run()
    checkpoints = tmp_path / "b" / "checkpoints"
    assert steps_of(checkpoints) == [4, 8, 12, 13]
    for data_file in glob.glob(str(checkpoints / "13" / "algo" / "**" / "d" / "*"), recursive=True):
        with open(data_file, "r+b") as f:
            f.truncate(3)  # as a disk filling up mid-write would leave it
    os.remove(checkpoints / "12" / "algo" / "_METADATA")  # as an interrupted copy would leave it
    config = offline_config()
    config.resume = True
    resumed = Trainer(config, updates_only_algorithm(), str(tmp_path / "b"))
    resumed.run()
    out = capsys.readouterr().out
    assert "13 (" in out and "12 (" in out and "could not be read" in out and "step 8" in out
    # Kept, not deleted; and out of the way of the resumed run's own checkpoints 12 and 13.
    assert sorted(os.listdir(tmp_path / "b" / "unreadable_checkpoints")) == ["12", "13"]
    np.testing.assert_array_equal(resumed.state["w"], straight.state["w"])


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


def test_a_run_of_another_algorithm_is_refused_in_one_line(tmp_path):
    """A workdir holding a ppo run, started or resumed with dreamer's config: the refusal
    names both algorithms in one line instead of listing every key the two configs differ
    in; a same-algorithm mismatch keeps its listing."""
    import json

    import orbax.checkpoint as ocp

    from jaxwm.config import load
    from jaxwm.loop.checkpoint import Checkpointer, config_to_json_dict

    manager = ocp.CheckpointManager(str(tmp_path / "checkpoints"))
    manager.save(50, args=ocp.args.StandardSave({"w": jnp.zeros(3)}))
    manager.wait_until_finished()
    with open(tmp_path / "config.json", "w") as f:
        json.dump(config_to_json_dict(load("ppo:tiny")), f)
    checkpointer = Checkpointer(str(tmp_path), keep=1)
    for resume in (True, False):
        with pytest.raises(IncompatibleCheckpointError) as error:
            checkpointer.check_can_start(load("dreamer:tiny", {"resume": resume}), resume)
        message = str(error.value)
        assert "\n" not in message and len(message) < 300, message
        assert f"{tmp_path} holds a ppo run" in message and "dreamer's" in message
        assert "another --workdir" in message and "nothing was changed" in message
    with pytest.raises(IncompatibleCheckpointError, match="env.num_envs: saved 4, now 8\n"):
        checkpointer.check_can_start(load("ppo:tiny", {"resume": True, "env.num_envs": 8}),
                                     True)


def test_resume_with_mismatched_state_is_refused_and_kept(tmp_path):
    Trainer(toy_config(), toy_algorithm(width=3), str(tmp_path)).run()
    config = toy_config()
    config.resume = True
    config.phases.train.duration = 5  # extending a run is allowed; the state shape is not
    trainer = Trainer(config, toy_algorithm(width=4), str(tmp_path))
    with pytest.raises(IncompatibleCheckpointError, match=r"does not match.*w: saved \(\(3,\)"):
        trainer.run()
    assert steps_of(tmp_path / "checkpoints") == [11]
    assert not os.path.exists(tmp_path / "unreadable_checkpoints")


def test_nan_loss_stops_without_saving_bad_state(tmp_path):
    config = toy_config()
    config.checkpoint.every = "20 env_steps"
    with pytest.raises(FloatingPointError, match="losses/loss"):
        Trainer(config, toy_algorithm(nan_at=4), str(tmp_path)).run()
    assert steps_of(tmp_path / "checkpoints") == [2]


def test_unwritable_workdir_is_a_one_line_error(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigError, match="cannot be written"):
        Trainer(toy_config(), toy_algorithm(), str(blocker / "run"))
    cli = subprocess.run([sys.executable, "-m", "jaxwm.train", "--config=ppo:cartpole",
                          f"--workdir={blocker}/run", "--config.log.progress=False"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert cli.returncode == 1 and "cannot be written" in cli.stderr
    assert "Traceback" not in cli.stderr


def read_tensorboard(workdir):
    """{tag: kinds} from the event files (TFRecord framing: length, crc, event, crc)."""
    from tensorboardX.proto import event_pb2

    kinds = {}
    for path in glob.glob(os.path.join(workdir, "events.out.tfevents.*")):
        data = open(path, "rb").read()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset:offset + 8])
            event = event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
            offset += 16 + length
            for value in event.summary.value:
                kinds.setdefault(value.tag, set()).add(value.WhichOneof("value"))
    return kinds


def test_videos_images_and_histograms_reach_tensorboard_as_what_they_are(tmp_path):
    def collect(state, data, key):
        frames = jax.random.uniform(key, (6, 16, 16, 3))
        return state, {}, {"model/prediction": Video(frames, fps=10),
                           "model/frame": Image(frames[0]),
                           "model/errors": Histogram(jax.random.normal(key, (100,))),
                           "charts/episodic_return": jnp.float32(1.0)}

    algo = Algorithm(name="media", init=lambda key: {"w": jnp.zeros(())},
                     hooks={"collect": Hook(jax.jit(collect), counts={"env_steps": 5})})
    c = toy_config()
    c.phase_order = ("warmup",)
    c.phases.warmup = dict(unit="env_steps", duration=20, hooks=("collect",))
    Trainer(c, algo, str(tmp_path)).run()
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert rows[0]["model/prediction"] == "videos/model_prediction_10.gif"
    assert rows[0]["model/frame"] == "images/model_frame_10.png"
    assert "model/errors" not in rows[0] and rows[0]["charts/episodic_return"] == 1.0
    gif = open(tmp_path / rows[1]["model/prediction"], "rb").read()
    assert gif[:6] == b"GIF89a"
    import imageio.v3 as iio
    assert iio.imread(tmp_path / rows[1]["model/prediction"], index=None).shape[0] == 6
    kinds = read_tensorboard(tmp_path)
    assert kinds["model/prediction"] == {"image"} and kinds["model/frame"] == {"image"}
    assert kinds["model/errors"] == {"histo"} and kinds["charts/episodic_return"] == {"simple_value"}


def test_metrics_are_fetched_once_per_window(monkeypatch):
    fetches = []
    real = jax.device_get
    monkeypatch.setattr(metrics_module.jax, "device_get",
                        lambda tree: fetches.append(1) or real(tree))
    window = MetricWindow()
    for i in range(50):
        window.add({"losses/a": jnp.float32(i), "losses/b": jnp.arange(3.0) + i})
    assert window.nonfinite("losses/") == []
    out = window.flush()
    assert len(fetches) == 1
    assert out["losses/a"] == pytest.approx(24.5) and out["losses/b"] == pytest.approx(25.5)


def test_read_only_data_is_passed_not_checkpointed(tmp_path):
    dataset = jnp.arange(2_000_000, dtype=jnp.float32)  # 8 MB
    seen = []

    @jax.jit
    def _update(state, data, key):
        idx = jax.random.randint(key, (), 0, data["dataset"].shape[0])
        return {"w": state["w"] + data["dataset"][idx]}, {}, {}

    def update(state, data, key):
        seen.append(data["dataset"])
        return _update(state, data, key)

    algo = Algorithm(name="offline", init=lambda key: {"w": jnp.zeros(())},
                     data={"dataset": dataset},
                     hooks={"update_agent": Hook(update, counts={"agent_updates": 1},
                                                 reads=("dataset",))})
    c = toy_config()
    c.log.every = "2 agent_updates"
    c.log.x_axis = "agent_updates"
    c.checkpoint.every = "2 agent_updates"
    c.phase_order = ("train",)
    c.phases = dict(train=dict(unit="agent_updates", duration=4, hooks=("update_agent",)))
    Trainer(c, algo, str(tmp_path)).run()
    assert len(seen) == 4 and all(d is dataset for d in seen)
    size = sum(os.path.getsize(p) for p in glob.glob(str(tmp_path / "checkpoints" / "**"),
                                                      recursive=True) if os.path.isfile(p))
    assert size < 1_000_000  # the 8 MB dataset is not in any checkpoint


@pytest.mark.parametrize(
    "phases, message",
    [
        (dict(train=dict(unit="iterations", duration=1, hooks=("colect",))),
         "'colect' is unknown.*Did you mean 'collect'"),
        (dict(train=dict(unit="steps", duration=1, hooks=("collect",))),
         "no hook of toy counts 'steps'"),
        (dict(train=dict(unit="iterations", duration=0, hooks=("collect",))), "> 0"),
        (dict(train=dict(unit="agent_updates", duration=5, hooks=("collect",))),
         "advance agent_updates"),
        (dict(train=dict(unit="iterations", duration=1, hooks=("update_agent",))),
         "reads 'batch'.*list it before"),
        (dict(train=dict(unit="iterations", duration=1, hooks=("collect",), until="done")),
         "predicate 'done' is unknown"),
        (dict(train=dict(unit="iterations", duration=1, hooks=("evaluate",))),
         "no policy to evaluate"),
    ],
)
def test_bad_phase_config_fails_early(tmp_path, phases, message):
    with pytest.raises(ConfigError, match=message):
        Trainer(toy_config(**phases), toy_algorithm(), str(tmp_path / "run"))
    assert not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize("field, value, message", [
    ("log.every", "100 updates", "log.every: no hook of toy counts 'updates'"),
    ("checkpoint.every", "100", "checkpoint.every='100': write 'N unit'"),
    ("log.x_axis", "env_step", "Did you mean 'env_steps'"),
])
def test_bad_clock_fails_early(tmp_path, field, value, message):
    config = toy_config()
    section, name = field.split(".")
    config[section][name] = value
    with pytest.raises(ConfigError, match=message):
        Trainer(config, toy_algorithm(), str(tmp_path / "run"))
    assert not os.path.exists(tmp_path / "run")


def test_algorithm_contract_rejects_reserved_names():
    with pytest.raises(ValueError, match="reserved|loop's evaluator"):
        Algorithm(name="x", init=lambda k: {}, hooks={"evaluate": Hook(lambda s, d, k: None)})
    with pytest.raises(ValueError, match="loop's own unit"):
        Hook(lambda s, d, k: None, counts={"iterations": 1})


def test_a_key_added_after_the_run_started_differs_only_off_its_default():
    """Resuming a run saved before the library grew env.batch_size: the default is no change;
    any other value is."""
    saved = {"env": {"id": "CartPole-v1"}, "seed": 1}
    assert config_differences(saved, {"env": {"id": "CartPole-v1", "batch_size": 0}, "seed": 1}) == []
    assert config_differences(saved, {"env": {"id": "CartPole-v1", "batch_size": 4}, "seed": 1}) == [
        "env.batch_size: saved '<absent>', now 4"]
    assert config_differences({**saved, "seed": 1}, {"env": {"id": "CartPole-v1"}, "seed": 2})
    # The same for the network block's keys (a GRU run saved before rnn.head_hidden existed).
    old = {"network": {"backbone": "gru", "rnn": {"hidden": 64}}}
    new = lambda heads: {"network": {"backbone": "gru", "rnn": {"hidden": 64,  # noqa: E731
                                                                "head_hidden": heads}}}
    assert config_differences(old, new([])) == []
    assert config_differences(old, new([512, 512])) == [
        "network.rnn.head_hidden: saved '<absent>', now [512, 512]"]


def test_a_new_name_linked_to_a_saved_setting_is_no_difference():
    """DreamerV3's ``model_size`` was added as a second name of ``dreamer.model_size`` (one
    FieldReference): a run saved before it resumes when the saved setting has the same value,
    and not when it differs."""
    from jaxwm.config import load
    from jaxwm.loop.checkpoint import config_to_json_dict, linked_keys

    config = load("dreamer:cartpole")
    linked = linked_keys(config)
    assert linked["model_size"] == ["dreamer.model_size"]
    assert "ppo.anneal_env_steps" not in linked_keys(load("ppo:cartpole"))  # derived
    current = config_to_json_dict(config)
    saved = {**current, "dreamer": dict(current["dreamer"])}
    del saved["model_size"]  # as written before the name existed
    assert config_differences(saved, current, linked) == []
    saved["dreamer"]["model_size"] = "12m"
    assert config_differences(saved, current, linked) == [
        "dreamer.model_size: saved '12m', now '1m'", "model_size: saved '<absent>', now '1m'"]


def test_processes_preparing_one_workdir_at_once_do_not_trip_over_each_other(tmp_path):
    """Every process of a multi-process run proves the workdir writable at start; with one
    shared probe-file name one process could delete another's probe (FileNotFoundError, seen
    in the 2-process test)."""
    import threading

    from jaxwm.loop.checkpoint import prepare_workdir

    errors = []

    def prepare_many():
        try:
            for _ in range(300):
                prepare_workdir(str(tmp_path / "run"))
        except Exception as e:  # noqa: BLE001 - any error is the failure
            errors.append(e)

    threads = [threading.Thread(target=prepare_many) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert os.listdir(tmp_path / "run") == []  # no probe left behind


def test_wandb_offline_logs_the_run_and_a_resume_continues_the_same_run(tmp_path):
    """``log.wandb.project`` set: an offline W&B run under <workdir>/wandb with the config,
    the scalars at the x-axis and media; the resumed run reopens the same run id."""
    pytest.importorskip("wandb")

    def collect(state, data, key):
        frames = jax.random.uniform(key, (4, 8, 8, 3))
        return state, {}, {"model/prediction": Video(frames, fps=10),
                           "charts/episodic_return": jnp.float32(2.0)}

    def algorithm():
        return Algorithm(name="media", init=lambda key: {"w": jnp.zeros(())},
                         hooks={"collect": Hook(collect, counts={"env_steps": 5})})

    config = toy_config()
    config.phase_order = ("warmup",)
    config.phases.warmup = dict(unit="env_steps", duration=20, hooks=("collect",))
    config.log.wandb.project = "jaxwm-test"
    config.checkpoint.every = "10 env_steps"
    Trainer(config, algorithm(), str(tmp_path)).run()
    run_id = open(tmp_path / "wandb_run_id").read().strip()
    (first,) = glob.glob(str(tmp_path / "wandb" / f"offline-run-*-{run_id}"))
    assert glob.glob(os.path.join(first, "*.wandb"))
    assert glob.glob(os.path.join(first, "files", "media", "videos", "**", "*.gif"),
                     recursive=True)  # the loop's GIF, as W&B media

    config.phases.warmup = dict(unit="env_steps", duration=30, hooks=("collect",))
    config.resume = True
    Trainer(config, algorithm(), str(tmp_path)).run()
    assert open(tmp_path / "wandb_run_id").read().strip() == run_id
    runs = glob.glob(str(tmp_path / "wandb" / "offline-run-*"))
    assert len(runs) == 2 and all(r.endswith(run_id) for r in runs)
    (run,) = _wandb_runs(tmp_path).values()  # one seed: one run, its charts against env steps
    assert run["ids"] == {run_id} and "seed_index" not in run["config"]
    assert run["metrics"] == {("counters/env_steps", ""), ("*", "counters/env_steps")}
    assert sorted(r["_step"] for r in run["history"]) == [10, 20, 30]
    # jaxwm.report's columns: training wall time runs on across the resume; progress is of
    # the run's plan at the time (20 steps, then 30 after the resume lengthened it)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    walls = [r["charts/wall_seconds"] for r in rows]
    assert [r["step"] for r in rows] == [10, 20, 30] and walls == sorted(walls) and walls[0] > 0
    assert [r["charts/progress"] for r in rows] == [0.5, 1.0, 1.0]  # of the plan at the time


def test_wandb_without_the_package_is_a_one_line_error(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_wandb(name, *args, **kwargs):
        if name == "wandb":
            raise ImportError("No module named 'wandb'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    from jaxwm.loop.wandb_sink import check_config

    config = toy_config()
    assert check_config(config) is None  # off: nothing is imported
    config.log.wandb.project = "p"
    assert "pip install 'jaxwm[wandb]'" in check_config(config)
    config.log.wandb.mode = "sometimes"
    assert "log.wandb.mode must be one of" in check_config(config)


def _wandb_runs(workdir) -> dict:
    """The offline W&B runs under ``<workdir>/wandb``, read back from their ``.wandb`` files
    (W&B's protobuf ``Record``s in LevelDB's log format: 32 KiB blocks of chunks, each after
    a 7-byte header of checksum, length and type), by display name: id, group, config,
    ``define_metric``s as (name or glob, step metric) and history rows. A resumed run's
    files add to its entry. ``run.finish()`` may return before W&B's service has written
    the run's file (seen with several runs in one process): ``wandb.teardown()`` waits."""
    import json

    import wandb
    from wandb.proto import wandb_internal_pb2

    wandb.teardown()
    runs, block = {}, 32768
    for path in sorted(glob.glob(os.path.join(workdir, "wandb", "offline-run-*", "*.wandb"))):
        data = open(path, "rb").read()
        assert data[:4] == b":W&B"
        records, pos, chunk = [], 7, b""
        while pos + 7 <= len(data):
            if block - pos % block < 7:  # a block's tail too short for a header: padding
                pos += block - pos % block
                continue
            _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
            if kind == 0:
                break
            chunk, pos = chunk + data[pos + 7:pos + 7 + length], pos + 7 + length
            if kind in (1, 4):  # a whole record, or its last chunk
                records.append(wandb_internal_pb2.Record.FromString(chunk))
                chunk = b""

        def key(item):
            return item.key or "/".join(item.nested_key)

        kinds = [r.WhichOneof("record_type") for r in records]
        assert kinds.count("run") == 1 and kinds[-1] == "exit", (path, kinds)  # finished
        (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
        entry = runs.setdefault(run.display_name, {"ids": set(), "config": {}, "metrics": set(),
                                                   "history": []})
        entry["ids"].add(run.run_id)
        entry["group"] = run.run_group
        for record in records:
            kind = record.WhichOneof("record_type")
            if kind in ("run", "config"):
                updates = (record.run if kind == "run" else record).config.update
                entry["config"].update({key(u): json.loads(u.value_json) for u in updates})
            elif kind == "metric":
                entry["metrics"].add((record.metric.name or record.metric.glob_name,
                                      record.metric.step_metric))
            elif kind == "history":
                entry["history"].append({key(i): json.loads(i.value_json)
                                         for i in record.history.item})
    return runs


def test_wandb_seed_rows_hold_each_seeds_values_under_the_plain_names():
    from jaxwm.loop.wandb_sink import seed_row

    window = MetricWindow()
    window.add({"eval/episodic_return": metrics_module.PerSeed(np.array([1.0, 3.0])),
                "charts/episodic_return": metrics_module.PerSeed(np.array([np.nan, 5.0]))})
    row = {**window.flush(), "charts/SPS": 100.0, "counters/env_steps": 10.0,
           "model/prediction": "videos/model_prediction_10.gif"}
    assert "eval/episodic_return/seed_1" in row and "charts/episodic_return/seed_0" not in row
    shared = {"charts/SPS": 100.0, "counters/env_steps": 10.0}
    media = frozenset({"model/prediction"})
    assert seed_row(row, 0, media) == {  # seed 0 had no episodic return; the media are its
        "eval/episodic_return": 1.0, **shared,
        "model/prediction": "videos/model_prediction_10.gif"}
    assert seed_row(row, 1, media) == {"eval/episodic_return": 3.0,
                                       "charts/episodic_return": 5.0, **shared}


def test_wandb_logs_each_seed_as_a_run_of_one_group(tmp_path, monkeypatch):
    """The sink driven directly, real wandb offline: a 2-seed run's rows make two W&B runs in
    one group, named and configured per seed, each with its seed's values under the plain
    names, the shared values, and every metric plotted against the x-axis counter."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    config = toy_config()
    config.num_seeds = 2
    config.log.wandb.project = "jaxwm-test"
    workdir = tmp_path / "run"
    workdir.mkdir()
    writer = metrics_module.MetricWriter(str(workdir), config=config)
    for step in (10, 20):
        window = MetricWindow()
        window.add({"eval/episodic_return": metrics_module.PerSeed(np.array([step, -step]))})
        writer.write(step, {**window.flush(), "charts/SPS": 7.0,
                            "counters/env_steps": float(step)})
    writer.close()
    assert read_jsonl(workdir / "metrics.jsonl")[0]["eval/episodic_return/seed_1"] == -10.0

    runs = _wandb_runs(workdir)
    assert sorted(runs) == ["run_seed_0", "run_seed_1"]
    ids = open(workdir / "wandb_run_id").read().split()
    for k, sign in enumerate((1, -1)):
        run = runs[f"run_seed_{k}"]
        assert run["ids"] == {ids[k]} and run["group"] == "toy"
        assert run["config"]["seed_index"] == k and run["config"]["num_seeds"] == 2
        assert run["config"]["agent_seed"] == 1 + 8 * k  # seed + k * env.num_envs
        assert run["metrics"] == {("counters/env_steps", ""), ("*", "counters/env_steps")}
        rows = run["history"]
        assert [r["eval/episodic_return"] for r in rows] == [sign * 10.0, sign * 20.0]
        assert [r["_step"] for r in rows] == [r["counters/env_steps"] for r in rows] == [10, 20]
        assert all(r["charts/SPS"] == 7.0 for r in rows)
        assert not any("/seed_" in name for r in rows for name in r)


def test_wandb_two_seeds_of_a_run_resume_as_the_same_two_runs(tmp_path, monkeypatch):
    """End to end: a 2-seed Trainer run logs one offline W&B run per seed; the resumed run
    reopens both (``wandb_run_id`` holds one id per seed); the media go to seed 0's run."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))

    def collect(state, data, key):
        n = state["n"] + 1
        return {"n": n}, {}, {"charts/episodic_return": n * jnp.array([1.0, 10.0]),
                              "model/prediction": Video(jnp.zeros((2, 8, 8, 3)), fps=10)}

    def algorithm():
        return Algorithm(name="seeds", init=lambda key: {"n": jnp.zeros((2,))},
                         hooks={"collect": Hook(collect, counts={"env_steps": 5})})

    config = toy_config()
    config.num_seeds = 2
    config.phase_order = ("warmup",)
    config.phases.warmup = dict(unit="env_steps", duration=20, hooks=("collect",))
    config.log.wandb.project = "jaxwm-test"
    config.checkpoint.every = "10 env_steps"
    workdir = tmp_path / "run"
    Trainer(config, algorithm(), str(workdir)).run()
    ids = open(workdir / "wandb_run_id").read().split()
    assert len(ids) == 2
    config.phases.warmup = dict(unit="env_steps", duration=30, hooks=("collect",))
    config.resume = True
    Trainer(config, algorithm(), str(workdir)).run()
    assert open(workdir / "wandb_run_id").read().split() == ids

    runs = _wandb_runs(workdir)
    assert sorted(runs) == ["run_seed_0", "run_seed_1"]
    assert len(glob.glob(str(workdir / "wandb" / "offline-run-*"))) == 4  # 2 runs, 2 starts
    for k, scale in enumerate((1.0, 10.0)):
        run = runs[f"run_seed_{k}"]
        assert run["ids"] == {ids[k]} and run["group"] == "toy"
        rows = sorted(run["history"], key=lambda r: r["_step"])  # of both starts
        # n is 1, 2 | 3, 4 | 5, 6 in the windows ending at 10, 20, 30 env steps
        assert [r["counters/env_steps"] for r in rows] == [10, 20, 30]
        assert [r["charts/episodic_return"] for r in rows] == [1.5 * scale, 3.5 * scale,
                                                                5.5 * scale]
        assert all("charts/SPS" in r and "charts/progress" in r for r in rows)
        assert [r.get("model/prediction/_type") for r in rows] == (  # a W&B video's fields
            ["video-file"] * 3 if k == 0 else [None] * 3)
        assert ("*", "counters/env_steps") in run["metrics"]


# ----------------------------------------------------------------- the run's pieces, alone


def test_clocks_fire_once_per_crossing_of_any_of_their_intervals():
    from jaxwm.loop.trainer import Clocks

    clocks = Clocks({"log": Clock.parse("10 env_steps, 3 agent_updates", "log.every"),
                     "checkpoint": Clock.parse("never", "checkpoint.every")},
                    {"env_steps": 0, "agent_updates": 0})
    fired = [clocks.due("log", {"env_steps": e, "agent_updates": a})
             for e, a in ((5, 0), (10, 0), (12, 0), (12, 3), (25, 6), (25, 6))]
    assert fired == [False, True, False, True, True, False]
    assert not clocks.due("checkpoint", {"env_steps": 100, "agent_updates": 9})
    assert not clocks.due("eval", {"env_steps": 100, "agent_updates": 9})  # none configured


def test_a_log_row_counts_rates_without_evaluation_time(tmp_path, monkeypatch):
    """``RunLog.write``: the window's means, each counter's rate over the window's wall time
    less the evaluation time in it, the counters, and the window starts again."""
    from jaxwm.loop.metrics import MetricWriter
    from jaxwm.loop.trainer import RunLog

    algorithm = toy_algorithm()
    sched = Scheduler(phases_from_config(toy_config()), algorithm)

    class Bar:
        def set_postfix(self, *args, **kwargs):
            pass

        def close(self):
            pass

    run = RunLog(MetricWriter(str(tmp_path), x_axis="env_steps"), Bar(), sched, algorithm,
                 "env_steps", lambda: 0.0, lambda last, latest: {})
    monkeypatch.setattr(time, "perf_counter", lambda: 103.0)  # the window: 3 s
    run.window_start = (100.0, dict(sched.totals), 0)
    for _ in range(2):
        _, name = sched.next_call()
        sched.record(name)
    run.add({"losses/loss": jnp.float32(1.0)})
    run.add({"losses/loss": jnp.float32(3.0)})
    run.eval_seconds = 2.0
    assert run.pending()
    row = run.write()
    assert row["losses/loss"] == pytest.approx(2.0)
    assert row["charts/SPS"] == pytest.approx(20.0)  # 20 steps over 3 s less 2 s of evaluation
    assert row["counters/env_steps"] == 20.0 and not run.pending()
    assert run.eval_seconds == 0.0 and run.last["losses/loss"] == pytest.approx(2.0)
    run.close()


def test_a_hook_call_is_timed_once_per_window_and_counted_always():
    from jaxwm.loop.trainer import HookTimer, call_hook

    algorithm = toy_algorithm()
    timer = HookTimer()
    state = algorithm.init(jax.random.key(0))
    for i in range(3):
        state, outputs, metrics = call_hook(algorithm, "collect", state, {},
                                            jax.random.key(i), timer)
    assert set(outputs) == {"batch"} and "charts/episodic_return" in metrics
    timing = timer.flush(1.0)
    # The first call ever is reported apart (compile included), the second is the sample.
    assert set(timing) == {"time/first_call/collect", "time/collect", "time/collect_fraction"}
    assert 0 < timing["time/collect_fraction"] <= 1.0


def test_the_nan_check_reads_the_window_before_it_is_logged(tmp_path):
    """``Trainer._check_finite`` raises on a non-finite ``losses/*`` still in the window,
    naming the state not saved; other non-finite metrics are not losses."""
    from jaxwm.loop.trainer import RunLog

    trainer = Trainer(offline_config(), updates_only_algorithm(), str(tmp_path))
    run = RunLog.__new__(RunLog)
    run.window = MetricWindow()
    run.window.add({"charts/other": jnp.float32(jnp.nan)})
    trainer._check_finite(run)  # not a loss: no stop
    run.window.add({"losses/l": jnp.float32(jnp.inf)})
    with pytest.raises(FloatingPointError, match=r"Non-finite losses \['losses/l'\].*not saved"):
        trainer._check_finite(run)
    trainer.checkpointer.close()
    trainer.artifacts.close()


def test_zero_size_arrays_come_back_from_a_checkpoint_with_their_shapes(tmp_path):
    """orbax refuses to save an array with no elements; MJX's env state has some (a
    Playground env's ``Data.act`` of a model without activations), so the checkpointer leaves
    them out and restores them from the template."""
    from jaxwm.loop.checkpoint import Checkpointer

    state = {"weights": jnp.arange(3.0), "act": jnp.zeros((4, 0), jnp.float32),
             "inner": {"contacts": jnp.zeros((0,), jnp.int32), "qpos": jnp.ones(2)}}
    checkpointer = Checkpointer(str(tmp_path), keep=1)
    checkpointer.save(7, jax.tree.map(lambda x: x + 1, state), {"calls": 7})
    checkpointer.wait()
    restored, loop, step, unreadable = checkpointer.restore(state)
    checkpointer.close()
    assert step == 7 and loop["calls"] == 7 and not unreadable
    assert jax.tree.structure(restored) == jax.tree.structure(state)
    assert restored["act"].shape == (4, 0) and restored["inner"]["contacts"].dtype == jnp.int32
    np.testing.assert_array_equal(restored["weights"], [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(restored["inner"]["qpos"], [2.0, 2.0])
