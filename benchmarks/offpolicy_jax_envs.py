"""SAC, TD-MPC2 and DreamerV3, each on an env written in JAX beside the same algorithm on the
host env it stands in for, on the same host, alternating, each run in a fresh process:
SAC and TD-MPC2 on MuJoCo Playground's CartpoleBalance (MJX) beside envpool's
CartpoleBalance-v1 (dm_control's C++ MuJoCo through XLA custom calls); DreamerV3 on
Craftax-Classic's pixels (63 x 63 resized to 64 x 64) beside Crafter (Python, on the host).

Each run is ``jaxwm.runner.run`` of the algorithm's config on one env (SAC: ``sac:pendulum``'s
settings, 1 update a step; TD-MPC2: the 1M model with the slow test's lighter planner, action
repeat 2; DreamerV3: ``dreamer:crafter``, size1m, train ratio 512) for a short budget, read back
from its ``metrics.jsonl``: ``compile_s`` is the sum of the loop's first-call times of every
hook (trace, compile, first run), ``steps_per_s`` the training phase's env steps per second over
its last log window (steady state: updates and planning included, as a user sees it; on a JAX
env the train phase is one program, ``iterate``), ``random_collect_ms_per_step`` the steady time
per env step of the first phase's ``collect`` hook, whose actions are uniformly random (the
env's step and the replay's write, no policy). ``vs_host`` is the JAX env's row over the host
env's row of the same algorithm, medians over ``--repeats`` rounds.

    python benchmarks/offpolicy_jax_envs.py             # 2 rounds, ~30 min on 2 CPU cores
    python benchmarks/offpolicy_jax_envs.py --quick     # tiny budgets, one round
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import common

# algorithm -> (the env written in JAX, the host env it stands in for)
PAIRS = {"sac": ("playground:CartpoleBalance", "CartpoleBalance-v1"),
         "tdmpc2": ("playground:CartpoleBalance", "CartpoleBalance-v1"),
         "dreamer": ("craftax:Craftax-Classic-Pixels-v1", "crafter")}


def settings(algo: str, env: str, quick: bool) -> tuple[str, dict]:
    """(config, overrides) of one algorithm's runs on ``env``; the budget's last log window is
    steady."""
    if algo == "sac":
        start, total, every = (200, 600, 200) if quick else (1000, 3000, 1000)
        return "sac:pendulum", {"sac.learning_starts": start, "total_env_steps": total,
                                "log.every": f"{every} env_steps"}
    if algo == "dreamer":  # train ratio 512 at batch 16 x 64: one update every 2 env steps
        start, total, every = (64, 96, 16) if quick else (200, 600, 100)
        spec = "dreamer:crafter" if env == "crafter" else "dreamer:craftax_classic_pixels"
        return spec, {"model_size": "1m", "dreamer.prefill": start, "total_env_steps": total,
                      "dreamer.capacity": 10_000, "dreamer.report_every": 0,
                      "log.every": f"{every} env_steps"}
    start, total, every = (100, 300, 100) if quick else (250, 1000, 250)
    return "tdmpc2:dmc", {"model_size": 1, "tdmpc2.seed_steps": start, "total_env_steps": total,
                          "tdmpc2.batch_size": 128, "tdmpc2.num_samples": 128,
                          "tdmpc2.iterations": 2, "tdmpc2.num_elites": 32,
                          "tdmpc2.num_pi_trajs": 12, "log.every": f"{every} env_steps"}


def measure(algo: str, env: str, quick: bool) -> dict:
    """One run (this process): its compile time, steady steps/s and collect cost."""
    from jaxwm import runner
    from jaxwm.config import load

    spec, over = settings(algo, env, quick)
    config = load(spec, {**over, "env.id": env, "eval.every": "never",
                         "eval.at_end": False, "log.progress": False,
                         "checkpoint.every": "never"})
    workdir = tempfile.mkdtemp(prefix=f"{algo}_{env}_")
    runner.run(config, workdir)
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    compile_s = sum(v for r in rows for k, v in r.items() if k.startswith("time/first_call/"))
    steady = [r for r in rows if "charts/SPS" in r][-1]
    first_phase = config.phases[config.phase_order[0]].duration  # env steps of random actions
    collect = [r["time/collect"] for r in rows if "time/collect" in r
               and r["step"] <= first_phase][-1]
    per_call = config.env.num_envs * config[algo].steps_per_collect
    return {"compile_s": compile_s, "steps_per_s": steady["charts/SPS"],
            "random_collect_ms_per_step": 1e3 * collect / per_call}


def child(algo: str, env: str, quick: bool) -> dict:
    out = subprocess.run([sys.executable, __file__, "--measure", algo, env]
                         + (["--quick"] if quick else []), capture_output=True, text=True,
                         check=False)
    if out.returncode:
        raise SystemExit(f"{algo} on {env} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = common.parser(__doc__, repeats=2)  # --repeats: alternating rounds (median)
    p.add_argument("--measure", nargs=2, metavar=("ALGO", "ENV"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure:
        print(json.dumps(measure(*args.measure, args.quick)))
        return
    rounds = 1 if args.quick else args.repeats
    rows = []
    for algo, pair in PAIRS.items():
        runs = {env: [] for env in pair}
        for _ in range(rounds):
            for env in pair:  # the JAX env, the host env, the JAX env, ...
                runs[env].append(child(algo, env, args.quick))
        for env in pair:
            row = {"algo": algo, "env": env, "rounds": rounds}
            for key in ("compile_s", "steps_per_s", "random_collect_ms_per_step"):
                row[key] = common.median([r[key] for r in runs[env]])
            rows.append(row)
        rows[-2]["vs_host"] = rows[-2]["steps_per_s"] / rows[-1]["steps_per_s"]
    notes = ["steps_per_s: training env steps per second over the last log window (updates "
             "and planning included; on the JAX env the train phase is one program, iterate); "
             "random_collect_ms_per_step: the first phase's collect hook (uniformly random "
             "actions: the env's step and the replay's write) per env step; compile_s: the "
             "loop's first-call times of every hook summed.",
             "vs_host: the JAX env's row's steps/s over the host env's (envpool's dm_control "
             "MuJoCo; Crafter in Python), same algorithm, same host, alternating runs, medians."]
    common.write_results("offpolicy_jax_envs", rows, common.hardware(), notes,
                         quick=args.quick)


if __name__ == "__main__":
    main()
