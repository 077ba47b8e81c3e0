"""Diffusion Policy: the schedule and samplers against hand numbers, the 1-D convolutions
against PyTorch's definitions, the U-Net's size, windows, the action queue, learning on a
fixed batch, the two-mode toy task, and one-line errors."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwm import runner
from jaxwm.agents import diffusion_policy as dp
from jaxwm.config import ConfigError, load
from jaxwm.data import datasets
from jaxwm.models import diffusion
from jaxwm.nets.conv import conv1d, conv_transpose1d


def test_squaredcos_schedule_matches_the_cosine_formula():
    s = diffusion.squaredcos_cap_v2(100)

    def abar(t):
        return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2

    assert float(s.betas[0]) == pytest.approx(1 - abar(0.01) / abar(0.0), rel=1e-5)
    assert float(s.betas[-1]) == pytest.approx(0.999)  # capped: abar(1) = 0
    assert float(s.alphas_cumprod[49]) == pytest.approx(
        np.prod([1 - min(1 - abar((i + 1) / 100) / abar(i / 100), 0.999) for i in range(50)]),
        rel=1e-5)


def three_steps():
    betas = jnp.array([0.1, 0.2, 0.3])
    return diffusion.Schedule(betas, jnp.cumprod(1 - betas))  # abar 0.9, 0.72, 0.504


def test_forward_noising_and_ddpm_posterior_match_hand_numbers():
    s = three_steps()
    # q(x_2 | x_0): sqrt(0.72) 0.5 + sqrt(0.28) (-1)
    x1 = diffusion.add_noise(s, jnp.array([0.5]), jnp.array([-1.0]), jnp.array([1]))
    assert float(x1[0]) == pytest.approx(0.848528 * 0.5 - 0.529150, abs=1e-5)
    # p(x_1 | x_2 = 0.3) with eps = 0.2, no clipping (Ho et al. eqs. 6-7):
    # x0 = (0.3 - sqrt(0.496) 0.2) / sqrt(0.504) = 0.224186
    # mean = sqrt(0.72) 0.3 / 0.496 x0 + sqrt(0.7) 0.28 / 0.496 0.3 = 0.115054 + 0.141693
    # variance = 0.28 / 0.496 0.3 = 0.169355
    mean, var = diffusion.ddpm_posterior(s, jnp.float32(0.3), jnp.float32(0.2), jnp.int32(2),
                                         clip=False)
    assert float(mean) == pytest.approx(0.256747, abs=1e-5)
    assert float(var) == pytest.approx(0.169355, abs=1e-5)
    # the last step (t = 0) returns the predicted x0 itself: abar_prev = 1
    mean0, _ = diffusion.ddpm_posterior(s, jnp.float32(0.3), jnp.float32(0.2), jnp.int32(0),
                                        clip=False)
    assert float(mean0) == pytest.approx((0.3 - math.sqrt(0.1) * 0.2) / math.sqrt(0.9), abs=1e-5)
    # clip_sample: an x0 beyond [-1, 1] is clipped before the posterior
    clipped, _ = diffusion.ddpm_posterior(s, jnp.float32(3.0), jnp.float32(0.0), jnp.int32(0))
    assert float(clipped) == pytest.approx(1.0)


def test_ddim_with_every_step_and_eta_one_is_ddpm():
    s = diffusion.squaredcos_cap_v2(20)
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    x, eps, noise = (jax.random.normal(k, (6, 4, 2)) for k in (k1, k2, k3))
    for t in (19, 7, 0):
        ddpm = diffusion.ddpm_step(s, x, eps, t, noise)
        ddim = diffusion.ddim_step(s, x, eps, t, t - 1, noise, eta=1.0)
        np.testing.assert_allclose(ddim, ddpm, atol=1e-5)
    # and the whole reverse process, with any noise model, from the same key
    def denoise(x_t, t):
        return jnp.sin(x_t + t)

    a = diffusion.sample(denoise, s, (3, 4, 2), k1, sampler="ddpm", num_inference=20)
    b = diffusion.sample(denoise, s, (3, 4, 2), k1, sampler="ddim", num_inference=20, eta=1.0)
    np.testing.assert_allclose(a, b, atol=1e-4)
    assert diffusion.timesteps(100, 10, "ddim").tolist() == list(range(90, -1, -10))


def test_ddim_sampling_with_fewer_steps_equals_its_steps_in_a_python_loop():
    s = diffusion.squaredcos_cap_v2(20)
    key = jax.random.PRNGKey(4)

    def denoise(x_t, t):
        return 0.3 * x_t + 0.01 * t

    got = diffusion.sample(denoise, s, (2, 4, 1), key, sampler="ddim", num_inference=5)
    k_init, k_steps = jax.random.split(key)
    x = jax.random.normal(k_init, (2, 4, 1))
    for t, k in zip([16, 12, 8, 4, 0], jax.random.split(k_steps, 5), strict=True):
        x = diffusion.ddim_step(s, x, denoise(x, t), t, t - 4, jax.random.normal(k, x.shape))
    np.testing.assert_allclose(got, x, atol=1e-5)
    # eta = 0: the last step lands on the predicted x_0 (abar = 1 after step 0), clipped
    assert float(jnp.abs(got).max()) <= 1.0


def test_conv1d_and_its_transpose_follow_pytorch_definitions():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 7, 3)).astype(np.float32)
    w = rng.normal(size=(3, 3, 4)).astype(np.float32)  # [K, C, F]
    stride, pad = 2, 1
    xp = np.pad(x, ((0, 0), (pad, pad), (0, 0)))
    out = (xp.shape[1] - 3) // stride + 1
    want = np.stack([sum(xp[:, i * stride + k] @ w[k] for k in range(3)) for i in range(out)], 1)
    np.testing.assert_allclose(conv1d(x, w, stride, pad), want, atol=1e-5)
    # ConvTranspose1d(k4, s2, p1): input step m adds x[m] @ w[k] to output 2m + k - 1
    wt = rng.normal(size=(4, 3, 4)).astype(np.float32)
    full = np.zeros((2, (7 - 1) * 2 + 4, 4), np.float32)
    for m in range(7):
        for k in range(4):
            full[:, 2 * m + k] += x[:, m] @ wt[k]
    got = conv_transpose1d(x, wt, 2, 1)
    assert got.shape == (2, 14, 4)  # twice the length: Upsample1d
    np.testing.assert_allclose(got, full[:, 1:-1], atol=1e-5)


def reference_unet_params(action_dim, cond_dim, dims=(256, 512, 1024), embed=256, k=5):
    """The parameter count of the reference's ConditionalUnet1D, layer by layer (PyTorch)."""
    def conv(cin, cout, kernel):
        return cin * cout * kernel + cout

    def block(cin, cout, cond):  # two Conv1dBlocks (conv + GroupNorm), FiLM, 1x1 residual
        n = conv(cin, cout, k) + 2 * cout + conv(cout, cout, k) + 2 * cout
        n += cond * 2 * cout + 2 * cout
        return n + (conv(cin, cout, 1) if cin != cout else 0)

    cond = embed + cond_dim
    n = embed * 4 * embed + 4 * embed + 4 * embed * embed + embed  # step encoder
    widths = (action_dim,) + tuple(dims)
    for i, (cin, cout) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
        n += block(cin, cout, cond) + block(cout, cout, cond)
        n += conv(cout, cout, 3) if i < len(dims) - 1 else 0
    n += 2 * block(dims[-1], dims[-1], cond)
    for cin, cout in reversed(list(zip(widths[1:-1], widths[2:], strict=True))):
        n += block(2 * cout, cin, cond) + block(cin, cin, cond) + conv(cin, cin, 4)
    return n + conv(dims[0], dims[0], k) + 2 * dims[0] + conv(dims[0], action_dim, 1)


def test_unet_full_size_shape_and_parameter_count_match_the_reference():
    net = diffusion.ConditionalUnet1D(action_dim=3)
    x, t, cond = jnp.zeros((2, 16, 3)), jnp.zeros((2,), jnp.int32), jnp.zeros((2, 2 * 11))
    params = jax.eval_shape(net.init, jax.random.PRNGKey(0), x, t, cond)
    count = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params))
    assert count == reference_unet_params(3, 22)
    assert 6.5e7 < count < 6.6e7  # the reference's lowdim U-Net: ~65M
    out = jax.eval_shape(net.apply, params, x, t, cond)
    assert out.shape == (2, 16, 3)


def test_windows_never_cross_episodes_and_pad_by_repeating_the_ends():
    obs = np.arange(9, dtype=np.float32)[:, None]
    t = {"obs": obs, "action": obs, "reward": np.zeros(9, np.float32),
         "next_obs": obs + 1, "terminated": np.zeros(9, bool)}
    t["terminated"][4] = True  # episode 0: rows 0-4
    t["next_obs"][6] = 99.0  # a timeout after row 6: episode 1 rows 5-6, episode 2 rows 7-8
    data = datasets.Dataset(t, "x", "d4rl", {})
    starts = data.episode_starts()
    assert starts.tolist() == [0, 5, 7]
    windows = datasets.sequence_windows(starts, 9, length=4, pad_before=1, pad_after=1)
    rows = datasets.window_rows(windows, 4)
    episode = np.searchsorted(starts, np.arange(9), side="right") - 1
    assert all(len(set(episode[r])) == 1 for r in rows)  # one episode per window
    assert rows[0].tolist() == [0, 0, 1, 2]  # padded before by the first step
    assert rows[3].tolist() == [2, 3, 4, 4]  # ... and after by the last
    assert len(windows) == (5 - 4 + 2 + 1) + (2 - 4 + 2 + 1) + (2 - 4 + 2 + 1)


def small_hyper(model="mlp", **kw):
    c = dp.config_block(model=model, horizon=8, n_obs_steps=2, action_steps=3,
                        down_dims=(32,), step_embed_dim=16, groups=4, mlp_hidden=(32,),
                        train_steps=20, inference_steps=20, warmup_steps=1)
    c.update(kw)
    return dp.Hyper.from_config(c, obs_dim=2, action_dim=1, schedule_steps=1000)


def test_action_queue_executes_the_planned_steps_then_replans():
    h = small_hyper("mlp")
    obs_data = np.random.default_rng(0).normal(size=(50, 2)).astype(np.float32)
    act_data = np.linspace(-1, 1, 50, dtype=np.float32)[:, None]
    learner = dp.init_learner(h, jax.random.PRNGKey(0), obs_data, act_data)
    params = dp.acting_params(learner)
    policy = dp.policy(h, [-10.0], [10.0])
    act = jax.jit(policy.act)
    carry = policy.init_carry(params, 2)
    key = jax.random.PRNGKey(1)
    observations = jnp.arange(20, dtype=jnp.float32).reshape(10, 1, 2).repeat(2, 1) / 10
    expected_plan = None
    for step in range(7):
        obs = observations[step]
        is_first = jnp.array([step == 0, step in (0, 4)])  # env 1 restarts at step 4
        carry, action, _ = act(params, carry, obs, is_first, key)
        if step % h.action_steps == 0:  # env 0 plans at 0, 3, 6 from its history
            history = carry["history"][:1]
            expected_plan = dp.plan(h, *params, history, key)[0, h.first_action:]
        np.testing.assert_allclose(action[0], expected_plan[step % h.action_steps], atol=1e-5)
        if step == 4:  # env 1's restart: its history is the new first observation, repeated
            np.testing.assert_allclose(carry["history"][1], observations[4, 1][None].repeat(2, 0))
    # ... and its queue emptied: it replanned at 4 and has run 3 of its actions since
    assert int(carry["index"][1]) == 3 and int(carry["index"][0]) == 1


def test_one_update_lowers_each_models_loss_on_a_fixed_batch():
    rng = np.random.default_rng(0)
    batch = {"obs": jnp.asarray(rng.normal(size=(32, 2, 2)), jnp.float32),
             "action": jnp.asarray(rng.uniform(-1, 1, size=(32, 8, 1)), jnp.float32)}
    for model in ("unet", "mlp"):
        h = small_hyper(model, learning_rate=3e-3, warmup_steps=0)
        learner = dp.init_learner(h, jax.random.PRNGKey(0), np.asarray(batch["obs"][:, 0]),
                                  np.asarray(batch["action"][:, 0]))
        update = jax.jit(dp.make_update(h, lambda key: batch))
        schedule = diffusion.squaredcos_cap_v2(h.train_steps)
        key = jax.random.PRNGKey(3)

        def loss(learner, key=key, h=h, schedule=schedule):
            return dp.loss_fn(h, schedule, learner.params, learner, batch, key)

        before = loss(learner)
        for i in range(5):
            learner, metrics = update(learner, jax.random.PRNGKey(i))
        assert float(loss(learner)) < float(before), model
        assert int(learner.step) == 5 and float(metrics["optim/ema_decay"]) > 0


def test_ema_decay_follows_the_reference_formula():
    h = small_hyper()
    # EMAModel.get_decay(optimization_step): max(0, step - 1) of the 0-based step; our
    # update number is 1-based: updates 1 and 2 copy, the 11th uses k = 9
    assert float(dp.ema_decay(h, 1)) == 0.0 and float(dp.ema_decay(h, 2)) == 0.0
    assert float(dp.ema_decay(h, 3)) == pytest.approx(1 - 2 ** -0.75)
    assert float(dp.ema_decay(h, 11)) == pytest.approx(1 - 10 ** -0.75)
    assert float(dp.ema_decay(h, 10 ** 9)) == pytest.approx(0.9999)


def test_two_modes_diffusion_lands_on_them_where_mlp_averages():
    """Chi et al.'s point: demonstrations that go either way (all +0.8 or all -0.8 from the
    same observation): diffusion samples near either mode, regression the mean, 0."""
    rng = np.random.default_rng(0)
    n = 256
    signs = np.where(rng.random(n) < 0.5, 0.8, -0.8).astype(np.float32)
    batch = {"obs": jnp.zeros((n, 2, 2)),
             "action": jnp.asarray(np.repeat(signs[:, None, None], 8, 1))}
    observation = jnp.zeros((64, 2, 2))
    chunks = {}
    for model in ("unet", "mlp"):
        h = small_hyper(model, learning_rate=3e-3, warmup_steps=0, clip_sample=True)
        learner = dp.init_learner(h, jax.random.PRNGKey(0), np.zeros((2, 2), np.float32),
                                  np.array([[-0.8], [0.8]], np.float32))
        update = jax.jit(dp.make_update(h, lambda key: batch))
        for i in range(300):
            learner, _ = update(learner, jax.random.PRNGKey(i))
        chunks[model] = np.asarray(dp.plan(h, learner.params, learner.obs_norm,
                                           learner.action_norm, observation,
                                           jax.random.PRNGKey(7))).mean(axis=(1, 2))
    near_mode = np.abs(np.abs(chunks["unet"]) - 0.8) < 0.25
    assert near_mode.mean() >= 0.8, chunks["unet"]
    assert 0.2 <= (chunks["unet"] > 0).mean() <= 0.8, chunks["unet"]  # both modes
    assert np.abs(chunks["mlp"]).max() < 0.25, chunks["mlp"]  # the average of the modes


def test_bad_settings_are_one_line_errors():
    with pytest.raises(ConfigError, match="too short"):
        runner.validate(load("diffusion:tiny", {"diffusion.horizon": 2}))
    with pytest.raises(ConfigError, match="inference_steps"):
        runner.validate(load("diffusion:tiny", {"diffusion.sampler": "ddim",
                                                           "diffusion.inference_steps": 3}))
    with pytest.raises(ConfigError, match="model must be one of"):
        runner.validate(load("diffusion:tiny", {"diffusion.model": "transformer"}))
    with pytest.raises(ConfigError, match="continuous"):
        runner.validate(load("diffusion:tiny", {"env.id": "CartPole-v1"}))


def test_a_dataset_of_another_env_or_without_actions_is_refused(tmp_path):
    import h5py

    from jaxwm.algos import diffusion as algo

    path = str(tmp_path / "demo.hdf5")
    n = 40
    datasets.write_d4rl(path, {"observations": np.zeros((n, 3), np.float32),
                               "actions": np.zeros((n, 2), np.float32),
                               "rewards": np.zeros(n, np.float32),
                               "terminals": np.zeros(n, bool), "timeouts": np.zeros(n, bool),
                               "next_observations": np.zeros((n, 3), np.float32)},
                        {"env_id": "x"})
    with pytest.raises(ConfigError, match="another env"):
        algo.build(load("diffusion:tiny", {"dataset": path}))
    with h5py.File(path, "a") as f:
        del f["actions"]
    with pytest.raises(ConfigError, match=r"lacks \['actions'\]"):
        algo.build(load("diffusion:tiny", {"dataset": path}))


def test_plan_with_all_steps_conditions_at_once_equals_the_unet_called_per_step():
    """``plan`` computes every step's FiLM before the scan (``conditions``) and runs only the
    ``trunk`` per step: the same chunk as calling the whole U-Net at each step."""
    h = dp.Hyper.from_config(dp.config_block(down_dims=(16, 32), step_embed_dim=8,
                                             sampler="ddim", inference_steps=5), 3, 2, 10)
    rng = np.random.default_rng(0)
    obs, action = rng.normal(size=(50, 3)), rng.uniform(-1, 1, (50, 2))
    learner = dp.init_learner(h, jax.random.PRNGKey(0), obs, action)
    history = jnp.asarray(rng.normal(size=(4, h.n_obs_steps, 3)), jnp.float32)
    key = jax.random.PRNGKey(1)
    got = dp.plan(h, learner.ema_params, learner.obs_norm, learner.action_norm, history, key)
    net, cond = dp.network(h), dp.condition(h, learner.obs_norm, history)
    want = diffusion.sample(
        lambda x, t: net.apply(learner.ema_params, x, jnp.full((4,), t), cond),
        diffusion.squaredcos_cap_v2(h.train_steps), (4, h.horizon, 2), key, sampler="ddim",
        num_inference=5)
    np.testing.assert_allclose(got, learner.action_norm.inverse(want), atol=1e-5)


def test_group_norm_matches_flax_and_the_definition():
    x = jax.random.normal(jax.random.PRNGKey(0), (3, 7, 16)) * 3.0 + 1.0
    ours = diffusion.GroupNorm(4)
    params = ours.init(jax.random.PRNGKey(1), x)
    params = jax.tree.map(lambda p: p + jax.random.uniform(jax.random.PRNGKey(2), p.shape),
                          params)
    got = ours.apply(params, x)
    flax_norm = nn.GroupNorm(num_groups=4, epsilon=1e-5)
    np.testing.assert_allclose(got, flax_norm.apply(params, x), atol=1e-5)
    g = np.asarray(x).reshape(3, 7, 4, 4)  # by hand: statistics per example and group
    mean, var = g.mean(axis=(1, 3), keepdims=True), g.var(axis=(1, 3), keepdims=True)
    want = ((g - mean) / np.sqrt(var + 1e-5)).reshape(3, 7, 16)
    want = want * np.asarray(params["params"]["scale"]) + np.asarray(params["params"]["bias"])
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_a_resume_refuses_demonstrations_that_changed(tmp_path):
    """The demonstrations are imported into the run when it starts (a phase artifact, as
    MOPO's dataset): a resume on a dataset file that changed since is refused in one line."""
    from jaxwm import train
    from jaxwm.tools import make_dataset

    path = make_dataset.make("Pendulum-v1", "random", str(tmp_path / "demos.hdf5"), size=400,
                             num_envs=2)
    overrides = {"dataset": path, "log.progress": False, "eval.at_end": False,
                 "checkpoint.every": "4 agent_updates"}
    train.run(load("diffusion:tiny", overrides), str(tmp_path / "run"))
    import h5py

    with h5py.File(path, "r+") as f:
        f["actions"][0] = f["actions"][0] + 0.5
    resumed = load("diffusion:tiny", {**overrides, "resume": True})
    with pytest.raises(ConfigError, match="has changed at its source") as error:
        train.run(resumed, str(tmp_path / "run"))
    assert "\n" not in str(error.value)
