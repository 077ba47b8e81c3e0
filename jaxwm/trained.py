"""Trained runs as objects: ``jaxwm.load(workdir)`` restores a run's checkpoint read-only and
returns a ``TrainedAgent`` that acts, evaluates again (on the run's env or another with the
same spaces, e.g. a noisy variant) and, for model-based systems, imagines with its world
model; ``jaxwm eval`` does the same from the shell. What SB3's ``load``, CleanRL's
``enjoy.py``, TD-MPC2's ``evaluate.py`` and DreamerV3's ``eval_only`` give their users.

Loading rebuilds the algorithm from the run's ``config.json`` (``algos.get(...).build``),
initialises a fresh state as the template, restores the newest readable checkpoint (or
``step``) into it through the loop's own ``Checkpointer.restore``, which verifies the files
and refuses another layout, and keeps only what acting and imagining read: one seed's
policy parameters and world-model parameters. Nothing in the run directory is written,
moved or rotated; ``jaxwm eval`` writes only under ``<workdir>/eval/``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxwm import algos, backend
from jaxwm.config import ConfigError, base_config
from jaxwm.envs import UnknownEnvError, probe_spec
from jaxwm.loop import seeds
from jaxwm.loop.checkpoint import Checkpointer, IncompatibleCheckpointError, saved_steps
from jaxwm.loop.evaluate import Evaluator
from jaxwm.media import Video
from jaxwm.models import protocol


class LoadError(RuntimeError):
    """A run directory that cannot be loaded; the message says why and what to do."""


def _tuples(node):
    """JSON's lists back into the tuples configs hold (jitted code hashes its settings)."""
    if isinstance(node, dict):
        return {k: _tuples(v) for k, v in node.items()}
    if isinstance(node, list):
        return tuple(_tuples(v) for v in node)
    return node


def run_config(workdir: str) -> ml_collections.ConfigDict:
    """The resolved config a run was started with (its ``config.json``)."""
    path = os.path.join(workdir, "config.json")
    if not os.path.isfile(path):
        raise LoadError(f"{workdir} is not a jaxwm run directory (no config.json); pass the "
                        "--workdir a `jaxwm train` run wrote.")
    with open(path) as f:
        try:
            saved = json.load(f)
        except json.JSONDecodeError as e:
            raise LoadError(f"{path} is not valid JSON ({e}).") from None
    if saved.get("algo") not in algos.REGISTRY:
        raise LoadError(f"{path} holds algorithm {saved.get('algo')!r}, which this jaxwm does "
                        f"not have (known: {', '.join(algos.names())}).")
    # Keys the shared config gained since the run keep their defaults, as on resume
    # (``checkpoint.config_differences``).
    config = base_config()
    config.unlock()
    config.update(ml_collections.ConfigDict(_tuples(saved)))
    return config


def _one_seed(tree, seed: int, num_seeds: int):
    if num_seeds == 1:
        return tree
    return jax.tree.map(lambda x: x[seed], tree)


@dataclasses.dataclass
class ImaginedWorldModel:
    """A run's world model (``models.protocol.WorldModel``) with its trained parameters."""

    model: protocol.WorldModel
    params: object
    spec: object
    seed: int

    def imagine(self, obs, actions, key=None) -> dict:
        """From observations ``obs`` [B, ...] (the env's layout), the model's predictions under
        ``actions`` [B, H, ...] in the agent's units (discrete: indices; continuous: [-1, 1],
        which the model maps to the env's box as the policy's actions are): ``rewards`` and
        ``continues`` [B, H], ``features`` [B, H, F] of each predicted state (for a vector
        model, the predicted observation) and, where the model decodes observations, ``frames``
        [B, H, height, width, channels] in [0, 1]."""
        key = jax.random.PRNGKey(self.seed) if key is None else key
        actions = np.asarray(actions)
        if self.model.discrete:
            agent_actions = jax.nn.one_hot(actions, self.model.action_dim)
        else:
            agent_actions = jnp.clip(jnp.asarray(actions, jnp.float32), -1.0, 1.0)
        out = protocol.predict(self.model, self.params, jnp.asarray(obs), agent_actions, key)
        return {name: np.asarray(value) for name, value in out.items()}


class TrainedAgent:
    """One seed's trained policy (and world model, where the algorithm has one)."""

    def __init__(self, config, workdir: str, step: int, counters: dict, policy, params,
                 spec, score_reference, world_model: ImaginedWorldModel | None, seed: int):
        self.config, self.workdir, self.step, self.counters = config, workdir, step, counters
        self.spec, self.seed = spec, seed
        self.world_model = world_model
        self._policy, self._params, self._score_reference = policy, params, score_reference
        self._act = backend.jit(policy.act)
        self._key = jax.random.PRNGKey(config.seed + 7_919 * seed)

    def __repr__(self) -> str:
        done = ", ".join(f"{n:,} {unit}" for unit, n in self.counters.items())
        return (f"TrainedAgent({self.config.algo} on {self.spec.env_id}, {self.workdir} "
                f"checkpoint {self.step}: {done})")

    def act(self, obs, carry=None, *, greedy: bool = True, is_first=None):
        """``(action, carry)`` for ``obs`` (one observation, or a batch [n, ...]). ``carry``:
        the recurrent or planning state the last call returned (``None``: a new episode).
        ``greedy``: the policy's mode (temperature 0), else a sample as trained.
        ``is_first`` [n]: which envs start an episode (default: all iff ``carry`` is None)."""
        obs = np.asarray(obs)
        single = obs.shape == tuple(self.spec.obs_shape)
        if not single and obs.shape[1:] != tuple(self.spec.obs_shape):
            raise ValueError(f"obs of shape {obs.shape}: this agent takes {self.spec.obs_shape} "
                             "or a batch of them.")
        batch = obs[None] if single else obs
        if is_first is not None:
            is_first = np.broadcast_to(np.asarray(is_first, bool), batch.shape[:1])
        if carry is None:
            carry = self._policy.init_carry(self._params, batch.shape[0])
            first = np.ones(batch.shape[0], bool) if is_first is None else is_first
        else:
            first = np.zeros(batch.shape[0], bool) if is_first is None else is_first
        self._key, key = jax.random.split(self._key)
        temperature = jnp.float32(0.0 if greedy else 1.0)
        carry, action, _ = self._act(self._params, carry, jnp.asarray(batch),
                                     jnp.asarray(first), key, temperature)
        action = np.asarray(action)
        return (action[0] if single else action), carry

    def evaluate(self, num_episodes: int = 10, *, video: bool = False, env_id: str | None = None,
                 greedy: bool | None = None, num_envs: int | None = None) -> dict:
        """Mean and std return (and the normalised scores the run reports) of
        ``num_episodes`` episodes on the run's env, or ``env_id``, which must have the same
        spaces. ``greedy``: ``None`` evaluates at the run's ``eval.temperature``. With
        ``video``, ``result["eval/video"]`` holds env 0's first episode (``media.Video``)."""
        config = ml_collections.ConfigDict(self.config.to_dict())
        config.num_seeds = 1
        config.eval.num_episodes, config.eval.video = int(num_episodes), bool(video)
        config.eval.num_envs = int(num_envs or min(config.eval.num_envs, num_episodes))
        config.eval.action_noise = config.eval.obs_noise = 0.0
        if greedy is not None:
            config.eval.temperature = 0.0 if greedy else 1.0
        if env_id is not None and env_id != config.env.id:
            config.env.id = env_id
            self._check_same_spaces(probe_spec(config.env))
        evaluator = Evaluator(config, self._policy, score_reference=self._score_reference)
        try:
            self._key, key = jax.random.split(self._key)
            metrics = evaluator.run(self._params, key)
        finally:
            evaluator.close()
        if "eval/episodic_return" not in metrics:
            raise LoadError(f"the evaluation on {config.env.id} did not finish {num_episodes} "
                            "episodes within its step cap (a policy that never ends an "
                            "episode?); nothing was written.")
        return metrics

    def _check_same_spaces(self, other) -> None:
        def spaces(spec) -> dict:
            box = None if spec.discrete else (np.asarray(spec.action_low).ravel().tolist(),
                                               np.asarray(spec.action_high).ravel().tolist())
            return {"observations": tuple(spec.obs_shape),
                    "observation dtype": str(np.dtype(spec.obs_dtype)),
                    "actions": spec.num_actions if spec.discrete else tuple(spec.action_shape),
                    "action bounds": box}

        ours, theirs = spaces(self.spec), spaces(other)
        differ = [f"{what} {theirs[what]} vs {ours[what]}" for what in ours
                  if theirs[what] != ours[what]]
        if differ:
            raise LoadError(f"{other.env_id} has other spaces than {self.spec.env_id}, which "
                            f"this agent was trained on: {'; '.join(differ)}.")


def load(workdir: str, step: int | None = None, *, seed: int = 0) -> TrainedAgent:
    """The agent of run ``workdir`` at its newest readable checkpoint (or ``step``), read-only.
    ``seed``: which of a ``num_seeds`` run's agents."""
    config = run_config(workdir)
    steps = saved_steps(workdir) if os.path.isdir(os.path.join(workdir, "checkpoints")) else []
    if not steps:
        raise LoadError(f"{workdir} has no checkpoint yet (a run saves at its checkpoint.every "
                        "and when it ends).")
    if step is not None and step not in steps:
        raise LoadError(f"{workdir} has no checkpoint {step}; it has {steps}.")
    if not 0 <= seed < config.num_seeds:
        raise LoadError(f"seed={seed}: this run trained {config.num_seeds} seed(s) (0 to "
                        f"{config.num_seeds - 1}).")
    entry = algos.get(config.algo)
    dataset = os.path.expanduser(str(config.get("dataset", "") or ""))
    if entry.offline and not os.path.exists(dataset):
        raise LoadError(f"this offline run reads its dataset at {dataset!r} (relative to where "
                        "it trained), which is not there: load it from that directory.")
    try:
        spec = probe_spec(config.env)
        algorithm = entry.build(config)
    except (KeyError, AttributeError) as e:
        missing = e.args[0] if e.args else e
        raise LoadError(f"{workdir} was written by another jaxwm version: its config lacks "
                        f"the setting {missing!s:.80} that this version's {config.algo} "
                        "reads.") from None
    try:
        # The template a checkpoint restores into, initialised as the trainer does (a key per
        # seed); its values are overwritten.
        _, init_key = seeds.split(seeds.loop_key(config.seed, config.num_seeds,
                                                 config.env.num_envs))
        state = algorithm.init(init_key)
        checkpointer = Checkpointer(workdir, keep=max(len(steps), 1), read_only=True)
        try:
            saved, loop, step, unreadable = checkpointer.restore(algorithm.persistent(state),
                                                                 step)
        finally:
            checkpointer.close()
        for bad, error in unreadable:
            print(f"jaxwm.load: checkpoint {bad} of {workdir} cannot be read ({error}); "
                  f"loaded {step}.", file=sys.stderr)
        state = algorithm.on_restore(state, saved)
        params = _one_seed(algorithm.policy_params(state), seed, config.num_seeds)
        world_model = None
        if algorithm.world_model is not None:
            world_model = ImaginedWorldModel(
                algorithm.world_model,
                _one_seed(algorithm.world_model_params(state), seed, config.num_seeds),
                spec, config.seed)
    finally:
        algorithm.close()
    counters = {k: v for k, v in loop.get("scheduler", {}).get("totals", {}).items()
                if k != "iterations"}
    return TrainedAgent(config, workdir, step, counters, algorithm.policy, params, spec,
                        algorithm.score_reference, world_model, seed)


def _eval_dir(workdir: str, step: int) -> str:
    """A new folder for this evaluation: ``eval/<step>/``, or ``eval/<step>-2/``... where an
    earlier evaluation of the same checkpoint is kept."""
    base = os.path.join(workdir, "eval", str(step))
    path, n = base, 1
    while os.path.exists(path):
        n += 1
        path = f"{base}-{n}"
    return path


def write_eval(agent: TrainedAgent, metrics: dict, env_id: str | None = None) -> str:
    """Writes ``results.json`` (and ``video.gif``, ``video.mp4`` where an encoder is
    installed) into a new ``eval/<step>/`` folder of the run; returns the folder."""
    from jaxwm.loop.metrics import gif_bytes, write_mp4

    while True:  # another evaluation may take the same name between looking and making
        out = _eval_dir(agent.workdir, agent.step)
        try:
            os.makedirs(out)
            break
        except FileExistsError:
            continue
    video = metrics.pop("eval/video", None)
    if isinstance(video, Video):
        with open(os.path.join(out, "video.gif"), "wb") as f:
            f.write(gif_bytes(video.frames, video.fps))
        write_mp4(os.path.join(out, "video.mp4"), video.frames, video.fps)
    record = {"workdir": agent.workdir, "checkpoint": agent.step, "env": env_id or agent.spec.env_id,
              "counters": agent.counters, "seed": agent.seed,
              **{k: float(v) for k, v in metrics.items()}}
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(record, f, indent=2)
    return out


def main(argv=None, prog: str = "jaxwm eval") -> int:
    parser = argparse.ArgumentParser(
        prog=prog, description="Evaluate a trained run again, from its checkpoint (read-only); "
        "results go to a new <workdir>/eval/<step>/ folder.")
    parser.add_argument("--workdir", required=True, help="the run directory")
    parser.add_argument("--episodes", type=int, default=10, help="episodes (default 10)")
    parser.add_argument("--video", action="store_true", help="record env 0's first episode")
    parser.add_argument("--step", type=int, default=None, help="checkpoint (default: newest)")
    parser.add_argument("--env_id", default=None, help="another env with the same spaces")
    parser.add_argument("--seed_index", type=int, default=0,
                        help="which agent of a num_seeds run (default 0)")
    parser.add_argument("--sample", action="store_true",
                        help="sample actions as trained (default: the run's eval.temperature)")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error(f"--episodes={args.episodes} must be >= 1")
    try:
        agent = load(args.workdir, args.step, seed=args.seed_index)
        metrics = agent.evaluate(args.episodes, video=args.video, env_id=args.env_id,
                                 greedy=False if args.sample else None)
    except (LoadError, IncompatibleCheckpointError, ConfigError, UnknownEnvError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    out = write_eval(agent, metrics, args.env_id)
    ret, std = metrics.get("eval/episodic_return"), metrics.get("eval/episodic_return_std")
    print(f"{agent!r}\n{args.episodes} episodes on {args.env_id or agent.spec.env_id}: return "
          f"{ret:.1f} +- {std:.1f}; written to {out}")
    return 0
