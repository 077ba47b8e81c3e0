"""Config pieces every algorithm shares, and the host-side validation run before compiling.

Algorithm config files (``configs/<algo>.py``) start from ``base_config()`` and add their
own block (e.g. ``config.ppo``). ``total_env_steps`` is a FieldReference, so phases whose
duration refers to it follow a ``--config.total_env_steps=...`` override.

Clocks (``log.every``, ``checkpoint.every``, ``eval.every``) are strings ``"N unit"`` in any
counter the algorithm's hooks declare, several separated by commas, or ``"never"``
(``jaxwm.loop.phases.Clock``); they are checked against the algorithm when the loop is built.
"""

from __future__ import annotations

import ml_collections


def base_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.algo = ""
    c.seed = 1
    c.resume = False
    c.total_env_steps = ml_collections.FieldReference(100_000)
    c.num_devices = 0  # 0: every device JAX sees
    c.num_seeds = 1  # > 1: that many independent agents in one process (jaxwm/loop/seeds.py)
    # With a JAX env (gymnax:..., craftax:...): whole iterations one compiled call runs, so the
    # host (logs, clocks, checkpoints) is visited once per that many (jaxwm/algos/ppo.py).
    c.iterations_per_call = 1

    c.env = ml_collections.ConfigDict()
    c.env.id = "CartPole-v1"
    c.env.num_envs = 8
    c.env.max_episode_steps = 0  # 0: the env's registered limit
    c.env.masked_indices = ()  # vector observations: dims set to 0 (velocity masking)
    # envpool's asynchronous mode (PPO): each step returns the batch_size envs ready first,
    # out of num_envs. 0: all envs, synchronously (jaxwm/envs/factory.py).
    c.env.batch_size = 0
    c.env.num_threads = 0  # envpool's worker threads; 0: its default (async: min(batch, cores))
    c.env.flatten_obs = False  # MinAtar (gymnax): frames as one float vector (jaxwm/envs/native.py)

    c.phase_order = ("train",)
    c.phases = ml_collections.ConfigDict()

    c.log = ml_collections.ConfigDict()
    c.log.every = "10000 env_steps"
    c.log.x_axis = "env_steps"  # the counter TensorBoard and metrics.jsonl plot against
    c.log.progress = True
    # Weights & Biases (jaxwm.loop.wandb_sink; pip install 'jaxwm[wandb]'): on when project is
    # set; group defaults to the algorithm, name to the run directory's.
    c.log.wandb = ml_collections.ConfigDict(
        {"project": "", "entity": "", "group": "", "name": "", "mode": "offline"})

    c.checkpoint = ml_collections.ConfigDict()
    c.checkpoint.every = "100000 env_steps"
    c.checkpoint.keep = 3

    c.eval = ml_collections.ConfigDict()
    c.eval.every = "50000 env_steps"  # "never": only at the end (eval.at_end)
    c.eval.at_end = True
    c.eval.num_envs = 8  # at most num_episodes are used: each env owes a fixed quota
    c.eval.num_episodes = 10
    c.eval.temperature = 1.0  # 0: the policy's mode (greedy); 1: as trained
    c.eval.video = False
    c.eval.action_noise = 0.0  # std of Gaussian noise added to actions (robustness tests)
    c.eval.obs_noise = 0.0  # std of Gaussian noise added to the observations the policy sees
    return c


def pool_is_async(c: ml_collections.ConfigDict) -> bool:
    """Whether ``c.env`` asks for envpool's asynchronous mode: ``env.batch_size`` of the
    ``env.num_envs`` envs per step (0 or ``num_envs``: all, synchronously)."""
    return 0 < c.env.batch_size < c.env.num_envs


def is_learning_rate(dotted: str) -> bool:
    """Whether a dotted setting names a learning rate (``sac.actor_lr``, ``ppo.learning_rate``)."""
    leaf = dotted.rsplit(".", 1)[-1]
    return leaf in ("lr", "learning_rate") or leaf.endswith("_lr")


class ConfigError(ValueError):
    """A config value the user set is invalid; the message says which and what to do."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def require(checks) -> None:
    """Raises the ``ConfigError`` of the first ``(ok, message)`` whose ``ok`` is false."""
    for ok, message in checks:
        _require(ok, message)


# The shared settings (``base_config``) where 0 means something other than a size; an
# algorithm's own are on its registry entry (``algos.Entry.zero_means``). Every other integer
# a config holds, alone or in a tuple, is a size and must be > 0 (``check_sizes``).
ZERO_MEANS = {
    "seed": "a seed", "num_devices": "every device", "env.batch_size": "every env, synchronously",
    "env.num_threads": "envpool's default", "env.max_episode_steps": "the registered limit",
    "env.noop_max": "no no-op starts", "env.masked_indices": "an index",
}
NOT_SIZES = ("env.camera",)  # indices that may be negative
# Phases are checked by the loop's parser (loop.phases.phases_from_config): only those in
# phase_order, whose durations must be > 0; a phase left out may have any.
CHECKED_ELSEWHERE = ("phases.",)


def _leaves(node, prefix=""):
    for name, value in node.items():
        if isinstance(value, ml_collections.ConfigDict):
            yield from _leaves(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", value


def check_sizes(c: ml_collections.ConfigDict, zero_means: dict | None = None) -> None:
    """Every integer setting (alone or in a tuple) is > 0, except those of ``ZERO_MEANS`` and
    the algorithm's ``zero_means`` (>= 0) and ``NOT_SIZES``: one place, so no algorithm meets
    a batch of 0 at run time."""
    zero_means = {**ZERO_MEANS, **(zero_means or {})}
    for name, value in _leaves(c):
        values = value if isinstance(value, (tuple, list)) else (value,)
        ints = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
        if name in NOT_SIZES or name.startswith(CHECKED_ELSEWHERE) or not ints:
            continue
        if name in zero_means:
            _require(min(ints) >= 0, f"{name}={value!r} must be >= 0 (0: "
                     f"{zero_means[name]}).")
        else:
            _require(min(ints) > 0, f"{name}={value!r} is a size and must be > 0.")


def validate_common(c: ml_collections.ConfigDict, zero_means: dict | None = None) -> None:
    """Checks of the settings every config shares (``base_config``), and of every size (those
    of ``zero_means`` may be 0 too)."""
    check_sizes(c, zero_means)
    _require(c.env.batch_size <= c.env.num_envs,
             f"env.batch_size={c.env.batch_size} must be in [0, env.num_envs={c.env.num_envs}]:"
             " an asynchronous pool returns batch_size of its num_envs envs per step (0: all "
             "of them, synchronously).")
    masked = c.env.masked_indices
    _require(isinstance(masked, (tuple, list)) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in masked),
        f"env.masked_indices={masked!r} must be a tuple of integers, e.g. "
        "--config.env.masked_indices='(1, 3)'.")
    _require(c.eval.temperature >= 0, f"eval.temperature must be >= 0 (0: greedy), got "
             f"{c.eval.temperature}.")
    _require(c.eval.action_noise >= 0 and c.eval.obs_noise >= 0,
             "eval.action_noise and eval.obs_noise are standard deviations: >= 0.")


PACKAGE = "jaxwm.configs"


def packaged_configs() -> tuple[str, ...]:
    """The names of the configs inside the package (``jaxwm/configs/<name>.py``)."""
    import importlib.util
    import pkgutil

    package = importlib.util.find_spec(PACKAGE)
    return tuple(sorted(m.name for m in pkgutil.iter_modules(package.submodule_search_locations)
                        if not m.name.startswith("_")))


def _load_file(path: str):
    import importlib.util
    import os

    name = "jaxwm_config_" + os.path.splitext(os.path.basename(path))[0]
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None:
        raise ConfigError(f"{path!r} is not a Python config file.")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def config_module(spec: str):
    """The module a config spec names, and the variant: ``"ppo:cartpole"`` (a config inside
    the package, ``jaxwm/configs/ppo.py``), ``"my_configs/ppo.py:cartpole"`` (a file of the
    user's), or the older ``"ppo:cartpole"``, which names the packaged config where
    no such file exists. No variant: the module's default."""
    import importlib
    import os

    path, _, variant = spec.partition(":")
    if path.endswith(".py") or os.sep in path or "/" in path:
        stem = os.path.splitext(os.path.basename(path))[0]
        if os.path.exists(path):
            module = _load_file(path)
        elif os.path.basename(os.path.dirname(path)) == "configs" and stem in packaged_configs():
            module = importlib.import_module(f"{PACKAGE}.{stem}")
        else:
            raise ConfigError(f"No config file at {path!r}; the packaged configs are named "
                              f"without a path: {', '.join(packaged_configs())} "
                              "(jaxwm configs lists their variants).")
    elif path in packaged_configs():
        module = importlib.import_module(f"{PACKAGE}.{path}")
    else:
        raise ConfigError(f"Unknown config {path!r}; the packaged ones are "
                          f"{', '.join(packaged_configs())} (jaxwm configs lists their variants),"
                          " or pass a path to a .py file of your own.")
    known = getattr(module, "VARIANTS", None)
    if variant and known is not None and variant not in known:
        raise ConfigError(f"{path} has no variant {variant!r}; its variants are "
                          f"{', '.join(known)}.")
    return module, variant


def set_dotted(config: ml_collections.ConfigDict, dotted: str, value) -> None:
    """``config[a][b] = value`` for ``"a.b"``, refusing a key the config lacks."""
    *parents, leaf = dotted.split(".")
    node = config
    for name in parents:
        if name not in node or not isinstance(node[name], ml_collections.ConfigDict):
            raise ConfigError(f"Unknown config key {dotted!r}.")
        node = node[name]
    if leaf not in node:
        raise ConfigError(f"Unknown config key {dotted!r}.")
    node[leaf] = value


def load_or_refuse(spec: str) -> ml_collections.ConfigDict:
    """``load(spec)`` for a command line: whatever a user's config file raises becomes a
    one-line ``ConfigError``."""
    try:
        return load(spec)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 -- a user's config file raised: one line, no trace
        raise ConfigError(f"cannot load the config {spec!r}: {type(e).__name__}: {e}") from None


def load(spec: str, overrides: dict | None = None) -> ml_collections.ConfigDict:
    """``"ppo:cartpole"`` (or a file path, ``config_module``) -> that module's
    ``get_config("cartpole")``, unlocked, with ``overrides`` applied by dotted path
    (``{"ppo.num_steps": 16}``), like ``--config.*``.

    For scripts and tests (``jaxwm.configs.get``); the command line goes through
    ``ml_collections.config_flags``."""
    module, variant = config_module(spec)
    config = module.get_config(variant) if variant else module.get_config()
    config.unlock()
    for dotted, value in (overrides or {}).items():
        set_dotted(config, dotted, value)
    return config


# Field descriptions and valid ranges: one source, beside the defaults. Each config block's
# module keeps a ``FIELDS`` dict, ``{key: (range, description)}`` (keys relative to the block;
# ``prefixed`` places them), and each config module (``jaxwm/configs/<name>.py``) composes its
# blocks' with its own into its ``FIELDS``; ``BASE_FIELDS`` below are base_config's. A key may
# hold ``*`` for one dotted part (``phases.*.duration``). ``range`` is ``None`` (anything of the
# default's type) or a rule ``check_range`` reads: ``"> 0"``, ``">= 0"``, ``"[0, 1]"``,
# ``"(0, 1]"``, or a choice ``"{adam, sgd}"``; a tuple value must hold values in range.
BASE_FIELDS = {
    "algo": (None, "The registered algorithm that trains (jaxwm configs lists them)."),
    "seed": (">= 0", "Seed of every random stream: init, envs, evaluation."),
    "resume": (None, "Continue the newest checkpoint in the run directory."),
    "total_env_steps": ("> 0", "The budget of real env steps (phases may refer to it)."),
    "num_devices": (">= 0", "Devices to split batches over; 0: every device JAX sees."),
    "num_seeds": ("> 0", "Independent agents trained side by side in one process."),
    "iterations_per_call": ("> 0", "JAX envs: whole iterations per compiled call (host visits)."),
    "env.id": (None, "The env: envpool's (CartPole-v1, Breakout-v5, ...) or a JAX suite's "
                     "(gymnax:CartPole-v1, gymnax:Breakout-MinAtar, craftax:...)."),
    "env.num_envs": ("> 0", "Envs stepped in parallel while training."),
    "env.max_episode_steps": (">= 0", "Episode cap; 0: the env's registered limit."),
    "env.masked_indices": (None, "Vector observation dims set to 0 (velocity masking)."),
    "env.batch_size": (">= 0", "Envs an asynchronous pool returns per step; 0: all, in sync."),
    "env.num_threads": (">= 0", "envpool's worker threads; 0: its default."),
    "env.flatten_obs": (None, "MinAtar (gymnax): its frames as one float vector (for an MLP)."),
    "env.episodic_life": (None, "Atari: a lost life ends the training episode."),
    "env.frame_skip": ("> 0", "Env steps per agent step (action repeat)."),
    "env.frame_stack": ("> 0", "Atari: frames stacked into one observation."),
    "env.full_action_space": (None, "Atari: all 18 actions instead of the game's minimal set."),
    "env.gray_scale": (None, "Atari: grayscale frames instead of RGB."),
    "env.img_height": ("> 0", "Frame height after resizing, pixels."),
    "env.img_width": ("> 0", "Frame width after resizing, pixels."),
    "env.noop_max": (">= 0", "Atari: up to this many no-op actions at each reset."),
    "env.repeat_action_probability": ("[0, 1]", "Atari: sticky actions' repeat probability."),
    "env.reward_clip": (None, "Atari: rewards clipped to their sign while training."),
    "env.use_fire_reset": (None, "Atari: press FIRE after each reset where the game needs it."),
    "env.camera": (None, "DMC pixels: the camera id rendered (-1: the task's default)."),
    "env.pixels": (None, "DMC: observe rendered frames instead of the state vector."),
    "phase_order": (None, "The phases run in this order, each for its duration."),
    "phases.*.hooks": (None, "The phase's hooks, 'name' or 'name:calls', in order; empty: derived."),
    "phases.*.duration": (None, "How long the phase runs, in its unit."),
    "phases.*.unit": (None, "The counter the duration is measured in (env_steps, iterations, ...)."),
    "phases.*.until": (None, "A predicate that may end the phase early (a cap remains)."),
    "log.every": (None, "Clock of log lines: 'N unit' in any counter, or 'never'."),
    "log.x_axis": (None, "The counter TensorBoard and metrics.jsonl plot against."),
    "log.progress": (None, "Show a progress bar."),
    "log.wandb.project": (None, "Weights & Biases project; empty: W&B off."),
    "log.wandb.entity": (None, "W&B entity (team or user); empty: your default."),
    "log.wandb.group": (None, "W&B group; empty: the algorithm's name."),
    "log.wandb.name": (None, "W&B run name; empty: the run directory's."),
    "log.wandb.mode": ("{online, offline, disabled}", "W&B mode; offline syncs later."),
    "checkpoint.every": (None, "Clock of checkpoints: 'N unit' in any counter, or 'never'."),
    "checkpoint.keep": ("> 0", "Newest checkpoints kept."),
    "eval.every": (None, "Clock of evaluations: 'N unit' in any counter, or 'never'."),
    "eval.at_end": (None, "Evaluate once more when training ends."),
    "eval.num_envs": ("> 0", "Envs of the evaluation pool (at most num_episodes are used)."),
    "eval.num_episodes": ("> 0", "Episodes per evaluation."),
    "eval.temperature": (">= 0", "Policy temperature: 0 greedy, 1 as trained."),
    "eval.video": (None, "Record env 0's first episode as a GIF (and MP4)."),
    "eval.action_noise": (">= 0", "Std of Gaussian noise added to evaluation actions."),
    "eval.obs_noise": (">= 0", "Std of Gaussian noise added to observations the policy sees."),
}


def prefixed(prefix: str, fields: dict) -> dict:
    """A block's ``FIELDS`` placed under ``prefix`` (``"ppo"`` -> ``"ppo.learning_rate"``)."""
    return {f"{prefix}.{key}": rule for key, rule in fields.items()}


def field_rule(fields: dict, key: str):
    """``(range, description)`` of ``key`` in ``fields`` (wildcards allowed), or ``None``."""
    if key in fields:
        return fields[key]
    parts = key.split(".")
    for pattern, rule in fields.items():
        pattern_parts = pattern.split(".")
        if "*" in pattern_parts and len(pattern_parts) == len(parts) and all(
                p in ("*", k) for p, k in zip(pattern_parts, parts, strict=True)):
            return rule
    return None


def _in_range(value, rule: str) -> bool:
    rule = rule.strip()
    if rule.startswith("{"):
        return str(value) in {c.strip() for c in rule[1:-1].split(",")}
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return True  # a rule on numbers says nothing of other types (types are checked apart)
    for op, test in ((">=", lambda a, b: a >= b), ("<=", lambda a, b: a <= b),
                     (">", lambda a, b: a > b), ("<", lambda a, b: a < b)):
        if rule.startswith(op):
            return test(value, float(rule[len(op):]))
    low, high = (float(x) for x in rule[1:-1].split(","))
    above = value >= low if rule[0] == "[" else value > low
    below = value <= high if rule[-1] == "]" else value < high
    return above and below


def check_ranges(config: ml_collections.ConfigDict, fields: dict) -> None:
    """Every setting with a range in ``fields`` holds a value in it (each value of a tuple)."""
    for name, value in _leaves(config):
        rule = field_rule(fields, name)
        if rule is None or rule[0] is None:
            continue
        values = value if isinstance(value, (tuple, list)) else (value,)
        bad = [v for v in values if not _in_range(v, rule[0])]
        _require(not bad, f"{name}={value!r} is out of range: it must be {rule[0]} "
                 f"({rule[1].rstrip('.')}).")


def leaves(config: ml_collections.ConfigDict):
    """``(dotted key, value)`` of every setting, depth first."""
    return _leaves(config)
