"""Sampling weights of MBARC's reward-model strategies (thomas-schillaci/mbarc_atari,
``mbarc/trainer.py``, ``train_reward_model``): which transitions of the real-data buffer the
reward head sees, when rewards are rare.

Rewards are clipped and stored as classes 0, 1, 2 (rewards -1, 0, +1). For each strategy the
weight of a transition is ``w[its class]`` (or ``w[its group]`` for ``mbarc``), plus 1e-4 as
the reference adds, and batches are drawn with replacement in proportion:

* ``class_balanced``: ``w_c = 1 - n_c / N``; with two classes present each gets half the mass;
* ``square_root``: ``w_c = 1 - sqrt(n_c) / sum_k sqrt(n_k)``;
* ``progressively_balanced``: stage ``t`` of ``stages`` (50) mixes uniform over classes and
  class-balanced, ``(1 - t / stages) / 3 + (t / stages) (1 - n_c / N)``;
* ``mbarc``: three groups, with masses ``(0.35, 0.05, 0.6)`` by default: zero-reward
  transitions not next to a reward, zero-reward transitions next to a reward (the previous or
  the next transition of the same episode is rewarded), and rewarded transitions (either
  sign); a transition's weight is its group's mass over the group's size (times N).

Departures from the reference, each a bug there: its ``mbarc`` raises on any negative reward
(it assumes rewards in {0, +1}), and its "next transition is a reward" test sits under an
``elif`` that only index 0 reaches, so its middle group is only the transitions right *after*
a reward; here every index is checked on both sides and negative rewards are rewards.
``online`` trains the reward head jointly with the world model and samples nothing here.

Pure functions of fixed-shape arrays (any layout: the buffer's ``[steps, envs]``), so they run
inside the jitted reward update.
"""

from __future__ import annotations

import jax.numpy as jnp

STRATEGIES = ("online", "class_balanced", "square_root", "progressively_balanced", "mbarc")
ZERO = 1  # the class of a zero reward
NUM_CLASSES = 3
EPSILON = 1e-4  # the reference's floor on every weight


def class_mass(classes: jnp.ndarray, weights: jnp.ndarray) -> jnp.ndarray:
    """``[3]`` sum of ``weights`` (same layout as ``classes``) over each class."""
    onehot = classes[..., None] == jnp.arange(NUM_CLASSES)
    return jnp.sum((onehot * weights[..., None]).reshape(-1, NUM_CLASSES), axis=0).astype(
        jnp.float32)


def class_counts(classes: jnp.ndarray, valid: jnp.ndarray) -> jnp.ndarray:
    """``[3]`` transitions per class among the valid ones."""
    return class_mass(classes, valid)


def class_weights(strategy: str, counts: jnp.ndarray, stage=0, stages: int = 50) -> jnp.ndarray:
    """``[3]`` per-class weights of the class-based strategies, before the 1e-4 floor."""
    total = jnp.maximum(jnp.sum(counts), 1.0)
    balanced = 1.0 - counts / total
    if strategy == "class_balanced":
        return balanced
    if strategy == "square_root":
        roots = jnp.sqrt(counts)
        return 1.0 - roots / jnp.maximum(jnp.sum(roots), 1e-12)
    if strategy == "progressively_balanced":
        mix = jnp.asarray(stage, jnp.float32) / stages
        return (1.0 - mix) / NUM_CLASSES + mix * balanced
    raise ValueError(f"{strategy!r} has no class weights; choose one of {STRATEGIES[1:4]}.")


def mbarc_groups(classes: jnp.ndarray, valid: jnp.ndarray, same_episode_as_next: jnp.ndarray
                 ) -> jnp.ndarray:
    """Group 0, 1 or 2 of every transition, time on axis 0: 2 rewarded, 1 unrewarded next to
    a rewarded transition of its episode (before or after it), 0 otherwise.
    ``same_episode_as_next[t]``: transition t + 1 follows t in the same episode (both valid)."""
    rewarded = valid & (classes != ZERO)
    link = same_episode_as_next
    after = jnp.zeros_like(rewarded).at[1:].set(rewarded[:-1] & link[:-1])
    before = jnp.zeros_like(rewarded).at[:-1].set(rewarded[1:] & link[:-1])
    near = valid & ~rewarded & (after | before)
    return jnp.where(rewarded, 2, jnp.where(near, 1, 0))


def transition_weights(strategy: str, classes, valid, same_episode_as_next, stage=0,
                       stages: int = 50, masses=(0.35, 0.05, 0.6)) -> jnp.ndarray:
    """Unnormalised sampling weight of every transition (0 where not ``valid``)."""
    if strategy == "mbarc":
        groups = mbarc_groups(classes, valid, same_episode_as_next)
        sizes = class_counts(groups, valid)
        # mass * N / size: the reference scales by its sample count the same way, so that
        # the 1e-4 floor stays negligible beside every non-empty group.
        total = jnp.sum(sizes)
        per_group = jnp.where(sizes > 0, jnp.asarray(masses) * total / jnp.maximum(sizes, 1.0),
                              0.0)
        weights = per_group[groups]
    else:
        weights = class_weights(strategy, class_counts(classes, valid), stage, stages)[classes]
    return jnp.where(valid, weights + EPSILON, 0.0)


def sampled_class_shares(weights: jnp.ndarray, classes: jnp.ndarray) -> jnp.ndarray:
    """``[3]`` share of each class in batches drawn in proportion to ``weights`` (any
    strategy's, same layout as ``classes``): the class mix the reward head is trained on."""
    mass = class_mass(classes, weights)
    return mass / jnp.maximum(jnp.sum(mass), 1e-30)
