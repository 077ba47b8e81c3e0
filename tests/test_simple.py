"""SimPLe / MBARC: the next-frame predictor's shapes and size, one update lowering its loss,
the reward strategies' weights on known histograms, the replay's values and frame stacks, the
learned simulator's scan against a Python loop, and the config's one-line errors. The whole
schedule runs end to end (and resumes exactly) in the contract suite (tests/test_contract.py)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxwm.agents import simple as simple_agent
from jaxwm.algos import simple
from jaxwm.config import ConfigError, load
from jaxwm.data import frames
from jaxwm.data.replay import SequenceReplay
from jaxwm.envs import acting
from jaxwm.models import nextframe, protocol
from jaxwm.ops import reward_balance


def make_net(size="tiny", **kwargs):
    return nextframe.NextFramePredictor(nextframe.SIZES[size], **kwargs)


def init(net, height, width, actions=3, key=0):
    stack = jnp.zeros((1, height, width, 12))
    return net.init({"params": jax.random.PRNGKey(key), "dropout": jax.random.PRNGKey(1),
                     "latent": jax.random.PRNGKey(2)}, stack, jnp.zeros((1, actions)),
                    jnp.zeros((1, height, width, 3)), 1.0, True)


def test_full_size_matches_mbarcs_parameter_count():
    """MBARC's model (Freeway, 3 actions) has 68,135,877 parameters plus 968,867 in its reward
    head, counted from its layer shapes. Ours differs only in the LSTM cell's biases (PyTorch
    keeps two) and flax's norm layout, so it agrees to 0.1%."""
    net = make_net("full")
    shapes = jax.eval_shape(lambda: init(net, 105, 80))
    leaves = jax.tree_util.tree_leaves_with_path(shapes)
    head = sum(math.prod(x.shape) for path, x in leaves if nextframe.is_reward_head(path))
    total = sum(math.prod(x.shape) for _, x in leaves)
    assert head == pytest.approx(968_867, rel=1e-3)
    assert total - head == pytest.approx(68_135_877, rel=1e-3)


@pytest.mark.parametrize("height,width,head", [(105, 80, "mbarc"), (52, 40, "simple")])
def test_outputs_have_the_frames_shape(height, width, head):
    net = make_net(reward_head=head)
    params = init(net, height, width)
    apply = nextframe.make_apply(net, 3)
    stack = jnp.zeros((2, height, width, 12), jnp.uint8)
    target = jnp.zeros((2, height, width, 3), jnp.uint8)
    logits, reward, value, lstm = jax.eval_shape(
        lambda: apply(params, stack, jnp.array([0, 2]), jax.random.PRNGKey(0), target, 0.5,
                      train=True))
    assert logits.shape == (2, height, width, 3, 256)
    assert reward.shape == (2, 3) and value.shape == (2,) and lstm.shape == ()
    logits, *_ = jax.eval_shape(lambda: apply(params, stack, jnp.array([0, 2]),
                                              jax.random.PRNGKey(0)))  # LSTM bits
    assert logits.shape == (2, height, width, 3, 256)


def test_dropout_only_in_training():
    net = make_net()
    params = init(net, 52, 40)
    apply = nextframe.make_apply(net, 3)
    stack = jax.random.randint(jax.random.PRNGKey(3), (2, 52, 40, 12), 0, 256).astype(jnp.uint8)
    target = stack[..., -3:]
    value = jax.jit(lambda key, train: apply(params, stack, jnp.array([1, 1]), key, target,
                                              train=train)[2], static_argnums=1)
    test_time = [value(jax.random.PRNGKey(k), False) for k in (4, 5)]
    np.testing.assert_allclose(test_time[0], test_time[1])  # value: no dropout, no latent
    trained = [value(jax.random.PRNGKey(k), True) for k in (4, 5)]
    assert not np.allclose(trained[0], trained[1])


def test_one_update_lowers_the_pixel_loss_on_a_fixed_batch():
    net = make_net(stochastic=False)
    params = init(net, 52, 40)
    apply = nextframe.make_apply(net, 3)
    key = jax.random.PRNGKey(6)
    stack = jax.random.randint(key, (4, 52, 40, 12), 0, 256).astype(jnp.uint8)
    target = stack[..., -3:]
    action = jnp.array([0, 1, 2, 1])
    optimizer = simple_agent.adafactor()
    opt_state = optimizer.init(params)

    @jax.jit
    def loss(params):
        logits, *_ = apply(params, stack, action, key, target, 0.0)
        return jnp.mean(nextframe.pixel_loss(logits, target))

    @jax.jit
    def update(params, opt_state):
        updates, opt_state = optimizer.update(jax.grad(loss)(params), opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    before = loss(params)
    for _ in range(3):
        params, opt_state = update(params, opt_state)
    assert loss(params) < before - 0.05


def test_minatar_frames_take_two_classes_per_cell_and_their_channels():
    """MinAtar's 10 x 10 frames of 4 object channels, cells 0 or 255: the minatar model's
    logits are 2 classes per cell and channel, its two compress steps and 4 / 2 inference
    convolutions fit 10 pixels; class 1 is 255, and back."""
    net = nextframe.NextFramePredictor(nextframe.SIZES["minatar"], channels=4, pixel_classes=2)
    stack = jnp.zeros((2, 10, 10, 4), jnp.uint8)
    params = jax.eval_shape(lambda: net.init(
        {"params": jax.random.PRNGKey(0), "dropout": jax.random.PRNGKey(0),
         "latent": jax.random.PRNGKey(0)}, stack.astype(jnp.float32), jnp.zeros((2, 3)),
        jnp.zeros((2, 10, 10, 4)), 1.0, True))
    logits, *_ = jax.eval_shape(lambda p: nextframe.make_apply(net, 3)(
        p, stack, jnp.array([0, 2]), jax.random.PRNGKey(0), stack, 0.5, train=True), params)
    assert logits.shape == (2, 10, 10, 4, 2)
    cells = jnp.array([0, 255, 255, 0], jnp.uint8)
    np.testing.assert_array_equal(nextframe.pixel_classes_of(cells, 2), [0, 1, 1, 0])
    np.testing.assert_array_equal(nextframe.pixel_values(jnp.array([[3.0, 1.0], [0.0, 2.0]])),
                                  [0, 255])
    # 256 classes are the values themselves; 3 are 0, 127 and 255 (each value to its nearest).
    values = jnp.array([0, 63, 64, 200, 255], jnp.uint8)
    np.testing.assert_array_equal(nextframe.pixel_classes_of(values, 256), values)
    np.testing.assert_array_equal(nextframe.pixel_classes_of(values, 3), [0, 0, 1, 2, 2])
    np.testing.assert_array_equal(nextframe.pixel_values(jax.nn.one_hot(jnp.arange(3), 3)),
                                  [0, 127, 255])
    # The loss reads the target's class: a cell of 255 with class 1 certain costs nothing.
    certain = jnp.array([-1e9, 0.0])[None, None, None, None]
    assert nextframe.pixel_loss(certain, jnp.full((1, 1, 1, 1), 255, jnp.uint8))[0] == \
        pytest.approx(0.0, abs=1e-6)


def test_reward_recall_by_hand_under_either_prefix():
    actual = jnp.array([[1, 2, 2, 1], [1, 1, 2, 0]])
    predicted = jnp.array([[1, 2, 1, 1], [2, 1, 2, 1]])
    valid = jnp.array([[True, True, True, True], [True, True, True, False]])
    out = simple_agent.reward_recall(predicted, actual, valid, "model/open_loop_reward_recall")
    assert float(out["model/open_loop_reward_recall_positive"]) == pytest.approx(2 / 3)
    assert float(out["model/open_loop_reward_recall_zero"]) == pytest.approx(3 / 4)
    assert np.isnan(out["model/open_loop_reward_recall_negative"])  # its one step is invalid
    assert set(simple_agent.reward_recall(predicted, actual, valid)) == {
        "model/reward_recall_negative", "model/reward_recall_zero",
        "model/reward_recall_positive"}


def test_object_channels_are_drawn_in_their_colours_the_highest_on_top():
    frame = jnp.zeros((1, 3, 4), jnp.uint8).at[0, 1, 0].set(255).at[0, 2, 0].set(255) \
        .at[0, 2, 3].set(255)
    rgb = frames.as_rgb(frame)
    np.testing.assert_array_equal(rgb[0, 0], [0, 0, 0])  # no channel on: black
    np.testing.assert_array_equal(rgb[0, 1], frames.PALETTE[0])
    np.testing.assert_array_equal(rgb[0, 2], frames.PALETTE[3])  # channels 0 and 3: 3's colour
    rgb_frame = jnp.arange(12, dtype=jnp.uint8).reshape(2, 2, 3)
    np.testing.assert_array_equal(frames.as_rgb(rgb_frame), rgb_frame)  # RGB as it is


def test_pixel_loss_is_clipped_cross_entropy():
    logits = jnp.log(jnp.array([[[[[0.5, 0.5] + [0.0] * 254]]]]) + 1e-30)  # [1,1,1,1,256]
    assert nextframe.pixel_loss(logits, jnp.zeros((1, 1, 1, 1), jnp.uint8))[0] == \
        pytest.approx(math.log(2) - 0.03, abs=1e-5)
    certain = jnp.where(jnp.arange(256) == 7, 0.0, -1e9)[None, None, None, None]
    assert nextframe.pixel_loss(certain, jnp.full((1, 1, 1, 1), 7, jnp.uint8))[0] == \
        pytest.approx(0.0, abs=1e-6)


def test_class_balanced_focal_loss_by_hand():
    """counts (1, 10, 1000): effective numbers 1 / (1 - b^n) (1 - b), normalised to sum to 3."""
    logits = jnp.log(jnp.array([[0.2, 0.3, 0.5], [0.1, 0.8, 0.1]]))
    counts = jnp.array([1.0, 10.0, 1000.0])
    b = 0.9999
    eff = np.array([(1 - b) / (1 - b ** n) for n in (1, 10, 1000)])
    w = 3 * eff / eff.sum()
    want = [w[2] * 0.5 ** 2 * -math.log(0.5), w[1] * 0.2 ** 2 * -math.log(0.8)]
    np.testing.assert_allclose(nextframe.class_balanced_focal(logits, jnp.array([2, 1]), counts),
                               want, rtol=1e-4)


def test_class_balanced_focal_loss_ignores_classes_the_game_never_produced():
    """Freeway has no negative rewards: counts (0, 10, 1000) weigh the two classes that occur
    exactly as a two-class problem would (normalised to sum to 2), finite everywhere."""
    logits = jnp.log(jnp.array([[0.2, 0.3, 0.5], [0.1, 0.8, 0.1]]))
    b = 0.9999
    eff = np.array([(1 - b) / (1 - b ** n) for n in (10, 1000)])
    w = 2 * eff / eff.sum()
    want = [w[1] * 0.5 ** 2 * -math.log(0.5), w[0] * 0.2 ** 2 * -math.log(0.8)]
    got = nextframe.class_balanced_focal(logits, jnp.array([2, 1]),
                                         jnp.array([0.0, 10.0, 1000.0]))
    np.testing.assert_allclose(got, want, rtol=1e-4)


def test_timing_signal_and_standardisation_by_hand():
    signal = nextframe.timing_signal(3, 2, 8)  # 2 timescales: 1 and 1e-4
    np.testing.assert_allclose(signal[2, 0, :4], [math.sin(2), math.sin(2e-4), math.cos(2),
                                                  math.cos(2e-4)], rtol=1e-5)
    np.testing.assert_allclose(signal[0, 1, 4:], [math.sin(1), math.sin(1e-4), math.cos(1),
                                                  math.cos(1e-4)], rtol=1e-5)
    x = jnp.arange(4.0).reshape(1, 2, 2, 1)
    std = math.sqrt(np.var([0, 1, 2, 3], ddof=1))
    np.testing.assert_allclose(nextframe.standardize(x)[0, :, :, 0].ravel(),
                               (np.arange(4) - 1.5) / std, rtol=1e-5)
    flat = jnp.ones((1, 2, 2, 1))  # std 0: divided by 1/sqrt(HW) instead
    np.testing.assert_allclose(nextframe.standardize(flat), 0.0)


def test_bits_round_trip_through_bytes():
    bits = jnp.where(jax.random.bernoulli(jax.random.PRNGKey(0), 0.5, (3, 16)), 1.0, -1.0)
    assert nextframe.to_bytes(bits, 8).max() < 256
    np.testing.assert_array_equal(nextframe.from_bytes(nextframe.to_bytes(bits, 8), 8), bits)
    np.testing.assert_array_equal(nextframe.to_bytes(jnp.array([[1.0, -1, -1, 1]]), 4), [[9]])


# ----------------------------------------------------------------------------- strategies


# classes: 0 = reward -1, 1 = zero, 2 = +1; 10 transitions, 1 negative, 2 positive.
HISTOGRAM = jnp.array([1, 1, 2, 1, 1, 0, 1, 1, 2, 1])


@pytest.mark.parametrize("strategy,class_weights", [
    ("class_balanced", [1 - 1 / 10, 1 - 7 / 10, 1 - 2 / 10]),
    ("square_root", [1 - 1 / (1 + math.sqrt(7) + math.sqrt(2)),
                     1 - math.sqrt(7) / (1 + math.sqrt(7) + math.sqrt(2)),
                     1 - math.sqrt(2) / (1 + math.sqrt(7) + math.sqrt(2))]),
])
def test_class_strategies_weights_by_hand(strategy, class_weights):
    valid = jnp.ones(10, bool)
    weights = reward_balance.transition_weights(strategy, HISTOGRAM, valid, valid)
    np.testing.assert_allclose(weights, np.asarray(class_weights)[HISTOGRAM] + 1e-4, rtol=1e-5)


def test_progressively_balanced_goes_from_uniform_to_balanced():
    valid = jnp.ones(10, bool)
    first = reward_balance.transition_weights("progressively_balanced", HISTOGRAM, valid, valid,
                                              stage=0, stages=50)
    np.testing.assert_allclose(first, 1 / 3 + 1e-4, rtol=1e-6)  # uniform over transitions
    last = reward_balance.transition_weights("progressively_balanced", HISTOGRAM, valid, valid,
                                             stage=50, stages=50)
    np.testing.assert_allclose(last, reward_balance.transition_weights(
        "class_balanced", HISTOGRAM, valid, valid), rtol=1e-6)


def test_class_balanced_gives_two_classes_equal_mass():
    classes = jnp.array([1] * 9 + [2])
    valid = jnp.ones(10, bool)
    w = np.asarray(reward_balance.transition_weights("class_balanced", classes, valid, valid))
    assert w[classes == 1].sum() == pytest.approx(w[classes == 2].sum(), rel=1e-3)


@pytest.mark.parametrize("strategy", reward_balance.STRATEGIES[1:])
@pytest.mark.parametrize("classes", [[1] * 8 + [2, 2], [1] * 8 + [0, 0]],
                         ids=["no_negative_rewards", "no_positive_rewards"])
def test_every_strategy_takes_a_game_without_one_reward_sign(strategy, classes):
    """Freeway never gives -1 and a losing game may never give +1: every strategy weighs the
    classes that occur (finite, positive weights) and favours the rare one over uniform."""
    classes, valid = jnp.array(classes), jnp.ones(10, bool)
    w = np.asarray(reward_balance.transition_weights(strategy, classes, valid, valid,
                                                     stage=25, stages=50))
    assert np.all(np.isfinite(w)) and np.all(w > 0)
    assert w[8:].sum() / w.sum() > 0.2  # uniform sampling would give the rare class 0.2


def test_mbarc_groups_check_both_neighbours_at_every_index_and_count_negative_rewards():
    """Episode 1 is transitions 0-4, episode 2 is 5-9 (4 -> 5 is no continuation). Rewards at
    2 (+1) and 5 (-1): 1 and 3 are next to the first; 6 is after the second; 4 is next to 5
    only across the episode boundary, so it is not."""
    classes = jnp.array([1, 1, 2, 1, 1, 0, 1, 1, 1, 1])
    valid = jnp.ones(10, bool)
    continues = jnp.array([True, True, True, True, False, True, True, True, True, False])
    groups = reward_balance.mbarc_groups(classes, valid, continues)
    np.testing.assert_array_equal(groups, [0, 1, 2, 1, 0, 2, 1, 0, 0, 0])
    weights = np.asarray(reward_balance.transition_weights("mbarc", classes, valid, continues))
    mass = [weights[np.asarray(groups) == g].sum() / weights.sum() for g in range(3)]
    np.testing.assert_allclose(mass, [0.35, 0.05, 0.6], atol=1e-3)
    # What the head is trained on: -1 is 1 of the 2 rewarded transitions (0.3 of the mass),
    # +1 the other 0.3, zero rewards 0.35 + 0.05.
    np.testing.assert_allclose(reward_balance.sampled_class_shares(weights, classes),
                               [0.3, 0.4, 0.3], atol=1e-3)
    assert reward_balance.mbarc_groups(classes, valid.at[1].set(False), continues)[1] == 0


# ----------------------------------------------------------------------------- replay


def replay_of(rewards, dones, firsts):
    """One env's steps: reward classes arriving with each row, done and is_first flags."""
    n = len(rewards)
    example = {"frame": jnp.zeros((3, 2, 2), jnp.uint8), "action": jnp.zeros((), jnp.int32),
               "reward": jnp.zeros((), jnp.int8), "is_first": jnp.zeros((), bool),
               "done": jnp.zeros((), bool), "value": jnp.zeros(()),
               "value_known": jnp.zeros((), bool)}
    replay = SequenceReplay.create(n + 2, example, 1)
    frames = jnp.arange(n, dtype=jnp.uint8)[:, None, None, None, None] * jnp.ones(
        (1, 1, 3, 2, 2), jnp.uint8)
    chunk = {"frame": frames, "action": jnp.zeros((n, 1), jnp.int32),
             "reward": jnp.asarray(rewards, jnp.int8)[:, None],
             "is_first": jnp.asarray(firsts, bool)[:, None], "done": jnp.asarray(dones, bool)[:, None],
             "value": jnp.zeros((n, 1)), "value_known": jnp.zeros((n, 1), bool)}
    return replay.add(chunk)


def test_real_reward_rates_count_executed_steps_only():
    """Rows 0-5, an episode ending at row 3 (its done row executed no action): transitions
    0, 1, 2 and 4 earn the classes of rows 1, 2, 3 and 5: +1, +1, 0, 0."""
    replay = replay_of([1, 2, 2, 1, 0, 1], dones=[0, 0, 0, 1, 0, 0], firsts=[1, 0, 0, 0, 1, 0])
    per_step, rewarded = simple_agent.real_reward_rates(replay)
    assert float(per_step) == pytest.approx(0.5) and float(rewarded) == pytest.approx(0.5)


def test_values_are_discounted_returns_filled_in_when_episodes_end():
    """Rows 0-3: an episode whose last row is 3 (rewards +1 arrive with rows 2 and 3); rows
    4-6: the next episode, unfinished. Row t's value is r_{t+1} + 0.9 V_{t+1}."""
    replay = simple_agent.fill_values(replay_of(
        rewards=[1, 1, 2, 2, 1, 0, 1], dones=[0, 0, 0, 1, 0, 0, 0], firsts=[1, 0, 0, 0, 1, 0, 0]),
        gamma=0.9)
    value, known = replay.data["value"][:7, 0], replay.data["value_known"][:7, 0]
    np.testing.assert_allclose(value[:4], [0.9 * (1 + 0.9), 1 + 0.9, 1.0, 0.0], rtol=1e-6)
    np.testing.assert_array_equal(known, [True] * 4 + [False] * 3)


def test_frame_stacks_repeat_an_episodes_first_frame():
    is_first = jnp.array([1, 0, 0, 0, 0, 1, 0], bool)[:, None]
    rows = frames.stack_rows(is_first, jnp.array([4]), 4)
    np.testing.assert_array_equal(rows, [[1, 2, 3, 4]])
    np.testing.assert_array_equal(frames.stack_rows(is_first, jnp.array([6]), 4), [[5, 5, 5, 6]])
    np.testing.assert_array_equal(frames.stack_rows(is_first, jnp.array([1]), 4), [[0, 0, 0, 1]])


def test_scheduled_sampling_fades_from_real_frames_to_predictions():
    assert simple_agent.scheduled_epsilon(0, 22_250) == pytest.approx(0.9999, abs=1e-6)
    assert simple_agent.scheduled_epsilon(22_250, 22_250) == pytest.approx(0.0, abs=1e-6)
    assert simple_agent.scheduled_epsilon(40_000, 22_250) == pytest.approx(0.0, abs=1e-6)
    assert 0.0 < simple_agent.scheduled_epsilon(11_000, 22_250) < 1.0


def test_median_noise_replaces_elements_by_the_median():
    pixels = jnp.arange(9, dtype=jnp.uint8).reshape(1, 3, 3)
    np.testing.assert_array_equal(frames.median_noise(jax.random.PRNGKey(0), pixels, 0.0),
                                  pixels)
    np.testing.assert_array_equal(frames.median_noise(jax.random.PRNGKey(0), pixels, 1.0), 4)


# ----------------------------------------------------------------------------- simulator


def test_the_simulator_scan_equals_stepping_it_in_a_python_loop():
    """The next-frame model as an env of the acting layer (``protocol.as_env`` of
    ``nextframe.FrameModel``): the scan's stacks and rewards are those of its steps one at a
    time, and each step appends the predicted frame to the stack."""
    net = make_net()
    params = init(net, 52, 40)
    model = nextframe.FrameModel(nextframe.make_apply(net, 3), 3, (12, 52, 40))
    n, steps = 3, 4
    stack = jax.random.randint(jax.random.PRNGKey(0), (n, 12, 52, 40), 0, 256).astype(jnp.uint8)
    key = jax.random.PRNGKey(1)
    policy = acting.stateless(lambda p, obs, k, t: jax.nn.one_hot(
        jax.random.randint(k, (obs.shape[0],), 0, 3), 3))
    env_state, first = protocol.env_start(model, params, stack, key)
    start = acting.ActorState.start(first, (), n)
    roll_key = jax.random.PRNGKey(2)
    _, ((final_stack, alive, _)), record, _ = jax.jit(lambda: acting.rollout(
        policy, protocol.as_env(model, params), None, start, env_state, roll_key, steps))()
    assert bool(jnp.all(alive))  # the simulator never ends an episode
    state, rewards = stack, []
    for t, k in enumerate(acting.step_keys(roll_key, steps)):
        action = policy.act(None, (), state, jnp.zeros(n, bool), k)[1]
        np.testing.assert_array_equal(action, record.action[t])
        key, k_step = jax.random.split(key)
        state, reward, cont = jax.jit(model.step)(params, state, action, k_step)
        np.testing.assert_array_equal(cont, 1.0)
        rewards.append(reward)
    np.testing.assert_array_equal(state, final_stack)
    np.testing.assert_array_equal(jnp.stack(rewards)[:-1], record.reward[1:])
    # The stack shifts by one frame per step: the oldest frame goes, the newest is appended.
    np.testing.assert_array_equal(final_stack[:, :12 - 3 * steps], stack[:, 3 * steps:])


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize("override,message", [
    ({"env.id": "CartPole-v1"}, "neither one of the 26 Atari 100k games"),
    ({"env.id": "VideoPinball-v5"}, "neither one of the 26 Atari 100k games"),
    ({"env.id": "gymnax:CartPole-v1"}, "nor a MinAtar game"),
    ({"env.id": "gymnax:Breakout-MinAtar"}, "MinAtar's frames are not stacked"),
    ({"strategy": "balanced"}, "simple.strategy='balanced' is unknown"),
    ({"simple.model_size": "huge"}, "simple.model_size='huge' does not exist"),
    ({"simple.reward_head": "conv"}, "simple.reward_head='conv'"),
    ({"simple.epochs": 3}, "phase_order"),
    ({"simple.model_steps": 5}, "multiples of rollout_length"),
])
def test_bad_settings_are_refused_before_anything_compiles(override, message):
    config = load("simple:tiny", override)
    with pytest.raises(ConfigError, match=message):
        simple.validate(config)


def test_strategy_and_stochastic_are_one_setting_at_either_path():
    config = load("simple:atari100k", {"strategy": "online", "stochastic": False})
    assert config.simple.strategy == "online" and config.simple.stochastic is False
    hooks = simple.phase_hooks(config)
    assert not any(h.startswith("update_reward") for h in hooks["epoch_00"])  # joint training
    config = load("simple:atari100k")
    hooks = simple.phase_hooks(config)
    assert hooks["random"] == ("collect",)
    assert hooks["epoch_00"] == ("collect:64", "report_model", "update_model:900",
                                 "update_reward:60", "update_agent:1000", "evaluate")
    assert hooks["epoch_01"][2] == "update_model:300"
    assert [hooks[f"epoch_{e:02d}"][4] for e in (6, 7, 11, 14)] == [
        "update_agent:1000", "update_agent:2000", "update_agent:2000", "update_agent:3000"]
    assert config.total_env_steps == 102_400
