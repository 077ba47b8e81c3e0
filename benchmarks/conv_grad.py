"""Nature-CNN gradient cost by loop form and by convolution-backward implementation.

Documents two XLA:CPU findings behind ``ppo.loop_form`` and ``jaxwm.nets.conv.Conv2D``:

* a *native* convolution gradient inside a rolled ``lax.scan`` is many times slower than the
  same gradient under plain jit, while ``scan(unroll=True)`` and a host loop of jitted steps
  are not (this is what makes CleanRL's scan PPO crawl on CPU);
* computing the convolution backward pass as patch GEMMs (``Conv2D(gemm_backward=True)``, the
  CPU default) beats XLA:CPU's own gradient convolutions, and removes the scan slowdown.

One gradient step is the gradient of a PPO-like loss (policy log-prob, value and entropy
terms) of the Nature-CNN actor-critic on a minibatch of uint8 4x84x84 observations (batch 256),
followed by an SGD update so that consecutive steps depend on each other. Loop forms: one step
under plain ``jit``; 4 minibatches in a rolled ``lax.scan``, in ``lax.scan(unroll=True)``, and
in a host loop of jitted steps. Reported: median seconds per gradient step and the compile time
(first call: trace, compile and first run).

    python benchmarks/conv_grad.py            # full (~3 min on 2 CPU cores)
    python benchmarks/conv_grad.py --quick    # smoke run: batch 32, one repeat
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from common import hardware, parser, timed, write_results

from jaxwm.nets.actor_critic import ActorCritic

NUM_ACTIONS = 4  # Breakout's minimal action set
LOOP_FORMS = ("jit (1 step)", "scan rolled", "scan unroll=True", "host loop")
BACKWARDS = {True: "GEMM (gemm_backward=True)", False: "XLA native (gemm_backward=False)"}


def make_problem(gemm_backward: bool, batch: int, minibatches: int, seed: int = 0):
    """Parameters, ``minibatches`` batches of data and a jittable ``step(params, data)``."""
    net = ActorCritic(discrete=True, action_dim=NUM_ACTIONS, encoder="nature_cnn",
                      separate_critic=False, gemm_backward=gemm_backward)
    rng = np.random.default_rng(seed)
    data = {
        "obs": jnp.asarray(rng.integers(0, 256, (minibatches, batch, 1, 4, 84, 84)), jnp.uint8),
        "action": jnp.asarray(rng.integers(0, NUM_ACTIONS, (minibatches, batch, 1)), jnp.int32),
        "target": jnp.asarray(rng.normal(size=(minibatches, batch, 1)), jnp.float32),
    }
    reset = jnp.zeros((batch, 1), bool)
    params = net.init(jax.random.PRNGKey(seed), (), data["obs"][0], reset)

    def loss(p, d):
        _, dist, value = net.apply(p, (), d["obs"], reset)
        return (-jnp.mean(dist.log_prob(d["action"])) + 0.5 * jnp.mean((value - d["target"]) ** 2)
                - 0.01 * jnp.mean(dist.entropy()))

    def step(p, d):
        grads = jax.grad(loss)(p, d)
        return jax.tree.map(lambda w, g: w - 1e-4 * g, p, grads)

    return params, data, step


def loop_runner(form: str, step: Callable, params, data) -> tuple[Callable[[], object], int]:
    """``(run, steps)``: a zero-argument call running ``steps`` gradient steps in ``form``."""
    minibatches = jax.tree.leaves(data)[0].shape[0]
    if form == "jit (1 step)":
        jitted = jax.jit(step)
        first = jax.tree.map(lambda x: x[0], data)
        return lambda: jitted(params, first), 1
    if form == "host loop":
        jitted = jax.jit(step)
        batches = [jax.tree.map(lambda x, i=i: x[i], data) for i in range(minibatches)]

        def run():
            p = params
            for d in batches:
                p = jitted(p, d)
            return p
        return run, minibatches
    unroll = True if form == "scan unroll=True" else 1
    scanned = jax.jit(lambda p, ds: jax.lax.scan(lambda c, d: (step(c, d), None), p, ds,
                                                 unroll=unroll)[0])
    return lambda: scanned(params, data), minibatches


def measure(gemm_backward: bool, batch: int, minibatches: int, repeats: int) -> list[dict]:
    """One row per loop form for one backward implementation."""
    params, data, step = make_problem(gemm_backward, batch, minibatches)
    rows = []
    for form in LOOP_FORMS:
        jax.clear_caches()  # jit caches by function: each form's compile_s starts from scratch
        run, steps = loop_runner(form, step, params, data)
        timing = timed(run, repeats)
        rows.append({"conv_backward": BACKWARDS[gemm_backward], "loop_form": form, "batch": batch,
                     "steps_per_call": steps, "s_per_grad_step": timing.median / steps,
                     "compile_s": timing.compile_s,
                     "samples_s_per_call": timing.samples})
        print(f"{rows[-1]['conv_backward']:32s} {form:18s} {rows[-1]['s_per_grad_step']:.4f} s/step"
              f"  compile {timing.compile_s:.2f} s", flush=True)
    return rows


def add_ratios(rows: list[dict]) -> None:
    """``gemm_speedup``: native s/step over GEMM s/step, same loop form; ``vs_jit``: s/step over
    the same backward's plain-jit s/step (> 1 means the loop form is slower per step)."""
    per = {(r["conv_backward"], r["loop_form"]): r["s_per_grad_step"] for r in rows}
    for r in rows:
        r["vs_jit"] = r["s_per_grad_step"] / per[(r["conv_backward"], "jit (1 step)")]
        r["gemm_speedup"] = per[(BACKWARDS[False], r["loop_form"])] / per[(BACKWARDS[True], r["loop_form"])]


def main() -> None:
    p = parser(__doc__, repeats=5)
    p.add_argument("--batch", type=int, default=256, help="minibatch size (default 256)")
    p.add_argument("--minibatches", type=int, default=4, help="steps per loop (default 4)")
    args = p.parse_args()
    batch = 32 if args.quick else args.batch
    repeats = 1 if args.quick else args.repeats
    hw = hardware()
    rows = measure(True, batch, args.minibatches, repeats) + measure(False, batch, args.minibatches,
                                                                     repeats)
    add_ratios(rows)
    notes = [
        f"Batch {batch} (uint8 4x84x84), {args.minibatches} dependent gradient steps per loop; "
        f"s_per_grad_step is the median over {repeats} call(s) divided by steps_per_call.",
        "compile_s is the first call (trace, compile and one run of the loop), not included in "
        "s_per_grad_step.",
        "gemm_speedup = native s/step / GEMM s/step for the same loop form; vs_jit = s/step over "
        "the same backward's plain-jit s/step (the conv-in-loop slowdown shows as vs_jit >> 1).",
        f"Conv2D's default (gemm_backward=None) uses the GEMM backward on the CPU backend only; "
        f"this run's backend is {hw['backend']}.",
    ]
    columns = ["conv_backward", "loop_form", "batch", "s_per_grad_step", "compile_s", "vs_jit",
               "gemm_speedup"]
    write_results("conv_grad", rows, hw, notes, columns=columns, quick=args.quick)


if __name__ == "__main__":
    main()
