"""Placement helpers of jaxwm.parallel, on 4 fake CPU devices (in a subprocess, since the
device count is fixed when JAX starts)."""

import textwrap

SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {root!r})
    import jax, jax.numpy as jnp, numpy as np
    from jaxwm import parallel
    mesh = parallel.data_mesh()
    placed = parallel.put_readonly({{
        "large": np.arange(1024 * 4096, dtype=np.float32).reshape(1024, 4096),  # 16 MiB
        "uneven": np.zeros((1023, 4096), np.float32),  # large, but 1023 rows do not split by 4
        "small": np.arange(10.0),
    }}, mesh)
    def layout(x):
        return dict(devices=len(x.devices()), rows=[s.data.shape[0] for s in x.addressable_shards])
    total = jax.jit(lambda d: jnp.sum(d["large"][::7]))(placed)  # a gather across shards
    expected = float(np.arange(1024 * 4096, dtype=np.float64).reshape(1024, 4096)[::7].sum())
    print(json.dumps({{**{{k: layout(v) for k, v in placed.items()}},
                      "sum_ok": bool(np.isclose(float(total), expected, rtol=1e-5))}}))
""")


def test_put_readonly_shards_large_data_and_replicates_the_rest(run_script):
    out = run_script(SCRIPT, devices=4)
    assert out["large"] == {"devices": 4, "rows": [256] * 4}  # each device holds a quarter
    assert out["uneven"] == {"devices": 4, "rows": [1023] * 4}  # replicated
    assert out["small"] == {"devices": 4, "rows": [10] * 4}
    assert out["sum_ok"]
