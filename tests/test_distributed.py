"""Multi-process training on JAX's distributed runtime (``jaxwm.parallel``, ``jaxwm.launch``),
with 2 local processes over gloo on CPU, as a cluster would run them."""

import json
import os
import subprocess
import sys
import textwrap

import contract
import numpy as np
import pytest

from jaxwm import algos, launch
from jaxwm.loop.metrics import read_jsonl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

JOIN_SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {root!r})
    from jaxwm import parallel
    joined = parallel.maybe_initialize_distributed()  # before anything touches the backend
    import jax
    print(json.dumps(dict(joined=joined, initialized=jax.distributed.is_initialized(),
                          processes=jax.process_count(), primary=parallel.is_primary())))
""")


def _launch(python_args, num_processes, devices_per_process=0, timeout=600):
    processes = launch.spawn(python_args, num_processes, devices_per_process,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    outputs = contract.communicate_all(processes, timeout)
    return [p.returncode for p in processes], outputs


@pytest.mark.parametrize("codes, expected", [
    ((0, 0), 0), ((75, 75), 75), ((0, 75), 75),  # 75: a signal stopped them, each saved
    ((3, None), 3),  # a failure stops the process still running
    ((-9, None), 137),  # killed by SIGKILL: 128 + 9, as a shell reports it
])
def test_the_launcher_returns_a_failure_else_interrupted_else_success(codes, expected, capsys):
    from jaxwm import train

    assert launch.EXIT_INTERRUPTED == train.EXIT_INTERRUPTED == 75  # the status documented
    processes = launch.spawn(["-c", f"import os, sys, time; code = {codes!r}[int(os.environ["
                              "'JAX_PROCESS_ID'])]; code is None and time.sleep(60); code and "
                              "code < 0 and os.kill(os.getpid(), -code); sys.exit(code)"],
                             len(codes))
    assert launch.wait(processes) == expected
    assert all(p.wait(timeout=10) is not None for p in processes)  # the sleeper was killed
    if None in codes:
        assert f"process 0 exited with status {codes[0]}; stopped the other 1" in \
            capsys.readouterr().err


def test_joining_a_job_initialises_the_distributed_runtime_before_the_backend():
    codes, outputs = _launch(["-c", JOIN_SCRIPT.format(root=ROOT)], 1)
    assert codes == [0], outputs[0][1][-2000:]
    out = json.loads(outputs[0][0].strip().splitlines()[-1])
    assert out == dict(joined=True, initialized=True, processes=1, primary=True)


def test_each_process_gets_its_own_gpus_from_the_visible_list(monkeypatch):
    assert launch.process_gpus(1, 2, 1, None) == ["1"]
    assert launch.process_gpus(1, 2, 2, "4,5,6,7") == ["6", "7"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert launch.process_env(1, 2, "127.0.0.1:1", gpus_per_process=1)["CUDA_VISIBLE_DEVICES"] == "1"
    assert "CUDA_VISIBLE_DEVICES" not in launch.process_env(1, 2, "127.0.0.1:1")  # all GPUs


@pytest.mark.parametrize("flags, message", [
    (["--gpus_per_process=2"], "2 processes x 2 GPUs need 4 GPUs, but CUDA_VISIBLE_DEVICES lists 3"),
    (["--gpus_per_process=1", "--devices_per_process=2"], "exclude each other: pass one"),
])
def test_gpu_assignments_that_cannot_work_are_refused_before_a_process_starts(
        flags, message, monkeypatch, capsys):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    with pytest.raises(SystemExit) as stopped:
        launch.main(["--num_processes=2", *flags, "--", "--config=ppo:tiny"])
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err


def test_a_process_the_coordinator_does_not_expect_is_refused_in_one_line():
    env = launch.process_env(2, 2, f"127.0.0.1:{launch.free_port()}")
    proc = subprocess.run([sys.executable, "-m", "jaxwm.train", "--config=ppo:cartpole"],
                          env=env, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("jaxwm train: JAX_PROCESS_ID=2, but the coordinator expects "
                                   "JAX_NUM_PROCESSES=2 processes (ids 0..1): start exactly 2 "
                                   "processes, or raise JAX_NUM_PROCESSES.")


ROLLOUT_SCRIPT = textwrap.dedent("""
    import os, pickle, sys
    sys.path.insert(0, {root!r})
    import jax, jaxwm.config
    from jaxwm.algos import ppo as ppo_algo
    c = jaxwm.config.load("ppo:cartpole")
    algo = ppo_algo.build(c)
    state = algo.init(jax.random.PRNGKey(0))
    _, passed, _ = algo.hooks["collect"].fn(state, {{}}, jax.random.PRNGKey(1))
    with open({path!r}, "wb") as f:
        pickle.dump(jax.device_get(passed["rollout"]), f)
    algo.close()
""")

UPDATE_SCRIPT = textwrap.dedent("""
    import json, os, pickle, sys
    sys.path.insert(0, {root!r})
    from jaxwm import parallel
    parallel.maybe_initialize_distributed()
    import jax, numpy as np, jaxwm.config
    from jaxwm.algos import ppo as ppo_algo
    c = jaxwm.config.load("ppo:cartpole")
    algo = ppo_algo.build(c)
    state = algo.init(jax.random.PRNGKey(0))
    with open({path!r}, "rb") as f:
        rollout = pickle.load(f)
    # This process's envs are its slice of the one global rollout.
    n, p = c.env.num_envs // jax.process_count(), jax.process_index()
    local = jax.tree.map(lambda x: x[p * n:(p + 1) * n], rollout)
    state, _, metrics = algo.hooks["update_agent"].fn(state, {{"rollout": local}},
                                                      jax.random.PRNGKey(3))
    leaves = jax.tree.leaves(state.learner.params)
    if parallel.is_primary():
        print(json.dumps(dict(
            params=[np.asarray(x.addressable_shards[0].data).ravel().tolist() for x in leaves],
            devices=jax.device_count(), processes=jax.process_count(),
            spans=len(leaves[0].devices()), loss=float(metrics["losses/value_loss"]))))
    algo.close()
""")


def test_two_processes_of_two_devices_give_the_update_of_one_process_of_four(tmp_path):
    path = str(tmp_path / "rollout.pkl")
    subprocess.run([sys.executable, "-c", ROLLOUT_SCRIPT.format(root=ROOT, path=path)],
                   check=True, capture_output=True, timeout=300)
    script = UPDATE_SCRIPT.format(root=ROOT, path=path)
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=4")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    single = json.loads(proc.stdout.strip().splitlines()[-1])
    codes, outputs = _launch(["-c", script], 2, devices_per_process=2)
    assert codes == [0, 0], outputs[0][1][-3000:] + outputs[1][1][-3000:]
    multi = json.loads(outputs[0][0].strip().splitlines()[-1])
    assert (single["devices"], single["processes"]) == (4, 1)
    assert (multi["devices"], multi["processes"], multi["spans"]) == (4, 2, 4)
    # The same global batch over the same 4-way mesh: the all-reduce crosses processes, the
    # arithmetic does not change (float32 sums in another order at most).
    np.testing.assert_allclose(multi["loss"], single["loss"], rtol=1e-5)
    for a, b in zip(single["params"], multi["params"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _train(workdir, num_processes, *overrides):
    args = ["-m", "jaxwm.train", "--config=ppo:cartpole", f"--workdir={workdir}",
            "--config.log.progress=False", *overrides]
    return _launch(args, num_processes, devices_per_process=2)


@pytest.mark.slow  # ~1 min: two processes start, train, resume
def test_two_process_run_logs_once_resumes_and_refuses_another_process_count(tmp_path):
    workdir = tmp_path / "run"
    short = ("--config.total_env_steps=2048", "--config.ppo.anneal_env_steps=200192",
             "--config.eval.num_episodes=2", "--config.eval.num_envs=2")
    codes, outputs = _train(workdir, 2, *short)
    assert codes == [0, 0], outputs[0][1][-3000:]
    assert "Finished 2,048 env steps" in outputs[0][0] and "Finished" not in outputs[1][0]
    rows = read_jsonl(workdir / "metrics.jsonl")
    steps = [r["step"] for r in rows]
    assert steps == sorted(set(steps)) and steps[-1] == 2048  # one writer: each row once
    assert np.isfinite(rows[-1]["eval/episodic_return"])

    codes, outputs = _train(workdir, 2, "--config.total_env_steps=4096",
                            "--config.ppo.anneal_env_steps=200192", *short[2:],
                            "--config.resume=True")
    assert codes == [0, 0], outputs[0][1][-3000:]
    assert "Resumed from" in outputs[0][1] + outputs[0][0]
    assert read_jsonl(workdir / "metrics.jsonl")[-1]["step"] == 4096

    proc = subprocess.run(
        [sys.executable, "-m", "jaxwm.train", "--config=ppo:cartpole",
         f"--workdir={workdir}", "--config.total_env_steps=8192",
         "--config.ppo.anneal_env_steps=200192", *short[2:], "--config.resume=True"],
        capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 1
    assert "saved by a run of 2 process(es); this one has 1" in proc.stderr


@pytest.mark.slow  # ~1 min: two processes start, train, stop on SIGTERM, resume
def test_sigterm_to_the_launcher_saves_every_process_and_exits_for_a_requeue(tmp_path):
    import signal
    import time

    workdir = tmp_path / "run"
    train_args = ["--config=ppo:cartpole", f"--workdir={workdir}",
                  "--config.total_env_steps=50000000", "--config.log.every=2048 env_steps",
                  "--config.log.progress=False"]
    launcher = subprocess.Popen([sys.executable, "-m", "jaxwm.launch", "--num_processes=2",
                                 "--devices_per_process=2", "--", *train_args], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    metrics = workdir / "metrics.jsonl"
    while not (metrics.exists() and metrics.stat().st_size) and time.time() < deadline:
        time.sleep(0.5)
    launcher.send_signal(signal.SIGTERM)  # as a scheduler's preemption: the launcher alone
    output, _ = launcher.communicate(timeout=300)
    assert launcher.returncode == 75, output[-3000:]
    assert "SIGTERM received" in output
    saved = int(sorted(os.listdir(workdir / "checkpoints"), key=int)[-1])
    env_steps = saved // 2 * 512  # collect and update a PPO iteration of 4 envs x 128 steps
    codes, outputs = _train(workdir, 2, f"--config.total_env_steps={env_steps + 1024}",
                            "--config.ppo.anneal_env_steps=50000000", "--config.resume=True",
                            "--config.eval.num_episodes=2", "--config.eval.num_envs=2")
    assert codes == [0, 0], outputs[0][1][-3000:]
    assert f"at step {saved}" in outputs[0][0] + outputs[0][1]
    assert f"Finished {env_steps + 1024:,} env steps" in outputs[0][0]


@pytest.mark.parametrize("overrides,message", [
    (("--config.env.num_envs=7", "--config.ppo.num_minibatches=7"),
     "env.num_envs=7 does not split over 2 processes"),
    (("--config.num_seeds=2",), "num_seeds > 1 runs in one process"),
])
def test_settings_that_do_not_fit_several_processes_are_refused(overrides, message, tmp_path):
    codes, outputs = _train(tmp_path / "run", 2, *overrides)
    assert codes[0] == 1
    assert message in outputs[0][1]
    assert not (tmp_path / "run" / "checkpoints").exists()


def _launch_tiny(spec, workdir, *overrides):
    args = ["-m", "jaxwm.train", f"--config={spec}", f"--workdir={workdir}",
            "--config.log.progress=False", *overrides]
    return _launch(args, 2, devices_per_process=2)


ALGOS_IN_PROCESSES = [pytest.param(name, marks=pytest.mark.slow) for name in algos.names()
                      if "processes" not in algos.get(name).capabilities.cannot]


@pytest.mark.parametrize("name", ALGOS_IN_PROCESSES)
def test_every_algorithm_finishes_a_tiny_run_in_two_processes(name, tmp_path, tiny_dataset):
    """``jaxwm launch --num_processes=2`` of each algorithm's tiny config (0.5 to 3 min each on
    2 cores), logged once, its checkpoints checked to hold one model on both processes."""
    entry = algos.get(name)
    extra = [f"--config.dataset={tiny_dataset}"] if entry.offline else []
    codes, outputs = _launch_tiny(entry.tiny, tmp_path / "run", *extra)
    assert codes == [0, 0], outputs[0][1][-3000:] + outputs[1][1][-3000:]
    assert "Finished" in outputs[0][0] and "Finished" not in outputs[1][0]
    # Logged once: no two rows hold the same counters, and no counter goes back. (No single
    # counter grows every row: an offline run's step, agent updates, stays at 0 while its model
    # trains, and SimPLe's iterations count whole cycles of its phases.)
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    names = sorted(k for k in rows[0] if k.startswith("counters/"))
    counters = [tuple(r[k] for k in names) for r in rows]
    assert len(set(counters)) == len(counters), "a row was logged twice"
    assert (np.diff(np.array(counters), axis=0) >= 0).all(), "a counter went back"


def test_a_jax_env_in_processes_is_refused_in_one_line(tmp_path):
    codes, outputs = _launch_tiny("ppo:tiny", tmp_path / "run", "--config.env.id=gymnax:CartPole-v1")
    assert codes[0] == 1
    assert "A JAX env (gymnax:CartPole-v1) runs in one process for now" in outputs[0][1]
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_dataset_is_not_made_by_a_multi_process_run(tmp_path):
    missing = tmp_path / "missing.hdf5"
    codes, outputs = _launch_tiny("mopo:tiny", tmp_path / "run", f"--config.dataset={missing}")
    assert codes[0] == 1
    assert "does not exist, and a run of 2 processes does not make datasets" in outputs[0][1]
    assert not missing.exists()


@pytest.mark.slow  # ~3 min: two TD-MPC2 processes start, stop on SIGTERM, resume to the end
def test_a_sigtermed_two_process_tdmpc2_run_resumes_to_the_end(tmp_path):
    import signal
    import time

    workdir = tmp_path / "run"
    train_args = ["--config=tdmpc2:tiny", f"--workdir={workdir}", "--config.log.progress=False",
                  "--config.total_env_steps=100000", "--config.checkpoint.every=32 env_steps"]
    launcher = subprocess.Popen([sys.executable, "-m", "jaxwm.launch", "--num_processes=2",
                                 "--devices_per_process=2", "--", *train_args], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 400
    checkpoints = workdir / "checkpoints"
    while not (checkpoints.exists() and any(n.isdigit() for n in os.listdir(checkpoints))) \
            and time.time() < deadline:
        time.sleep(0.5)
    launcher.send_signal(signal.SIGTERM)
    output, _ = launcher.communicate(timeout=300)
    assert launcher.returncode == 75, output[-3000:]
    saved = max(int(n) for n in os.listdir(checkpoints) if n.isdigit())
    codes, outputs = _launch_tiny("tdmpc2:tiny", workdir, "--config.resume=True",
                                  "--config.total_env_steps=192")
    assert codes == [0, 0], outputs[0][1][-3000:]
    assert f"at step {saved}" in outputs[0][0] + outputs[0][1]
    assert "Finished 192 env steps" in outputs[0][0]


def _repeatable(row: dict) -> dict:
    """A metrics row less its clock readings (throughput, wall time, hook timings)."""
    return {k: v for k, v in row.items() if not (k.startswith("time/") or "_per_s" in k
                                                 or k in ("charts/SPS", "charts/wall_seconds"))}


@pytest.mark.slow  # ~2 min: three 2-process launches of MOPO's tiny config
def test_a_sigtermed_two_process_offline_run_resumes_exactly(tmp_path, tiny_dataset):
    """An offline run's data is the same on every try, so a 2-process MOPO run stopped by
    SIGTERM at its first checkpoint and resumed logs what one never stopped logs, to the last
    digit. (An online run's envpool episodes restart on resume, so the TD-MPC2 case above
    checks that it resumes from its save and runs to the end.)"""
    import signal
    import time

    args = [f"--config.dataset={tiny_dataset}"]
    codes, outputs = _launch_tiny("mopo:tiny", tmp_path / "whole", *args)
    assert codes == [0, 0], outputs[0][1][-3000:]
    workdir = tmp_path / "stopped"
    launcher = subprocess.Popen([sys.executable, "-m", "jaxwm.launch", "--num_processes=2",
                                 "--devices_per_process=2", "--", "--config=mopo:tiny",
                                 f"--workdir={workdir}", "--config.log.progress=False", *args],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
    deadline, checkpoints = time.time() + 300, workdir / "checkpoints"
    while not (checkpoints.exists() and any(n.isdigit() for n in os.listdir(checkpoints))) \
            and time.time() < deadline:
        time.sleep(0.2)
    launcher.send_signal(signal.SIGTERM)
    output, _ = launcher.communicate(timeout=300)
    # 75: stopped and saved (0 would mean the run ended before the signal: nothing was tested)
    assert launcher.returncode == 75, output[-3000:]
    codes, outputs = _launch_tiny("mopo:tiny", workdir, *args, "--config.resume=True")
    assert codes == [0, 0], outputs[0][1][-3000:]
    whole = [_repeatable(r) for r in read_jsonl(tmp_path / "whole" / "metrics.jsonl")]
    resumed = [_repeatable(r) for r in read_jsonl(workdir / "metrics.jsonl")]
    assert resumed[-1] == whole[-1]  # the last row: the final losses, evaluation and counters


# Process 1 alone finds the newest checkpoint damaged (as a stale copy on a shared filesystem
# would look to it); the others read it well.
DAMAGED_ON_ONE_PROCESS = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from jaxwm import parallel
    parallel.maybe_initialize_distributed()
    import jax
    from jaxwm import train
    from jaxwm.loop import checkpoint
    if jax.process_index() == 1:
        verify = checkpoint.verify
        def stale(step_dir, contents=True):
            if step_dir.endswith("/{step}"):
                raise checkpoint._Damaged("seen damaged by process 1 alone")
            return verify(step_dir, contents)
        checkpoint.verify = stale
    sys.exit(train.main({argv!r}))
""")


@pytest.mark.slow  # ~1.5 min: two 2-process SAC runs
def test_damage_one_process_sees_moves_the_checkpoint_aside_for_all(tmp_path):
    workdir = tmp_path / "run"
    codes, outputs = _launch_tiny("sac:tiny", workdir)
    assert codes == [0, 0], outputs[0][1][-3000:]
    newest = max(int(n) for n in os.listdir(workdir / "checkpoints") if n.isdigit())
    argv = ["jaxwm.train", "--config=sac:tiny", f"--workdir={workdir}", "--config.resume=True",
            "--config.total_env_steps=96", "--config.log.progress=False"]
    codes, outputs = _launch(["-c", DAMAGED_ON_ONE_PROCESS.format(root=ROOT, step=newest,
                                                                 argv=argv)], 2, 2)
    said = outputs[0][0] + outputs[0][1]
    assert codes == [0, 0], said[-3000:] + outputs[1][1][-3000:]
    assert f"{newest} (_Damaged: process(es) [1] of this run found it damaged)" in said
    assert os.listdir(workdir / "unreadable_checkpoints") == [str(newest)]  # moved, not lost
    assert "Finished 96 env steps" in said


@pytest.mark.slow  # ~1.5 min: a 2-process SAC run, one process killed, resumed to the end
def test_a_dead_process_stops_the_others_and_the_run_resumes(tmp_path):
    import signal
    import time

    workdir = tmp_path / "run"
    train_args = ["--config=sac:tiny", f"--workdir={workdir}", "--config.log.progress=False",
                  "--config.total_env_steps=2048"]
    launcher = subprocess.Popen([sys.executable, "-m", "jaxwm.launch", "--num_processes=2",
                                 "--devices_per_process=2", "--", *train_args], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    checkpoints, deadline = workdir / "checkpoints", time.time() + 300
    while not (checkpoints.exists() and any(n.isdigit() for n in os.listdir(checkpoints))) \
            and time.time() < deadline:
        time.sleep(0.1)
    children = subprocess.run(["pgrep", "-P", str(launcher.pid)], capture_output=True,
                              text=True).stdout.split()
    os.kill(int(sorted(children, key=int)[-1]), signal.SIGKILL)  # process 1, as an OOM kill
    output, _ = launcher.communicate(timeout=120)
    assert launcher.returncode == 137, output[-3000:]
    assert "process 1 exited with status -9; stopped the other 1" in output
    codes, outputs = _launch_tiny("sac:tiny", workdir, "--config.resume=True",
                                  "--config.total_env_steps=2048")
    said = outputs[0][0] + outputs[0][1]
    assert codes == [0, 0], said[-3000:]
    assert "Resumed from" in said and "Finished 2,048 env steps" in said


@pytest.mark.slow
def test_two_process_cartpole_is_solved(tmp_path):
    """The default CartPole job (200k steps) as 2 processes x 2 devices: ~8 min on 2 cores,
    most of it in gloo all-reduces between processes."""
    codes, outputs = _train(tmp_path / "run", 2)
    assert codes == [0, 0], outputs[0][1][-3000:]
    final = read_jsonl(tmp_path / "run" / "metrics.jsonl")[-1]
    assert final["eval/episodic_return"] >= 475.0
