"""Nature-CNN gradient cost by loop form and weight-gradient implementation.

Documents two CPU findings behind ``ppo.loop_form`` and ``nets.conv.Conv2D``:
* a conv net's gradient inside a rolled ``lax.scan`` is many times slower than under plain jit
  on XLA:CPU, while ``scan(unroll=True)`` and a host loop of jitted steps are not;
* computing the convolution gradients as patch GEMMs (``nets.conv``) beats XLA:CPU's own.

One "step" is the gradient of the actor-critic's PPO-like loss at batch 256 (uint8 4x84x84),
plus an SGD update so that steps depend on each other; the loop forms run 4 such steps.

    python benchmarks/conv_grad.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import hardware, median, timed, write_results  # noqa: E402

from jaxwm.nets.actor_critic import ActorCritic  # noqa: E402

BATCH, STEPS = 256, 4


def build(gemm: bool):
    """The Nature-CNN actor-critic with the GEMM backward forced on or off."""
    net = ActorCritic(discrete=True, action_dim=4, encoder="nature_cnn",
                      separate_critic=False, gemm_backward=gemm)
    obs = jnp.asarray(np.random.default_rng(0).integers(0, 255, (STEPS, BATCH, 1, 4, 84, 84)),
                      jnp.uint8)
    reset = jnp.zeros((BATCH, 1), bool)
    params = net.init(jax.random.PRNGKey(0), (), obs[0], reset)

    def loss(p, x):
        _, dist, value = net.apply(p, (), x, reset)
        return jnp.mean(value**2) - jnp.mean(dist.entropy())

    def step(p, x):
        grads = jax.grad(loss)(p, x)
        return jax.tree.map(lambda a, g: a - 1e-4 * g, p, grads)

    return params, obs, step


def measure(step, params, obs, form: str, repeats: int):
    if form == "jit (1 step)":
        fn = jax.jit(step)
        run = lambda: fn(params, obs[0])  # noqa: E731
        steps = 1
    elif form == "host loop":
        fn = jax.jit(step)

        def run():
            p = params
            for i in range(STEPS):
                p = fn(p, obs[i])
            return p
        steps = STEPS
    else:
        unroll = True if form == "scan unroll=True" else 1
        fn = jax.jit(lambda p, xs: jax.lax.scan(lambda c, x: (step(c, x), None), p, xs,
                                                unroll=unroll)[0])
        run = lambda: fn(params, obs)  # noqa: E731
        steps = STEPS
    compile_s = timed(run)
    per_step = median([timed(run) for _ in range(repeats)]) / steps
    return compile_s, per_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    forms = ["jit (1 step)", "host loop", "scan unroll=True", "scan (rolled)"]
    if args.quick:
        forms = forms[:2]
    rows = []
    for gemm in (True, False):
        params, obs, step = build(gemm)
        for form in forms:
            compile_s, per_step = measure(step, params, obs, form, repeats)
            rows.append({"conv_backward": "patches GEMM" if gemm else "XLA native",
                         "loop_form": form, "s_per_grad_step": per_step, "compile_s": compile_s})
    base = {r["loop_form"]: r["s_per_grad_step"] for r in rows if r["conv_backward"] == "XLA native"}
    for r in rows:
        r["speedup_vs_native"] = base[r["loop_form"]] / r["s_per_grad_step"]
    notes = [f"Batch {BATCH}, {STEPS} dependent gradient steps per loop; median of {repeats}; "
             "compile_s is the first call (trace, compile, run)."]
    write_results("conv_grad", rows, ["conv_backward", "loop_form", "s_per_grad_step", "compile_s",
                                      "speedup_vs_native"], hardware(), notes,
                  suffix="_quick" if args.quick else "")


if __name__ == "__main__":
    main()
