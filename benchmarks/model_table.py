"""The world-model table: every world model on jaxwm's protocol (``jaxwm.models.protocol``)
trained on the same locally made data, then measured the same way.

    python benchmarks/model_table.py            # ~10 min on 2 CPU cores
    python benchmarks/model_table.py --quick    # smoke run, tiny budgets (~2 min)

Two tasks, data made here by uniformly random play (envpool; training and held-out data from
different seeds):

* vector, ``Pendulum-v1`` (dense rewards): DreamerV3's RSSM, TD-MPC2's latent model and
  MOPO's dynamics ensemble;
* pixels, ``Boxing-v5`` at 64x64 RGB (frequent +1/-1 rewards under random play): DreamerV3's
  RSSM from pixels, SimPLe's next-frame model (4 stacked frames) and World Models' VAE +
  MDN-RNN.

Each model gets the same number of optimiser steps on batches of the same sequences (its own
loss and optimiser, at CPU sizes). Columns: parameters; ``train_step_ms``, the median of a
timed step after the first (compile apart, ``compile_s``); ``imagine_step_ms``, one jitted
protocol ``step`` of 16 states; and from ``protocol.open_loop`` on held-out sequences (5
observed steps, then the model alone under the recorded actions) the reward's mean squared
error at horizons 1, 5 and 15 (all of 1-15 in the JSON and the figure), and for the models
that decode the frame's (pixels in [0, 1]). ``reward_var`` is the variance of the held-out
rewards: the error of predicting their mean, the floor a model must get under to have learned
anything. The figure is ``model_table_<backend>.png``.

What differs between the models is part of the result: each trains as its system does
(sequences for the RSSM, TD-MPC2's horizon-3 consistency windows, single transitions for the
ensemble and the next-frame model, frames then latent windows for V and M), at the sizes
``main`` and the ``*_trainer`` functions give them (the RSSM at ``jaxwm/configs/pairing.py``'s
sizes, TD-MPC2's 1M model).
"""

from __future__ import annotations

import math
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import hardware, median, parser, write_results  # noqa: E402

from jaxwm import backend  # noqa: E402
from jaxwm.agents import dreamer, mopo  # noqa: E402
from jaxwm.agents import simple as simple_agent  # noqa: E402
from jaxwm.config import base_config  # noqa: E402
from jaxwm.data import frames as fr  # noqa: E402
from jaxwm.envs import acting, make_env  # noqa: E402
from jaxwm.envs.types import ActionBox  # noqa: E402
from jaxwm.models import ensemble, mdnrnn, nextframe, protocol, rssm, termination, vae  # noqa: E402
from jaxwm.models import tdmpc2 as tdmpc2_model  # noqa: E402
from jaxwm.models.dynamics import Normalizer  # noqa: E402
from jaxwm.models.vision_memory import VisionMemory, preprocess  # noqa: E402

CONTEXT, HORIZON = 5, 15
LENGTH = CONTEXT + HORIZON


# ----------------------------------------------------------------------------- data


def play(env_id: str, steps: int, seed: int, **env) -> dict:
    """Uniformly random play, time-major ``[T, n]`` in the replay's convention."""
    c = base_config().env
    c.id = env_id
    c.update(env)
    pool = make_env(c, num_envs=4, seed=seed)
    try:
        policy = acting.uniform(pool.spec)
        runner = acting.Actor(pool, policy, steps)
        actor = runner.init(())
        _, (steps_, _) = runner.collect((), actor, jax.random.PRNGKey(seed))
    finally:
        runner.close()
    spec = pool.spec
    action = steps_.action
    if not spec.discrete:  # agent units, [-1, 1]
        action = ActionBox.of(spec).from_env(action)
    return spec, {"obs": np.asarray(steps_.obs), "action": np.asarray(action),
                  "reward": np.asarray(steps_.reward, np.float32),
                  "is_first": np.asarray(steps_.is_first),
                  "is_terminal": np.asarray(steps_.terminated)}


def windows(data: dict, length: int, count: int, rng) -> dict:
    """``count`` windows [B, length] drawn uniformly from time-major data."""
    t, n = data["reward"].shape
    starts = rng.integers(0, t - length, count)
    envs = rng.integers(0, n, count)
    rows = starts[:, None] + np.arange(length)
    return {k: jnp.asarray(v[rows, envs[:, None]]) for k, v in data.items()}


def stacked(data: dict) -> dict:
    """Pixel data with each observation its stack of the last 4 frames (SimPLe's input)."""
    obs = data["obs"]  # [T, n, 3, H, W]
    t = obs.shape[0]
    rows = np.stack([np.asarray(fr.stack_rows(jnp.asarray(data["is_first"]),
                                             jnp.full((obs.shape[1],), r), 4)) for r in range(t)])
    stack = obs[rows, np.arange(obs.shape[1])[None, :, None]]  # [T, n, 4, 3, H, W]
    return {**data, "obs": stack.reshape(stack.shape[:2] + (-1,) + stack.shape[-2:])}


# ----------------------------------------------------------------------------- models


def trainable(model, spec, batch, lr: float = 3e-4):
    """A model with ``init`` and ``loss`` (RSSM, TD-MPC2's) trained alone as a pairing with
    CMA-ES trains it: ``agents.dreamer``'s learner without an actor-critic."""
    d = dreamer.config_block(learning_rate=lr, warmup=10)
    agent = dreamer.make(spec, d, model, learns_in_imagination=False)
    learner = agent.init(jax.random.PRNGKey(0), batch["obs"][:1, 0])
    step = backend.jit(agent.make_update(), donate_argnums=0)
    return model, learner, step, lambda learner: learner.params["model"]


def ensemble_trainer(spec, data):
    """MOPO's ensemble: one epoch of its bootstrap training per step, on the data's
    transitions (actions in the env's units)."""
    flat = {k: v[:-1].reshape((-1,) + v.shape[2:]) for k, v in data.items()}
    valid = ~data["is_first"][1:].reshape(-1)
    to_env = ActionBox.of(spec).to_env
    transitions = {"obs": flat["obs"][valid], "action": np.asarray(to_env(flat["action"]))[valid],
                   "reward": data["reward"][1:].reshape(-1)[valid],
                   "next_obs": data["obs"][1:].reshape((-1,) + data["obs"].shape[2:])[valid]}
    split = jax.tree.map(jnp.asarray, mopo.model_split(len(transitions["reward"]), 7, seed=0))
    spec_e = ensemble.EnsembleSpec(spec.obs_shape[0], spec.action_shape[0], 7, 5, (64, 64, 64),
                                   weight_decay=(2.5e-5, 5e-5, 7.5e-5, 1e-4))
    state = ensemble.init(spec_e, jax.random.PRNGKey(0), Normalizer.fit(jnp.asarray(
        ensemble.inputs(transitions["obs"][split["train"]],
                        transitions["action"][split["train"]]))))
    arrays = jax.tree.map(jnp.asarray, transitions)
    epoch = backend.jit(lambda s, k: ensemble.train_epoch(
        spec_e, s, arrays, split["train"], split["bootstrap"], split["holdout"], k),
        donate_argnums=0)
    model = ensemble.EnsembleModel(spec_e, termination.termination_fn(spec.env_id), to_env)
    return model, state, lambda state, batch, key: epoch(state, key), lambda state: state


def nextframe_trainer(spec, num_actions: int):
    """SimPLe's next-frame model (``tiny``): one Adafactor step of its pixel and reward
    losses on a batch of single transitions (teacher-forced)."""
    net = nextframe.NextFramePredictor(nextframe.SIZES["tiny"], "simple", stochastic=False,
                                       detach_reward=False)
    apply = nextframe.make_apply(net, num_actions)
    height, width = spec.obs_shape[1:]
    params = net.init({"params": jax.random.PRNGKey(0), "dropout": jax.random.PRNGKey(1),
                       "latent": jax.random.PRNGKey(2)}, jnp.zeros((1, height, width, 12)),
                      jnp.zeros((1, num_actions)), jnp.zeros((1, height, width, 3)), 1.0, True)
    tx = simple_agent.adafactor()

    def step(carry, batch, key):
        params, opt_state = carry
        stack, action = fr.to_hwc(batch["obs"][:, 0]), batch["action"][:, 0]
        target = fr.frame_hwc(batch["obs"][:, 1, -3:])
        label = (jnp.sign(batch["reward"][:, 1]) + 1).astype(jnp.int32)

        def loss(p):
            logits, reward_logits, _, _ = apply(p, stack, action, key, target, 0.0,
                                                train=True)
            return jnp.mean(nextframe.pixel_loss(logits, target)) + jnp.mean(
                nextframe.reward_cross_entropy(reward_logits, label))

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), {"loss": value}

    model = nextframe.FrameModel(apply, num_actions, (12, height, width))
    return model, (params, tx.init(params)), backend.jit(step, donate_argnums=0), \
        lambda carry: carry[0]


def vision_memory_trainer(num_actions: int):
    """World Models' V and M (z 32, LSTM 64): one Adam step of the VAE on the batch's frames
    and one of the MDN-RNN (reward and done heads) on its windows' posterior samples."""
    vision, memory = vae.ConvVAE(32), mdnrnn.MDNRNN(mdnrnn.MDNHyper(
        z_dim=32, hidden=64, predict_reward=True, predict_done=True))
    params = {"vae": vae.init(vision, jax.random.PRNGKey(0)),
              "rnn": mdnrnn.init(memory, jax.random.PRNGKey(1), num_actions)}
    tx = optax.adam(1e-3)

    def step(carry, batch, key):
        params, opt_state = carry
        k_vae, k_z = jax.random.split(key)
        frames = preprocess(batch["obs"].reshape((-1,) + batch["obs"].shape[2:]))

        def loss(p):
            vae_loss, _ = vae.loss(vision, p["vae"], frames, k_vae)
            mu, logvar = vision.apply(jax.lax.stop_gradient(p["vae"]), frames,
                                      method=vae.ConvVAE.encode)
            z = vae.sample(mu, logvar, k_z).reshape(batch["obs"].shape[:2] + (32,))
            inside = ~batch["is_first"][:, 1:]
            rnn_loss, _ = mdnrnn.loss(memory, p["rnn"], {
                "z": z, "action": jax.nn.one_hot(batch["action"][:, :-1], num_actions),
                "reset": batch["is_first"][:, :-1], "mask": inside,
                "reward": batch["reward"][:, 1:], "done": batch["is_terminal"][:, 1:]})
            return vae_loss + rnn_loss

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), {"loss": value}

    model = VisionMemory(vision, memory, num_actions, lambda a: a, discrete=True)
    return model, (params, tx.init(params)), backend.jit(step, donate_argnums=0), \
        lambda carry: carry[0]


# ----------------------------------------------------------------------------- measurement


def parameters(params) -> int:
    return int(sum(math.prod(x.shape) for x in jax.tree.leaves(params)))


def measure(name, task, model, carry, step, params_of, train, held, steps, batch_size,
            repeats) -> dict:
    rng = np.random.default_rng(1)
    length = 4 if name == "tdmpc2" else LENGTH  # TD-MPC2's horizon + 1
    seconds = []
    for i in range(steps):
        batch = windows(train, length, batch_size, rng)
        start = time.perf_counter()
        carry, _ = step(carry, batch, jax.random.PRNGKey(i))
        jax.block_until_ready(carry)
        seconds.append(time.perf_counter() - start)
    compile_s, seconds = seconds[0], seconds[1:] or seconds
    params = params_of(carry)
    test = windows(held, LENGTH, 64, np.random.default_rng(2))
    rewards, states = jax.jit(lambda p, b, k: protocol.open_loop(model, p, b, CONTEXT, k))(
        params, test, jax.random.PRNGKey(3))
    truth = test["reward"][:, CONTEXT:]
    reward_mse = np.asarray(jnp.mean((rewards - truth) ** 2, 0))  # [HORIZON]
    row = {"task": task, "model": name, "parameters": parameters(params),
           "train_step_ms": 1e3 * median(seconds), "compile_s": compile_s,
           "imagine_step_ms": 1e3 * imagine_time(model, params, test, repeats),
           "reward_var": float(np.var(np.asarray(truth))),
           **{f"reward_mse_h{h}": float(reward_mse[h - 1]) for h in (1, 5, 15)},
           "reward_mse": reward_mse.tolist()}
    if model.decodes:
        frames = model.decode(params, states)
        true = test["obs"][:, CONTEXT:]
        true = true[:, :, -3:] if true.shape[2] != 3 else true  # a stack's newest frame
        true = jnp.moveaxis(true, -3, -1).astype(jnp.float32) / 255.0
        if frames.shape[-3:-1] != true.shape[-3:-1]:
            true = jax.image.resize(true, true.shape[:2] + frames.shape[-3:], "bilinear")
        frame_mse = np.asarray(jnp.mean((frames - true) ** 2, (0, 2, 3, 4)))
        row.update({f"frame_mse_h{h}": float(frame_mse[h - 1]) for h in (1, 5, 15)},
                   frame_mse=frame_mse.tolist())
    return row


def imagine_time(model, params, test, repeats: int) -> float:
    """One jitted protocol ``step`` of 16 states (after a first, compiling call)."""
    batch = jax.tree.map(lambda x: x[:16], test)
    state = jax.tree.map(lambda x: x[:, 0], protocol.observe_sequence(
        model, params, jax.tree.map(lambda x: x[:, :1], batch), jax.random.PRNGKey(4)))
    action = protocol.agent_action(model, batch["action"][:, 0])
    step = jax.jit(model.step)
    jax.block_until_ready(step(params, state, action, jax.random.PRNGKey(5)))
    samples = []
    for i in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(step(params, state, action, jax.random.PRNGKey(i)))
        samples.append(time.perf_counter() - start)
    return median(samples)


def figure(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({r["task"] for r in rows})
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 3.6))
    for ax, task in zip(np.atleast_1d(axes), tasks, strict=True):
        for r in (r for r in rows if r["task"] == task):
            ax.plot(range(1, HORIZON + 1), r["reward_mse"], marker="o", ms=3, label=r["model"])
        floor = [r["reward_var"] for r in rows if r["task"] == task][0]
        ax.axhline(floor, color="grey", ls="--", lw=1, label="predicting the mean")
        ax.set(title=task, xlabel="open-loop horizon (steps)", ylabel="reward MSE",
               yscale="log")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    args = parser(__doc__, repeats=20).parse_args(argv)
    steps = 20 if args.quick else 300
    batch_size = 8 if args.quick else 16
    play_steps = 120 if args.quick else 1000
    rows = []
    spec, train = play("Pendulum-v1", play_steps, seed=1)
    _, held = play("Pendulum-v1", play_steps // 4 + LENGTH, seed=2)
    probe = windows(train, LENGTH, 2, np.random.default_rng(0))
    small = dict(deter=128, hidden=64, classes=8, units=64, depth=4)  # jaxwm/configs/pairing.py's
    for name, model in (
            ("rssm", rssm.make(spec.obs_shape, 1, False, "1m", **small)),
            ("tdmpc2", tdmpc2_model.LatentModel(tdmpc2_model.WorldModel(
                1, tdmpc2_model.SIZES[1])))):
        rows.append(measure(name, "Pendulum-v1 (vector)", *trainable(model, spec, probe),
                            train, held, steps, batch_size, args.repeats))
    model, state, step, params_of = ensemble_trainer(spec, train)
    rows.append(measure("ensemble", "Pendulum-v1 (vector)", model, state, step, params_of,
                        train, held, max(1, steps // 30), batch_size, args.repeats))

    pixels = dict(img_height=64, img_width=64, gray_scale=False, frame_stack=1)
    spec, train = play("Boxing-v5", play_steps, seed=1, **pixels)
    _, held = play("Boxing-v5", play_steps // 4 + LENGTH, seed=2, **pixels)
    n = spec.num_actions
    probe = windows(train, LENGTH, 2, np.random.default_rng(0))
    rows.append(measure("rssm", "Boxing-v5 (64x64 pixels)", *trainable(
        rssm.make(spec.obs_shape, n, True, "1m", **small), spec, probe), train, held, steps,
        batch_size, args.repeats))
    model, carry, step, params_of = nextframe_trainer(spec, n)
    stacks_train, stacks_held = stacked(train), stacked(held)
    rows.append(measure("nextframe", "Boxing-v5 (64x64 pixels)", model, carry, step,
                        params_of, stacks_train, stacks_held, steps, batch_size, args.repeats))
    model, carry, step, params_of = vision_memory_trainer(n)
    rows.append(measure("vae_mdnrnn", "Boxing-v5 (64x64 pixels)", model, carry, step,
                        params_of, train, held, steps, batch_size, args.repeats))

    hw = hardware()
    stem = write_results(
        "model_table", rows, hw,
        [f"{steps} optimiser steps each at batch {batch_size} (the ensemble: "
         f"{max(1, steps // 30)} epochs over all the data); data: "
         f"{play_steps} steps x 4 envs of random play (held out: another seed)",
         "reward_mse_hN: open-loop reward MSE N steps after 5 observed ones; reward_var: the "
         "held-out rewards' variance (predicting their mean)",
         "frame_mse_hN (decoding models): the newest frame's pixels in [0, 1]"],
        columns=["task", "model", "parameters", "train_step_ms", "compile_s",
                 "imagine_step_ms", "reward_var", "reward_mse_h1", "reward_mse_h5",
                 "reward_mse_h15", "frame_mse_h1", "frame_mse_h5", "frame_mse_h15"],
        quick=args.quick)
    figure(rows, stem + ".png")
    print(f"wrote {stem}.png")


if __name__ == "__main__":
    main()
