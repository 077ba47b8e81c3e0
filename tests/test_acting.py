"""The acting layer (jaxwm/envs/acting.py): the one env-stepping scan against stepping by hand,
episode bookkeeping across envpool's reset rows, warm-up and grouped policies, transitions,
and the architecture doc's worked example (a learned model as the env, PPO's pieces acting)."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxwm.agents import ppo
from jaxwm.envs import acting, make_env
from jaxwm.envs.types import StepResult
from jaxwm.nets.actor_critic import ActorCritic

KEY = jax.random.PRNGKey(0)


def counter_env(num_envs, lengths):
    """A pure env: each env counts up; env i's episodes last ``lengths[i]`` steps (then the
    envpool reset row: count 0, reward 0, flags False); reward = the action."""
    lengths = jnp.asarray(lengths)

    def result(count, reward, terminated):
        zeros = jnp.zeros(num_envs, bool)
        return StepResult(obs=count[:, None].astype(jnp.float32), reward=reward,
                          terminated=terminated, truncated=zeros, episode_over=terminated,
                          raw_reward=reward)

    def step(count, action):
        reset = count < 0  # the row after an episode's last: ignores its action
        count = jnp.where(reset, 0, count + 1)
        terminated = ~reset & (count == lengths)
        reward = jnp.where(reset, 0.0, action.astype(jnp.float32))
        return jnp.where(terminated, -1, count), result(count, reward, terminated)

    zeros = jnp.zeros(num_envs, jnp.int32)
    return acting.sync(step, start=lambda: (zeros, result(zeros, jnp.zeros(num_envs),
                                                          jnp.zeros(num_envs, bool))),
                       spec=types.SimpleNamespace(num_envs=num_envs))


def constant(action):
    return acting.stateless(lambda params, obs, key, t: jnp.full(obs.shape[0], action))


def test_the_scan_records_rows_and_counts_episodes_without_the_reset_rows():
    env = counter_env(2, lengths=[3, 5])
    env_state, first = env.start()
    actor = acting.ActorState.start(first, (), 2)
    final, _, steps, completed = acting.rollout(constant(2), env, None, actor, env_state, KEY, 12)
    # Env 0: 0 1 2 3(final) 0(reset row) 1 2 3 0 1 2 3
    np.testing.assert_array_equal(steps.obs[:, 0, 0], [0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3])
    np.testing.assert_array_equal(steps.is_first[:, 0],
                                  [1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0])
    np.testing.assert_array_equal(steps.valid[:, 0], [1, 1, 1, 0] * 3)
    # Episodes are counted where they end, their reward summed without the reset rows.
    ends = np.flatnonzero(np.asarray(completed["mask"][:, 0]))
    np.testing.assert_array_equal(ends, [3, 7, 11])
    np.testing.assert_array_equal(completed["length"][ends, 0], [3, 3, 3])
    np.testing.assert_array_equal(completed["return"][ends, 0], [6, 6, 6])
    assert int(completed["mask"][:, 1].sum()) == 2  # env 1: steps 5 and 11


def test_an_actor_steps_any_env_step_and_continues_across_collects():
    actor = acting.Actor(counter_env(2, lengths=[3, 5]), constant(1), 4)
    state = actor.init(None)
    rows = []
    for k in jax.random.split(KEY, 3):
        state, (steps, _) = actor.collect(None, state, k)
        rows.append(np.asarray(steps.obs[:, 0, 0]))
    np.testing.assert_array_equal(np.concatenate(rows), [0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3])
    actor.close()


def test_transitions_take_reward_and_next_observation_from_the_next_row():
    env = counter_env(1, lengths=[2])
    env_state, first = env.start()
    actor = acting.ActorState.start(first, (), 1)
    final, _, steps, _ = acting.rollout(constant(1), env, None, actor, env_state, KEY, 5)
    batch, valid = acting.transitions(steps, final)
    # rows: 0 1 2(final) 0(reset) 1; the last step's successor is the pending row: 2.
    np.testing.assert_array_equal(batch["obs"][:, 0], [0, 1, 2, 0, 1])
    np.testing.assert_array_equal(batch["next_obs"][:, 0], [1, 2, 0, 1, 2])
    np.testing.assert_array_equal(batch["terminated"], [0, 1, 0, 0, 1])
    np.testing.assert_array_equal(valid, [1, 1, 0, 1, 1])
    np.testing.assert_array_equal(batch["reward"], [1, 1, 0, 1, 1])


def test_the_scan_on_envpool_equals_stepping_its_host_path_by_hand():
    """The same uniform policy and keys, through the acting scan (XLA path) and by hand on
    the host path of an identically seeded pool."""
    config = {"id": "CartPole-v1"}
    policy = acting.uniform(make_env(config, num_envs=3, seed=5).spec)
    actor = acting.Actor(make_env(config, num_envs=3, seed=5), policy, 40)
    state = actor.init(None)
    state, (steps, _) = actor.collect(None, state, KEY)
    host = make_env(config, num_envs=3, seed=5)
    res = host.reset()
    for t, k in enumerate(acting.step_keys(KEY, 40)):
        np.testing.assert_allclose(steps.obs[t], res.obs, rtol=1e-6)
        _, action, _ = policy.act(None, (), res.obs, None, k)
        np.testing.assert_array_equal(steps.action[t], action)
        res = host.step(np.asarray(action))
    np.testing.assert_allclose(state.pending.obs, res.obs, rtol=1e-6)
    actor.close()
    host.close()


def test_warmup_acts_at_random_until_told_and_leaves_the_carry_alone():
    spec = types.SimpleNamespace(discrete=False, action_low=np.full(2, -1.0, np.float32),
                                 action_high=np.full(2, 1.0, np.float32), action_shape=(2,))

    def act(params, carry, obs, is_first, key, temperature=1.0):
        return carry + 1, jnp.full((obs.shape[0], 2), 5.0), {}

    policy = acting.warmup(acting.Policy(lambda params, n: jnp.zeros(()), act), spec)
    obs = jnp.zeros((64, 3))
    carry, action, _ = policy.act((jnp.array(True), None), jnp.zeros(()), obs, None, KEY)
    assert float(carry) == 0.0 and float(jnp.abs(action).max()) <= 1.0
    assert float(jnp.std(action)) > 0.3  # uniform over [-1, 1]
    carry, action, _ = policy.act((jnp.array(False), None), jnp.zeros(()), obs, None, KEY)
    assert float(carry) == 1.0 and bool(jnp.all(action == 5.0))


def test_groups_split_and_merge_zero_size_leaves():
    """MJX's ``Data`` carries zero-size arrays (``[envs, 0]``), whose rows a ``-1`` cannot
    infer: seeds split and merge them as any other leaf."""
    tree = {"rows": jnp.arange(12.0).reshape(4, 3), "empty": jnp.zeros((4, 0))}
    split = acting.split_groups(tree, 2)
    assert split["rows"].shape == (2, 2, 3) and split["empty"].shape == (2, 2, 0)
    np.testing.assert_array_equal(split["rows"][1], tree["rows"][2:])
    merged = acting.merge_groups(split)
    assert merged["empty"].shape == (4, 0)
    np.testing.assert_array_equal(merged["rows"], tree["rows"])


def test_a_grouped_policy_acts_as_each_group_alone():
    def act(params, carry, obs, is_first, key, temperature=1.0):
        noise = jax.random.normal(key, (obs.shape[0],))
        return carry + params, obs[:, 0] * params + noise, {"seen": obs[:, 0]}

    policy = acting.Policy(lambda params, n: jnp.zeros(n), act)
    params, keys = jnp.array([2.0, 3.0]), jax.random.split(KEY, 2)
    obs = jnp.arange(6.0)[:, None]
    grouped = acting.grouped(policy, 2)
    carry = grouped.init_carry(params, 6)
    assert carry.shape == (2, 3)
    carry, action, extras = grouped.act(params, carry, obs, jnp.zeros(6, bool), keys)
    for g in range(2):
        _, alone, _ = policy.act(params[g], jnp.zeros(3), obs[3 * g:3 * g + 3], None, keys[g])
        np.testing.assert_allclose(action[3 * g:3 * g + 3], alone, rtol=1e-6)
    np.testing.assert_array_equal(extras["seen"], obs[:, 0])


def test_worked_example_a_learned_model_as_the_env_with_ppo_acting():
    """docs/architecture.md, "Worked example": a model of the env (here linear dynamics,
    reward -|s|, episodes end where |s| > 3) stepped as an ``EnvStep``, PPO's policy and
    ``make_finish`` as they are, one jitted scan."""
    n, horizon = 4, 50
    network = ActorCritic(discrete=True, action_dim=2, hidden=(8,))
    hyper = ppo.PPOHyper(num_steps=horizon, gamma=0.99, gae_lambda=0.95, num_minibatches=1,
                         update_epochs=1, clip_coef=0.2, clip_vloss=False, ent_coef=0.0,
                         vf_coef=0.5, norm_adv=True, normalize_obs=False,
                         normalize_reward=False, recurrent=False)
    spec = types.SimpleNamespace(obs_shape=(4,), obs_dtype=np.float32)
    learner = ppo.init_learner(network, optax.adam(1e-3), spec, KEY, n)
    weights = jnp.eye(4) * 1.1

    def model_step(frames, action):  # the "learned model": frames are its state
        frames = frames @ weights + (2.0 * action[:, None] - 1.0) * 0.5
        done = jnp.linalg.norm(frames, axis=-1) > 3.0
        reward = -jnp.linalg.norm(frames, axis=-1)
        restart = jnp.where(done[:, None], 0.0, frames)  # a new episode from the start state
        result = StepResult(obs=frames, reward=reward, terminated=done,
                            truncated=jnp.zeros(n, bool), episode_over=done, raw_reward=reward)
        return restart, result

    start_frames = jnp.zeros((n, 4))
    first = StepResult(obs=start_frames, reward=jnp.zeros(n), terminated=jnp.zeros(n, bool),
                       truncated=jnp.zeros(n, bool), episode_over=jnp.zeros(n, bool),
                       raw_reward=jnp.zeros(n))
    env = acting.sync(model_step, start=lambda: (start_frames, first))
    policy = ppo.policy(network, hyper)
    env_state, pending = env.start()
    start = acting.ActorState.start(pending, policy.init_carry(learner, n), n)

    @jax.jit
    def simulate(learner, start, env_state, key):
        final, _, steps, completed = acting.rollout(policy, env, learner, start, env_state,
                                                    key, horizon)
        return ppo.make_finish(network, hyper)(learner, start, steps, final, completed)

    carry, (_, rollout, metrics) = simulate(learner, start, env_state, KEY)
    assert rollout.obs.shape == (n, horizon, 4) and rollout.action.shape == (n, horizon)
    # Each transition's reward is the model's reward for the state it led to (the next row).
    np.testing.assert_allclose(rollout.reward[:, :-1],
                               -jnp.linalg.norm(rollout.obs[:, 1:], axis=-1), rtol=1e-5)
    assert bool(jnp.any(rollout.terminated)) and bool(jnp.any(~rollout.valid))
    assert float(metrics["charts/episodes"]) > 0  # episodes ended and restarted in the model
