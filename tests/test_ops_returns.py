"""GAE against hand-computed numbers and a plain Python loop, jitted and not."""

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxwm.ops.returns import gae, lambda_return


def python_gae(rewards, values, next_values, terminated, truncated, gamma, lam):
    advantages = np.zeros(len(rewards))
    next_adv = 0.0
    for t in reversed(range(len(rewards))):
        bootstrap = 0.0 if terminated[t] else gamma * next_values[t]
        delta = rewards[t] + bootstrap - values[t]
        cont = 0.0 if (terminated[t] or truncated[t]) else 1.0
        next_adv = delta + gamma * lam * cont * next_adv
        advantages[t] = next_adv
    return advantages


class GaeTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_computed(self):
        # T=3, gamma=0.5, lambda=0.5; episode terminates at t=1, new one at t=2.
        rewards = jnp.array([1.0, 2.0, 3.0])
        values = jnp.array([0.5, 1.0, 2.0])
        next_values = jnp.array([1.0, 9.0, 4.0])  # 9.0 must be ignored (terminal)
        terminated = jnp.array([False, True, False])
        truncated = jnp.array([False, False, False])
        adv, ret = self.variant(gae, static_argnums=(5, 6))(
            rewards, values, next_values, terminated, truncated, 0.5, 0.5
        )
        # t=2: delta = 3 + 0.5*4 - 2 = 3
        # t=1: delta = 2 - 1 = 1 (terminal), no recursion
        # t=0: delta = 1 + 0.5*1 - 0.5 = 1; A = 1 + 0.25*1 = 1.25
        np.testing.assert_allclose(adv, [1.25, 1.0, 3.0], rtol=1e-6)
        np.testing.assert_allclose(ret, [1.75, 2.0, 5.0], rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_truncation_bootstraps_but_cuts(self):
        rewards = jnp.array([1.0, 1.0])
        values = jnp.array([0.0, 0.0])
        next_values = jnp.array([10.0, 20.0])
        terminated = jnp.array([False, False])
        truncated = jnp.array([True, False])
        adv, _ = self.variant(gae, static_argnums=(5, 6))(
            rewards, values, next_values, terminated, truncated, 0.9, 1.0
        )
        # t=0 truncated: delta = 1 + 0.9*10 = 10, and does not see t=1.
        np.testing.assert_allclose(adv, [10.0, 1.0 + 0.9 * 20.0], rtol=1e-6)

    def test_matches_python_loop(self):
        rng = np.random.default_rng(0)
        T = 64
        args = (
            rng.normal(size=T).astype(np.float32),
            rng.normal(size=T).astype(np.float32),
            rng.normal(size=T).astype(np.float32),
            rng.random(T) < 0.1,
            rng.random(T) < 0.05,
        )
        expected = python_gae(*args, 0.99, 0.95)
        adv, ret = jax.jit(gae, static_argnums=(5, 6))(*map(jnp.asarray, args), 0.99, 0.95)
        np.testing.assert_allclose(adv, expected, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(ret, expected + args[1], rtol=1e-4, atol=1e-5)


def test_lambda_return_takes_a_lambda_per_step():
    """lambda_ [H]: step t mixes with its own lambda; 0 stops the recursion at the one-step
    target (hand-computed, H = 3, gamma 0.5)."""
    r, v, c = jnp.array([1.0, 2.0, 3.0]), jnp.array([10.0, 20.0, 30.0]), jnp.ones(3)
    got = lambda_return(r, v, c, jnp.float32(40.0), 0.5, jnp.array([0.5, 0.0, 1.0]))
    r2 = 3.0 + 0.5 * 40.0  # lambda 1: the bootstrap
    r1 = 2.0 + 0.5 * 20.0  # lambda 0: its own value, R_2 ignored
    r0 = 1.0 + 0.5 * (0.5 * 10.0 + 0.5 * r1)
    np.testing.assert_allclose(got, [r0, r1, r2], rtol=1e-6)
    np.testing.assert_allclose(lambda_return(r, v, c, jnp.float32(40.0), 0.5, 0.7),
                               lambda_return(r, v, c, jnp.float32(40.0), 0.5, jnp.full(3, 0.7)),
                               rtol=1e-6)
