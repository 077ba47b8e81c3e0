#!/bin/bash
# jaxwm on several machines without a scheduler: run this on every machine, each with its
# own rank, all pointing at machine 0's address.
#
#   # on machine 0 (10.0.0.1), then on machine 1:
#   bash examples/multinode.sh 0 2 10.0.0.1:12345 ppo:atari runs/pong_mn --config.env.id=Pong-v5
#   bash examples/multinode.sh 1 2 10.0.0.1:12345 ppo:atari runs/pong_mn --config.env.id=Pong-v5
#
# Each machine runs one process of one JAX job (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES,
# JAX_PROCESS_ID: jaxwm.parallel.maybe_initialize_distributed), which drives that machine's
# accelerators; process 0 writes the logs and checkpoints, so WORKDIR must be one shared
# directory (NFS or the like) that every machine sees at the same path. Several processes
# run PPO today; the other algorithms refuse them in one line.
#
# Stopping and resuming: Ctrl-C or SIGTERM on any machine stops every process at the same
# hook call, a checkpoint is saved, and each exits with status 75
# (jaxwm.train.EXIT_INTERRUPTED). Run the same commands again and they resume; a run is
# resumed with the process count it was started with (another count is refused).
set -uo pipefail
usage="usage: bash examples/multinode.sh RANK NUM_MACHINES HOST:PORT CONFIG WORKDIR [--config.KEY=VALUE ...]"
RANK=${1:?$usage}
NUM=${2:?$usage}
ADDRESS=${3:?$usage}
CONFIG=${4:?$usage}
WORKDIR=${5:?$usage}
shift 5

RESUME=False
if compgen -G "$WORKDIR/checkpoints/[0-9]*" > /dev/null; then
  RESUME=True
fi
JAX_COORDINATOR_ADDRESS="$ADDRESS" JAX_NUM_PROCESSES="$NUM" JAX_PROCESS_ID="$RANK" \
  python -m jaxwm.train --config="$CONFIG" --workdir="$WORKDIR" --config.resume="$RESUME" "$@"
