"""Multi-process training on one machine: ``python -m jaxwm.launch --num_processes=2 -- <args>``.

Starts ``--num_processes`` copies of ``python -m jaxwm.train <args>``, each with JAX's
coordinator variables set (``JAX_COORDINATOR_ADDRESS`` on a free local port,
``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``), so that ``jaxwm.parallel.maybe_initialize_distributed``
joins them into one job: each process steps its own slice of the envs and the update's
all-reduce spans every process's devices. Process 0 writes the logs, progress bar and run
files; the others print only errors. If one process fails, the others are stopped and its
exit status is returned. SIGINT or SIGTERM to the launcher reaches every process, which save
a checkpoint together and exit with ``jaxwm.train.EXIT_INTERRUPTED`` (75), as the launcher
then does.

    python -m jaxwm.launch --num_processes=2 -- --config=ppo:cartpole --workdir=runs/mp

Fake devices per process (CPU): ``--devices_per_process=2`` sets
``XLA_FLAGS=--xla_force_host_platform_device_count=2``. GPUs per process:
``--gpus_per_process=1`` gives process ``i`` the ``i``-th GPU alone (``CUDA_VISIBLE_DEVICES``,
taken from the launcher's own list where it has one); without it every process would see every
GPU of the machine. On a cluster the scheduler starts
the processes instead, and JAX reads the same three values from it (Slurm: ``srun`` with one
task per process; docs/user_guide.md, "Scaling across devices and processes").
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_env(process_id: int, num_processes: int, address: str,
                devices_per_process: int = 0, gpus_per_process: int = 0) -> dict[str, str]:
    env = dict(os.environ, JAX_COORDINATOR_ADDRESS=address, JAX_NUM_PROCESSES=str(num_processes),
               JAX_PROCESS_ID=str(process_id))
    if devices_per_process:
        env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=(
            env.get("XLA_FLAGS", "") +
            f" --xla_force_host_platform_device_count={devices_per_process}").strip())
    if gpus_per_process:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(process_gpus(
            process_id, num_processes, gpus_per_process, os.environ.get("CUDA_VISIBLE_DEVICES")))
    return env


def process_gpus(process_id: int, num_processes: int, gpus_per_process: int,
                 visible: str | None) -> list[str]:
    """Process ``process_id``'s GPUs: its ``gpus_per_process`` of the launcher's visible list
    (``visible``, as ``CUDA_VISIBLE_DEVICES`` writes it; ``None``: the machine's 0, 1, ...)."""
    needed = num_processes * gpus_per_process
    ids = [g.strip() for g in visible.split(",") if g.strip()] if visible else \
        [str(i) for i in range(needed)]
    if len(ids) < needed:
        raise ValueError(f"{num_processes} processes x {gpus_per_process} GPUs need {needed} "
                         f"GPUs, but CUDA_VISIBLE_DEVICES lists {len(ids)} ({visible}).")
    return ids[process_id * gpus_per_process:(process_id + 1) * gpus_per_process]


def spawn(python_args: list[str], num_processes: int, devices_per_process: int = 0,
          gpus_per_process: int = 0, **popen_kwargs) -> list[subprocess.Popen]:
    """Starts ``python <python_args>`` ``num_processes`` times as one JAX job."""
    if num_processes < 1:
        raise ValueError(f"--num_processes must be >= 1, got {num_processes}.")
    if devices_per_process and gpus_per_process:
        raise ValueError("--devices_per_process (fake CPU devices) and --gpus_per_process "
                         "exclude each other: pass one.")
    address = f"127.0.0.1:{free_port()}"
    envs = [process_env(i, num_processes, address, devices_per_process, gpus_per_process)
            for i in range(num_processes)]  # every one checked before a process starts
    return [subprocess.Popen([sys.executable, *python_args], env=env, **popen_kwargs)
            for env in envs]


# jaxwm.train's status for a run a signal stopped after saving (not imported: the launcher
# starts before, and apart from, JAX).
EXIT_INTERRUPTED = 75


def wait(processes: list[subprocess.Popen]) -> int:
    """Waits for every process; stops the rest as soon as one fails. The first failure's exit
    status, else ``EXIT_INTERRUPTED`` if a signal stopped them (each saved), else 0."""
    while True:
        codes = [p.poll() for p in processes]
        failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0, EXIT_INTERRUPTED)]
        if failed:
            running = [p for p in processes if p.poll() is None]
            for p in running:
                p.kill()
            index, code = failed[0]
            if running:  # the others wait for it at their next collective: stop them now
                print(f"jaxwm.launch: process {index} exited with status {code}; stopped the "
                      f"other {len(running)}. Any checkpoints saved so far are kept (resume with "
                      "--config.resume=True).", file=sys.stderr, flush=True)
            return 128 - code if code < 0 else code  # killed by signal N: 128 + N, as shells say
        if all(c in (0, EXIT_INTERRUPTED) for c in codes):
            return EXIT_INTERRUPTED if EXIT_INTERRUPTED in codes else 0
        time.sleep(0.2)


def main(argv: list[str] | None = None, prog: str = "python -m jaxwm.launch") -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("--num_processes", type=int, required=True)
    parser.add_argument("--devices_per_process", type=int, default=0,
                        help="fake CPU devices per process (0: the machine's own)")
    parser.add_argument("--gpus_per_process", type=int, default=0,
                        help="GPUs per process, each process its own (0: every process sees all)")
    args = parser.parse_args(argv[:split])
    train_args = argv[split + 1:]
    if not train_args:
        parser.error("pass the jaxwm.train arguments after --, e.g. -- --config=ppo:cartpole")
    try:
        processes = spawn(["-m", "jaxwm.train", *train_args], args.num_processes,
                          args.devices_per_process, args.gpus_per_process)
    except ValueError as e:
        parser.error(str(e))

    def forward(signum, frame):  # a scheduler's SIGTERM reaches the launcher alone
        del frame
        for p in processes:
            if p.poll() is None:
                p.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    try:
        return wait(processes)
    except KeyboardInterrupt:  # the processes got the same SIGINT: let them save and exit
        return wait(processes)


if __name__ == "__main__":
    sys.exit(main())
