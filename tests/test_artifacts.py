"""Phase artifacts (jaxwm/loop/artifacts.py): rows one phase writes to the run directory and
later phases stream, kept consistent with the checkpoints through stops, crashes and resumes;
imported data refused on resume when its source changed."""

import os

import contract
import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from jaxwm.algos import Entry
from jaxwm.config import ConfigError, base_config
from jaxwm.loop.algorithm import Algorithm, Hook
from jaxwm.loop.artifacts import Artifact, ArtifactFile, Artifacts, read_key
from jaxwm.loop.trainer import Trainer

EXAMPLE = {"x": np.zeros(3, np.float32), "t": np.zeros((), np.int32)}


def rows(start, n):
    t = np.arange(start, start + n, dtype=np.int32)
    return {"x": np.stack([t, t + 0.5, -t], -1).astype(np.float32), "t": t}


def test_a_file_appends_masked_rows_and_reads_rows_and_windows(tmp_path):
    f = ArtifactFile(str(tmp_path / "a.h5"), Artifact(EXAMPLE, batch=4))
    f.append(rows(0, 5))
    f.append({"rows": rows(5, 4), "mask": np.array([True, False, True, False])})
    assert f.rows == 7
    np.testing.assert_array_equal(f.whole()["t"], [0, 1, 2, 3, 4, 5, 7])
    batch = f.read(read_key(jax.random.PRNGKey(3), "a"))
    assert batch["x"].shape == (4, 3) and set(np.asarray(batch["t"]).tolist()) <= {0, 1, 2, 3, 4, 5, 7}
    np.testing.assert_array_equal(batch["x"][:, 0], batch["t"])  # rows stay whole
    again = f.read(read_key(jax.random.PRNGKey(3), "a"))
    np.testing.assert_array_equal(batch["t"], again["t"])  # the key decides the rows
    windows = ArtifactFile(str(tmp_path / "a.h5"), Artifact(EXAMPLE, batch=8, length=3))
    t = np.asarray(windows.read(read_key(jax.random.PRNGKey(4), "a"))["t"])
    assert t.shape == (8, 3)
    assert all(tuple(w) in {(0, 1, 2), (1, 2, 3), (2, 3, 4), (3, 4, 5), (4, 5, 7)} for w in t)
    f.truncate(2)
    assert f.rows == 2 and f.whole()["t"].tolist() == [0, 1]
    f.close()
    windows.close()


def test_ordered_reads_follow_the_rows_another_artifact_holds(tmp_path):
    """``after``: a pass that maps rows of one artifact to rows of another reads, each call,
    the rows after those already mapped (a resume truncates the target, so the pass goes on
    from its checkpoint); past the end the rows are zeros and masked out."""
    artifacts = Artifacts(str(tmp_path), {"frames": Artifact(EXAMPLE, batch=3, after="latents"),
                                          "latents": Artifact({"t": np.zeros((), np.int32)})})
    artifacts.start(None)
    artifacts.append("frames", rows(0, 7))
    key = jax.random.PRNGKey(0)
    seen = []
    for _ in range(3):
        read = artifacts.read("frames", key)
        seen.append((np.asarray(read["rows"]["t"]).tolist(), np.asarray(read["mask"]).tolist()))
        artifacts.append("latents", {"rows": {"t": read["rows"]["t"] * 10},
                                     "mask": read["mask"]})
    assert seen == [([0, 1, 2], [True] * 3), ([3, 4, 5], [True] * 3),
                    ([6, 0, 0], [True, False, False])]
    assert artifacts.files["latents"].whole()["t"].tolist() == [0, 10, 20, 30, 40, 50, 60]
    artifacts.files["latents"].truncate(3)  # a resume to a checkpoint taken after one read
    assert np.asarray(artifacts.read("frames", key)["rows"]["t"]).tolist() == [3, 4, 5]
    artifacts.close()


def test_a_file_of_another_layout_is_refused(tmp_path):
    ArtifactFile(str(tmp_path / "a.h5"), Artifact(EXAMPLE)).close()
    with pytest.raises(ConfigError, match="written by another config"):
        ArtifactFile(str(tmp_path / "a.h5"), Artifact({"x": np.zeros(4, np.float32),
                                                       "t": np.zeros((), np.int32)}))


# ----------------------------------------------------------------------------- in the loop


@struct.dataclass
class ToyState:
    w: jax.Array
    written: jax.Array


def toy_module(fail_at_call=None):
    """``gather`` writes 8 noisy rows per call to the ``rollouts`` artifact; ``learn`` reads
    4 streamed rows per call and moves ``w`` toward them. ``fail_at_call`` crashes once."""
    calls = {"n": 0}

    def build(config):
        def gather(state, data, key):
            x = jax.random.normal(key, (8, 3)) + state.w
            out = {"x": x, "t": state.written + jnp.arange(8, dtype=jnp.int32)}
            return state.replace(written=state.written + 8), {"rollouts": out}, {}

        def learn(state, data, key):
            calls["n"] += 1
            if calls["n"] == fail_at_call:
                raise RuntimeError("a crash")
            w = state.w + 0.1 * (jnp.mean(data["rollouts"]["x"], 0) - state.w)
            return state.replace(w=w), {}, {"losses/gap": jnp.sum(w)}

        return Algorithm(
            name="artifact-toy",
            init=lambda key: ToyState(jnp.zeros(3), jnp.zeros((), jnp.int32)),
            hooks={"gather": Hook(gather, counts={"rollout_rows": 8}, writes=("rollouts",)),
                   "learn": Hook(learn, counts={"agent_updates": 1}, reads=("rollouts",))},
            artifacts={"rollouts": Artifact(EXAMPLE, batch=4)})

    return Entry(name="artifact-toy", build=build, validate=lambda config: None,
                 hook_counts=lambda config: {}, tiny="")


def toy_config():
    c = base_config()
    c.algo = "artifact-toy"
    c.log.progress = False
    c.eval.every, c.eval.at_end = "never", False
    c.log.every = "2 agent_updates"
    c.log.x_axis = "agent_updates"
    c.checkpoint.every = "16 rollout_rows, 3 agent_updates"
    c.phase_order = ("gather", "learn")
    c.phases.gather = dict(unit="rollout_rows", duration=40, hooks=("gather",))
    c.phases.learn = dict(unit="agent_updates", duration=9, hooks=("learn",))
    return c


def rows_in(workdir):
    with h5py.File(os.path.join(workdir, "artifacts", "rollouts.h5"), "r") as f:
        return f["['t']"][...]


def test_a_run_writes_then_streams_its_artifact_and_resumes_exactly(tmp_path):
    contract.check_exact_resume(toy_module(), toy_config(), str(tmp_path / "run"))
    np.testing.assert_array_equal(rows_in(tmp_path / "run"), np.arange(40))


def test_rows_written_after_the_last_checkpoint_are_written_again_not_twice(tmp_path):
    straight = Trainer(toy_config(), toy_module().build(None), str(tmp_path / "a"))
    straight.run()
    crashing = Trainer(toy_config(), toy_module(fail_at_call=5).build(None), str(tmp_path / "b"))
    with pytest.raises(RuntimeError, match="a crash"):
        crashing.run()  # after the checkpoint at 3 updates; the file has all 40 rows
    config = toy_config()
    config.resume = True
    resumed = Trainer(config, toy_module().build(None), str(tmp_path / "b"))
    resumed.run()
    np.testing.assert_array_equal(rows_in(tmp_path / "b"), np.arange(40))
    np.testing.assert_array_equal(resumed.state.w, straight.state.w)


def test_a_resume_refuses_imported_data_whose_source_changed(tmp_path):
    source = {"rows": rows(0, 6)}
    declared = {"data": Artifact(EXAMPLE, source=lambda: source["rows"])}
    first = Artifacts(str(tmp_path), declared)
    first.start(None)
    saved = first.state_dict()
    first.close()
    assert saved == {"data": 6}
    again = Artifacts(str(tmp_path), declared)
    again.start(saved)  # unchanged: fine
    again.close()
    source["rows"] = rows(1, 6)
    changed = Artifacts(str(tmp_path), declared)
    with pytest.raises(ConfigError, match="has changed at its source"):
        changed.start(saved)
    changed.close()


def cut_short(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def test_a_damaged_imported_artifact_is_imported_again_and_checked(tmp_path, capsys):
    """An imported artifact's file cut short (a kill or a full disk): moved aside, never
    deleted, and imported again from its source, which must still be the data the
    checkpoint recorded."""
    source = {"rows": rows(0, 6)}
    declared = {"data": Artifact(EXAMPLE, source=lambda: source["rows"])}
    first = Artifacts(str(tmp_path), declared)
    first.start(None)
    saved, digests = first.state_dict(), first.digests()
    first.close()
    path = os.path.join(str(tmp_path), "artifacts", "data.h5")
    cut_short(path)
    again = Artifacts(str(tmp_path), declared)
    again.start(saved, digests)
    assert "cannot be read" in capsys.readouterr().out
    assert os.path.exists(path + ".unreadable") and again.files["data"].rows == 6
    again.close()
    cut_short(path)
    source["rows"] = rows(1, 6)  # and the source changed meanwhile: refused
    changed = Artifacts(str(tmp_path), declared)
    with pytest.raises(ConfigError, match="has changed at its source"):
        changed.start(saved, digests)
    changed.close()


def test_a_damaged_written_artifact_is_a_one_line_error(tmp_path):
    """World Models' frames, say: rows the run's phases wrote, which nothing can rebuild."""
    workdir = str(tmp_path / "run")
    Trainer(toy_config(), toy_module().build(None), workdir).run()
    path = os.path.join(workdir, "artifacts", "rollouts.h5")
    cut_short(path)
    before = sorted(os.listdir(os.path.dirname(path)))
    config = toy_config()
    config.resume = True
    with pytest.raises(ConfigError) as error:
        Trainer(config, toy_module().build(None), workdir)
    assert "cannot be read" in str(error.value) and "another --workdir" in str(error.value)
    assert "\n" not in str(error.value)
    assert sorted(os.listdir(os.path.dirname(path))) == before  # nothing moved
