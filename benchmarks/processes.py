"""Several processes on one machine: env steps/s of PPO, SAC and DreamerV3 run as 1 process of
2 CPU devices and as 2 processes of 1 device each (``jaxwm launch``, gloo collectives between
the processes), the same 2 devices and the same global batches either way.

Each run is ``jaxwm.train`` as a user launches it; the numbers come from its own metrics
(``charts/SPS`` per log window, ``time/<hook>`` the seconds per call of each hook, the loop's
``HookTimer``). The first log window (compile) is reported apart as ``first_window_s``; steady
state is the median over the later windows, and the median over ``--repeats`` runs, 1 and 2
processes interleaved. ``time/<hook>`` shows where the time goes: a hook's extra seconds per
call with 2 processes are its cross-process collectives (the all-reduce of the gradients in
an update; in a collect, the all-gather of every process's new transitions into the replay,
``Actor.collect_into``) plus the two processes sharing 2 cores.

On a machine with several GPUs, ``--gpus N`` compares 1 process of N GPUs with N processes of
one GPU each (``jaxwm launch --gpus_per_process``), the collectives over NCCL, each case's envs
scaled by N / 2 so that every process steps as many as on the CPU rows.

    python benchmarks/processes.py            # ~55 min on 2 CPU cores
    python benchmarks/processes.py --quick    # smoke run (~4 min)
    python benchmarks/processes.py --gpus 2   # on a machine with 2 GPUs
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from common import ROOT, hardware, median, parser, write_results

# (config, overrides, env steps): envs a multiple of 2 (each process steps half).
CASES = {
    "ppo": ("ppo:cartpole", ["--config.env.num_envs=4", "--config.log.every=2048 env_steps"],
            40960),
    "sac": ("sac:pendulum", ["--config.env.num_envs=2", "--config.sac.learning_starts=500",
                             "--config.log.every=500 env_steps"], 4000),
    "dreamer": ("dreamer:debug", ["--config.log.every=200 env_steps"], 1600),
}
COMMON = ["--config.eval.every=never", "--config.eval.at_end=False",
          "--config.checkpoint.every=never", "--config.log.progress=False"]


def run(config: str, overrides: list[str], processes: int, devices: int, gpus: bool) -> list[dict]:
    """One ``jaxwm launch`` of ``processes`` x (``devices`` / processes) CPU devices or GPUs:
    its metrics rows."""
    per_process = ("--gpus_per_process=" if gpus else "--devices_per_process=") + \
        str(devices // processes)
    with tempfile.TemporaryDirectory() as workdir:
        command = [sys.executable, "-m", "jaxwm.launch", f"--num_processes={processes}",
                   per_process, "--", f"--config={config}",
                   f"--workdir={workdir}", *overrides, *COMMON]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
        with open(os.path.join(workdir, "metrics.jsonl")) as f:
            return [json.loads(line) for line in f if line.strip()]


def summary(rows: list[dict]) -> dict:
    """Steady-state figures of one run: every log window after the first."""
    first, later = rows[0], [r for r in rows[1:] if "charts/SPS" in r]
    hooks = sorted({k[5:] for r in later for k in r
                    if k.startswith("time/") and "/" not in k[5:] and not k.endswith("_fraction")})
    out = {"env_steps_per_s": median([r["charts/SPS"] for r in later]),
           "first_window_s": first["step"] / first["charts/SPS"]}
    for hook in hooks:
        out[f"{hook}_ms"] = 1e3 * median([r[f"time/{hook}"] for r in later if f"time/{hook}" in r])
    return out


def scaled_envs(overrides: list[str], factor: int) -> list[str]:
    """``overrides`` with ``env.num_envs`` (where set) multiplied by ``factor``."""
    key = "--config.env.num_envs="
    return [f"{key}{int(o[len(key):]) * factor}" if o.startswith(key) else o for o in overrides]


def main() -> None:
    p = parser(__doc__, repeats=2)
    p.add_argument("--gpus", type=int, default=0,
                   help="N >= 2: 1 process of N GPUs against N processes of one (default: the "
                        "CPU rows, 2 fake devices)")
    args = p.parse_args()
    if args.gpus == 1 or args.gpus < 0 or args.gpus % 2:
        p.error(f"--gpus {args.gpus}: pass an even number of GPUs, at least 2")
    devices = args.gpus or 2
    repeats = 1 if args.quick else args.repeats
    rows = []
    for name, (config, overrides, steps) in CASES.items():
        steps = steps // 4 if args.quick else steps
        filled = [f"--config.total_env_steps={steps}", *scaled_envs(overrides, devices // 2)]
        runs = {1: [], devices: []}
        for _ in range(repeats):  # interleaved: both see the same machine state
            for processes in runs:
                runs[processes].append(summary(run(config, filled, processes, devices,
                                                   gpus=bool(args.gpus))))
                print(name, processes, runs[processes][-1], flush=True)
        one = median([r["env_steps_per_s"] for r in runs[1]])
        for processes, results in runs.items():
            row = {"algorithm": name, "config": config, "processes": processes,
                   "devices_per_process": devices // processes, "env_steps": steps}
            for key in results[0]:
                row[key] = median([r.get(key, float("nan")) for r in results])
            row["vs_1_process"] = row["env_steps_per_s"] / one
            rows.append(row)
    notes = [
        f"Same machine, same run of this script, 1 and {devices} processes interleaved; "
        + (f"{devices} GPUs in all either way, envs scaled by {devices // 2}." if args.gpus else
           "2 CPU devices in all either way (2 processes share the machine's cores)."),
        "`<hook>_ms`: the loop's seconds per call of that hook (median over the log windows "
        "after the first); with 2 processes the difference is the cross-process collectives "
        "(gloo on CPU) and the two processes sharing the cores.",
        "`first_window_s`: the first log window's wall time (compiles included).",
    ]
    write_results("processes", rows, hardware(), notes, quick=args.quick)


if __name__ == "__main__":
    main()
