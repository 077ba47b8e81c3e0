"""SimPLe / MBARC throughput: world-model training and the simulated rollout, at the full size
(MBARC's ~69M parameters, 105x80 RGB) and the tiny one.

Rows, per model size (``--sizes``):

* ``update_model``: the hook as training calls it, one 50-step training rollout at batch 4 with
  one Adafactor step per rollout step (50 optimiser steps): seconds per optimiser step and
  predicted frames/s (batch x steps / time). MBARC's ``train_world_model`` does the same work
  per optimiser step.
* ``train_conv_share`` and ``sim_conv_share``: two programs timed in turn with exactly their
  convolutions run alone (``common.program_row``; the convolutions read from the jaxpr, FLOPs
  2 x multiply-adds): one optimiser step at batch 4 (loss, gradient, Adafactor) and one step
  of the learned simulator at batch 16 (forward pass, argmax frame, reward). ``conv_share``
  is the convolutions' time alone over the program's: the share of this machine's
  convolution rate for exactly these shapes (``gflops_alone``) that the program reaches
  (``gflops``); for the optimiser step ``gflops_in_scan`` is the same FLOPs at
  ``update_model``'s time per step.
* ``sim_rollout``: 16 agents x 50 steps in the learned simulator with PPO's policy acting
  (``acting.rollout`` over the simulator, ``agents.simple.SimPLeAgent.simulate``), one
  jitted call; ``update_agent`` adds
  PPO's update on it (the hook as training calls it).

Compile time (the first call) is reported apart; steady state is the median of ``--repeats``
calls. The peer is MBARC's own code on the same host, run between jaxwm's measurements when
``--mbarc-command`` is given: a command that prints one JSON line with ``train_step_s``
(seconds per optimiser step at batch 4), ``forward16_s`` and ``sim_rollout_16x50_s``
(its SubprocVecEnv simulated env + policy loop), run at the same thread count as jaxwm
(``benchmarks/peers/mbarc_torch.py`` is that command; the reference code is never committed).
Without it the figures of benchmarks/REFERENCES.md are quoted.

    python benchmarks/simple.py --quick                    # tiny only (~1 min)
    python benchmarks/simple.py                            # tiny and full (~15 min on 2 cores)
    python benchmarks/simple.py --mbarc-command "$VENV/bin/python benchmarks/peers/mbarc_torch.py \
        --src ../mbarc_atari --shims benchmarks/peers/mbarc_shims --threads 2"
    python benchmarks/simple.py --sizes full --mbarc-command "python3 \
        benchmarks/peers/mbarc_torch.py --src ../mbarc_atari --shims benchmarks/peers/mbarc_shims \
        --device cuda"                                       # on a GPU: both sides on it
"""

from __future__ import annotations

import time
from functools import partial

import jax
import jax.numpy as jnp
import optax
from common import block, hardware, median, parser, peak_memory, program_row, run_peer, write_results

from jaxwm import backend
from jaxwm.agents import simple as simple_agent
from jaxwm.algos import simple
from jaxwm.config import load
from jaxwm.models import nextframe
from jaxwm.parallel import data_mesh

# MBARC PyTorch, one thread, this machine class (benchmarks/REFERENCES.md).
MBARC_TRAIN_STEP_S = 3.3
FULL_ROLLOUT = 5  # training-rollout steps per timed update_model call at full size


def build(size: str):
    overrides = {"simple.model_size": size, "simple.epochs": 1, "log.progress": False,
                 "simple.random_steps": 800, "simple.collect_per_epoch": 800,
                 "phase_order": ("random", "epoch_00")}
    if size == "full":  # the same step, fewer of them per timed call (seconds each on a CPU)
        overrides["simple.rollout_length"] = FULL_ROLLOUT
    config = load("simple:atari100k", overrides)
    config.phases.random.duration = 800
    return config, simple.build(config)


def timed_calls(fn, repeats: int):
    start = time.perf_counter()
    block(fn())
    compile_s = time.perf_counter() - start
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        block(fn())
        samples.append(time.perf_counter() - start)
    return compile_s, samples


def measure(size: str, repeats: int) -> list[dict]:
    config, algo = build(size)
    s = config.simple
    try:
        key = jax.random.key(0)
        state = algo.init(key)
        for i in range(8):  # 800 random real steps
            state, _, _ = algo.hooks["collect"].fn(state, {}, jax.random.fold_in(key, i))
        holder = {"state": state, "i": 0}

        def call(hook):
            holder["i"] += 1
            holder["state"], _, metrics = algo.hooks[hook].fn(
                holder["state"], {}, jax.random.fold_in(key, 1000 + holder["i"]))
            return holder["state"], metrics

        rows = []
        compile_s, samples = timed_calls(partial(call, "update_model"), repeats)
        per_step = median(samples) / s.rollout_length
        rows.append({"size": size, "what": f"update_model ({s.rollout_length} steps, batch 4)",
                     "s_per_call": median(samples), "s_per_optimizer_step": per_step,
                     "frames_per_s": s.batch_size / per_step, "compile_s": compile_s,
                     "samples_s": samples})
        rows += conv_shares(config, holder["state"], per_step, repeats)
        rows.append(sim_rollout(config, holder["state"], repeats))
        compile_s, samples = timed_calls(partial(call, "update_agent"), repeats)
        rows.append({"size": size, "what": "update_agent (16 x 50 sim steps + PPO update)",
                     "s_per_call": median(samples), "compile_s": compile_s,
                     "sim_steps_per_s": s.sim.num_agents * config.ppo.num_steps
                     / median(samples), "samples_s": samples})
        mib, label = peak_memory()
        for row in rows:
            row["peak_mib"], row["memory"] = mib, label
        return rows
    finally:
        algo.close()


def conv_shares(config, state, scan_step_s: float, repeats: int) -> list[dict]:
    """The two programs' convolution shares (``common.program_row``): one world-model optimiser
    step at batch 4 (loss, gradient, Adafactor) and one step of the learned simulator at batch
    16 (the model's forward pass, the argmax frame and the reward), each timed in turn with
    exactly its convolutions run alone (``common.convs_alone``, from its jaxpr). The share is
    the share of this machine's convolution rate for these shapes that the program reaches."""
    s = config.simple
    size = s.model_size
    net = nextframe.NextFramePredictor(nextframe.SIZES[size], s.reward_head,
                                       s.stochastic, detach_reward=s.strategy != "online")
    apply = nextframe.make_apply(net, 3)
    optimizer = simple_agent.adafactor()
    height, width = config.env.img_height, config.env.img_width
    stack = jnp.zeros((s.batch_size, height, width, 12), jnp.uint8)
    target = jnp.zeros((s.batch_size, height, width, 3), jnp.uint8)
    action = jnp.zeros((s.batch_size,), jnp.int32)
    params = state.model.params

    def train_step(params, opt_state, key):
        def loss(params):
            logits, _, value, lstm = apply(params, stack, action, key, target, 0.0, train=True)
            return jnp.mean(nextframe.pixel_loss(logits, target)) + jnp.mean(value ** 2) + lstm
        grads = jax.grad(loss)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    n = s.sim.num_agents
    simulator = nextframe.FrameModel(apply, 3, (12, height, width), s.frame_mode)
    sim_state = jnp.zeros((n, 12, height, width), jnp.uint8)
    rows = []
    for what, fn, args in (
            (f"train_conv_share (one optimiser step, batch {s.batch_size})", train_step,
             (params, optimizer.init(params), jax.random.key(0))),
            (f"sim_conv_share (one simulator step, batch {n})", simulator.step,
             (params, sim_state, jax.nn.one_hot(jnp.zeros((n,), jnp.int32), 3),
              jax.random.key(1)))):
        row = program_row(fn, args, repeats, products="conv")
        rows.append({"size": size, "what": what, **row,
                     "gflops_alone": row["conv_gflop"] / row["conv_alone_s"]})
    rows[0]["gflops_in_scan"] = rows[0]["conv_gflop"] / scan_step_s
    return rows


def sim_rollout(config, state, repeats: int) -> dict:
    """16 agents x 50 steps of PPO acting in the learned simulator, one jitted call."""
    s, p = config.simple, config.ppo
    agent = simple_agent.make(_spec(config), config, 1, data_mesh(1))
    n = s.sim.num_agents
    height, width = config.env.img_height, config.env.img_width

    @backend.jit
    def rollout(params, learner, key):
        k_stack, k_sim, k_roll = jax.random.split(key, 3)
        stack = jax.random.randint(k_stack, (n, 12, height, width), 0, 256).astype(jnp.uint8)
        _, _, steps, _ = agent.simulate(learner, params, stack, k_sim, k_roll)
        return steps.reward

    counter = {"i": 0}

    def run():
        counter["i"] += 1
        return rollout(state.model.params, state.agent, jax.random.key(counter["i"]))

    compile_s, samples = timed_calls(run, repeats)
    return {"size": s.model_size, "what": f"sim_rollout ({n} x {p.num_steps}, PPO acting)",
            "s_per_call": median(samples), "compile_s": compile_s,
            "sim_steps_per_s": n * p.num_steps / median(samples), "samples_s": samples,
            "steps_per_agent": p.num_steps}


def _spec(config):
    from jaxwm.envs import make_env
    env = make_env(config.env, num_envs=1, seed=0)
    try:
        return env.spec
    finally:
        env.close()


def main() -> None:
    p = parser(__doc__, repeats=3)
    p.add_argument("--sizes", default="tiny,full", help="comma-separated model sizes")
    p.add_argument("--mbarc-command", default="",
                   help="a command printing MBARC's timings as one JSON line (see the docstring)")
    args = p.parse_args()
    sizes = args.sizes.split(",")
    if args.quick:
        args.repeats, sizes = 1, ["tiny"]
    rows, peers = [], []
    for size in sizes:
        if args.mbarc_command and size == "full":  # interleaved: peer, jaxwm, peer
            peers.append(run_peer(args.mbarc_command))
        rows += measure(size, args.repeats)
    if args.mbarc_command and "full" in sizes:
        peers.append(run_peer(args.mbarc_command))
    hw = hardware()
    notes = [
        "s_per_optimizer_step: the update_model hook (a training rollout at batch 4, one "
        "Adafactor step per step; 50 steps per call at tiny size, "
        f"{FULL_ROLLOUT} at full size, where a step takes seconds on a CPU) over its steps, median of "
        f"{args.repeats} calls; compile_s: the first call.",
        "conv_share: the program's convolutions run alone (XLA:"
        f"{hw['backend'].upper()}'s rate for exactly these shapes: gflops_alone) over the "
        "program's time, timed in turn, median of the repeats' ratios (goal >= 0.7 for the "
        "optimiser step).",
        "peak_mib: " + rows[0]["memory"] + " (on CPU the whole process, host side).",
    ]
    full = {r["what"].split(" ")[0]: r for r in rows if r["size"] == "full"}
    if full:
        train = full["update_model"]["s_per_optimizer_step"]
        if peers:
            peer_train = median([x["train_step_s"] for x in peers])
            peer_sim = median([x["sim_rollout_16x50_s"] for x in peers])

            def per_run(key):
                return "runs: " + ", ".join(f"{x[key]:.3g}" for x in peers)

            threads, device = peers[0].get("threads"), peers[0].get("device", "cpu")
            where = f"{threads} thread(s)" if device == "cpu" else f"on {device}"
            notes.append(
                f"MBARC PyTorch {peers[0].get('torch', '')} on this host ({where}, "
                f"{len(peers)} runs interleaved "
                f"with jaxwm's, medians): {peer_train:.3g} s per training step at batch 4 "
                f"({per_run('train_step_s')}), {peer_sim:.3g} s per 16 x 50 simulated rollout "
                f"with its policy ({per_run('sim_rollout_16x50_s')}).")
        else:
            peer_train, peer_sim = MBARC_TRAIN_STEP_S, None
            notes.append(f"MBARC PyTorch, one thread, this machine class (benchmarks/"
                         f"REFERENCES.md): {peer_train} s per training step at batch 4.")
        versus = (f"{peer_train / train:.2f}x MBARC's rate (goal >= 1x)" if hw["backend"] == "cpu"
                  or peers else f"{peer_train / train:.0f}x MBARC's one-CPU-thread figure (not "
                  "the same hardware: no MBARC run on this GPU)")
        notes.append(f"World-model training: {versus};"
                     f" the optimiser step reaches {full['train_conv_share']['conv_share']:.0%} of "
                     "this machine's convolution rate for its shapes (goal >= 70%).")
        if peer_sim:
            sim = full["sim_rollout"]["s_per_call"]
            config_steps = full["sim_rollout"]["steps_per_agent"]
            floor = full["sim_conv_share"]["conv_alone_s"] * config_steps
            notes.append(f"Simulated rollout (16 x 50 with PPO acting): {peer_sim / sim:.2f}x "
                         "MBARC's simulated env + policy loop (goal >= 3x). Its "
                         f"{config_steps} simulator steps' convolutions alone take "
                         f"{floor:.3g} s, so no program on this machine's convolutions beats "
                         f"MBARC's by more than {peer_sim / floor:.2f}x.")
    columns = ["size", "what", "s_per_call", "s_per_optimizer_step", "frames_per_s",
               "sim_steps_per_s", "conv_gflop", "conv_alone_s", "gflops", "gflops_alone",
               "gflops_in_scan", "conv_share", "compile_s", "peak_mib"]
    write_results("simple", rows, hw, notes, columns=columns, quick=args.quick)


if __name__ == "__main__":
    main()
