#!/usr/bin/env bash
# The GPU rows in one prepared call on a lent device machine (a GPU session's short lease):
#
#   bash benchmarks/gpu.sh throughput   # PPO Breakout at 64 and 8 envs beside CleanRL's scan
#                                       # PPO and the envpool limits; PPO on gymnax CartPole and
#                                       # MinAtar Breakout beside PureJaxRL
#   bash benchmarks/gpu.sh learning     # PPO on MinAtar at PureJaxRL's full budget (1e7 steps
#                                       # a seed, 4 seeds vmapped on each side), with the curves
#
# What the machine lacks travels in PEERS (default .peers, a folder git ignores, carried with
# the call): PEERS/site holds the unpacked cp312 wheels (envpool with only its Atari and classic
# control families, gymnasium, gym, gymnax, distrax, tfp-nightly, tyro, ml-collections,
# tensorboardX, evosax), PEERS/cleanrl and PEERS/purejaxrl the peers' checkouts. Each part runs
# under its own timeout, so one that overruns leaves the others' results; every results file
# and figure with "gpu" in its name, and the log, are packed into $OUT/gpu_results.tgz.
# JAXWM_COMMIT names the commit measured (the copied tree has no git folder).
set -u
part=${1:?"throughput or learning"}
PEERS=${PEERS:-.peers}
OUT=${OUT:-/tmp/jaxwm-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:$PEERS/site${PYTHONPATH:+:$PYTHONPATH}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false TF_CPP_MIN_LOG_LEVEL=2
log="$OUT/gpu_${part}_log.txt"
start=$(mktemp)  # results written after this are the ones packed
{
  echo "== host"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import jax, envpool, gymnax; print('jax', jax.__version__, jax.devices(), 'envpool', envpool.__version__)"
  echo "commit ${JAXWM_COMMIT:-unknown}"
  case "$part" in
    throughput)
      echo "== PPO Breakout scaling beside CleanRL"
      timeout 210 python3 benchmarks/ppo_throughput.py --only-scale --skip-processes \
        --skip-async-ppo --scale-envs 64,8 --window 3 --scale-repeats 2 --max-iterations 400 \
        --cleanrl-command "python3 benchmarks/peers/cleanrl_ppo_scan.py --src $PEERS/cleanrl --envs {envs} --iterations 8"
      echo "rc $?"
      echo "== PPO on gymnax beside PureJaxRL"
      timeout 130 python3 benchmarks/jax_envs.py --tasks cartpole,minatar_breakout --rounds 1 \
        --purejaxrl-src "$PEERS/purejaxrl"
      echo "rc $?" ;;
    learning)
      echo "== PPO on MinAtar at PureJaxRL's budget"
      timeout 230 python3 benchmarks/jax_envs.py --learning --budget 10000000 --num-seeds 4 \
        --games Breakout-MinAtar,Asterix-MinAtar --purejaxrl-src "$PEERS/purejaxrl"
      echo "rc $?" ;;
    *) echo "unknown part $part: throughput or learning"; exit 2 ;;
  esac
} 2>&1 | tee "$log"
tar czf "$OUT/gpu_${part}_results.tgz" "$log" \
  $(find benchmarks/results docs/figures -name "*_gpu*" -newer "$start")
