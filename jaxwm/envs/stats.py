"""Episode return/length bookkeeping in fixed-shape arrays, usable inside jit and scan.

Counting convention (matches envpool's ``info['elapsed_step']`` at the end of an episode):

* An episode's **length** is the number of steps whose action the env executed. The step
  right after any ``done`` (terminated or truncated) is envpool's reset transition: its action
  is ignored, its reward is 0 and it returns the next first observation, so it is counted in
  neither length nor return. This applies after a lost Atari life too: envpool's
  ``elapsed_step`` does not advance on that transition either.
* The **return** is the sum of ``raw_reward`` (unclipped) over the same steps.
* An env's ``outcomes`` (``StepResult.outcomes``: Craftax's achievements) are read at the
  step that ends the episode, and averaged over episodes as the return is
  (``charts/achievements/<name>``: the share of episodes that unlocked it).
* Both accumulate across lost lives and reset only when ``episode_over`` (the real game over
  or a truncation), which is the step at which the episode is reported.

Feed ``update`` the result of every ``step`` in order. A fresh ``EpisodeStats`` assumes the
next result is the first real step of each env; ``create(n, awaiting_reset=True)`` instead
expects the reset's result first and skips it (the acting layer feeds it every row it acts
on, the reset observations included).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxwm.envs.types import StepResult


@struct.dataclass
class EpisodeStats:
    """Running per-env return and length, shape ``[num_envs]``."""

    running_return: jax.Array  # float32
    running_length: jax.Array  # int32
    after_done: jax.Array  # bool: the previous step ended a (life or) episode

    @classmethod
    def create(cls, num_envs: int, awaiting_reset: bool = False) -> EpisodeStats:
        return cls(
            running_return=jnp.zeros(num_envs, jnp.float32),
            running_length=jnp.zeros(num_envs, jnp.int32),
            after_done=jnp.full(num_envs, awaiting_reset, bool),
        )

    def update(self, res: StepResult) -> tuple[EpisodeStats, dict[str, jax.Array]]:
        """Fold in one step; return the new stats and the episodes that ended at this step.

        ``completed`` holds ``return`` and ``length`` (float32, ``[num_envs]``; 0 where the
        episode did not end) and ``mask`` (bool: the env's real episode ended at this step).
        """
        counted = ~self.after_done
        ret = self.running_return + jnp.where(counted, jnp.asarray(res.raw_reward, jnp.float32), 0.0)
        length = self.running_length + counted.astype(jnp.int32)
        over = jnp.asarray(res.episode_over, bool)
        completed = {
            "return": jnp.where(over, ret, 0.0),
            "length": jnp.where(over, length, 0).astype(jnp.float32),
            "mask": over,
            "outcomes": {name: jnp.where(over, jnp.asarray(value, jnp.float32), 0.0)
                         for name, value in res.outcomes.items()},
        }
        new = EpisodeStats(
            running_return=jnp.where(over, 0.0, ret),
            running_length=jnp.where(over, 0, length),
            after_done=jnp.asarray(res.done, bool),
        )
        return new, completed


def episode_metrics(completed: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Mean return and length of the episodes ``completed`` reports (any shape, e.g. stacked
    over a rollout's steps), under the names the loop logs; NaN when none ended."""
    n = jnp.sum(completed["mask"])

    def mean(x):
        return jnp.where(n > 0, jnp.sum(x * completed["mask"]) / jnp.maximum(n, 1), jnp.nan)

    return {"charts/episodic_return": mean(completed["return"]),
            "charts/episodic_length": mean(completed["length"]), "charts/episodes": n,
            **{f"charts/{name}": mean(value)
               for name, value in completed.get("outcomes", {}).items()}}


OUTCOME_KINDS = ("achievements",)  # the namespaces of ``StepResult.outcomes``' names


def per_episode(name: str) -> bool:
    """Whether a metric of ``episode_metrics`` is a mean over the episodes that ended (so
    windows merge weighted by their episodes): the return, the length and the outcomes."""
    return name in ("charts/episodic_return", "charts/episodic_length") or \
        name.startswith(tuple(f"charts/{kind}/" for kind in OUTCOME_KINDS))


def merge_episode_metrics(metrics: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Metrics of several windows stacked on a leading axis (iterations of one compiled
    call) as one window's: ``episode_metrics``' means weighted by each window's episodes
    (NaN when none ended in any; ``per_episode``), their counts summed, every other metric
    averaged."""
    n = metrics["charts/episodes"]
    total = jnp.sum(n, axis=0)

    def weighted(x):
        summed = jnp.sum(jnp.where(n > 0, x, 0.0) * n, axis=0)
        return jnp.where(total > 0, summed / jnp.maximum(total, 1), jnp.nan)

    return {name: total if name == "charts/episodes" else
            weighted(x) if per_episode(name) else jnp.mean(x, axis=0)
            for name, x in metrics.items()}
