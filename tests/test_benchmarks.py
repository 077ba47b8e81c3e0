"""The benchmark scripts keep running as the library changes under them.

Benchmarks are not timed here (speed lives in benchmarks/ and its results). These tests only
check that each script still works: the default suite imports every script and takes one
Nature-CNN gradient step of ``conv_grad``'s problem at a tiny batch (an API change once broke
that script unnoticed); the ``slow`` test runs every script's ``--quick`` smoke mode, whose
results are written with a ``_quick`` suffix that git ignores.
"""

import importlib
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = os.path.join(ROOT, "benchmarks")
SCRIPTS = ("ab", "backbones", "conv_grad", "diffusion", "dreamer", "model_table", "offline",
           "ppo_throughput", "seeds", "simple", "tdmpc2", "worldmodels", "jax_envs",
           "offpolicy_jax_envs", "processes")


@pytest.fixture(scope="module")
def benchmark_modules():
    sys.path.insert(0, BENCHMARKS)  # the scripts import their shared ``common`` module
    try:
        yield {name: importlib.import_module(name) for name in SCRIPTS}
    finally:
        sys.path.remove(BENCHMARKS)


def test_every_script_imports_and_has_a_main(benchmark_modules):
    for name, module in benchmark_modules.items():
        assert callable(getattr(module, "main", None)), name
        assert module.__doc__ and "python benchmarks/" in module.__doc__, name


def test_conv_grad_problem_takes_a_gradient_step(benchmark_modules):
    conv_grad = benchmark_modules["conv_grad"]
    for canonical in (True, False):
        params, data, step = conv_grad.make_problem(canonical, batch=2, minibatches=2)
        run, steps = conv_grad.loop_runner("scan rolled", step, params, data, jax.jit)
        new = run()
        assert steps == 2
        changed = jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))),
                               params, new)
        assert any(jax.tree.leaves(changed))


def test_sac_flop_count_matches_xla(benchmark_modules):
    """``offline.update_flops`` (the dense layers' FLOPs behind the SAC row's GFLOP/s) agrees
    with XLA's own count of the compiled update, which adds only elementwise work and Adam
    (8% at these small sizes, 2% at the benchmark's). The earlier formula counted weight
    gradients of the critics inside the actor loss that jax.grad never computes, and read
    above XLA's total (10% here, 12% at the benchmark's sizes)."""
    offline = benchmark_modules["offline"]
    from jaxwm.agents import sac

    batch, hidden, obs_dim, action_dim = 64, 64, offline.OBS_DIM, offline.ACTION_DIM
    box = sac.ActionBox(-np.ones(action_dim, np.float32), np.ones(action_dim, np.float32))
    nets = sac.SACNets.create(box, (hidden, hidden), (hidden, hidden))
    hyper = sac.SACHyper(batch_size=batch)
    data = {**offline.synthetic(batch), "terminated": np.zeros(batch, bool)}
    learner = sac.init_learner(nets, hyper, jax.random.PRNGKey(0), obs_dim)
    step = jax.jit(lambda learner, b, k: sac.update_step(nets, hyper, learner, b, k))
    cost = step.lower(learner, data, jax.random.PRNGKey(1)).compile().cost_analysis()
    xla_flops = (cost[0] if isinstance(cost, list) else cost)["flops"]
    dense = offline.update_flops(batch, obs_dim, action_dim, hidden)
    assert 0.85 * xla_flops < dense <= xla_flops, (dense, xla_flops)


def test_dot_shapes_count_every_product_of_a_scan_and_a_gradient(benchmark_modules):
    """``common.dot_shapes`` (behind TD-MPC2's matmul share) against hand counts: a scan of 3
    steps of ``x @ w`` ([4, 5] x [5, 6]) is 3 x 2 x 4 x 5 x 6 = 720 FLOPs; its gradient with
    respect to ``w`` adds one product per step for the cotangent of ``w`` (contracting the
    batch of 4) and one for that of ``x`` (through the carry): 3 x 720 in all. A while loop,
    whose trip count the jaxpr does not know, is refused."""
    import jax.numpy as jnp

    common = sys.modules["common"]
    w = jnp.ones((5, 6))

    def forward(w, x):
        def step(carry, _):
            return jnp.tanh(carry @ w)[:, :5], None
        return jax.lax.scan(step, x, None, length=3)[0].sum()

    x = jnp.ones((4, 5))
    assert common.dot_flops(common.dot_shapes(forward, w, x)) == 720
    grad_shapes = common.dot_shapes(jax.grad(forward, argnums=(0, 1)), w, x)
    assert common.dot_flops(grad_shapes) == 3 * 720
    assert sum(grad_shapes.values()) == 9
    with pytest.raises(ValueError, match="while"):
        common.dot_shapes(lambda x: jax.lax.while_loop(lambda c: c.sum() < 9, lambda c: c @ w[:, :5], x), x)


def test_program_row_times_the_program_and_its_matmuls_in_turn(benchmark_modules, monkeypatch):
    """``common.program_row`` alternates one call of the program and one of its matmuls alone
    (after one compiling call of each), and the share is the median of the per-pair ratios,
    so that a host that changes speed between calls moves both sides of each ratio. The
    clock is replaced by fixed durations: program calls 2, 4, 8 s; matmul calls 1, 1, 1 s."""
    import jax.numpy as jnp

    common = sys.modules["common"]
    order, durations = [], {"call": iter([9.0, 2.0, 4.0, 8.0]), "matmuls": iter([9.0, 1, 1, 1])}

    def fake_seconds(fn):
        which = "call" if fn.__name__ == "call" else "matmuls"
        order.append(which)
        fn()
        return next(durations[which])

    monkeypatch.setattr(common, "seconds", fake_seconds)
    a = jnp.ones((8, 8))
    row = common.program_row(lambda a, b: jnp.tanh(a @ b), (a, a), repeats=3)
    assert order == ["call", "matmuls"] + ["call", "matmuls"] * 3
    assert row["samples_s"] == [2.0, 4.0, 8.0] and row["compile_s"] == 9.0
    assert row["matmul_share"] == 0.25  # median of 1/2, 1/4, 1/8
    assert row["s_per_call"] == 4.0 and row["matmul_alone_s"] == 1.0
    assert row["matmul_gflop"] == 2 * 8 * 8 * 8 / 1e9


def test_matmuls_alone_computes_every_product_whole(benchmark_modules):
    """``common.matmuls_alone`` (the numerator of every matmul share) returns each shape's last
    product in full, so XLA computes all of it on every trip: [3, 4] x [4, 5] of 0.01s is
    4e-4 everywhere, and a batched [2, 3, 4] x [2, 4, 6] likewise."""
    import collections

    common = sys.modules["common"]
    plain = (((1,), (0,)), ((), ()))
    batched = (((2,), (1,)), ((0,), (0,)))
    shapes = collections.Counter({((3, 4), (4, 5), plain, "float32"): 3,
                                  ((2, 3, 4), (2, 4, 6), batched, "float32"): 2})
    outputs = common.matmuls_alone(shapes)()
    assert [o.shape for o in outputs] == [(3, 5), (2, 3, 6)]
    for o in outputs:
        np.testing.assert_allclose(o, 4e-4, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_quick_mode_runs(name):
    """``python benchmarks/<name>.py --quick`` (seconds to a minute or two each)."""
    proc = subprocess.run([sys.executable, os.path.join(BENCHMARKS, f"{name}.py"), "--quick"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "|" in proc.stdout  # the markdown table it printed


def test_a_failing_peer_command_stops_with_its_error(benchmark_modules):
    """A peer that crashes (wrong --src, a missing dependency) stops the benchmark with the
    command and the end of its stderr, not a bare CalledProcessError or a JSON error."""
    common = importlib.import_module("common")  # on the path while the fixture is up
    assert common.run_peer("echo progress; echo '{\"s\": 1.5}'") == {"s": 1.5}
    with pytest.raises(SystemExit, match=r"(?s)exit 3\).*no module named mbarc"):
        common.run_peer("echo 'no module named mbarc' >&2; exit 3")
    with pytest.raises(SystemExit, match="exit 0"):
        common.run_peer("true")  # printed nothing
    with pytest.raises(SystemExit, match="not JSON"):
        common.run_peer("echo done")


def test_tdmpc2_floor_loop_returns_every_output_of_its_piece(benchmark_modules):
    """``tdmpc2._looped`` (behind the update's and planning's floors) carries each call's whole
    output to its result, so XLA cannot compute less of a piece than the program does: a loop
    that kept one element of the output let XLA evaluate Mish for that element alone."""
    import jax.numpy as jnp

    bench = benchmark_modules["tdmpc2"]
    piece = bench._backward_of(bench._ln_mish)
    x = jax.random.normal(jax.random.PRNGKey(0), (8, 32))
    scale, bias = 1.0 + 0.1 * x[0], 0.1 * x[1]
    outputs = bench._looped(piece, 3)(x, scale, bias)
    for got, want in zip(outputs, piece(x, scale, bias), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert [o.shape for o in outputs] == [(8, 32), (32,), (32,)]
    assert float(jnp.abs(outputs[1]).sum()) > 0  # the scale's gradient is computed, not dropped


def test_conv_shapes_and_convs_alone_against_hand_counts(benchmark_modules):
    """``common.conv_shapes`` (behind SimPLe's convolution share) counts a scan's convolution
    once per step: [2, 5, 5, 3] x [3, 3, 3, 4] VALID is [2, 3, 3, 4] outputs of 27
    multiply-adds, 3888 FLOPs, three times. ``convs_alone`` computes each output whole:
    inputs of 0.01 give 27 x 1e-4 everywhere."""
    import jax.numpy as jnp

    common = sys.modules["common"]
    w = jnp.ones((3, 3, 3, 4))

    def forward(x):
        def step(carry, _):
            y = jax.lax.conv_general_dilated(carry, w, (1, 1), "VALID",
                                             dimension_numbers=("NHWC", "HWIO", "NHWC"))
            return carry + y.sum(), None
        return jax.lax.scan(step, x, None, length=3)[0]

    shapes = common.conv_shapes(forward, jnp.ones((2, 5, 5, 3)))
    assert sum(shapes.values()) == 3 and len(shapes) == 1
    assert common.conv_flops(shapes) == 3 * 3888
    (out,) = common.convs_alone(shapes)()
    assert out.shape == (2, 3, 3, 4)
    np.testing.assert_allclose(out, 27e-4, rtol=1e-5)


def test_ab_refuses_an_unknown_measurement_before_running_anything():
    out = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "ab.py"), "--before", ROOT,
                          "--only", "dreamer,dreamr"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2
    assert "unknown measurement(s) dreamr" in out.stderr and "dreamer_pong" in out.stderr
