"""World Models throughput: VAE and MDN-RNN updates/s at the paper's sizes, and a CMA-ES
generation's cost in the real env against the same generation inside M's dream.

Rows (the algorithm's own hooks, ``jaxwm.algos.worldmodels``, called on synthetic inputs):

* ``vae update``: one Adam step of the ConvVAE at batch 100 (64x64x3 frames), s and updates/s;
* ``rnn update``: one MDN-RNN step at batch 100 on windows of ``--seq`` + 1 latents (the
  paper: 1000), LSTM 256, 5 Gaussians, s and updates/s;
* ``generation, real env`` / ``in the dream``: one ``evolve`` call, ask -> the population
  acts -> tell, at ``--population`` candidates x ``--episodes`` episodes of ``--steps`` steps
  (a pool of P x E CarRacing-v3 envs from envpool, its default threads: one per env; or M
  stepped as the env), s per generation, env steps/s, and the dream's speed-up over the real
  env. ``hours per paper generation``: the same rate at the paper's 64 x 16 episodes of 1000
  steps. The dream-beside-real video a generation may add (``worldmodels.video_every``) is
  off here.

Compile time (the first call) apart; steady state is the median of ``--repeats`` calls. No
peer runs beside it yet: hardmaru's code is TensorFlow 1 (no Python 3.11 wheels), and
ctallec/world-models' PyTorch (the runnable reproduction) is not wired in here.

    python benchmarks/worldmodels.py --quick     # small sizes, one repeat (~1 min)
    python benchmarks/worldmodels.py             # the paper's sizes (~5 min on 2 cores)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from common import hardware, parser, peak_memory, timed, write_results

from jaxwm.algos import worldmodels
from jaxwm.config import load

PAPER_GENERATION_STEPS = 64 * 16 * 1000


def build(train_in: str, args, quick: bool):
    overrides = {"controller.train_in": train_in, "controller.population": args.population,
                 "controller.episodes": args.episodes, "controller.max_steps": args.steps,
                 "worldmodels.rnn_seq_len": args.seq, "worldmodels.video_every": 0,
                 "log.progress": False}
    if quick:
        overrides.update({"worldmodels.rnn_hidden": 32, "worldmodels.vae_batch": 8,
                          "worldmodels.rnn_batch": 4})
    config = load("worldmodels:carracing", overrides)
    worldmodels.validate(config)
    return config, worldmodels.build(config)


def inputs(config, key):
    w = config.worldmodels
    k1, k2, k3 = jax.random.split(key, 3)
    frames = jax.random.randint(k1, (w.vae_batch, 64, 64, 3), 0, 256).astype(jnp.uint8)
    b, length = w.rnn_batch, w.rnn_seq_len + 1
    windows = {"mu": jax.random.normal(k2, (b, length, w.z_dim)),
               "logvar": -2 * jnp.ones((b, length, w.z_dim)),
               "action": jax.random.uniform(k3, (b, length, 3)),
               "reward": jnp.zeros((b, length)), "reset": jnp.zeros((b, length), bool),
               "done": jnp.zeros((b, length), bool)}
    return {"frames": {"frame": frames}}, {"latents": windows}


def hook_timing(algorithm, state, name, data, repeats):
    hook = algorithm.hooks[name].fn
    box = {"state": state, "key": jax.random.PRNGKey(0)}

    def call():
        box["key"], key = jax.random.split(box["key"])
        box["state"], _, metrics = hook(box["state"], data, key)
        return box["state"], metrics

    return timed(call, repeats), box["state"]


def main() -> None:
    p = parser(__doc__, repeats=3)
    p.add_argument("--population", type=int, default=16)
    p.add_argument("--episodes", type=int, default=2)
    p.add_argument("--steps", type=int, default=200, help="steps per evaluation episode")
    p.add_argument("--seq", type=int, default=1000, help="MDN-RNN window length")
    args = p.parse_args()
    if args.quick:
        args.population, args.episodes, args.steps, args.seq, args.repeats = 4, 1, 20, 16, 1
    rows, rates = [], {}
    for train_in in ("real", "dream"):
        config, algorithm = build(train_in, args, args.quick)
        try:
            state = algorithm.init(jax.random.PRNGKey(0))
            vae_data, rnn_data = inputs(config, jax.random.PRNGKey(1))
            if train_in == "real":
                for name, data, what in (("update_vae", vae_data, "vae update"),
                                         ("update_rnn", rnn_data, "rnn update")):
                    t, state = hook_timing(algorithm, state, name, data, args.repeats)
                    rows.append({"what": what, "compile_s": t.compile_s, "s": t.median,
                                 "per_s": 1 / t.median, "unit": "updates/s"})
            t, state = hook_timing(algorithm, state, "evolve", rnn_data, args.repeats)
            steps = args.population * args.episodes * (args.steps + 1)
            rates[train_in] = steps / t.median
            where = "real env" if train_in == "real" else "in the dream"
            rows.append({"what": f"generation, {where}",
                         "compile_s": t.compile_s, "s": t.median, "per_s": rates[train_in],
                         "unit": "env steps/s",
                         "hours_per_paper_generation": PAPER_GENERATION_STEPS
                         / rates[train_in] / 3600})
        finally:
            algorithm.close()
    rss, what = peak_memory()
    notes = [f"population {args.population} x {args.episodes} episodes of {args.steps} steps; "
             f"MDN-RNN windows of {args.seq} + 1; the dream's speed-up over the real env: "
             f"{rates['dream'] / rates['real']:.1f}x",
             f"peak memory {rss / 1024:.2f} GiB ({what})",
             "medians of the timed calls; compile_s is the first call"]
    write_results("worldmodels", rows, hardware(), notes,
                  columns=["what", "compile_s", "s", "per_s", "unit",
                           "hours_per_paper_generation"], quick=args.quick)


if __name__ == "__main__":
    main()
