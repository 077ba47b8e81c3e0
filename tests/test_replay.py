"""Replay v2 (jaxwm/data/replay.py): one type per layout, one meaning of capacity."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwm.data.replay import SequenceReplay, TransitionReplay


def test_transitions_wrap_skip_masked_rows_and_sample_filled_slots():
    replay = TransitionReplay.create(4, {"x": jnp.zeros(())})
    assert not bool(replay.can_sample())
    replay = replay.add({"x": jnp.array([1.0, 2.0, 3.0])}, jnp.array([True, False, True]))
    assert int(replay.size) == 2 and int(replay.insert) == 2 and bool(replay.can_sample())
    np.testing.assert_array_equal(replay.data["x"], [1.0, 3.0, 0.0, 0.0])
    replay = replay.add({"x": jnp.array([4.0, 5.0, 6.0])})
    np.testing.assert_array_equal(replay.data["x"], [6.0, 3.0, 4.0, 5.0])
    assert int(replay.size) == 4 and int(replay.insert) == 1
    partial = TransitionReplay.create(8, {"x": jnp.zeros(())}).add({"x": jnp.array([7.0, 9.0])})
    drawn = partial.sample(jax.random.PRNGKey(0), 256)["x"]
    assert set(np.asarray(drawn).tolist()) == {7.0, 9.0}


def test_sequences_hold_capacity_transitions_over_all_envs_in_time_order():
    # 3 envs, capacity 30 transitions = 10 steps of each; step t of env e holds 100 e + t.
    replay = SequenceReplay.create(30, {"t": jnp.zeros((), jnp.int32)}, num_envs=3)
    assert replay.capacity == 30 and replay.steps == 10 and replay.num_envs == 3
    assert not bool(replay.can_sample(4))
    for step in range(12):  # wraps: steps 2..11 remain
        chunk = {"t": (100 * jnp.arange(3) + step)[None].astype(jnp.int32)}
        replay = replay.add(chunk)
    assert int(replay.size) == 10 and int(replay.transitions) == 30
    assert bool(replay.can_sample(10)) and not bool(replay.can_sample(11))
    windows = np.asarray(replay.sample(jax.random.key(19), 64, 4)["t"])
    assert windows.shape == (64, 4)
    env, start = windows // 100, windows % 100
    assert np.all(env == env[:, :1])  # one env per window
    assert np.all(np.diff(start, axis=1) == 1)  # consecutive steps, never across the wrap
    assert start.min() >= 2 and start.max() <= 11  # only the steps still held


def test_a_chunk_of_several_steps_is_added_in_order():
    replay = SequenceReplay.create(8, {"t": jnp.zeros((), jnp.int32)}, num_envs=2)
    replay = replay.add({"t": jnp.arange(6, dtype=jnp.int32).reshape(3, 2)})
    assert int(replay.size) == 3 and int(replay.insert) == 3
    np.testing.assert_array_equal(replay.data["t"][:3], [[0, 1], [2, 3], [4, 5]])


def test_the_two_layouts_cannot_be_mixed_up():
    transitions = TransitionReplay.create(4, {"x": jnp.zeros(())})
    sequences = SequenceReplay.create(8, {"x": jnp.zeros(())}, num_envs=2)
    with pytest.raises(TypeError):
        transitions.sample(jax.random.key(0), 2, 3)  # no sequence length for transitions
    with pytest.raises(TypeError):
        sequences.sample(jax.random.key(0), 2)  # sequences need their length
    with pytest.raises(ValueError, match="holds no step"):
        SequenceReplay.create(1, {"x": jnp.zeros(())}, num_envs=2)


def test_a_donated_add_writes_in_place():
    replay = TransitionReplay.create(100_000, {"obs": jnp.zeros(17)})
    pointer = replay.data["obs"].unsafe_buffer_pointer()
    add = jax.jit(lambda r, b: r.add(b), donate_argnums=0)
    replay = add(replay, {"obs": jnp.ones((8, 17))})
    assert replay.data["obs"].unsafe_buffer_pointer() == pointer


def test_rows_of_two_processes_join_as_one_process_stepping_every_env():
    """Process p steps envs (2p, 2p+1); value = 10 * step + global env index. One process
    stepping all four envs gives, time-major, 0 1 2 3 10 11 12 13 (and [T, 4] chunks)."""
    steps, envs = 2, 2
    by_process = np.stack([
        (10 * np.arange(steps)[:, None] + 2 * p + np.arange(envs)[None, :]) for p in range(2)])
    flat = by_process.reshape(2, steps * envs)  # TransitionReplay's time-major rows
    batch, mask = TransitionReplay.join_processes(({"x": flat}, flat > 0), steps)
    np.testing.assert_array_equal(batch["x"], [0, 1, 2, 3, 10, 11, 12, 13])
    np.testing.assert_array_equal(mask, batch["x"] > 0)
    (chunk,) = SequenceReplay.join_processes(({"x": by_process[..., None]},), steps)
    np.testing.assert_array_equal(chunk["x"][..., 0], [[0, 1, 2, 3], [10, 11, 12, 13]])
