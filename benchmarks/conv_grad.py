"""Nature-CNN gradient cost by loop form, convolution backward and compiler options.

Documents the XLA:CPU findings behind ``ppo.loop_form``, ``jaxwm.nets.conv`` and
``jaxwm.backend``:

* autodiff's convolution gradients inside a rolled ``lax.scan`` are many times slower than the
  same gradients under plain jit, while ``scan(unroll=True)`` and a host loop of jitted steps
  are not (this is what makes CleanRL's scan PPO crawl on CPU);
* writing the gradients as dense canonical convolutions (``Conv2D(canonical_backward=True)``,
  the CPU default) removes that slowdown and is faster than XLA's own rewrite under jit;
* XLA:CPU's default hands convolutions to YNNPACK, several times slower here than XLA's
  Eigen convolutions; ``jaxwm.backend.jit`` keeps them out.

Each (backward, compiler) pair runs in every loop form.

One gradient step is the gradient of a PPO-like loss (policy log-prob, value and entropy
terms) of the Nature-CNN actor-critic on a minibatch of uint8 4x84x84 observations (batch 256),
followed by an SGD update so that consecutive steps depend on each other. Loop forms: one step
under plain ``jit``; 4 minibatches in a rolled ``lax.scan``, in ``lax.scan(unroll=True)``, and
in a host loop of jitted steps. Reported: median seconds per gradient step and the compile time
(first call: trace, compile and first run).

    python benchmarks/conv_grad.py            # full (~6 min on 2 CPU cores)
    python benchmarks/conv_grad.py --quick    # smoke run: batch 32, one repeat (~20 s)
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from common import Timing, hardware, parser, seconds, write_results

from jaxwm import backend
from jaxwm.nets.actor_critic import ActorCritic

NUM_ACTIONS = 4  # Breakout's minimal action set
LOOP_FORMS = ("jit (1 step)", "scan rolled", "scan unroll=True", "host loop")
BACKWARDS = {True: "canonical (nets.conv)", False: "XLA autodiff"}
COMPILERS = {True: "jaxwm (backend.jit)", False: "XLA defaults (jax.jit)"}
SLOW_FIRST_CALL_S = 20.0  # a first call slower than this is timed once more, not --repeats times


def make_problem(canonical: bool, batch: int, minibatches: int, seed: int = 0):
    """Parameters, ``minibatches`` batches of data and a jittable ``step(params, data)``."""
    net = ActorCritic(discrete=True, action_dim=NUM_ACTIONS, encoder="nature_cnn",
                      separate_critic=False, canonical_backward=canonical)
    rng = np.random.default_rng(seed)
    data = {
        "obs": jnp.asarray(rng.integers(0, 256, (minibatches, batch, 1, 4, 84, 84)), jnp.uint8),
        "action": jnp.asarray(rng.integers(0, NUM_ACTIONS, (minibatches, batch, 1)), jnp.int32),
        "target": jnp.asarray(rng.normal(size=(minibatches, batch, 1)), jnp.float32),
    }
    reset = jnp.zeros((batch, 1), bool)
    carry = net.initialize_carry(batch)  # ((), ()): no frame window, no memory
    params = net.init(jax.random.PRNGKey(seed), carry, data["obs"][0], reset)

    def loss(p, d):
        _, dist, value = net.apply(p, carry, d["obs"], reset)
        return (-jnp.mean(dist.log_prob(d["action"])) + 0.5 * jnp.mean((value - d["target"]) ** 2)
                - 0.01 * jnp.mean(dist.entropy()))

    def step(p, d):
        grads = jax.grad(loss)(p, d)
        return jax.tree.map(lambda w, g: w - 1e-4 * g, p, grads)

    return params, data, step


def loop_runner(form: str, step: Callable, params, data, jit: Callable) -> tuple[Callable[[], object], int]:
    """``(run, steps)``: a zero-argument call running ``steps`` gradient steps in ``form``,
    compiled by ``jit`` (``backend.jit`` or ``jax.jit``)."""
    minibatches = jax.tree.leaves(data)[0].shape[0]
    if form == "jit (1 step)":
        jitted = jit(step)
        first = jax.tree.map(lambda x: x[0], data)
        return lambda: jitted(params, first), 1
    if form == "host loop":
        jitted = jit(step)
        batches = [jax.tree.map(lambda x, i=i: x[i], data) for i in range(minibatches)]

        def run():
            p = params
            for d in batches:
                p = jitted(p, d)
            return p
        return run, minibatches
    unroll = True if form == "scan unroll=True" else 1
    scanned = jit(lambda p, ds: jax.lax.scan(lambda c, d: (step(c, d), None), p, ds,
                                                 unroll=unroll)[0])
    return lambda: scanned(params, data), minibatches


def measure(canonical: bool, jaxwm_options: bool, batch: int, minibatches: int,
            repeats: int) -> list[dict]:
    """One row per loop form for one (backward, compiler) pair."""
    params, data, step = make_problem(canonical, batch, minibatches)
    jit = backend.jit if jaxwm_options else jax.jit
    rows = []
    for form in LOOP_FORMS:
        jax.clear_caches()  # jit caches by function: each form's compile_s starts from scratch
        run, steps = loop_runner(form, step, params, data, jit)
        first = seconds(run)
        timing = Timing(first, [seconds(run) for _ in range(1 if first > SLOW_FIRST_CALL_S else repeats)])
        rows.append({"backward": BACKWARDS[canonical], "compiler": COMPILERS[jaxwm_options],
                     "loop_form": form, "batch": batch, "steps_per_call": steps,
                     "s_per_grad_step": timing.median / steps, "compile_s": timing.compile_s,
                     "samples_s_per_call": timing.samples})
        print(f"{rows[-1]['backward']:22s} {rows[-1]['compiler']:23s} {form:17s} "
              f"{rows[-1]['s_per_grad_step']:.4f} s/step  compile {timing.compile_s:.2f} s", flush=True)
    return rows


def add_ratios(rows: list[dict]) -> None:
    """``vs_jit``: s/step over the same (backward, compiler)'s plain-jit s/step (> 1: the loop
    form is slower per step); ``speedup``: XLA autodiff with XLA's defaults s/step over this
    row's s/step, same loop form (what jaxwm's choices buy)."""
    per = {(r["backward"], r["compiler"], r["loop_form"]): r["s_per_grad_step"] for r in rows}
    for r in rows:
        r["vs_jit"] = r["s_per_grad_step"] / per[(r["backward"], r["compiler"], "jit (1 step)")]
        r["speedup"] = per[(BACKWARDS[False], COMPILERS[False], r["loop_form"])] / r["s_per_grad_step"]


def main() -> None:
    p = parser(__doc__, repeats=5)
    p.add_argument("--batch", type=int, default=256, help="minibatch size (default 256)")
    p.add_argument("--minibatches", type=int, default=4, help="steps per loop (default 4)")
    args = p.parse_args()
    batch = 32 if args.quick else args.batch
    repeats = 1 if args.quick else args.repeats
    hw = hardware()
    rows = [row for canonical in (True, False) for options in (True, False)
            for row in measure(canonical, options, batch, args.minibatches, repeats)]
    add_ratios(rows)
    notes = [
        f"Batch {batch} (uint8 4x84x84), {args.minibatches} dependent gradient steps per loop; "
        f"s_per_grad_step is the median over {repeats} call(s) divided by steps_per_call (one "
        f"call where the first took over {SLOW_FIRST_CALL_S:.0f} s).",
        "compile_s is the first call (trace, compile and one run of the loop), not included in "
        "s_per_grad_step.",
        "vs_jit = s/step over the same backward and compiler's plain-jit s/step (the "
        "conv-in-loop slowdown shows as vs_jit >> 1); speedup = s/step of XLA autodiff with XLA's "
        "default options in the same loop form / this row's s/step.",
        f"jaxwm's compiler options on this backend ({hw['backend']}): {backend.compiler_options()}. "
        "Conv2D's default (canonical_backward=None) uses the canonical backward on CPU only.",
    ]
    columns = ["backward", "compiler", "loop_form", "batch", "s_per_grad_step", "compile_s",
               "vs_jit", "speedup"]
    write_results("conv_grad", rows, hw, notes, columns=columns, quick=args.quick)


if __name__ == "__main__":
    main()
