"""Offline model-based RL throughput: SAC updates/s (the ensemble, rollouts and RealNVP rows
come with those parts of the offline issue).

SAC: ``jaxwm.agents.sac.make_update`` at batch 256 with 256x256 actor and twin critics on
HalfCheetah's sizes (17-dim observations, 6-dim actions), batches sampled from a full
device-resident replay of 1M transitions, K updates per jitted scan. Compile time (first
call) apart; steady state is the median of ``--repeats`` calls. Reference (REFERENCE.md):
OfflineRL-Kit's PyTorch SAC on one CPU thread, ~50-80 updates/s at batch 256.

    python benchmarks/offline.py            # ~1 min on 2 CPU cores
    python benchmarks/offline.py --quick    # smoke run: batch 32, small networks
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from common import hardware, parser, timed, write_results

from jaxwm import backend
from jaxwm.agents import sac
from jaxwm.data import replay

OBS_DIM, ACTION_DIM = 17, 6
REFERENCE_UPDATES_PER_S = (50, 80)


def update_flops(batch: int, obs_dim: int, action_dim: int, hidden: int) -> float:
    """Dense-layer FLOPs of one SAC update (2 per multiply-add; backward = 2x forward):
    target critics and next action (forward), critics (forward + backward), actor and the
    critics it is scored by (forward + backward)."""
    def mlp(inp, out):
        return 2 * batch * (inp * hidden + hidden * hidden + hidden * out)

    actor, critic = mlp(obs_dim, 2 * action_dim), mlp(obs_dim + action_dim, 1)
    return actor + 2 * critic + 3 * 2 * critic + 3 * (actor + 2 * critic)


def sac_row(batch: int, hidden: int, num_updates: int, capacity: int, repeats: int) -> dict:
    box = sac.ActionBox(-np.ones(ACTION_DIM, np.float32), np.ones(ACTION_DIM, np.float32))
    nets = sac.SACNets.create(box, (hidden, hidden), (hidden, hidden))
    hyper = sac.SACHyper(batch_size=batch)
    rng = np.random.default_rng(0)
    data = {"obs": rng.normal(size=(capacity, OBS_DIM)), "next_obs": rng.normal(
        size=(capacity, OBS_DIM)), "action": rng.uniform(-1, 1, (capacity, ACTION_DIM)),
        "reward": rng.normal(size=capacity), "terminated": rng.random(capacity) < 0.001}
    buffer = replay.ReplayState(
        data={k: jnp.asarray(v, jnp.float32 if v.dtype != bool else bool) for k, v in data.items()},
        insert=jnp.zeros((), jnp.int32), size=jnp.asarray(capacity, jnp.int32), capacity=capacity)
    update = backend.jit(sac.make_update(nets, hyper, lambda b, k: replay.sample(b, k, batch),
                                         num_updates), donate_argnums=0)
    state = {"learner": sac.init_learner(nets, hyper, jax.random.PRNGKey(0), OBS_DIM), "i": 0}

    def call():
        state["i"] += 1
        state["learner"], metrics = update(state["learner"], buffer,
                                           jax.random.PRNGKey(state["i"]))
        return state["learner"], metrics

    timing = timed(call, repeats)
    per_s = num_updates / timing.median
    flops = update_flops(batch, OBS_DIM, ACTION_DIM, hidden)
    return {"what": "SAC update", "batch": batch, "hidden": hidden,
            "updates_per_call": num_updates, "updates_per_s": per_s,
            "compile_s": timing.compile_s, "gflop_per_update": flops / 1e9,
            "gflop_per_s": per_s * flops / 1e9,
            "vs_pytorch_1thread": per_s / np.mean(REFERENCE_UPDATES_PER_S)}


def main() -> None:
    args = parser(__doc__, repeats=3).parse_args()
    if args.quick:
        rows = [sac_row(32, 32, 10, 10_000, 1)]
    else:
        rows = [sac_row(256, 256, 100, 1_000_000, args.repeats)]
    r = rows[0]
    notes = [
        "updates_per_s: median over calls of `updates_per_call` SAC updates in one jitted scan "
        "(compile_s: the first call apart); gflop_per_s from the dense layers' FLOPs.",
        f"Reference: OfflineRL-Kit PyTorch SAC, one CPU thread, ~{REFERENCE_UPDATES_PER_S[0]}-"
        f"{REFERENCE_UPDATES_PER_S[1]} updates/s at batch 256 (REFERENCE.md); ratio to its "
        f"midpoint: {r['vs_pytorch_1thread']:.2f}x (goal: 10x)" +
        (" -- not comparable: quick sizes." if args.quick else "."),
    ]
    write_results("offline", rows, hardware(), notes, quick=args.quick)


if __name__ == "__main__":
    main()
