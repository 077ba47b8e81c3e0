"""Offline datasets: D4RL and Minari loaders on small HDF5 files written here, their errors,
normalised scores, and the generator end to end on Pendulum."""

import contextlib
import glob
import json
import os
import re

import h5py
import numpy as np
import pytest

from jaxwm.data import datasets
from jaxwm.data.datasets import DatasetError, load_dataset
from jaxwm.tools import make_dataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def d4rl_file(path, n=6, next_obs=True, **replace):
    """Two episodes of 3 steps: the first terminates, the second times out; obs[i] = i."""
    obs = np.arange(n, dtype=np.float32)[:, None].repeat(2, 1)
    arrays = {"observations": obs, "actions": np.full((n, 1), 0.5, np.float32),
              "rewards": np.arange(n, dtype=np.float32),
              "terminals": np.array([0, 0, 1, 0, 0, 0], bool)[:n],
              "timeouts": np.array([0, 0, 0, 0, 0, 1], bool)[:n]}
    if next_obs:
        arrays["next_observations"] = obs + 100  # distinguishable from obs[i + 1]
    arrays.update(replace)
    with h5py.File(path, "w") as f:
        for key, value in arrays.items():
            if value is not None:
                f[key] = value
        f["metadata/env_id"] = "Hopper-v4"
    return str(path)


def test_d4rl_uses_next_observations_and_drops_timeouts(tmp_path):
    data = load_dataset(d4rl_file(tmp_path / "d.hdf5"))
    t = data.transitions
    assert len(data) == 5  # the timeout step is dropped (qlearning_dataset)
    np.testing.assert_array_equal(t["obs"][:, 0], [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(t["next_obs"][:, 0], [100, 101, 102, 103, 104])
    np.testing.assert_array_equal(t["terminated"], [0, 0, 1, 0, 0])
    assert data.format == "d4rl" and data.metadata["env_id"] == "Hopper-v4"
    assert data.reference_returns == datasets.D4RL_REFERENCE["hopper"]


def test_d4rl_without_next_observations_reads_the_following_row(tmp_path):
    data = load_dataset(d4rl_file(tmp_path / "d.hdf5", next_obs=False))
    np.testing.assert_array_equal(data.transitions["obs"][:, 0], [0, 1, 2, 3, 4])
    # Row 2 terminates: its next state is never used (no bootstrap) whatever it holds.
    np.testing.assert_array_equal(data.transitions["next_obs"][:, 0], [1, 2, 3, 4, 5])


def minari_dir(root):
    path = root / "mujoco" / "pendulum" / "expert-v0" / "data"
    path.mkdir(parents=True)
    with h5py.File(path / "main_data.hdf5", "w") as f:
        f.attrs["env_spec"] = json.dumps({"id": "Pendulum-v1"})
        for i, (t, terminated) in enumerate([(3, True), (2, False)]):
            ep = f.create_group(f"episode_{i}")
            ep["observations"] = np.arange(t + 1, dtype=np.float32)[:, None] + 10 * i
            ep["actions"] = np.zeros((t, 1), np.float32)
            ep["rewards"] = np.ones(t, np.float32)
            ep["terminations"] = np.eye(t, dtype=bool)[-1] & terminated
            ep["truncations"] = np.eye(t, dtype=bool)[-1] & (not terminated)
    return root / "mujoco" / "pendulum" / "expert-v0"


def test_minari_episodes_become_transitions(tmp_path):
    directory = minari_dir(tmp_path)
    for path in (directory, directory / "data" / "main_data.hdf5"):
        data = load_dataset(str(path))
        t = data.transitions
        assert data.format == "minari" and len(data) == 5  # truncated last steps are kept
        np.testing.assert_array_equal(t["obs"][:, 0], [0, 1, 2, 10, 11])
        np.testing.assert_array_equal(t["next_obs"][:, 0], [1, 2, 3, 11, 12])
        np.testing.assert_array_equal(t["terminated"], [0, 0, 1, 0, 0])
        assert data.metadata["env_id"] == "Pendulum-v1"


@pytest.mark.parametrize("replace, message", [
    ({"rewards": None}, r"lacks \['rewards'\]"),
    ({"actions": np.zeros((5, 1), np.float32)}, "different lengths"),
    ({"rewards": np.array([0, 1, np.nan, 3, 4, 5], np.float32)}, "1 non-finite values in reward"),
    ({"observations": np.zeros((6, 2, 2), np.float32),
      "next_observations": np.zeros((6, 2, 2), np.float32)}, r"\[N, dim\] vectors"),
])
def test_malformed_d4rl_files_are_refused_naming_the_problem(tmp_path, replace, message):
    with pytest.raises(DatasetError, match=message):
        load_dataset(d4rl_file(tmp_path / "bad.hdf5", **replace))


def test_a_non_finite_value_is_reported_at_the_files_own_row(tmp_path):
    """Rows after a dropped timeout keep their numbers: a NaN in the file's row 8 is reported
    as row 8, not as the 7th transition kept; a Minari one as its episode's step."""
    n = 10
    timeouts = np.zeros(n, bool)
    timeouts[2] = True  # dropped, so transitions after it are one row behind the file's
    rewards = np.zeros(n, np.float32)
    rewards[8] = np.nan
    path = d4rl_file(tmp_path / "nan.hdf5", n=n, rewards=rewards, timeouts=timeouts,
                     terminals=np.zeros(n, bool))
    with pytest.raises(DatasetError, match=r"1 non-finite values in reward \(at row 8\)"):
        load_dataset(path)
    directory = minari_dir(tmp_path / "minari")
    with h5py.File(directory / "data" / "main_data.hdf5", "r+") as f:
        f["episode_1/rewards"][1] = np.inf
    with pytest.raises(DatasetError, match=r"\(at episode_1 step 1\)"):
        load_dataset(str(directory))


def test_missing_file_says_where_it_looked(tmp_path):
    with pytest.raises(DatasetError, match=f"No dataset at {tmp_path}/nothing.hdf5.*make_dataset"):
        load_dataset(str(tmp_path / "nothing.hdf5"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="directory without data/main_data.hdf5"):
        load_dataset(str(tmp_path / "empty"))


@pytest.mark.parametrize("content, what", [(b"", "empty"), (b"not hdf5", "8 bytes")])
def test_a_file_that_is_not_hdf5_is_a_one_line_error(tmp_path, content, what):
    path = tmp_path / "data.hdf5"
    path.write_bytes(content)
    with pytest.raises(DatasetError, match=f"is not an HDF5 file \\({what};.*make_dataset"):
        load_dataset(str(path))


@pytest.mark.parametrize("args, message", [
    (["--env=CartPole-v1", "--level=random"], "CartPole-v1 has discrete actions"),
    (["--env=Pendulum-v1", "--level=random", "--size=0"], "--size \\(0\\)"),
    (["--env=Pendulum-v1", "--level=nope"], "invalid choice"),
])
def test_make_dataset_checks_its_input_before_stepping_any_env(tmp_path, capsys, args, message):
    out = tmp_path / "d.hdf5"
    with pytest.raises(SystemExit) if "nope" in args[1] else contextlib.nullcontext():
        assert make_dataset.main([*args, f"--out={out}"]) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not out.exists()


def test_make_dataset_refuses_an_output_it_cannot_write(tmp_path, capsys):
    # A folder that cannot exist (its parent is a file): unwritable even for root.
    (tmp_path / "file").write_text("")
    assert make_dataset.main(["--env=Pendulum-v1", "--level=random",
                              f"--out={tmp_path / 'file' / 'd.hdf5'}"]) == 2
    assert "cannot be written" in capsys.readouterr().err
    assert make_dataset.main(["--env=Pendulum-v1", "--level=random", f"--out={tmp_path}"]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert make_dataset.main(["--env=Pendulum-v1", "--level=random", f"--out={tmp_path}",
                              "--overwrite"]) == 2  # refused first, not at the final rename
    assert "is a directory" in capsys.readouterr().err
    assert not glob.glob(str(tmp_path / "*.partial")) and not glob.glob(f"{tmp_path}.partial")


def test_env_shape_mismatch_is_refused(tmp_path):
    data = load_dataset(d4rl_file(tmp_path / "d.hdf5"))
    data.check_matches((2,), (1,))
    with pytest.raises(DatasetError, match=r"observations \(2,\).*env Hopper-v4 has \(11,\)"):
        data.check_matches((11,), (3,), "Hopper-v4")


def test_normalized_score_uses_d4rl_references():
    ref = datasets.reference_returns("hopper-medium-v2")
    np.testing.assert_allclose(datasets.normalized_score([-20.272305, 3234.3], ref), [0, 100])
    assert datasets.reference_returns("Pendulum-v1") is None
    assert np.isnan(datasets.normalized_score(1.0, None))


def test_finish_rows_marks_timeouts_where_the_next_state_jumps():
    obs = np.array([[0.0], [1.0], [5.0], [6.0], [9.0]])
    rows = make_dataset.finish_rows({
        "observations": obs, "next_observations": np.array([[1.0], [2.0], [6.0], [7.0], [10.0]]),
        "terminals": np.array([0, 0, 0, 1, 0]), "rewards": np.zeros(5),
        "actions": np.zeros((5, 1))})
    # Row 1's next state (2) is not row 2's state (5): a cut episode. Row 3 terminated; the
    # last row is cut by the end of the data.
    np.testing.assert_array_equal(rows["timeouts"], [0, 1, 0, 0, 1])


def test_write_refuses_to_overwrite(tmp_path):
    path = d4rl_file(tmp_path / "d.hdf5")
    arrays = {k: np.zeros((2, 1)) for k in ("observations", "actions", "next_observations")}
    arrays.update(rewards=np.zeros(2), terminals=np.zeros(2, bool), timeouts=np.ones(2, bool))
    with pytest.raises(DatasetError, match="exists"):
        datasets.write_d4rl(path, arrays, {})
    assert load_dataset(path).metadata["env_id"] == "Hopper-v4"  # untouched


def test_a_run_makes_the_dataset_its_config_says_how_to_make(tmp_path):
    from jaxwm.config import load
    out = tmp_path / "made.hdf5"
    config = load("mopo:tiny", {"dataset": str(out)})
    make_dataset.make_missing_inputs(config)  # level random, 2,000 transitions
    data = load_dataset(str(out))
    assert data.metadata["level"] == "random" and data.metadata["size"] == 2000
    made = out.stat().st_mtime_ns
    make_dataset.make_missing_inputs(config)  # there now: left alone
    assert out.stat().st_mtime_ns == made


@pytest.mark.slow  # ~1 min: SAC trains the medium level
def test_make_dataset_random_and_medium_replay_on_pendulum(tmp_path, capsys):
    out = tmp_path / "pendulum-random.hdf5"
    assert make_dataset.main(["--env=Pendulum-v1", "--level=random", f"--out={out}",
                              "--size=2000", "--num_envs=4"]) == 0
    data = load_dataset(str(out))
    assert data.metadata["level"] == "random" and data.metadata["size"] == 2000
    assert 1900 <= len(data) < 2000  # timeouts (episode cuts) dropped
    assert data.transitions["action"].min() >= -2 and data.transitions["action"].max() <= 2
    # Each env's steps are contiguous: outside episode ends, row i+1 follows row i.
    with h5py.File(out) as f:
        ends = np.asarray(f["terminals"]) | np.asarray(f["timeouts"])
        follows = np.all(np.asarray(f["next_observations"])[:-1] ==
                         np.asarray(f["observations"])[1:], axis=1)
    assert np.all(follows[~ends[:-1]])
    assert make_dataset.main(["--env=Pendulum-v1", "--level=random", f"--out={out}"]) == 2

    out = tmp_path / "pendulum-mr.hdf5"
    args = ["--env=Pendulum-v1", "--level=medium-replay", f"--out={out}", "--size=1000"]
    # 400 steps of SAC do not beat the random policy: refused, saying what to do.
    assert make_dataset.main(args + ["--train_steps=400", "--snapshot_every=200"]) == 2
    assert "raise --train_steps" in capsys.readouterr().err
    # Resumed to 3000 steps (the same run), it does.
    assert make_dataset.main(args + ["--train_steps=3000", "--snapshot_every=200"]) == 0
    data = load_dataset(str(out))
    generation = data.metadata["generation"]
    assert generation["medium_step"] % 200 == 0 and generation["medium_step"] <= 3000
    assert generation["medium_eval_return"] >= generation["medium_threshold"]
    # The replay at the medium snapshot: every env step taken by then, less envpool's reset
    # transitions (one per 200-step episode; 1 env).
    steps = generation["medium_step"]
    assert steps - steps // 200 - 1 <= data.metadata["size"] <= steps
    assert data.metadata["ref_max_score"] == generation["expert_eval_return"]
    assert os.path.isdir(tmp_path / "sac-Pendulum-v1-seed0" / "checkpoints")


def test_a_failed_write_leaves_no_file(tmp_path):
    path = tmp_path / "new.hdf5"
    with pytest.raises(KeyError):
        datasets.write_d4rl(str(path), {"observations": np.zeros((2, 1))}, {})
    assert list(tmp_path.iterdir()) == []
