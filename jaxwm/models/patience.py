"""Early stopping with snapshot-on-improvement, as pure functions (one mechanism for every
model trained to convergence on a fixed dataset: the dynamics ensemble, the RealNVP density).

The rule is MBPO's / OfflineRL-Kit's (Janner et al. 2019, ``_save_best``): after each epoch,
a model whose held-out loss improved on its best by more than ``min_improvement`` (relative)
is snapshotted; the run stops once ``patience`` epochs in a row improved nothing. With a
leading member axis (an ensemble), each member is judged and snapshotted on its own, and the
counter restarts when any member improved. The snapshot, not the last epoch's weights, is
what is used afterwards.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class Patience:
    best_loss: jax.Array  # [] or [members]
    best_params: object  # the snapshot: same tree as the trained params
    epochs_since_improvement: jax.Array  # int32 []

    @classmethod
    def start(cls, params, members: int | None = None) -> Patience:
        shape = () if members is None else (members,)
        # A copy: the trained params are donated by the next update.
        return cls(jnp.full(shape, jnp.inf, jnp.float32), jax.tree.map(jnp.copy, params),
                   jnp.zeros((), jnp.int32))

    def exhausted(self, patience: int) -> jax.Array:
        return self.epochs_since_improvement >= patience


def observe(state: Patience, loss: jax.Array, params, min_improvement: float = 0.01) -> Patience:
    """Records one epoch's held-out ``loss`` (shape of ``best_loss``) for ``params``."""
    improved = (state.best_loss - loss) / jnp.abs(state.best_loss) > min_improvement
    improved = improved | (jnp.isinf(state.best_loss) & jnp.isfinite(loss))

    def pick(new, old):
        mask = improved.reshape(improved.shape + (1,) * (new.ndim - improved.ndim))
        return jnp.where(mask, new, old)

    return Patience(
        best_loss=jnp.where(improved, loss, state.best_loss),
        best_params=jax.tree.map(pick, params, state.best_params),
        epochs_since_improvement=jnp.where(jnp.any(improved), 0,
                                           state.epochs_since_improvement + 1),
    )
