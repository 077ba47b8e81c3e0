"""TD-MPC2 throughput: updates/s and planning steps/s at the 1M and 5M model sizes, against the
reference PyTorch code on the same host, and each side's share of this machine's matmul rate.

Rows, per model size (``--sizes``), on cheetah-run's shapes (17 observations, 6 actions):

* ``update``: one TD-MPC2 update at batch 256, horizon 3 (``Agent.update_step``, jitted; the
  replay's sampling left out, as on the peer's side), seconds and updates/s;
* ``plan x1``: one MPPI step for one env (6 iterations of 512 samples, 24 policy
  trajectories): the acting layer's ``act`` of the planner, seconds and env steps/s;
* ``plan x8``: the same for 8 envs in one jitted call, one env after another (``lax.map``,
  the planner's default on a CPU: ``mppi.MPPIHyper.envs_per_batch``);
* ``plan x8 vmapped``: the 8 envs' candidates in one batch (4,096 rows per layer; the default
  on a GPU).

``matmul_share``: the time this machine needs for exactly the program's matrix products (every
``dot_general`` of its jaxpr, loops counted by their length, run alone: ``common.matmuls_alone``)
over the program's time; the peer's share is the same matmul time over the peer's time, since
both compute the same products (the peer evaluates all Q heads where jaxwm evaluates the two
it uses: its share is then an overestimate, ``notes``). The program and its matmuls alone
are timed in turn, one call each per repeat, and the share is the median of the per-pair
ratios (``common.program_row``). Compile time (the first call) apart; steady state is the
median of ``--repeats`` calls; peak memory is the process's.

``floor_s`` and ``share_bound``: the work of a program that is not a matrix product, each
piece compiled and timed alone at the shapes of one head or step, and what that leaves for
the matmul share at best, ``matmul_alone_s / (matmul_alone_s + floor_s)``. For the update
(``floor``): every hidden layer's LayerNorm + Mish and every latent's LayerNorm + SimNorm,
forward and backward where gradients flow, the dropout masks, the two-hot cross-entropies and
decodes, the policy prior's squashed Gaussian, both Adam steps with their gradient clips, the
target copy's EMA; it leaves out the consistency loss, the per-step masked means, the policy
loss's running scale and the copies the program makes. For planning (``plan_floor``, per env):
every hidden layer's LayerNorm + Mish and every latent's LayerNorm + SimNorm (centred, as the
planner runs them: ``models.tdmpc2.centre_weights``) in the
candidates' and the policy prior's rollouts, the two-hot decodes of rewards and Q-values, and
the policy prior's squashed Gaussian, and MPPI's own sampling, top-k and refit on an objective
that costs nothing; it leaves out the concatenations. Layers run ``count`` times in one
``lax.scan`` (``_looped``), not one dispatch each; each call computes and writes its whole
output and reads its input as the program does (the loop until 2026-11-28 did neither:
``_looped``). Each piece is a median of ``--repeats`` calls. Both bounds are estimates, not
ceilings: in the program XLA may overlap a piece with a product, and the 1M plan's share has
come out above its bound (benchmarks/README.md, TD-MPC2).

The peer is nicklashansen/tdmpc2's own code, run between jaxwm's measurements when
``--peer-command`` is given: a command that prints one JSON line (``benchmarks/peers/
tdmpc2_torch.py`` is that command; the reference code is never committed), at the same
thread count. ``speedup_bound`` is the peer's time over ``matmul_alone_s + floor_s``: what a
program doing this work's products and non-matmul pieces, each at its rate alone, would gain
on the peer here.

    python benchmarks/tdmpc2.py --quick                  # 1M only, one repeat (~1 min)
    python benchmarks/tdmpc2.py                          # 1M and 5M (~2 min on 2 cores)
    python benchmarks/tdmpc2.py --peer-command \\
        "$VENV/bin/python benchmarks/peers/tdmpc2_torch.py --src ../tdmpc2 --threads 2"
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
from common import (
    attach_peer,
    between_peer_runs,
    hardware,
    parser,
    peak_memory,
    program_row,
    timed,
    write_results,
)

from jaxwm.agents import mppi, tdmpc2
from jaxwm.envs.types import EnvSpec
from jaxwm.models import tdmpc2 as wm
from jaxwm.ops.dropout import dropout
from jaxwm.ops.layer_norm import layer_norm, layer_norm_mish

OBS_DIM, ACTION_DIM = 17, 6  # cheetah-run
BATCH = 256


def make_agent(size: int) -> tdmpc2.Agent:
    spec = EnvSpec("CheetahRun-v1", "dmc", 1, (OBS_DIM,), np.float32, False, None,
                   (ACTION_DIM,), -np.ones(ACTION_DIM, np.float32),
                   np.ones(ACTION_DIM, np.float32), 500)
    return tdmpc2.make(spec, tdmpc2.config_block(model_size=size, batch_size=BATCH))


def fixed_batch(agent: tdmpc2.Agent) -> dict:
    k_obs, k_act, k_rew = jax.random.split(jax.random.PRNGKey(0), 3)
    window = agent.hyper.horizon + 1
    return {"obs": jax.random.normal(k_obs, (BATCH, window, OBS_DIM)),
            "action": jax.random.uniform(k_act, (BATCH, window, ACTION_DIM), minval=-1,
                                         maxval=1),
            "reward": jax.random.uniform(k_rew, (BATCH, window)),
            "terminated": jnp.zeros((BATCH, window), bool),
            "is_first": jnp.zeros((BATCH, window), bool)}


def _ln_mish(x, scale, bias, centred=False):
    """What follows a hidden layer's matmul in ``models.tdmpc2.NormedLinear``: LayerNorm, then
    Mish (``ops.layer_norm``, the op the model runs, with its own backward); ``centred`` as
    the planner runs it."""
    return layer_norm_mish(x, scale, bias, centred)


def _backward_of(fn, inputs: int | None = None):
    """``fn``'s forward and its backward with respect to its first ``inputs`` arguments (all of
    them by default: a layer's scale and bias as well as its input), with the output itself as
    the incoming gradient."""

    def run(*args):
        n = len(args) if inputs is None else inputs
        y, vjp = jax.vjp(lambda *wrt: fn(*wrt, *args[n:]), *args[:n])
        return vjp(y)

    return run


def _ln_simnorm(x, scale, bias, centred=False):
    """The latent's output layer after its matmul: LayerNorm, then SimNorm."""
    return wm.simnorm(layer_norm(x, scale, bias, centred))


def _alone(fn, repeats: int, *args) -> float:
    return timed(lambda: jax.block_until_ready(fn(*args)), repeats).median


def _looped(fn, count: int):
    """``fn(x, *rest)`` run ``count`` times in one ``lax.scan``, with no dispatch between the
    calls (a floor of hundreds of small layers would otherwise time the dispatcher). Each call's
    whole output is carried to the loop's result, so XLA computes and writes all of it, as the
    program does; ``x`` is carried too, through an optimisation barrier with the output, so
    XLA cannot tell it is loop-invariant and hoist work on it out of the loop, and no pass
    over it is added. (Until 2026-11-28 the loop kept one element of the output, so XLA
    computed Mish and the two-hot decodes for that element alone, and it multiplied ``x`` by
    a carried scalar, a pass the program does not make.)"""

    @jax.jit
    def run(x, *rest):
        def body(carry, _):
            x, _ = carry
            out = fn(x, *rest)
            return jax.lax.optimization_barrier((x, out)), None

        shapes = jax.eval_shape(fn, x, *rest)
        outputs = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        return jax.lax.scan(body, (x, outputs), None, length=count)[0][1]

    return run


def _layers_alone(table: dict, fn, repeats: int) -> float:
    """Seconds for ``count`` calls of ``fn`` on ``(rows, width)`` activations, per table entry."""
    total = 0.0
    for (rows, width), count in table.items():
        x = jax.random.normal(jax.random.PRNGKey(0), (rows, width))
        total += _alone(_looped(fn, count), repeats, x, jnp.ones(width), jnp.zeros(width))
    return total


def floor(agent: tdmpc2.Agent, learner, repeats: int) -> dict[str, float]:
    """Seconds of the update's non-matmul pieces, each alone (module docstring): the layers
    counted from the update (``Agent.update_step``) for the model's sizes."""
    s, h, b = agent.model.sizes, agent.hyper.horizon, BATCH
    steps, with_pi = h * b, (h + 1) * b  # rows per head: model loss / TD target, policy loss
    enc_hidden = max(s.num_enc_layers - 1, 1)
    # (rows, width) -> layers: forward and backward (gradients flow) or forward only.
    trained = {(steps, s.mlp_dim): 2 + 2 + 2 * s.num_q,  # dynamics, reward, every Q head
               (with_pi, s.mlp_dim): 2 + 2 * 2,  # the policy prior, two Q heads on its actions
               (b, s.enc_dim): enc_hidden}  # the encoder on the first observation
    forward = {(steps, s.mlp_dim): 2 + 2 * 2,  # TD target: the prior, two target Q heads
               (steps, s.enc_dim): enc_hidden}  # the encoder on the next observations
    pieces = {"LayerNorm+Mish fwd+bwd": _layers_alone(trained, _backward_of(_ln_mish), repeats),
              "LayerNorm+Mish fwd": _layers_alone(forward, _ln_mish, repeats)}
    masks = jax.jit(lambda k, rows: dropout(k, jnp.ones((rows, s.mlp_dim)), wm.Q_DROPOUT),
                    static_argnums=1)
    pieces["dropout masks"] = (s.num_q * _alone(masks, repeats, jax.random.PRNGKey(0), steps)
                               + 2 * _alone(masks, repeats, jax.random.PRNGKey(0), with_pi))
    model_tx, pi_tx = agent.optimizers()
    params, pi_params = learner.params, wm.policy_params(learner.params)

    def adam(tx, params, state):
        grads = jax.tree.map(lambda p: 1e-3 * p, params)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    pieces["Adam steps"] = (_alone(jax.jit(partial(adam, model_tx)), repeats, params,
                                   learner.model_opt)
                            + _alone(jax.jit(partial(adam, pi_tx)), repeats, pi_params,
                                     learner.pi_opt))
    ema = jax.jit(lambda online, target: optax.incremental_update(online, target, 0.01))
    pieces["target EMA"] = _alone(ema, repeats, wm.q_params(params), learner.target_qs)
    # The latents' LayerNorm + SimNorm: the dynamics' outputs over the horizon and the
    # encoder's on the first observation (gradients flow), the encoder's on the next ones.
    pieces["LayerNorm+SimNorm fwd+bwd"] = _layers_alone(
        {(steps, s.latent_dim): 1, (b, s.latent_dim): 1}, _backward_of(_ln_simnorm), repeats)
    pieces["LayerNorm+SimNorm fwd"] = _layers_alone({(steps, s.latent_dim): 1}, _ln_simnorm,
                                                    repeats)
    # The two-hot cross-entropies of the reward and every Q head (symlog and two-hot encoding
    # of the targets included), and the decodes of two heads' Q-values: the TD target's
    # (forward) and the policy loss's (forward and backward).
    logits = lambda rows: jax.random.normal(jax.random.PRNGKey(0), (rows, wm.NUM_BINS))  # noqa: E731
    ce_rows = (1 + s.num_q) * steps
    targets = jax.random.normal(jax.random.PRNGKey(1), (ce_rows,))
    pieces["two-hot losses fwd+bwd"] = _alone(jax.jit(_backward_of(wm.soft_cross_entropy)),
                                              repeats, logits(ce_rows), targets)
    pieces["two-hot decodes"] = (_alone(jax.jit(wm.decode), repeats, logits(2 * steps))
                                 + _alone(jax.jit(_backward_of(wm.decode)), repeats,
                                          logits(2 * with_pi)))
    # The policy prior's squashed Gaussian: the TD target's (forward), the policy loss's.
    out = lambda rows: jax.random.normal(jax.random.PRNGKey(0), (rows, 2 * agent.action_dim))  # noqa: E731
    key = jax.random.PRNGKey(2)
    pieces["policy squash"] = (
        _alone(jax.jit(wm.squashed_gaussian), repeats, out(steps), key)
        + _alone(jax.jit(_backward_of(lambda o, k: wm.squashed_gaussian(o, k)[1], inputs=1)),
                 repeats, out(with_pi), key))
    return pieces


def plan_floor(agent: tdmpc2.Agent, repeats: int) -> dict[str, float]:
    """Seconds of one env's planning step that are not matrix products, each piece alone
    (module docstring), counted from ``Agent.objective`` and ``mppi.plan``: per iteration, the
    candidates' rollouts (reward and dynamics, ``horizon`` steps), the policy prior and two Q
    heads at the final latent; once, the policy prior's own rollouts."""
    s, p = agent.model.sizes, agent.planning
    n, h, iters = p.num_samples, p.horizon, p.iterations
    hidden = {(n, s.mlp_dim): iters * (4 * h + 2 + 2 * 2),  # reward, dynamics; pi, two Q heads
              (p.num_pi_trajs, s.mlp_dim): 4 * h}  # the prior's rollouts: pi, dynamics
    latent = {(n, s.latent_dim): iters * h, (p.num_pi_trajs, s.latent_dim): h}
    logits = jax.random.normal(jax.random.PRNGKey(0), (n, wm.NUM_BINS))
    pieces = {"LayerNorm+Mish fwd": _layers_alone(hidden, partial(_ln_mish, centred=True),
                                                  repeats),
              "LayerNorm+SimNorm fwd": _layers_alone(latent, partial(_ln_simnorm, centred=True),
                                                     repeats),
              "two-hot decodes": _alone(_looped(wm.decode, iters * (h + 2)), repeats, logits)}
    # The policy prior's squashed Gaussian: at each iteration's final latents, and in the
    # prior's own rollouts.
    key = jax.random.PRNGKey(2)
    squash = lambda out, key: wm.squashed_gaussian(out, key)[0]  # noqa: E731
    pieces["policy squash"] = sum(
        _alone(_looped(squash, count), repeats,
               jax.random.normal(key, (rows, 2 * agent.action_dim)), key)
        for rows, count in ((n, iters), (p.num_pi_trajs, h)))
    # MPPI's own work (sampling, top-k, the elites' refit, the final pick) on a free objective.
    mean = jnp.zeros((h, agent.action_dim))
    fixed = jnp.zeros((p.num_pi_trajs, h, agent.action_dim))
    search = jax.jit(lambda key: mppi.plan(lambda seqs, k: -jnp.sum(seqs ** 2, (1, 2)), key,
                                           mean, p, fixed))
    pieces["MPPI sampling, top-k, refit"] = _alone(search, repeats, jax.random.PRNGKey(0))
    return pieces


def with_bound(row: dict, pieces: dict[str, float], copies: int = 1) -> dict:
    """``row`` with its floor (``copies`` times ``pieces``) and the share that leaves room for."""
    row["floor_pieces_s"] = {k: copies * v for k, v in pieces.items()}
    row["floor_s"] = sum(row["floor_pieces_s"].values())
    row["share_bound"] = row["matmul_alone_s"] / (row["matmul_alone_s"] + row["floor_s"])
    return row


def row(size: int, what: str, fn, args, per_call: float, unit: str, repeats: int) -> dict:
    out = program_row(fn, args, repeats, carry_first=what == "update")
    return {"size": f"{size}M", "what": what, **out,
            f"{unit}_per_s": per_call / out["s_per_call"]}


def measure(size: int, repeats: int) -> list[dict]:
    agent = make_agent(size)
    learner = agent.init_learner(jax.random.PRNGKey(1))
    rows = [row(size, "update", agent.update_step,
                (learner, fixed_batch(agent), jax.random.PRNGKey(2)), 1, "updates", repeats)]
    with_bound(rows[0], floor(agent, learner, repeats))
    planning = plan_floor(agent, repeats)
    # 8 envs one after another (the CPU default) and all 8 vmapped at once (the GPU default).
    for envs, per_batch in ((1, 1), (8, 1), (8, 8)):
        planner = dataclasses.replace(
            agent, planning=dataclasses.replace(agent.planning, envs_per_batch=per_batch))
        policy = planner.planner()
        carry = policy.init_carry(learner, envs)
        obs = jax.random.normal(jax.random.PRNGKey(3), (envs, OBS_DIM))
        args = (learner, carry, obs, jnp.zeros(envs, bool), jax.random.PRNGKey(4), 1.0)
        what = f"plan x{envs}" + (" vmapped" if per_batch > 1 else "")
        rows.append(with_bound(row(size, what, policy.act, args, envs, "env_steps", repeats),
                               planning, envs))
    mib, label = peak_memory()
    for r in rows:
        r["peak_mib"], r["memory"] = mib, label
    return rows


def main() -> None:
    p = parser(__doc__, repeats=5)
    p.add_argument("--sizes", default="1,5", help="comma-separated model sizes (M params)")
    p.add_argument("--peer-command", default="",
                   help="a command printing the reference's timings as one JSON line")
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.quick:
        args.repeats, sizes = 1, [1]
    rows, peers = between_peer_runs(
        args.peer_command, lambda: [r for size in sizes for r in measure(size, args.repeats)])
    notes = [
        f"update: batch {BATCH}, horizon 3, one update per call; plan: 6 MPPI iterations of 512 "
        "samples (24 from the policy prior), 64 elites; median of "
        f"{args.repeats} calls; compile_s: the first call.",
        "matmul_share: the time of the program's matrix products run alone over the program's "
        "time (1.0 = every cycle spent in matmuls at the rate this machine reaches for those "
        "shapes); the two are timed in turn and the share is the median of the per-pair ratios.",
        "share_bound: matmul_alone_s / (matmul_alone_s + floor_s), floor_s the program's "
        "non-matmul pieces timed alone (LayerNorm + Mish and + SimNorm, two-hot losses and "
        "decodes, the policy's squash; the update's dropout masks, clipped Adam steps and "
        "target EMA; planning's MPPI sampling, top-k and refit; floor_pieces_s in the JSON): "
        "the highest matmul_share a program with those pieces could reach on this machine if "
        "none overlapped a product (an estimate, not a ceiling: a share can come out above it).",
        "peak_mib: " + rows[0]["memory"] + ".",
    ]
    if peers:
        threads = peers[0].get("threads")
        where = (f"on {peers[0]['device_name']}" if peers[0].get("device") == "cuda"
                 else f"{threads} thread(s)")
        notes.append(f"Peer: nicklashansen/tdmpc2 (PyTorch {peers[0].get('torch')}, "
                     f"{where}, compile={peers[0].get('compile')}), "
                     f"{len(peers)} runs, one before and one after jaxwm's.")
        keys = {"update": "update_s", "plan x1": "plan_s"}  # the peer plans for one env

        def peer_seconds(r, p):
            size = p.get("sizes", {}).get(r["size"][:-1], {})  # "5M" -> "5"
            return size.get(keys[r["what"]]) if r["what"] in keys else None

        attach_peer(rows, peers, peer_seconds)
        for r in rows:  # the most a program doing this work could gain on the peer here
            if "peer_s" in r:
                r["speedup_bound"] = r["peer_s"] / (r["matmul_alone_s"] + r["floor_s"])
        notes.append("speedup_bound: peer_s / (matmul_alone_s + floor_s), the speedup of a "
                     "program that did this work's matrix products and non-matmul pieces "
                     "each at their rate alone, one after another.")
    columns = ["size", "what", "s_per_call", "updates_per_s", "env_steps_per_s", "peer_s",
               "speedup", "speedup_bound", "matmul_gflop", "gflops", "matmul_share",
               "share_bound", "floor_s", "peer_matmul_share", "compile_s", "peak_mib"]
    write_results("tdmpc2", rows, hardware(), notes, columns=columns, quick=args.quick)


if __name__ == "__main__":
    main()
