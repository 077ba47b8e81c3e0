"""jaxwm.envs: shapes per family, host == XLA path, flags and auto-reset, episode statistics.

Everything runs on tiny pools (2-3 envs) and short rollouts so the file stays fast on CPU.
"""

from __future__ import annotations

import envpool
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from ml_collections import ConfigDict

from jaxwm.envs import EnvSpec, EpisodeStats, StepResult, UnknownEnvError, make_env

FIELDS = ("obs", "reward", "terminated", "truncated", "episode_over", "raw_reward")


def _make(num_envs: int = 2, seed: int = 0, render: bool = False, **cfg):
    return make_env(ConfigDict(cfg), num_envs=num_envs, seed=seed, render=render)


def _random_actions(spec: EnvSpec, steps: int, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if spec.discrete:
        return rng.integers(0, spec.num_actions, (steps, spec.num_envs)).astype(np.int32)
    shape = (steps, spec.num_envs, *spec.action_shape)
    return (scale * rng.standard_normal(shape)).astype(np.float32)


def _stack(results: list[StepResult]) -> StepResult:
    return jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *results)


def _run_host(env, actions: np.ndarray) -> StepResult:
    env.reset()
    return _stack([env.step(a) for a in actions])


def _run_xla(env, actions: np.ndarray) -> StepResult:
    handle, _ = env.xla_reset()

    @jax.jit
    def rollout(handle, actions):
        return lax.scan(env.xla_step, handle, actions)

    _, results = rollout(handle, jnp.asarray(actions))
    return jax.tree.map(np.asarray, results)


RUNNERS = {"host": _run_host, "xla": _run_xla}


def _skip_if_missing(env_id: str) -> None:
    if env_id not in envpool.list_all_envs():
        pytest.skip(f"{env_id} is not registered in this envpool build")


# ---- shapes and dtypes per family ----------------------------------------------------------

FAMILY_CASES = [
    # (config, family, obs_shape, obs_dtype, num_actions, action_shape)
    (dict(id="CartPole-v1"), "classic", (4,), np.float32, 2, ()),
    (dict(id="Pendulum-v1"), "classic", (3,), np.float32, None, (1,)),
    (dict(id="Breakout-v5"), "atari", (4, 84, 84), np.uint8, 4, ()),
    (
        dict(id="Breakout-v5", gray_scale=False, img_height=64, img_width=64),
        "atari",
        (12, 64, 64),
        np.uint8,
        4,
        (),
    ),
    (dict(id="HalfCheetah-v4"), "mujoco", (17,), np.float32, None, (6,)),
    (dict(id="CheetahRun-v1"), "dmc", (17,), np.float32, None, (6,)),
    (dict(id="MiniGrid-DoorKey-5x5-v0"), "minigrid", (3, 7, 7), np.uint8, 7, ()),
    (dict(id="CarRacing-v3"), "box2d", (3, 96, 96), np.uint8, None, (3,)),
]


@pytest.mark.parametrize(
    "cfg,family,obs_shape,obs_dtype,num_actions,action_shape",
    FAMILY_CASES,
    ids=lambda c: c["id"] if isinstance(c, dict) else None,
)
def test_reset_and_step_shapes_per_family(cfg, family, obs_shape, obs_dtype, num_actions, action_shape):
    _skip_if_missing(cfg["id"])
    env = _make(**cfg)
    spec = env.spec
    assert (spec.family, spec.obs_shape, spec.obs_dtype) == (family, obs_shape, obs_dtype)
    assert (spec.num_actions, spec.action_shape) == (num_actions, action_shape)
    assert spec.discrete == (num_actions is not None)
    if not spec.discrete:
        assert spec.action_low.shape == spec.action_high.shape == action_shape
    first = env.reset()
    assert not first.reward.any() and not (first.terminated | first.truncated).any()
    for res in [first, *(env.step(a) for a in _random_actions(spec, 3))]:
        assert res.obs.shape == (2, *obs_shape) and res.obs.dtype == obs_dtype
        for name in ("reward", "raw_reward"):
            assert getattr(res, name).shape == (2,) and getattr(res, name).dtype == np.float32
        for name in ("terminated", "truncated", "episode_over"):
            assert getattr(res, name).shape == (2,) and getattr(res, name).dtype == bool
    env.close()


def test_default_max_episode_steps_is_envpools():
    assert _make(id="CartPole-v1").spec.max_episode_steps == 500
    assert _make(id="CartPole-v1", max_episode_steps=20).spec.max_episode_steps == 20


def test_dmc_action_repeat_sums_the_rewards_of_its_control_steps():
    """``env.frame_skip=2`` on DMC: an agent step is two control steps of the same action, its
    reward their sum (envpool's own frame_skip reports only the last); episodes are 500 agent
    steps, then envpool's reset step alone, so the next episode is aligned again. Host and
    XLA paths agree."""
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (1100, 2, 1)).astype(np.float32)
    single, double = _make(seed=3, id="CartpoleBalance-v1"), \
        _make(seed=3, id="CartpoleBalance-v1", frame_skip=2)
    assert (single.spec.max_episode_steps, double.spec.max_episode_steps) == (1000, 500)
    single.reset()
    double.reset()
    for t in range(3):
        a = single.step(actions[2 * t]).reward + single.step(actions[2 * t]).reward
        b = double.step(actions[2 * t]).reward
        np.testing.assert_allclose(b, a, rtol=1e-6)
    ends = []
    for t in range(3, 1005):
        if double.step(actions[t]).truncated.any():
            ends.append(t)
    assert ends == [499, 1000]  # 500 agent steps, the reset step, 500 more
    single.close()
    double.close()
    # the XLA path, on fresh pools of the same seed (their first episodes are the same)
    single, double = _make(seed=3, id="CartpoleBalance-v1"), \
        _make(seed=3, id="CartpoleBalance-v1", frame_skip=2)
    (hs, _), (hd, _) = single.xla_reset(), double.xla_reset()
    step_single, step_double = jax.jit(single.xla_step), jax.jit(double.xla_step)
    for t in range(3):
        hs, r1 = step_single(hs, jnp.asarray(actions[t]))
        hs, r2 = step_single(hs, jnp.asarray(actions[t]))
        hd, r = step_double(hd, jnp.asarray(actions[t]))
        np.testing.assert_allclose(r.reward, r1.reward + r2.reward, rtol=1e-6)
    single.close()
    double.close()


# ---- observation layouts against raw envpool -----------------------------------------------


def test_dmc_obs_is_sorted_key_concatenation():
    # dm_control's own order is orientations, height (a scalar), velocity; ours is sorted.
    raw = envpool.make("WalkerWalk-v1", env_type="gymnasium", num_envs=2, batch_size=2, seed=3)
    raw_obs, _ = raw.reset()
    env = _make(seed=3, id="WalkerWalk-v1")
    assert env.spec.obs_shape == (24,)
    parts = [raw_obs[k].reshape(2, -1) for k in ("height", "orientations", "velocity")]
    np.testing.assert_array_equal(env.reset().obs, np.concatenate(parts, 1).astype(np.float32))


@pytest.mark.parametrize("env_id,key", [("MiniGrid-DoorKey-5x5-v0", "image"), ("CarRacing-v3", None)])
def test_image_obs_are_channels_first(env_id, key):
    _skip_if_missing(env_id)
    raw = envpool.make(env_id, env_type="gymnasium", num_envs=2, batch_size=2, seed=1)
    raw_obs, _ = raw.reset()
    raw_obs = raw_obs[key] if key else raw_obs
    np.testing.assert_array_equal(_make(seed=1, id=env_id).reset().obs, np.transpose(raw_obs, (0, 3, 1, 2)))


@pytest.mark.parametrize("gray_scale,channels", [(True, 1), (False, 3)])
def test_atari_frame_stack_oldest_first(gray_scale, channels):
    env = _make(id="Breakout-v5", gray_scale=gray_scale, img_height=64, img_width=64)
    prev = env.reset().obs
    for _ in range(6):  # FIRE launches the ball, so frames differ; no life is lost this early
        res = env.step(np.ones(2, np.int32))
        assert not res.done.any()
        # one new frame enters at the end, the oldest leaves at the front
        np.testing.assert_array_equal(res.obs[:, :-channels], prev[:, channels:])
        prev = res.obs
    assert not np.array_equal(prev[:, -channels:], prev[:, :channels])


# ---- XLA path == host path -----------------------------------------------------------------

XLA_CASES = [
    (dict(id="CartPole-v1"), 100),
    (dict(id="Pendulum-v1"), 20),
    (dict(id="Breakout-v5"), 40),
    (dict(id="HalfCheetah-v4"), 20),
    (dict(id="CheetahRun-v1"), 20),
    (dict(id="MiniGrid-DoorKey-5x5-v0", max_episode_steps=8), 30),
]


@pytest.mark.parametrize("cfg,steps", XLA_CASES, ids=lambda c: c["id"] if isinstance(c, dict) else None)
def test_xla_path_equals_host_path(cfg, steps):
    host_env, xla_env = _make(num_envs=3, seed=7, **cfg), _make(num_envs=3, seed=7, **cfg)
    actions = _random_actions(host_env.spec, steps, scale=3.0)  # some continuous ones out of range
    first_host = host_env.reset()
    _, first_xla = xla_env.xla_reset()
    for name in FIELDS:
        np.testing.assert_array_equal(np.asarray(getattr(first_xla, name)), getattr(first_host, name))
    host, xla = _run_host(host_env, actions), _run_xla(xla_env, actions)
    for name in FIELDS:
        np.testing.assert_array_equal(getattr(xla, name), getattr(host, name), err_msg=name)
        assert getattr(xla, name).dtype == getattr(host, name).dtype, name
    if cfg["id"] in ("CartPole-v1", "MiniGrid-DoorKey-5x5-v0"):
        assert host.done.sum() >= 3  # the comparison crossed several auto-resets


# ---- termination, truncation and auto-reset ------------------------------------------------


@pytest.mark.parametrize("path", ["host", "xla"])
def test_cartpole_truncates_at_max_episode_steps_then_resets(path):
    env = _make(id="CartPole-v1", max_episode_steps=20)
    actions = np.tile((np.arange(62) % 2)[:, None], (1, 2)).astype(np.int32)  # keeps it upright
    res = RUNNERS[path](env, actions)
    # 20 real steps truncate; the 21st is the reset transition; the counter restarts from it
    truncated_at = np.nonzero(res.truncated[:, 0])[0].tolist()
    assert truncated_at == [19, 40, 61]
    assert not res.terminated.any()
    assert res.episode_over[truncated_at].all()
    after = [t + 1 for t in truncated_at[:-1]]
    assert not res.reward[after].any() and not res.done[after].any()
    assert (res.reward[:19] == 1).all()


@pytest.mark.parametrize("path", ["host", "xla"])
def test_cartpole_termination_is_not_truncation(path):
    env = _make(id="CartPole-v1")
    res = RUNNERS[path](env, np.ones((40, 2), np.int32))  # always push right: the pole falls
    t = int(np.argmax(res.terminated[:, 0]))
    assert 0 < t < 39 and res.terminated[t, 0]
    assert not res.truncated.any() and res.episode_over[t, 0]
    assert res.reward[t, 0] == 1.0  # the terminal step itself is rewarded in CartPole-v1
    assert res.reward[t + 1, 0] == 0.0 and not res.done[t + 1, 0]  # reset transition
    assert not res.done[:t, 0].any()


# ---- episode statistics --------------------------------------------------------------------


def _reference_episodes(res: StepResult) -> list[list[tuple[float, int]]]:
    """Plain-Python episode bookkeeping: skip each step right after a done (the reset)."""
    steps, num_envs = res.reward.shape
    episodes: list[list[tuple[float, int]]] = [[] for _ in range(num_envs)]
    for i in range(num_envs):
        ret, length, after_done = 0.0, 0, False
        for t in range(steps):
            if after_done:
                assert res.raw_reward[t, i] == 0.0
            else:
                ret += float(res.raw_reward[t, i])
                length += 1
            if res.episode_over[t, i]:
                episodes[i].append((ret, length))
                ret, length = 0.0, 0
            after_done = bool(res.done[t, i])
    return episodes


def _stats_episodes(completed: dict, num_envs: int) -> list[list[tuple[float, int]]]:
    ret, length, mask = (np.asarray(completed[k]) for k in ("return", "length", "mask"))
    return [
        [(float(r), int(n)) for r, n in zip(ret[mask[:, i], i], length[mask[:, i], i], strict=True)]
        for i in range(num_envs)
    ]


def test_episode_stats_match_python_reference_on_cartpole():
    env = _make(num_envs=3, seed=1, id="CartPole-v1", max_episode_steps=30)
    res = _run_host(env, _random_actions(env.spec, 200, seed=1))
    reference = _reference_episodes(res)

    stats, completed = EpisodeStats.create(3), []
    for t in range(200):  # eager, on the host path's numpy results
        stats, c = stats.update(jax.tree.map(lambda x, t=t: x[t], res))
        completed.append(c)
    eager = jax.tree.map(lambda *xs: np.stack(xs), *completed)
    _, scanned = jax.jit(lambda r: lax.scan(lambda s, x: s.update(x), EpisodeStats.create(3), r))(
        jax.tree.map(jnp.asarray, res)
    )

    assert _stats_episodes(eager, 3) == reference
    assert _stats_episodes(jax.tree.map(np.asarray, scanned), 3) == reference
    flat = [ep for eps in reference for ep in eps]
    assert len(flat) >= 15
    assert all(r == n for r, n in flat)  # +1 per executed step: the reset is not counted
    assert any(n == 30 for _, n in flat) and all(n <= 30 for _, n in flat)  # truncations
    assert not eager["return"][~eager["mask"]].any()  # zero where no episode ended


def test_atari_life_loss_terminates_but_episode_goes_on():
    """episodic_life: `terminated` on each lost life, `episode_over` only at game over.

    A raw envpool pool with the same settings and seed replays the same game, so flags,
    rewards and lengths are checked against envpool's own info (lives, terminated, reward,
    elapsed_step).
    """
    raw = envpool.make(
        "Breakout-v5",
        env_type="gymnasium",
        num_envs=2,
        batch_size=2,
        seed=5,
        episodic_life=True,
        reward_clip=True,
        noop_max=30,
        frame_skip=4,
        use_fire_reset=True,
        img_height=84,
        img_width=84,
        gray_scale=True,
        stack_num=4,
        repeat_action_probability=0.0,
        full_action_space=False,
    )
    env = _make(seed=5, id="Breakout-v5")
    raw.reset()
    env.reset()
    stats = EpisodeStats.create(2)
    rng = np.random.default_rng(0)
    saw_life_loss = saw_game_over = False
    for _ in range(1500):
        action = rng.integers(0, 4, 2).astype(np.int32)
        _, raw_reward, raw_term, raw_trunc, info = raw.step(action)
        res = env.step(action)
        np.testing.assert_array_equal(res.terminated, raw_term)
        np.testing.assert_array_equal(res.episode_over, raw_trunc | (info["terminated"] == 1))
        np.testing.assert_array_equal(res.raw_reward, info["reward"])
        np.testing.assert_array_equal(res.reward, np.sign(info["reward"]))
        stats, completed = stats.update(res)
        life_loss = res.terminated & ~res.episode_over
        if life_loss.any():
            saw_life_loss = True
            assert (info["lives"][life_loss] > 0).all()
            assert (np.asarray(stats.running_length)[life_loss] > 0).all()  # not reset
            assert not np.asarray(completed["mask"])[life_loss].any()
        if res.episode_over.any():
            saw_game_over = True
            over = res.episode_over
            assert (info["lives"][over] == 0).all()
            np.testing.assert_array_equal(np.asarray(completed["length"])[over], info["elapsed_step"][over])
            break
    assert saw_life_loss and saw_game_over


# ---- errors and actions --------------------------------------------------------------------


def test_unknown_id_names_close_match():
    with pytest.raises(UnknownEnvError, match="Did you mean: CartPole-v1") as err:
        _make(id="CartPol-v1")
    assert isinstance(err.value, ValueError)
    assert "envpool.list_all_envs()" in str(err.value)


def test_unsupported_family_and_missing_id_are_rejected():
    with pytest.raises(UnknownEnvError, match="does not wrap"):
        _make(id="CoinrunEasy-v0")
    with pytest.raises(ValueError, match="env_config.id"):
        _make()


@pytest.mark.parametrize("path", ["host", "xla"])
def test_continuous_actions_are_clipped(path):
    # HalfCheetah's control cost is computed from the action as sent, so an unclipped action
    # changes the reward (envpool's Pendulum clips internally and could not tell).
    env_id = "HalfCheetah-v4"
    spec = _make(id=env_id).spec
    rng = np.random.default_rng(0)
    big = (10.0 * np.sign(rng.standard_normal((5, 2, *spec.action_shape)))).astype(np.float32)
    at_bounds = np.where(big > 0, spec.action_high, spec.action_low).astype(np.float32)
    run = RUNNERS[path]
    clipped_by_env = run(_make(id=env_id), big)
    clipped_by_hand = run(_make(id=env_id), at_bounds)
    inside = run(_make(id=env_id), 0.5 * at_bounds)
    np.testing.assert_array_equal(clipped_by_env.obs, clipped_by_hand.obs)
    np.testing.assert_array_equal(clipped_by_env.reward, clipped_by_hand.reward)
    assert not np.array_equal(inside.obs, clipped_by_hand.obs)  # the action does matter


def test_render_frames_only_where_asked():
    frame = _make(id="CartPole-v1", render=True).render()
    assert frame.shape == (400, 600, 3) and frame.dtype == np.uint8
    env = _make(id="Breakout-v5", render=True)
    env.reset()
    assert env.render().shape == (210, 160, 3)
    cheetah = _make(id="HalfCheetah-v4", render=True)  # through EGL (jaxwm.envs.mujoco_video)
    cheetah.reset()
    assert cheetah.render().shape == (240, 240, 3)
    # Training envs are built without envpool's renderer (it costs throughput).
    with pytest.raises(RuntimeError, match="render=True"):
        _make(id="Breakout-v5").render()


def test_pools_seeded_one_apart_share_all_but_one_env():
    """envpool seeds env i of a pool with seed + i: what ``report.runs.env_streams`` and the
    user guide's advice ("Several seeds in one process") to space separate runs' seeds rest on."""
    first = _make(num_envs=4, seed=1, id="Pendulum-v1").reset().obs
    second = _make(num_envs=4, seed=2, id="Pendulum-v1").reset().obs
    np.testing.assert_array_equal(first[1:], second[:-1])
    assert not np.array_equal(first[0], second[0])
    apart = _make(num_envs=4, seed=1001, id="Pendulum-v1").reset().obs
    assert not any(np.array_equal(a, b) for a in first for b in apart)


def test_merged_windows_weight_every_per_episode_mean_by_its_episodes():
    """Two windows of one compiled call: 1 episode with return 10 and an achievement, then 3
    with return 2 and none: the return, length and outcome means weight by episodes, counts
    add up, other metrics average; a window with no episode (NaN) does not count."""
    import jax.numpy as jnp

    from jaxwm.envs.stats import merge_episode_metrics

    metrics = {"charts/episodic_return": jnp.array([10.0, 2.0, jnp.nan]),
               "charts/episodic_length": jnp.array([4.0, 8.0, jnp.nan]),
               "charts/achievements/collect_wood": jnp.array([1.0, 0.0, jnp.nan]),
               "charts/episodes": jnp.array([1.0, 3.0, 0.0]),
               "losses/value_loss": jnp.array([1.0, 2.0, 3.0])}
    merged = merge_episode_metrics(metrics)
    assert float(merged["charts/episodic_return"]) == pytest.approx(4.0)
    assert float(merged["charts/episodic_length"]) == pytest.approx(7.0)
    assert float(merged["charts/achievements/collect_wood"]) == pytest.approx(0.25)
    assert float(merged["charts/episodes"]) == 4.0
    assert float(merged["losses/value_loss"]) == pytest.approx(2.0)
