"""The scripts of ``examples/`` run as a user runs them (at a few thousand env steps), so the
Python surface they show (``jaxwm.configs``, ``jaxwm.train``, ``jaxwm.load``, ``act``,
``evaluate``, ``jaxwm.report.make_report``) cannot drift from them."""

import os
import subprocess
import sys

import contract
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")


@pytest.mark.parametrize("script, expected", [
    ("train_load_evaluate.py", "5 evaluation episodes:"),
    ("compare_settings.py", "Probability of improvement"),
])
def test_example_runs(tmp_path, script, expected):
    result = subprocess.run([sys.executable, os.path.join(EXAMPLES, script), "--steps", "2048"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert expected in result.stdout, result.stdout[-2000:]


def run_sbatch_script(tmp_path, srun_status: int, *checkpoints: str):
    """examples/slurm.sbatch under stand-ins for Slurm's ``srun`` (records the command it
    would start and exits ``srun_status``) and ``scontrol`` (records its arguments)."""
    bin_dir, workdir = tmp_path / "bin", tmp_path / "run"
    bin_dir.mkdir(parents=True)
    for step in checkpoints:
        (workdir / "checkpoints" / step).mkdir(parents=True)
    (bin_dir / "srun").write_text(f'#!/bin/bash\necho "$@" > {tmp_path}/srun.args\n'
                                  f"exit {srun_status}\n")
    (bin_dir / "scontrol").write_text(f'#!/bin/bash\necho "$@" > {tmp_path}/scontrol.args\n')
    for tool in ("srun", "scontrol"):
        os.chmod(bin_dir / tool, 0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_ID="4242")
    result = subprocess.run(["bash", os.path.join(EXAMPLES, "slurm.sbatch"), "ppo:cartpole",
                             str(workdir), "--config.seed=3"], env=env, capture_output=True,
                            text=True, timeout=60)
    def read(name):
        return (tmp_path / name).read_text() if (tmp_path / name).exists() else None

    return result, read("srun.args"), read("scontrol.args")


def test_the_slurm_recipe_starts_then_resumes_and_requeues_only_an_interrupted_run(tmp_path):
    result, srun, scontrol = run_sbatch_script(tmp_path / "new", 0)
    assert result.returncode == 0 and scontrol is None
    assert "python -m jaxwm.train --config=ppo:cartpole" in srun
    assert "--config.resume=False --config.seed=3" in srun

    result, srun, scontrol = run_sbatch_script(tmp_path / "stopped", 75, "1200")
    assert result.returncode == 75 and scontrol.split() == ["requeue", "4242"]
    assert "--config.resume=True" in srun

    result, _, scontrol = run_sbatch_script(tmp_path / "failed", 1, "1200")
    assert result.returncode == 1 and scontrol is None


@pytest.mark.slow  # ~1 min: two processes join, train and finish
def test_the_multinode_recipe_joins_its_machines_into_one_run(tmp_path):
    """examples/multinode.sh, both ranks on this machine at a local address."""
    from jaxwm import launch

    address, workdir = f"127.0.0.1:{launch.free_port()}", tmp_path / "run"
    ranks = [subprocess.Popen(["bash", os.path.join(EXAMPLES, "multinode.sh"), str(rank), "2",
                               address, "ppo:cartpole", str(workdir),
                               "--config.total_env_steps=2048",
                               "--config.ppo.anneal_env_steps=200192",
                               "--config.eval.num_episodes=2", "--config.eval.num_envs=2",
                               "--config.log.progress=False"], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in (0, 1)]
    outputs = [out for out, _ in contract.communicate_all(ranks, timeout=600)]
    assert [p.returncode for p in ranks] == [0, 0], outputs[0][-3000:]
    assert "Finished 2,048 env steps" in outputs[0] and "Finished" not in outputs[1]
