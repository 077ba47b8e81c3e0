"""DreamerV3 ops against hand-computed numbers: symlog / two-hot, lambda-returns, percentile scale."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxwm.ops import twohot
from jaxwm.ops.normalize import PercentileScale
from jaxwm.ops.returns import lambda_return

SMALL_BINS = jnp.array([-1.0, -0.5, 0.0, 0.5, 1.0])


class SymlogTest(chex.TestCase):
    def test_hand_numbers_and_inverse(self):
        e = math.e
        np.testing.assert_allclose(twohot.symlog(jnp.array([e - 1.0, 0.0, 1.0 - e])), [1.0, 0.0, -1.0],
                                   rtol=1e-6)
        np.testing.assert_allclose(twohot.symexp(jnp.array([1.0, 0.0, -2.0])), [e - 1.0, 0.0, 1.0 - e**2],
                                   rtol=1e-6)
        x = jnp.array([-1e4, -3.0, -1e-3, 0.0, 2e-3, 7.0, 1e5])
        np.testing.assert_allclose(twohot.symexp(twohot.symlog(x)), x, rtol=1e-5)


class TwoHotTest(chex.TestCase):
    def test_bins(self):
        b = twohot.bins()
        self.assertEqual(b.shape, (255,))
        self.assertEqual((float(b[0]), float(b[-1])), (-20.0, 20.0))
        self.assertAlmostEqual(float(b[127]), 0.0, places=6)
        np.testing.assert_allclose(np.diff(b), 40.0 / 254, rtol=1e-4)
        np.testing.assert_allclose(twohot.bins(5, -1.0, 1.0), SMALL_BINS)

    @chex.variants(with_jit=True, without_jit=True)
    def test_encode_hand_numbers(self):
        x = jnp.array([0.1, -0.75, 0.5, 5.0, -5.0, 1.0])
        w = self.variant(twohot.encode)(x, SMALL_BINS)
        np.testing.assert_allclose(w, [
            [0.0, 0.0, 0.8, 0.2, 0.0],  # 0.1 lies 1/5 of the way from 0 to 0.5
            [0.5, 0.5, 0.0, 0.0, 0.0],  # halfway between -1 and -0.5
            [0.0, 0.0, 0.0, 1.0, 0.0],  # exactly on a bin
            [0.0, 0.0, 0.0, 0.0, 1.0],  # above the range: the top edge bin
            [1.0, 0.0, 0.0, 0.0, 0.0],  # below the range: the bottom edge bin
            [0.0, 0.0, 0.0, 0.0, 1.0],  # exactly on the top edge
        ], atol=1e-6)

    def test_encode_any_leading_shape(self):
        x = jax.random.uniform(jax.random.PRNGKey(0), (2, 3, 4), minval=-25.0, maxval=25.0)
        b = twohot.bins()
        w = twohot.encode(x, b)
        self.assertEqual(w.shape, (2, 3, 4, 255))
        np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-6)
        self.assertTrue(bool(jnp.all((w > 0).sum(-1) <= 2)))
        # The weighted mean of the bins recovers x inside the range, the clipped x outside.
        np.testing.assert_allclose((w * b).sum(-1), jnp.clip(x, -20.0, 20.0), atol=1e-4)

    @chex.variants(with_jit=True, without_jit=True)
    def test_decode(self):
        p = jnp.array([0.1, 0.2, 0.3, 0.2, 0.2])
        # -0.1 - 0.1 + 0 + 0.1 + 0.2 = 0.1
        self.assertAlmostEqual(float(self.variant(twohot.decode)(jnp.log(p), SMALL_BINS)), 0.1, places=6)
        # Uniform logits (a zero-initialised head) decode to the bins' mean, which is ~0 but
        # not 0: float32 linspace is not exactly symmetric, and how it rounds differs between
        # CPUs (-3.76e-8 on an AVX-512 host, where a 2e-8 bound around 0 failed). The paired
        # sum hits the exact mean of the actual bins (float64) within 1e-8 (seen: 5e-9 under
        # jit, where XLA may fuse into FMAs); a left-to-right sum is ~2e-7 off.
        zeros = jnp.zeros((3, 255))
        exact_mean = np.asarray(twohot.bins(), np.float64).mean()
        np.testing.assert_allclose(self.variant(twohot.decode)(zeros, twohot.bins()), exact_mean,
                                   rtol=0, atol=1e-8)
        # decode inverts encode on the log of the two-hot weights, for any leading shape.
        x = jnp.array([[0.1, -0.3], [0.9, -1.0]])
        logits = jnp.log(twohot.encode(x, SMALL_BINS) + 1e-12)
        np.testing.assert_allclose(self.variant(twohot.decode)(logits, SMALL_BINS), x, atol=1e-5)

    def test_loss_hand_numbers_and_gradients(self):
        p = jnp.array([0.1, 0.2, 0.3, 0.2, 0.2])
        # Target 0.1: weight 0.8 on p=0.3 and 0.2 on p=0.2.
        expected = -(0.8 * math.log(0.3) + 0.2 * math.log(0.2))
        value = twohot.loss(jnp.log(p), jnp.asarray(0.1), SMALL_BINS)
        self.assertAlmostEqual(float(value), expected, places=5)
        # Uniform logits: log(K) whatever the target; batched targets give batched losses.
        losses = twohot.loss(jnp.zeros((2, 5)), jnp.array([0.3, -7.0]), SMALL_BINS)
        np.testing.assert_allclose(losses, [math.log(5.0)] * 2, rtol=1e-6)
        # d loss / d logits = softmax - twohot; the target gets no gradient.
        g_logits, g_target = jax.grad(twohot.loss, argnums=(0, 1))(jnp.log(p), jnp.asarray(0.1), SMALL_BINS)
        np.testing.assert_allclose(g_logits, p - jnp.array([0.0, 0.0, 0.8, 0.2, 0.0]), atol=1e-6)
        self.assertEqual(float(g_target), 0.0)


class RegressionTest(chex.TestCase):
    """``twohot.Regression``: the official code's raw-space bins beside the paper's."""

    def test_symexp_bins_are_mirrored_symexp_of_evenly_spaced_values(self):
        for k in (255, 6):
            b = np.asarray(twohot.symexp_bins(k))
            self.assertEqual(b.shape, (k,))
            np.testing.assert_array_equal(b, -b[::-1])  # exactly symmetric
            self.assertTrue(np.all(np.diff(b) > 0))
        b = np.asarray(twohot.symexp_bins(255))
        self.assertEqual(b[127], 0.0)
        np.testing.assert_allclose(b[-1], math.expm1(20.0), rtol=1e-6)
        np.testing.assert_allclose(b[128], math.expm1(20.0 / 127), rtol=1e-5)

    def test_prediction_in_each_space_for_a_two_way_split(self):
        """Probability 1/2 on the bins nearest 10 and 90: raw space predicts their mean,
        symlog space the symexp of the mean symlog, sqrt(11 x 91) - 1 = 30.64."""
        for space, expected in (("symexp", 50.0), ("symlog", math.sqrt(11 * 91) - 1)):
            head = twohot.Regression(space)
            b = np.asarray(head.bins())
            targets = (10.0, 90.0) if space == "symexp" else (math.log(11), math.log(91))
            near = [int(np.argmin(np.abs(b - t))) for t in targets]
            logits = jnp.full(255, -1e9).at[jnp.array(near)].set(0.0)
            at_bins = b[near] if space == "symexp" else np.expm1(b[near])
            # the bins nearest the targets, not the targets: compare with their own numbers
            want = at_bins.mean() if space == "symexp" else math.expm1(b[near].mean())
            np.testing.assert_allclose(head.predict(logits), want, rtol=1e-4)
            np.testing.assert_allclose(want, expected, rtol=0.1)

    def test_loss_is_minimal_at_the_two_hot_of_the_target(self):
        for space in twohot.SPACES:
            head = twohot.Regression(space)
            y = jnp.array([-57.0, 0.3, 10.0, 480.0])
            w = twohot.encode(y if space == "symexp" else twohot.symlog(y), head.bins())
            logits = jnp.log(w + 1e-12)
            np.testing.assert_allclose(head.predict(logits), y, rtol=1e-4)
            # cross-entropy at the target's own two-hot is its entropy, below any other
            other = jnp.roll(logits, 3, axis=-1)
            self.assertTrue(bool(jnp.all(head.loss(logits, y) < head.loss(other, y))))

    def test_unknown_space_is_refused(self):
        with self.assertRaisesRegex(ValueError, "symlog"):
            twohot.Regression("raw")


def python_lambda_return(rewards, values, continues, bootstrap, gamma, lam):
    returns = np.zeros(len(rewards))
    next_ret = bootstrap
    for t in reversed(range(len(rewards))):
        next_ret = rewards[t] + gamma * continues[t] * ((1 - lam) * values[t] + lam * next_ret)
        returns[t] = next_ret
    return returns


class LambdaReturnTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_computed(self):
        # H=3, gamma=0.5, lambda=0.5; the state reached by step 1 is terminal (continue 0).
        rewards = jnp.array([1.0, 2.0, 3.0])
        values = jnp.array([4.0, 8.0, 16.0])
        continues = jnp.array([1.0, 0.0, 1.0])
        fn = self.variant(lambda_return, static_argnums=(4, 5))
        ret = fn(rewards, values, continues, jnp.asarray(16.0), 0.5, 0.5)
        # t=2: 3 + 0.5 * (0.5 * 16 + 0.5 * 16) = 11
        # t=1: 2 + 0.5 * 0 * (...) = 2 (cut)
        # t=0: 1 + 0.5 * (0.5 * 4 + 0.5 * 2) = 2.5
        np.testing.assert_allclose(ret, [2.5, 2.0, 11.0], rtol=1e-6)
        # The bootstrap really is R_H: with 0 instead, t=2 becomes 3 + 0.5 * (8 + 0) = 7.
        ret = fn(rewards, values, continues, jnp.asarray(0.0), 0.5, 0.5)
        np.testing.assert_allclose(ret, [2.5, 2.0, 7.0], rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_lambda_one_is_monte_carlo_and_zero_is_td(self):
        rewards = jnp.array([1.0, 2.0, 3.0])
        values = jnp.array([10.0, 20.0, 30.0])
        continues = jnp.array([1.0, 1.0, 1.0])
        fn = self.variant(lambda_return, static_argnums=(4, 5))
        ret = fn(rewards, values, continues, jnp.asarray(40.0), 0.9, 1.0)
        np.testing.assert_allclose(ret, [
            1 + 0.9 * 2 + 0.81 * 3 + 0.729 * 40,
            2 + 0.9 * 3 + 0.81 * 40,
            3 + 0.9 * 40,
        ], rtol=1e-6)
        ret = fn(rewards, values, jnp.array([True, False, True]), jnp.asarray(40.0), 0.9, 0.0)
        np.testing.assert_allclose(ret, [1 + 0.9 * 10, 2.0, 3 + 0.9 * 30], rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_matches_python_loop(self):
        rng = np.random.default_rng(0)
        H = 15
        rewards, values = rng.normal(size=(2, H)).astype(np.float32)
        continues = (rng.random(H) > 0.2).astype(np.float32) * rng.random(H).astype(np.float32)
        expected = python_lambda_return(rewards, values, continues, values[-1], 0.997, 0.95)
        ret = self.variant(lambda_return, static_argnums=(4, 5))(
            jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(continues), values[-1], 0.997, 0.95
        )
        np.testing.assert_allclose(ret, expected, rtol=1e-5, atol=1e-5)

    def test_vmaps_over_trajectories(self):
        rng = np.random.default_rng(1)
        r, v, c = (jnp.asarray(rng.random((4, 6)), jnp.float32) for _ in range(3))
        batched = jax.vmap(lambda_return, in_axes=(0, 0, 0, 0, None, None))(r, v, c, v[:, -1], 0.99, 0.95)
        for i in range(4):
            np.testing.assert_allclose(batched[i], lambda_return(r[i], v[i], c[i], v[i, -1], 0.99, 0.95),
                                       rtol=1e-6)


class PercentileScaleTest(chex.TestCase):
    def test_hand_numbers(self):
        values = jnp.arange(101.0)  # 0..100: the 5th / 95th percentiles are 5 and 95
        s = PercentileScale.create().update(values, rate=1.0)
        self.assertEqual((float(s.low), float(s.high), float(s.scale())), (5.0, 95.0, 90.0))
        s = PercentileScale.create().update(values)  # rate 0.01 from zeros
        np.testing.assert_allclose([s.low, s.high], [0.05, 0.95], rtol=1e-6)
        self.assertEqual(float(s.scale()), 1.0)  # max(1, 0.9): small returns are not scaled up
        np.testing.assert_allclose(s.scale(limit=0.5), 0.9, rtol=1e-6)
        # A second step: 0.99 * 0.95 + 0.01 * 95 = 1.8905.
        np.testing.assert_allclose(s.update(values).high, 1.8905, rtol=1e-6)

    def test_any_shape_jit_and_no_gradient(self):
        values = jnp.arange(101.0)[::-1].reshape(1, 101)
        s = jax.jit(lambda s, v: s.update(v, rate=1.0))(PercentileScale.create(), values)
        np.testing.assert_allclose([s.low, s.high], [5.0, 95.0], rtol=1e-6)
        grad = jax.grad(lambda v: PercentileScale.create().update(v, rate=1.0).scale())(values)
        np.testing.assert_array_equal(grad, 0.0)
