"""Offline model-based RL throughput: SAC updates, ensemble epochs, model rollouts, RealNVP.

Every row times jaxwm's own jitted functions (the ones ``jaxwm.algos.mopo`` calls) on
synthetic data of HalfCheetah's sizes; compile time (first call) apart, steady state the
median of ``--repeats`` calls. References (benchmarks/REFERENCES.md, OfflineRL-Kit PyTorch on one CPU
thread): SAC ~50-80 updates/s at batch 256; one ensemble epoch (7 x 4x200, 100k transitions)
~10 s; MOPO rollouts ~11.7k transitions/s. Goals: SAC 10x, ensemble and rollouts 5x.

* SAC: ``jaxwm.agents.sac.make_update`` at batch 256 with 256x256 actor and twin critics on
HalfCheetah's sizes (17-dim observations, 6-dim actions), batches sampled from a full
device-resident replay of 1M transitions, K updates per jitted scan.
* Ensemble: ``jaxwm.models.ensemble.train_epoch`` (7 members, 4x200 Swish, batch 256, a
  bootstrap per member, held-out MSE and snapshots) on 100k transitions (OfflineRL-Kit's
  reference size) and on 1M (a D4RL dataset; full runs only).
* Rollouts: MOPO's ``imagine`` step (``mopo_agent.branch_rollout``, the acting layer's scan with
  the ensemble as the env): 50k dataset starts x horizon 5, the SAC actor's sampled action,
  all 7 members' Gaussians (the penalty needs every member's std), a random elite's sample,
  the termination rule and the uncertainty penalty; transitions/s.
* RealNVP: GORMPO's density (6 couplings, [256, 256] scale and shift nets) log-prob of
  (s, a) rows, rows/s at 50k rows (one rollout step's batch).

    python benchmarks/offline.py            # ~10 min on 2 CPU cores
    python benchmarks/offline.py --quick    # smoke run: batch 32, small networks (~20 s)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from common import hardware, parser, timed, write_results

from jaxwm import backend
from jaxwm.agents import mopo as mopo_agent
from jaxwm.agents import sac
from jaxwm.data.replay import TransitionReplay
from jaxwm.models import ensemble, realnvp, termination
from jaxwm.models.dynamics import Normalizer

OBS_DIM, ACTION_DIM = 17, 6
REFERENCE_UPDATES_PER_S = (50, 80)
REFERENCE_EPOCH_S_100K = 10.0
REFERENCE_ROLLOUT_PER_S = 11_700.0


def synthetic(n: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(n, OBS_DIM)).astype(np.float32)
    action = rng.uniform(-1, 1, (n, ACTION_DIM)).astype(np.float32)
    return {"obs": jnp.asarray(obs), "action": jnp.asarray(action),
            "next_obs": jnp.asarray(obs + 0.1 * rng.normal(size=obs.shape).astype(np.float32)),
            "reward": jnp.asarray(rng.normal(size=n).astype(np.float32))}


def ensemble_row(n: int, hidden: int, repeats: int) -> dict:
    spec = ensemble.EnsembleSpec(OBS_DIM, ACTION_DIM, hidden=(hidden,) * 4)
    data = synthetic(n)
    rng = np.random.default_rng(1)
    train, holdout = ensemble.split_indices(n, rng)
    boot = jnp.asarray(rng.integers(0, len(train), (spec.num_members, len(train))), jnp.int32)
    train, holdout = jnp.asarray(train, jnp.int32), jnp.asarray(holdout, jnp.int32)
    epoch = backend.jit(lambda s, k: ensemble.train_epoch(spec, s, data, train, boot, holdout, k),
                        donate_argnums=0)
    state = {"s": ensemble.init(spec, jax.random.PRNGKey(0),
                                Normalizer.fit(ensemble.inputs(data["obs"], data["action"]))),
             "i": 0}

    def call():
        state["i"] += 1
        state["s"], metrics = epoch(state["s"], jax.random.PRNGKey(state["i"]))
        return metrics

    timing = timed(call, repeats)
    row = {"what": "ensemble epoch", "transitions": n, "hidden": hidden,
           "epoch_s": timing.median, "epochs_per_s": 1 / timing.median,
           "compile_s": timing.compile_s}
    if n == 100_000 and hidden == 200:
        row["vs_pytorch_1thread"] = REFERENCE_EPOCH_S_100K / timing.median
    return row


def rollout_row(starts: int, horizon: int, hidden: int, repeats: int) -> dict:
    """MOPO's rollout (``mopo_agent.branch_rollout``, as its ``imagine`` hook calls it) on a
    HalfCheetah-sized model."""
    spec = ensemble.EnsembleSpec(OBS_DIM, ACTION_DIM, hidden=(hidden,) * 4)
    data = synthetic(max(starts, 10_000))
    model = ensemble.init(spec, jax.random.PRNGKey(0),
                          Normalizer.fit(ensemble.inputs(data["obs"], data["action"])))
    box = sac.ActionBox(-np.ones(ACTION_DIM, np.float32), np.ones(ACTION_DIM, np.float32))
    nets = sac.SACNets.create(box)
    done_fn = termination.termination_fn("HalfCheetah-v4")

    policy = sac.policy(nets)
    learner = sac.init_learner(nets, sac.SACHyper(), jax.random.PRNGKey(1), OBS_DIM)
    penalty = lambda std, obs, action, next_obs: jnp.max(jnp.linalg.norm(std, axis=-1), 0)  # noqa: E731

    @backend.jit
    def rollout(key):
        k_start, k_rollout = jax.random.split(key)
        obs = data["obs"][jax.random.randint(k_start, (starts,), 0, data["obs"].shape[0])]
        return mopo_agent.branch_rollout(spec, model, policy, learner, obs, k_rollout, horizon,
                                   penalty, done_fn, 1.0)

    keys = iter(range(10_000))
    timing = timed(lambda: rollout(jax.random.PRNGKey(next(keys))), repeats)
    per_s = starts * horizon / timing.median
    return {"what": "model rollout", "starts": starts, "horizon": horizon, "hidden": hidden,
            "rollout_s": timing.median, "transitions_per_s": per_s,
            "compile_s": timing.compile_s, "vs_pytorch_1thread": per_s / REFERENCE_ROLLOUT_PER_S}


def realnvp_row(rows: int, hidden: int, repeats: int) -> dict:
    spec = realnvp.DensitySpec(OBS_DIM + ACTION_DIM, hidden=(hidden, hidden))
    state = realnvp.init_density(spec, jax.random.PRNGKey(0),
                                 Normalizer.identity(OBS_DIM + ACTION_DIM))
    x = jax.random.normal(jax.random.PRNGKey(1), (rows, spec.dim))
    logp = backend.jit(lambda p, v: realnvp.log_prob(spec, p, state.scaler, v))
    timing = timed(lambda: logp(state.params, x), repeats)
    return {"what": "RealNVP log-prob", "rows": rows, "hidden": hidden,
            "rows_per_s": rows / timing.median, "compile_s": timing.compile_s}


def update_flops(batch: int, obs_dim: int, action_dim: int, hidden: int) -> float:
    """Dense-layer FLOPs of one SAC update, 2 per multiply-add. For each layer the forward pass,
    the weight gradient and the input gradient cost the same; an input gradient is computed only
    where something upstream needs it (never for the observation):

    * targets: actor forward on s', twin target critics forward on (s', a');
    * critic loss: twin critics forward, weight gradients, input gradients of all but the first
      layer;
    * actor loss: actor forward, weight gradients, input gradients of all but the first layer;
      twin critics forward and input gradients down to the action (their weights are constants
      there: ``jax.grad`` is taken with respect to the actor only).
    """
    def layers(inputs: int, outputs: int) -> list[float]:
        return [2.0 * batch * n * m for n, m in ((inputs, hidden), (hidden, hidden), (hidden, outputs))]

    actor, critic = layers(obs_dim, 2 * action_dim), layers(obs_dim + action_dim, 1)
    to_action = 2.0 * batch * action_dim * hidden  # the critic's first layer, action columns
    targets = sum(actor) + 2 * sum(critic)
    critic_loss = 2 * (2 * sum(critic) + sum(critic[1:]))
    actor_loss = 2 * sum(actor) + sum(actor[1:]) + 2 * (sum(critic) + sum(critic[1:]) + to_action)
    return targets + critic_loss + actor_loss


def sac_row(batch: int, hidden: int, num_updates: int, capacity: int, repeats: int) -> dict:
    box = sac.ActionBox(-np.ones(ACTION_DIM, np.float32), np.ones(ACTION_DIM, np.float32))
    nets = sac.SACNets.create(box, (hidden, hidden), (hidden, hidden))
    hyper = sac.SACHyper(batch_size=batch)
    rng = np.random.default_rng(0)
    data = {"obs": rng.normal(size=(capacity, OBS_DIM)), "next_obs": rng.normal(
        size=(capacity, OBS_DIM)), "action": rng.uniform(-1, 1, (capacity, ACTION_DIM)),
        "reward": rng.normal(size=capacity), "terminated": rng.random(capacity) < 0.001}
    buffer = TransitionReplay(
        data={k: jnp.asarray(v, jnp.float32 if v.dtype != bool else bool) for k, v in data.items()},
        insert=jnp.zeros((), jnp.int32), size=jnp.asarray(capacity, jnp.int32),
        added=jnp.asarray(capacity, jnp.int32), capacity=capacity)
    update = backend.jit(sac.make_update(nets, hyper, lambda b, k: b.sample(k, batch),
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


def notes_for(rows: list[dict], quick: bool) -> list[str]:
    """The reference comparisons, from the measured rows."""
    sac_update = rows[0]
    rows_of = {what: [row for row in rows if row["what"] == what]
               for what in ("ensemble epoch", "model rollout")}
    # The ensemble row at the reference's size (100k transitions) when there is one.
    epoch = next((row for row in rows_of["ensemble epoch"] if "vs_pytorch_1thread" in row),
                 rows_of["ensemble epoch"][0])
    rollout = rows_of["model rollout"][0]
    return [
        "updates_per_s: median over calls of `updates_per_call` SAC updates in one jitted scan "
        "(compile_s: the first call apart); gflop_per_s from the dense layers' FLOPs.",
        f"Reference: OfflineRL-Kit PyTorch SAC, one CPU thread, ~{REFERENCE_UPDATES_PER_S[0]}-"
        f"{REFERENCE_UPDATES_PER_S[1]} updates/s at batch 256 (benchmarks/REFERENCES.md); ratio to its "
        f"midpoint: {sac_update['vs_pytorch_1thread']:.2f}x (goal: 10x)" +
        (" -- not comparable: quick sizes." if quick else "."),
        f"Ensemble epoch: {epoch['epoch_s']:.1f} s on {epoch['transitions']:,} transitions; "
        f"reference ~{REFERENCE_EPOCH_S_100K:.0f} s per epoch on 100k (goal: 5x faster)"
        + (f", ratio {epoch['vs_pytorch_1thread']:.2f}x." if "vs_pytorch_1thread" in epoch
           else " -- not comparable: quick sizes."),
        f"Rollouts: {rollout['transitions_per_s']:,.0f} transitions/s; reference "
        f"~{REFERENCE_ROLLOUT_PER_S:,.0f}/s (goal: 5x), ratio "
        f"{rollout['vs_pytorch_1thread']:.2f}x" + (" -- quick sizes." if quick else "."),
    ]


def main() -> None:
    args = parser(__doc__, repeats=3).parse_args()
    if args.quick:
        rows = [sac_row(32, 32, 10, 10_000, 1), ensemble_row(5_000, 32, 1),
                rollout_row(2_000, 5, 32, 1), realnvp_row(2_000, 32, 1)]
    else:
        rows = [sac_row(256, 256, 100, 1_000_000, args.repeats),
                ensemble_row(100_000, 200, args.repeats),
                ensemble_row(1_000_000, 200, 1),
                rollout_row(50_000, 5, 200, args.repeats),
                realnvp_row(50_000, 256, args.repeats)]
    write_results("offline", rows, hardware(), notes_for(rows, args.quick), quick=args.quick)


if __name__ == "__main__":
    main()
