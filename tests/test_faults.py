"""Fault injection: damage a run's checkpoints (or kill it, or fill its disk) and resume.

For PPO (CartPole) and MOPO (offline, Pendulum) on their tiny configs, each fault of
``FAULTS`` is applied to a copy of one finished run with three checkpoints; the copy is then
resumed with a longer schedule. Every fault must end in one of two ways:

* an exact resume from the newest readable checkpoint: the final state equals that of a copy
  of the undamaged run with only the newer checkpoints removed, resumed the same way;
  checkpoints that could not be read are in ``unreadable_checkpoints/``, not deleted;
* a one-line refusal, with every file left where it was.

In both, ``metrics.jsonl`` never holds a step twice. The user guide's fault matrix
(docs/user_guide.md) is this file's ``FAULTS`` table. Seeded: which bytes are flipped comes
from ``np.random.default_rng(0)``.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import textwrap

import contract
import numpy as np
import pytest

from jaxwm.loop.checkpoint import IncompatibleCheckpointError, saved_steps
from jaxwm.loop.metrics import read_jsonl
from jaxwm.loop.trainer import Trainer
from jaxwm.tools import make_dataset

NEWEST, OLDER, REFUSED = "newest", "next older", "refused"


def newest(workdir: str) -> str:
    return os.path.join(workdir, "checkpoints", str(saved_steps(workdir)[-1]))


def largest_data_file(workdir: str) -> str:
    files = glob.glob(os.path.join(newest(workdir), "algo", "**", "d", "*"), recursive=True)
    return max(files, key=lambda f: (os.path.getsize(f), f))


def truncate(size_of):
    def fault(workdir):
        path = largest_data_file(workdir)
        with open(path, "r+b") as f:
            f.truncate(size_of(os.path.getsize(path)))
    return fault


def flip_bytes(workdir):
    path = largest_data_file(workdir)
    data = bytearray(open(path, "rb").read())
    where = np.random.default_rng(0).choice(len(data), size=min(200, len(data)), replace=False)
    for i in where:
        data[i] ^= 0xFF
    open(path, "wb").write(bytes(data))


def delete_file(workdir):
    os.remove(largest_data_file(workdir))


def delete_metadata(workdir):
    os.remove(os.path.join(newest(workdir), "algo", "_METADATA"))


def drop_manifest(workdir):  # as a kill between orbax's finalisation and the manifest leaves it
    os.remove(os.path.join(newest(workdir), "jaxwm_manifest.json"))


def junk_files(workdir):
    for path in (os.path.join(newest(workdir), "notes.txt"),
                 os.path.join(workdir, "checkpoints", "README"),
                 os.path.join(newest(workdir), "algo", "junk.bin")):
        with open(path, "w") as f:
            f.write("not orbax's")


def junk_numbered_dirs(workdir):
    for step in (1, 999_999):  # older than every checkpoint, and newer
        os.makedirs(os.path.join(workdir, "checkpoints", str(step)))
        with open(os.path.join(workdir, "checkpoints", str(step), "junk.txt"), "w") as f:
            f.write("junk")


def damage_all(workdir):
    for step in saved_steps(workdir):
        os.remove(os.path.join(workdir, "checkpoints", str(step), "algo", "_METADATA"))


# fault -> (what it does to the run directory, how the resume must end)
FAULTS = {
    "one data file truncated to 0 bytes": (truncate(lambda n: 0), OLDER),
    "one data file truncated to 3 bytes": (truncate(lambda n: 3), OLDER),
    "one data file truncated to half": (truncate(lambda n: n // 2), OLDER),
    "3 kB cut off one data file": (truncate(lambda n: max(n - 3072, 1)), OLDER),
    "200 bytes flipped in one data file": (flip_bytes, OLDER),
    "one data file deleted": (delete_file, OLDER),
    "the tree metadata deleted": (delete_metadata, OLDER),
    "the manifest missing (killed before it was written)": (drop_manifest, NEWEST),
    "junk files added": (junk_files, NEWEST),
    "numbered junk directories added": (junk_numbered_dirs, NEWEST),
    "every checkpoint damaged": (damage_all, REFUSED),
}

ALGOS = {  # tiny configs with four checkpoints (three kept), and a longer schedule to resume to
    "ppo": ("ppo:tiny", {"total_env_steps": 512, "ppo.anneal_lr": False},
            {"total_env_steps": 640, "ppo.anneal_lr": False}),
    "mopo": ("mopo:tiny", {"phases.policy.duration": 48},
             {"phases.policy.duration": 64}),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Per algorithm: a finished run directory and the configs to make and resume it."""
    root = tmp_path_factory.mktemp("faults")
    dataset = make_dataset.make("Pendulum-v1", "random", str(root / "pendulum-tiny.hdf5"),
                                size=2_000, num_envs=2)
    made = {}

    def get(algo):
        if algo not in made:
            spec, first, longer = ALGOS[algo]
            extra = {"dataset": dataset} if algo == "mopo" else {}
            config = contract.load(spec, **extra, **first)
            workdir = str(root / algo)
            run(config, workdir)
            resume = contract.load(spec, **extra, **longer, resume=True)
            made[algo] = (workdir, config, resume, {})
        return made[algo]
    return get


def run(config, workdir: str) -> Trainer:
    entry = contract.entry_of_config(config)
    algorithm = contract.build(entry, config)
    try:
        trainer = Trainer(config, algorithm, workdir, resumable=entry.resumable)
        trainer.run()
    finally:
        algorithm.close()
    return trainer


def copy_run(source: str, target: str) -> str:
    shutil.copytree(source, target)
    return target


def reference(made, step: int, tmp_path) -> object:
    """The final state of the undamaged run resumed from ``step`` (newer checkpoints removed)."""
    workdir, _, resume, cache = made
    if step not in cache:
        clean = copy_run(workdir, str(tmp_path / f"reference-{step}"))
        for newer in [s for s in saved_steps(clean) if s > step]:
            shutil.rmtree(os.path.join(clean, "checkpoints", str(newer)))
        cache[step] = contract.persistent_of(run(resume, clean))
    return cache[step]


def listing(workdir: str) -> dict[str, int]:
    return {os.path.relpath(f, workdir): os.path.getsize(f)
            for f in glob.glob(os.path.join(workdir, "**"), recursive=True) if os.path.isfile(f)}


def assert_no_repeated_steps(workdir: str) -> None:
    """Every row's counters move on from the row before (MOPO logs several rows at 0 env and
    agent steps, one per model epoch, so the x-axis alone is not the row's position)."""
    rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    positions = [tuple(v for k, v in sorted(row.items()) if k.startswith("counters/"))
                 for row in rows]
    for before, after in zip(positions, positions[1:], strict=False):
        assert all(a >= b for a, b in zip(after, before, strict=True)) and after != before, \
            f"metrics.jsonl repeats or goes back: {before} then {after}"


def resume_and_check(made, workdir: str, expected: str, tmp_path) -> None:
    _, _, resume, _ = made
    steps = saved_steps(workdir)
    if expected == REFUSED:
        before = listing(workdir)
        with pytest.raises(IncompatibleCheckpointError) as error:
            run(resume, workdir)
        assert "\n" not in str(error.value) and "Nothing was moved" in str(error.value)
        assert listing(workdir) == before
        return
    trainer = run(resume, workdir)
    good = [s for s in steps if s < 999_999 and s != 1]
    want = good[-1] if expected == NEWEST else good[-2]
    assert trainer.resumed_from == want
    contract.assert_trees_equal(contract.persistent_of(trainer), reference(made, want, tmp_path),
                                "resumed after the fault != resumed from a clean copy")
    assert_no_repeated_steps(workdir)
    set_aside = set(os.listdir(os.path.join(workdir, "unreadable_checkpoints"))) \
        if os.path.isdir(os.path.join(workdir, "unreadable_checkpoints")) else set()
    damaged = {str(s) for s in steps if s > want or s in (1, 999_999)}
    assert set_aside == damaged, "an unreadable checkpoint was deleted or a good one moved"


@pytest.mark.parametrize("algo", sorted(ALGOS))
@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_damaged_run_resumes_exactly_or_refuses(algo, fault, runs, tmp_path):
    made = runs(algo)
    apply, expected = FAULTS[fault]
    workdir = copy_run(made[0], str(tmp_path / "run"))
    apply(workdir)
    resume_and_check(made, workdir, expected, tmp_path)


# A child process trains the run of ``made`` with ``Checkpointer.save`` wrapped: at the third
# save, ``before_third`` runs first and ``after_third`` after orbax has started writing.
CHILD = textwrap.dedent("""
    import os, resource, signal, sys
    sys.path.insert(0, {tests!r})
    import contract
    from jaxwm.loop import checkpoint
    from jaxwm.loop.trainer import Trainer

    save, saves = checkpoint.Checkpointer.save, []

    def wrapped(self, *args, **kwargs):
        saves.append(1)
        if len(saves) == 3:
            {before_third}
        save(self, *args, **kwargs)
        if len(saves) == 3:
            {after_third}

    checkpoint.Checkpointer.save = wrapped
    config = contract.load({spec!r}, **{overrides!r})
    algorithm = contract.build(contract.entry_of_config(config), config)
    try:
        Trainer(config, algorithm, {workdir!r}).run()
    except checkpoint.WriteError as e:
        print("REFUSED", e)
        sys.exit(1)
""")
DIE = "os.kill(os.getpid(), signal.SIGKILL)"
SEAL = "self._seal()"  # the second save finished and its manifest written
# From the third save on no file may grow past 64 bytes: a full disk, as an unprivileged
# process sees one (root ignores a read-only directory; a file-size limit binds everyone).
FILL_DISK = ("signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
             "resource.setrlimit(resource.RLIMIT_FSIZE, (64, resource.RLIM_INFINITY))")


def run_child(made, algo: str, tmp_path, before_third: str = "pass", after_third: str = "pass"):
    """The run of ``made`` in a child process with those statements at its third save;
    returns ``(completed process, workdir)``."""
    _, config, _, _ = made
    spec, first, _ = ALGOS[algo]
    overrides = {**first, **({"dataset": config.dataset} if algo == "mopo" else {})}
    workdir = str(tmp_path / "run")
    script = CHILD.format(tests=os.path.dirname(__file__), spec=spec, overrides=overrides,
                          workdir=workdir, before_third=before_third, after_third=after_third)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True), workdir


@pytest.mark.parametrize("algo", sorted(ALGOS))
@pytest.mark.parametrize("between", [False, True], ids=["during a save", "between saves"])
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_run_killed_with_sigkill_resumes_exactly(algo, between, runs, tmp_path):
    made = runs(algo)
    if between:
        killed, workdir = run_child(made, algo, tmp_path, before_third=f"{SEAL}; {DIE}")
    else:  # orbax is writing the third in the background
        killed, workdir = run_child(made, algo, tmp_path, after_third=DIE)
    assert killed.returncode == -9, killed.stderr[-2000:]
    resume_and_check(made, workdir, NEWEST, tmp_path)


@pytest.mark.parametrize("algo", sorted(ALGOS))
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_full_disk_stops_with_one_line_and_the_run_resumes(algo, runs, tmp_path):
    made = runs(algo)
    full, workdir = run_child(made, algo, tmp_path, before_third=f"{SEAL}; {FILL_DISK}")
    assert full.returncode == 1 and "REFUSED" in full.stdout, full.stderr[-2000:]
    message = full.stdout.split("REFUSED", 1)[1].strip()
    assert "\n" not in message and "were kept" in message and "resume=True" in message
    resume_and_check(made, workdir, NEWEST, tmp_path)


# ----------------------------------------------------------------------------- found by users


def test_resume_without_checkpoints_is_refused_and_keeps_the_logs(runs, tmp_path):
    workdir, _, resume, _ = runs("ppo")
    workdir = copy_run(workdir, str(tmp_path / "run"))
    shutil.rmtree(os.path.join(workdir, "checkpoints"))
    before = listing(workdir)
    with pytest.raises(IncompatibleCheckpointError, match="holds no checkpoint") as error:
        run(resume, workdir)
    assert "\n" not in str(error.value) and "leave out --config.resume" in str(error.value)
    fresh = resume.copy_and_resolve_references()
    fresh.resume = False  # nor may a new run mix its rows with the old ones
    with pytest.raises(IncompatibleCheckpointError, match="of an earlier run but no checkpoint"):
        run(fresh, workdir)
    assert listing(workdir) == before


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_the_nan_stop_names_its_checkpoint_and_its_advice_works(runs, tmp_path):
    spec, first, longer = ALGOS["ppo"]
    fresh = contract.load(spec, **first, **{"ppo.learning_rate": 1e30})
    with pytest.raises(FloatingPointError) as error:  # no checkpoint yet: says so
        run(fresh, str(tmp_path / "at-once"))
    message = str(error.value)
    assert "No checkpoint was saved" in message and "another --workdir" in message
    assert "--config.ppo.learning_rate=1e+29 (now 1e+30)" in message
    assert saved_steps(str(tmp_path / "at-once")) == []

    workdir = copy_run(runs("ppo")[0], str(tmp_path / "run"))
    exploding = contract.load(spec, **longer, **{"ppo.learning_rate": 1e30}, resume=True)
    with pytest.raises(FloatingPointError) as error:  # after a checkpoint: names it
        run(exploding, workdir)
    last = saved_steps(workdir)[-1]
    assert f"The last checkpoint, step {last} in" in str(error.value)
    assert "--config.resume=True" in str(error.value) and "\n" not in str(error.value)
    lowered = contract.load(spec, **longer, **{"ppo.learning_rate": 1e-4}, resume=True)
    trainer = run(lowered, workdir)  # the advice: a lower rate, resumed -- not refused
    assert trainer.resumed_from == last
    rates = [row["charts/learning_rate"] for row in read_jsonl(os.path.join(workdir,
             "metrics.jsonl")) if "charts/learning_rate" in row]
    assert rates[-1] == pytest.approx(1e-4)  # the new rate is the one in use
    history = read_jsonl(os.path.join(workdir, "config_history.jsonl"))
    assert [h["changed"]["ppo.learning_rate"]["now"] for h in history] == [1e30, 1e-4]
    assert_no_repeated_steps(workdir)


def test_files_it_may_not_open_stop_the_resume_with_nothing_moved(runs, tmp_path, monkeypatch):
    # As root every file is readable, so the permission check itself is made to say no.
    workdir = copy_run(runs("ppo")[0], str(tmp_path / "run"))
    before = listing(workdir)
    monkeypatch.setattr(os, "access", lambda path, mode: not path.endswith("_METADATA"))
    with pytest.raises(IncompatibleCheckpointError, match="permission denied.*fix the permissions"):
        run(runs("ppo")[2], workdir)
    assert listing(workdir) == before
