"""SAC: the squashed Gaussian against hand-computed densities, the update's targets and
temperature rule, K scanned updates against K single ones, the online algorithm end to end,
and learning (slow). Resume, donation, devices and seeds: tests/test_contract.py."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxwm.config
from jaxwm import backend, train
from jaxwm.agents import sac
from jaxwm.config import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BOX = sac.ActionBox(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))


def sac_config(variant="pendulum", **overrides):
    return jaxwm.config.load(f"sac:{variant}",
                             {"log.progress": False, **overrides})


def batch(n=32, obs_dim=3, terminated=False, seed=0):
    rng = np.random.default_rng(seed)
    return {"obs": jnp.asarray(rng.normal(size=(n, obs_dim)), jnp.float32),
            "action": jnp.asarray(rng.uniform(BOX.low, BOX.high, size=(n, 2)), jnp.float32),
            "reward": jnp.asarray(rng.normal(size=n), jnp.float32),
            "next_obs": jnp.asarray(rng.normal(size=(n, obs_dim)), jnp.float32),
            "terminated": jnp.full(n, terminated)}


def small_nets():
    return sac.SACNets.create(BOX, (32, 32), (32, 32))


def test_squashed_sample_log_prob_is_the_change_of_variables_density():
    mean, log_std = jnp.array([[0.3, -0.5]]), jnp.array([[-0.2, 0.4]])
    action, log_prob = sac.squashed_sample(mean, log_std, BOX, jax.random.PRNGKey(0))
    assert bool(jnp.all((action >= BOX.low) & (action <= BOX.high)))
    # Hand-computed: u = atanh((a - c) / h); log p(a) = log N(u) - log(h (1 - tanh(u)^2)).
    c, h = (BOX.high + BOX.low) / 2, (BOX.high - BOX.low) / 2
    y = (np.asarray(action, np.float64) - c) / h
    u = np.arctanh(y)
    std = np.exp(np.asarray(log_std, np.float64))
    gauss = -0.5 * ((u - np.asarray(mean)) / std) ** 2 - np.log(std) - 0.5 * np.log(2 * np.pi)
    expected = np.sum(gauss - np.log(h * (1 - y**2)), -1)
    np.testing.assert_allclose(np.asarray(log_prob), expected, rtol=1e-4)


def test_squashed_sample_at_temperature_zero_is_the_mode():
    mean, log_std = jnp.array([[0.3, -0.5]]), jnp.zeros((1, 2))
    action, _ = sac.squashed_sample(mean, log_std, BOX, jax.random.PRNGKey(0), temperature=0.0)
    np.testing.assert_allclose(action, BOX.center + BOX.half_width * np.tanh(mean), rtol=1e-6)


def test_critic_regresses_on_the_reward_when_terminated():
    """With terminated everywhere the target is the reward alone (no bootstrap), so the critic
    loss is sum over critics of mean (Q - r)^2 whatever the target critic holds."""
    nets, hyper = small_nets(), sac.SACHyper()
    learner = sac.init_learner(nets, hyper, jax.random.PRNGKey(0), 3)
    b = batch(terminated=True)
    q = nets.critics.apply(learner.critic, b["obs"], b["action"])
    expected = float(jnp.sum(jnp.mean((q - b["reward"]) ** 2, -1)))
    scrambled = learner.replace(target_critic=jax.tree.map(lambda x: x + 5.0,
                                                           learner.target_critic))
    for start in (learner, scrambled):
        _, metrics = sac.update_step(nets, hyper, start, b, jax.random.PRNGKey(1))
        assert float(metrics["losses/q_loss"]) == pytest.approx(expected, rel=1e-5)


def test_targets_move_by_polyak_averaging():
    nets, hyper = small_nets(), sac.SACHyper(tau=0.1)
    learner = sac.init_learner(nets, hyper, jax.random.PRNGKey(0), 3)
    after, _ = sac.update_step(nets, hyper, learner, batch(), jax.random.PRNGKey(1))
    jax.tree.map(lambda t, c, old: np.testing.assert_allclose(t, 0.1 * c + 0.9 * old, atol=1e-6),
                 after.target_critic, after.critic, learner.target_critic)


@pytest.mark.parametrize("target_entropy, direction", [(-100.0, -1), (100.0, 1)])
def test_temperature_moves_toward_the_entropy_target(target_entropy, direction):
    """eq. 18: alpha falls while the policy is more random than the target, rises otherwise."""
    nets = small_nets()
    hyper = sac.SACHyper(target_entropy=target_entropy, alpha_lr=1e-2)
    learner = sac.init_learner(nets, hyper, jax.random.PRNGKey(0), 3)
    after, _ = sac.update_step(nets, hyper, learner, batch(), jax.random.PRNGKey(1))
    assert np.sign(float(after.log_alpha - learner.log_alpha)) == direction
    fixed = sac.SACHyper(auto_alpha=False, initial_alpha=0.2)
    learner = sac.init_learner(nets, fixed, jax.random.PRNGKey(0), 3)
    after, _ = sac.update_step(nets, fixed, learner, batch(), jax.random.PRNGKey(1))
    assert float(after.log_alpha) == pytest.approx(np.log(0.2))


def test_clipped_log_std_is_the_linear_output_clamped_to_the_bounds():
    """OfflineRL-Kit's actor (``log_std="clip"``): log-std = clamp(W x + b, -5, 2), with no
    gradient outside the bounds; CleanRL's ("tanh") squashes the same output smoothly."""
    obs = jnp.asarray(np.random.default_rng(0).normal(size=(4, 3)) * 50, jnp.float32)
    clip = sac.TanhGaussianActor(2, (8,), log_std="clip")
    params = clip.init(jax.random.PRNGKey(0), obs)
    _, log_std = clip.apply(params, obs)
    hidden = jax.nn.relu(obs @ params["params"]["Dense_0"]["kernel"]
                         + params["params"]["Dense_0"]["bias"])
    raw = hidden @ params["params"]["Dense_2"]["kernel"] + params["params"]["Dense_2"]["bias"]
    np.testing.assert_allclose(log_std, np.clip(raw, -5.0, 2.0), rtol=1e-5, atol=1e-5)
    assert (np.abs(raw) > 5).any()  # the clamp is exercised
    grad = jax.grad(lambda p: jnp.sum(clip.apply(p, obs)[1]))(params)
    outside = (np.asarray(raw) < -5) | (np.asarray(raw) > 2)
    np.testing.assert_allclose(np.asarray(grad["params"]["Dense_2"]["bias"]),
                               (~outside).sum(0), atol=1e-6)
    tanh = sac.TanhGaussianActor(2, (8,), log_std="tanh")
    _, smooth = tanh.apply(params, obs)
    np.testing.assert_allclose(smooth, -5.0 + 3.5 * (np.tanh(raw) + 1), rtol=1e-5, atol=1e-5)


def test_torch_init_is_torch_linears_default():
    """``weight_init="torch"``: weights and biases uniform in +-1/sqrt(fan_in) (torch.nn.Linear), a
    third of flax's lecun-normal weight variance; "flax" keeps zero biases."""
    obs, action = jnp.zeros((1, 3)), jnp.zeros((1, 2))
    layers = []
    for module, args in ((sac.TanhGaussianActor(2, (256, 256), weight_init="torch"), (obs,)),
                         (sac.Critics(2, (256, 256), weight_init="torch"), (obs, action))):
        params = module.init(jax.random.PRNGKey(0), *args)
        jax.tree_util.tree_map_with_path(
            lambda path, x: layers.append(x) if isinstance(x, dict) and "kernel" in x else None,
            params, is_leaf=lambda x: isinstance(x, dict) and "kernel" in x)
    assert len(layers) == 4 + 3  # actor: 2 hidden, mean, log-std; critics (vmapped): 3
    for layer in layers:
        kernel, bias = np.asarray(layer["kernel"]), np.asarray(layer["bias"])
        bound = 1 / np.sqrt(kernel.shape[-2])  # fan-in: 3, 5 (obs + action) or 256
        assert np.abs(kernel).max() <= bound and np.abs(bias).max() <= bound
        assert np.all(bias != 0)
        if kernel.size > 1000:
            assert kernel.std() == pytest.approx(bound / np.sqrt(3), rel=0.05)
    flax_params = sac.Critics(2, (256, 256)).init(jax.random.PRNGKey(0), obs, action)
    biases = [x for p, x in jax.tree_util.tree_leaves_with_path(flax_params)
              if "bias" in jax.tree_util.keystr(p)]
    assert len(biases) == 3 and not any(np.any(np.asarray(b)) for b in biases)


def test_actor_learning_rate_follows_the_stepped_cosine():
    """CosineAnnealingLR(T_max=4) stepped every 10 updates: lr (1 + cos(pi n / 4)) / 2 after n
    steps, constant within a step, 0 from the 40th update on."""
    hyper = sac.SACHyper(actor_lr=1.0, actor_lr_decay_steps=4, actor_lr_step_every=10)
    schedule = sac.actor_learning_rate(hyper)
    got = [float(schedule(c)) for c in (0, 9, 10, 19, 20, 30, 40, 55)]
    half = 0.5 * (1 + np.cos(np.pi / 4))
    np.testing.assert_allclose(got, [1.0, 1.0, half, half, 0.5, 1 - half, 0.0, 0.0], atol=1e-6)
    assert sac.actor_learning_rate(sac.SACHyper(actor_lr=3e-4)) == 3e-4


def test_temperature_is_capped_where_max_alpha_is_set():
    nets = small_nets()
    for cap, expected in ((None, 5.0), (1.0, 1.0)):
        hyper = sac.SACHyper(initial_alpha=5.0, max_alpha=cap)
        learner = sac.init_learner(nets, hyper, jax.random.PRNGKey(0), 3)
        _, metrics = sac.update_step(nets, hyper, learner, batch(), jax.random.PRNGKey(1))
        assert float(metrics["agent/alpha"]) == pytest.approx(expected)


def test_scanned_updates_equal_single_updates():
    nets, hyper = small_nets(), sac.SACHyper(batch_size=8)
    data = batch(n=64)

    def sample(source, key):
        idx = jax.random.randint(key, (hyper.batch_size,), 0, 64)
        return jax.tree.map(lambda x: x[idx], source)

    learner = sac.init_learner(nets, hyper, jax.random.PRNGKey(0), 3)
    scanned, metrics = jax.jit(sac.make_update(nets, hyper, sample, 3))(
        learner, data, jax.random.PRNGKey(2))
    one = learner
    losses = []
    for k in jax.random.split(jax.random.PRNGKey(2), 3):
        k_sample, k_step = jax.random.split(k)
        one, m = sac.update_step(nets, hyper, one, sample(data, k_sample), k_step)
        losses.append(float(m["losses/q_loss"]))
    # Same arithmetic in another loop form: float32 roundings only (backend.float32_tolerance;
    # the suite runs at exact float32, see conftest). Absolute: a fraction of Adam's reach, ~lr
    # per step over 3 steps. Adam divides each gradient component by its own scale, so a
    # component made small by cancellation, whose rounding is relatively large, moves its
    # parameter by a relatively different amount: 1.2e-5 of the reach was seen on an AVX-512
    # host (another summation order), hence 1e-4 of it. A wrong key, sample or step differs by
    # O(lr) per parameter, ~1e4 times more.
    tol = backend.float32_tolerance()
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=tol, atol=1e-4 * 3 * hyper.critic_lr),
                 scanned, one)
    assert float(metrics["losses/q_loss"]) == pytest.approx(np.mean(losses), rel=tol)


def test_online_sac_runs_end_to_end(tmp_path):
    overrides = {"total_env_steps": 600, "sac.learning_starts": 200, "sac.batch_size": 32,
                 "sac.actor_hidden": (32, 32), "sac.critic_hidden": (32, 32),
                 "log.every": "200 env_steps", "checkpoint.every": "400 env_steps",
                 "eval.num_episodes": 2, "eval.num_envs": 2, "eval.every": "never"}
    summary = train.run(sac_config(**overrides), str(tmp_path))
    assert summary["env_steps"] == 600
    assert summary["agent_updates"] == 400
    assert summary["replay/size"] > 0
    assert np.isfinite(summary["eval/episodic_return"])


@pytest.mark.parametrize("overrides, message", [
    ({"env.id": "CartPole-v1"}, "sac takes continuous actions; CartPole-v1's are discrete"),
    ({"sac.learning_starts": 200_000, "total_env_steps": 300_000}, "at most sac.capacity"),
    ({"sac.log_std": "softplus"}, r"Unknown sac.log_std 'softplus'; choose one of"),
    ({"sac.max_alpha": 0.0}, "sac.max_alpha must be positive"),
    ({"sac.weight_init": "xavier"},
     r"Unknown sac.weight_init 'xavier'; choose one of \('flax', 'torch'\)"),
])
def test_bad_settings_are_refused(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        train.run(sac_config(**overrides), str(tmp_path))


@pytest.mark.slow
def test_pendulum_reaches_minus_250_within_20k_steps(tmp_path):
    summary = train.run(sac_config("pendulum", **{"checkpoint.every": "never"}), str(tmp_path))
    assert summary["env_steps"] <= 20_000
    assert summary["eval/episodic_return"] >= -250, summary


@pytest.mark.slow
def test_halfcheetah_reaches_3000_within_300k_steps(tmp_path):
    summary = train.run(sac_config("mujoco", **{"total_env_steps": 300_000,
                                                "checkpoint.every": "never"}), str(tmp_path))
    print(f"HalfCheetah: final eval {summary['eval/episodic_return']:.1f}")
    assert summary["eval/episodic_return"] >= 3000, summary
