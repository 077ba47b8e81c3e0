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
