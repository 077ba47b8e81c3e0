import jax
import jax.numpy as jnp
import numpy as np

from jaxwm.ops.normalize import RunningMeanStd


def test_running_moments_match_numpy_over_many_batches():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=(17, 3)).astype(np.float32) for _ in range(5)]
    rms = RunningMeanStd.create((3,))
    for b in batches:
        rms = rms.update(jnp.asarray(b))
    data = np.concatenate(batches)
    np.testing.assert_allclose(rms.mean, data.mean(0), rtol=1e-4)
    np.testing.assert_allclose(rms.var, data.var(0), rtol=1e-3)
    z = rms.normalize(jnp.asarray(data))
    np.testing.assert_allclose(np.asarray(z).mean(0), 0.0, atol=1e-3)
    np.testing.assert_allclose(np.asarray(z).std(0), 1.0, atol=1e-3)


def test_normalize_clips():
    rms = RunningMeanStd.create(())
    assert float(rms.normalize(jnp.asarray(1e6), clip=5.0)) == 5.0


def test_merging_process_updates_equals_one_update_with_every_sample():
    """Several processes update the same start with their own samples; the merge equals the
    statistics of start followed by all of them (what one process would have computed)."""
    rng = np.random.default_rng(0)
    start = RunningMeanStd.create((3,))
    for _ in range(4):  # a start with history, so the recovery from differences matters
        start = start.update(jnp.asarray(rng.normal(2.0, 3.0, (64, 3)), jnp.float32))
    batches = [rng.normal(-1.0, 0.5, (32, 3)) for _ in range(2)] + [rng.normal(5, 2, (32, 3))]
    per_process = [start.update(jnp.asarray(b, jnp.float32)) for b in batches]
    stacked = jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *per_process)
    merged = RunningMeanStd.merge_updates(start, stacked)
    expected = start.update(jnp.asarray(np.concatenate(batches), jnp.float32))
    assert merged.mean.shape == (3,) and merged.count.shape == ()
    np.testing.assert_allclose(merged.count, expected.count, rtol=1e-6)
    np.testing.assert_allclose(merged.mean, expected.mean, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(merged.var, expected.var, rtol=1e-4)
