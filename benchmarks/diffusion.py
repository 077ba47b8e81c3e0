"""Diffusion Policy throughput: training steps/s at batch 256 and action latency (DDPM 100,
DDIM 10) for one observation, against the reference's own PyTorch code on the same host.

Rows, per model size (``--sizes``: ``full``, the reference's U-Net with down dims
[256, 512, 1024], ~65M parameters; ``small``, down dims [64, 128, 256] and a step embedding
of 64, 4.2M parameters, where per-op overhead shows), on Push-T's low-dimensional shapes
(20 observations, 2 actions, horizon 16, 2 observation steps):

* ``train step``: one update of ``agents.diffusion_policy`` (noise, U-Net forward and
  backward, AdamW, EMA) at batch 256 on a fixed batch, jitted as training compiles it;
* ``plan DDPM 100`` / ``plan DDIM 10``: one action chunk for one observation history
  (``diffusion_policy.plan``: the reverse process, one ``lax.scan``), what the policy does
  each time its action queue runs out.

``matmul_share``: the time this machine needs for exactly the program's matrix products
(jaxwm's convolutions are matmuls, ``nets.conv.conv1d``; every ``dot_general``, loops
counted, run alone: ``common.matmuls_alone``) over the program's time: 1.0 is every cycle in
matmuls at the rate this machine reaches for those shapes. Compile time (the first call)
apart; steady state is the median of ``--repeats`` calls; peak memory is the process's.

The peer is real-stanford/diffusion_policy's ``ConditionalUnet1D`` with diffusers'
``DDPMScheduler`` / ``DDIMScheduler`` as its ``DiffusionUnetLowdimPolicy`` uses them, run
between jaxwm's measurements when ``--peer-command`` is given (``benchmarks/peers/
diffusion_torch.py``; the reference code is never committed), at the same thread count.

    python benchmarks/diffusion.py --quick               # small size, one repeat
    python benchmarks/diffusion.py                       # full and small sizes
    python benchmarks/diffusion.py --peer-command \\
        "$VENV/bin/python benchmarks/peers/diffusion_torch.py --src ../diffusion_policy --threads 2"
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from common import (
    attach_peer,
    between_peer_runs,
    hardware,
    parser,
    peak_memory,
    program_row,
    write_results,
)

from jaxwm.agents import diffusion_policy as dp

OBS_DIM, ACTION_DIM, BATCH = 20, 2, 256  # Push-T low-dimensional
SIZES = {"full": (256, 512, 1024), "small": (64, 128, 256)}
EMBED = {"full": 256, "small": 64}


def hyper(size: str, sampler: str = "ddpm", steps: int = 100) -> dp.Hyper:
    c = dp.config_block(down_dims=SIZES[size], step_embed_dim=EMBED[size], sampler=sampler,
                        inference_steps=steps)
    return dp.Hyper.from_config(c, OBS_DIM, ACTION_DIM, schedule_steps=100_000)


def row(size: str, what: str, fn, args, repeats: int, update: bool) -> dict:
    out = program_row(fn, args, repeats, carry_first=update)
    return {"size": size, "what": what, **out, "per_s": 1.0 / out["s_per_call"]}


def measure(size: str, repeats: int) -> list[dict]:
    rng = np.random.default_rng(0)
    h = hyper(size)
    obs = rng.normal(size=(1000, OBS_DIM)).astype(np.float32)
    action = rng.uniform(-1, 1, size=(1000, ACTION_DIM)).astype(np.float32)
    learner = dp.init_learner(h, jax.random.PRNGKey(0), obs, action)
    batch = {"obs": jnp.asarray(rng.normal(size=(BATCH, h.n_obs_steps, OBS_DIM)), jnp.float32),
             "action": jnp.asarray(rng.uniform(-1, 1, (BATCH, h.horizon, ACTION_DIM)),
                                   jnp.float32)}
    update = dp.make_update(h, lambda key: batch)
    rows = [row(size, "train step (batch 256)", update, (learner, jax.random.PRNGKey(1)),
                repeats, update=True)]
    history = jnp.asarray(rng.normal(size=(1, h.n_obs_steps, OBS_DIM)), jnp.float32)
    for sampler, steps in (("ddpm", 100), ("ddim", 10)):
        hs = hyper(size, sampler, steps)

        def plan(params, key, hs=hs):
            return dp.plan(hs, params[0], params[1], params[2], history, key)

        rows.append(row(size, f"plan {sampler.upper()} {steps}", plan,
                        (dp.acting_params(learner), jax.random.PRNGKey(2)), repeats,
                        update=False))
    mib, label = peak_memory()
    for r in rows:
        r["peak_mib"], r["memory"] = mib, label
    return rows


PEER_KEYS = {"train step (batch 256)": "train_s", "plan DDPM 100": "ddpm100_s",
             "plan DDIM 10": "ddim10_s"}


def main() -> None:
    p = parser(__doc__, repeats=5)
    p.add_argument("--sizes", default="full,small", help="comma-separated: full,small")
    p.add_argument("--peer-command", default="",
                   help="a command printing the reference's timings as one JSON line")
    args = p.parse_args()
    sizes = args.sizes.split(",")
    if args.quick:
        args.repeats, sizes = 1, ["small"]
    rows, peers = between_peer_runs(
        args.peer_command, lambda: [r for size in sizes for r in measure(size, args.repeats)])
    notes = [f"Push-T low-dimensional shapes ({OBS_DIM} observations, {ACTION_DIM} actions), "
             f"horizon 16, 2 observation steps; median of {args.repeats} calls; compile_s: "
             "the first call.",
             "matmul_share: the program's matrix products run alone over the program's time.",
             "peak_mib: " + rows[0]["memory"] + "."]
    if peers:
        notes.append(f"Peer: real-stanford/diffusion_policy ConditionalUnet1D + diffusers "
                     f"{peers[0].get('diffusers')} (PyTorch {peers[0].get('torch')}, "
                     f"{peers[0].get('threads')} thread(s)), {len(peers)} runs, one before and "
                     "one after jaxwm's.")
        attach_peer(rows, peers, lambda r, p: p.get("sizes", {}).get(r["size"], {}).get(
            PEER_KEYS[r["what"]]))
    columns = ["size", "what", "s_per_call", "per_s", "peer_s", "speedup", "matmul_gflop",
               "gflops", "matmul_share", "peer_matmul_share", "compile_s", "peak_mib"]
    write_results("diffusion", rows, hardware(), notes, columns=columns, quick=args.quick)


if __name__ == "__main__":
    main()
