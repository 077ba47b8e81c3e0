"""The one training loop: phases -> hooks, plus everything algorithms must not do.

The trainer walks the phases one hook call at a time. For each call it splits its key,
hands the hook ``(state, data, key)`` -- ``data`` holding what the hook reads: outputs of an
earlier hook of the same cycle, or the algorithm's read-only data -- and keeps the returned
state, outputs and metrics. Outputs live until the last hook of the cycle that reads them has
run; they are never checkpointed. After every call it checks its clocks (``log.every``,
``eval.every``, ``checkpoint.every``, each in any counter) and SIGINT/SIGTERM, so a cycle as
long as a SimPLe epoch never delays a log line, a checkpoint or a stop. They wait only
while passed data is pending (between PPO's collect and its update, say), because a
checkpoint taken then could not resume; a log row then holds the whole iteration.

It owns, and nothing below it does: the progress bar, TensorBoard and ``metrics.jsonl``
(x-axis ``log.x_axis``, default env steps), orbax checkpoints (periodic, final, on a
signal), resumption (to the exact position inside a cycle), the evaluation schedule, early
phase ends, per-hook timing, the learning-curve PNG (and the normalised-score PNG where the policy has
reference returns) and ``eval.csv`` (every evaluation's counters and results).

Metrics stay on the device until a log step, then are fetched in one transfer. Non-finite
losses stop the run at that log step (or before a checkpoint) with the last good checkpoint
untouched.

What is checkpointed: the algorithm's ``persistent`` part of the state, and as JSON the
loop's key and the scheduler (counters, per-phase progress, position in the cycle), at step
= hook calls so far. A resume builds a fresh state (its envs just reset; envpool cannot save
its C++ state), lets the algorithm's ``on_restore`` put the saved part into it, and continues
with the same parameters, optimiser state, RNG key, counters and next hook. Rows logged after
that checkpoint (before a crash) are dropped from ``metrics.jsonl`` and TensorBoard.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from jaxwm import parallel
from jaxwm.config import is_learning_rate
from jaxwm.loop import seeds
from jaxwm.loop.algorithm import EVALUATE, Algorithm, Hook
from jaxwm.loop.artifacts import Artifacts
from jaxwm.loop.checkpoint import (
    WRITE_ERRNOS,
    Checkpointer,
    IncompatibleCheckpointError,
    config_to_json_dict,
    flatten,
    prepare_workdir,
    write_failed,
)
from jaxwm.loop.metrics import (
    MEDIA,
    SCORE_SERIES,
    MetricWindow,
    MetricWriter,
    PerSeed,
    plot_learning_curve,
    write_eval_csv,
)
from jaxwm.loop.phases import Clock, Scheduler, check_phases, phases_from_config

EVAL_STREAM = 0x6576616C  # "eval": folded into the current key for the evaluator's key


class _StopRequested:
    """Turns SIGINT/SIGTERM into a flag checked after every hook call (then save and exit)."""

    def __init__(self):
        self.signal = None
        self._previous = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                pass
        return self

    def _handle(self, signum, frame):
        del frame
        self.signal = signal.Signals(signum).name

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class HookTimer:
    """Where the time goes, per hook, without a host sync per call.

    In each log window the first call of every hook is timed between two waits (the queued
    work drained before it, its results ready after it); later calls are only counted.
    ``time/<hook>`` is the mean timed seconds per call and ``time/<hook>_fraction`` the share
    of the window's wall time spent in that hook, estimated as seconds per call x calls (and
    scaled down together if the estimates add up to more than the window: one timed call is a
    sample, not a census). A hook's first call ever (trace, compile and run) is reported
    apart, as ``time/first_call/<hook>``.
    """

    def __init__(self):
        self._seen: set[str] = set()
        self._first: dict[str, float] = {}
        self._timed = Counter()
        self._seconds = Counter()
        self._calls = Counter()

    def wants(self, name: str) -> bool:
        return name not in self._seen or self._timed[name] == 0

    def record(self, name: str, seconds: float, first_apart: bool = True) -> None:
        """``first_apart=False`` for work timed on every call (evaluation), whose first call
        is a sample like the others."""
        if first_apart and name not in self._seen:
            self._seen.add(name)
            self._first[name] = seconds
        else:
            self._timed[name] += 1
            self._seconds[name] += seconds

    def count(self, name: str) -> None:
        self._calls[name] += 1

    def flush(self, wall_seconds: float) -> dict[str, float]:
        metrics = {f"time/first_call/{name}": s for name, s in self._first.items()}
        per_call = {name: self._seconds[name] / timed for name, timed in self._timed.items()
                    if timed}
        estimated = {name: seconds * self._calls[name] for name, seconds in per_call.items()}
        denominator = max(wall_seconds, sum(estimated.values()))
        for name, seconds in per_call.items():
            metrics[f"time/{name}"] = seconds
            metrics[f"time/{name}_fraction"] = estimated[name] / denominator
        self._first.clear()
        self._timed.clear()
        self._seconds.clear()
        self._calls.clear()
        return metrics


def hook_inputs(algorithm: Algorithm, hook: Hook, flow: dict, artifacts: Artifacts, key):
    """What a hook reads: outputs of earlier hooks of the cycle (``flow``), read-only data, or
    phase artifacts (read with the call's ``key``)."""
    def one(name):
        if name in flow:
            return flow[name]
        if name in algorithm.data:
            return algorithm.data[name]
        return artifacts.read(name, key)

    return {name: one(name) for name in hook.reads}


def route_outputs(algorithm: Algorithm, name: str, outputs: dict, flow: dict,
                  artifacts: Artifacts) -> None:
    """A hook's outputs: rows for phase artifacts are appended to their files, the rest is
    passed on to later hooks of the cycle (``flow``)."""
    hook = algorithm.hooks[name]
    if set(outputs) != set(hook.writes):
        raise RuntimeError(f"{algorithm.name} hook {name!r} returned outputs "
                           f"{sorted(outputs)} but declares writes {list(hook.writes)}.")
    for out, value in outputs.items():
        if out in artifacts:
            artifacts.append(out, value)
        else:
            flow[out] = value


class Clocks:
    """When to log, evaluate and checkpoint (``log.every``, ``eval.every``,
    ``checkpoint.every``): a clock is due once each time one of its counters crosses a
    multiple of its interval, checked after every hook call."""

    def __init__(self, clocks: dict[str, Clock], totals):
        self.clocks = clocks
        self.marks = {name: clock.marks(totals) for name, clock in clocks.items()}

    def due(self, name: str, totals) -> bool:
        """Whether ``name`` has fired since it was last asked (never, if there is none)."""
        if name not in self.clocks:
            return False
        now = self.clocks[name].marks(totals)
        fired, self.marks[name] = now != self.marks[name], now
        return fired


class RunLog:
    """A run's logging side: the window of metrics since the last log row, per-hook timing,
    the rates (evaluation time excluded), the writer (TensorBoard, ``metrics.jsonl``) and the
    progress bar. ``write`` makes one row; the metrics stay on the device until then."""

    def __init__(self, writer: MetricWriter, bar, scheduler: Scheduler, algorithm: Algorithm,
                 x_axis: str, wall_seconds, postfix):
        self.writer, self.bar, self.scheduler, self.algorithm = writer, bar, scheduler, algorithm
        self.x_axis, self.wall_seconds, self.postfix = x_axis, wall_seconds, postfix
        self.window, self.timer = MetricWindow(), HookTimer()
        self.last = {}  # the newest value of every scalar logged
        self.eval_seconds = 0.0  # in this window, excluded from the rates
        self.window_start = (time.perf_counter(), dict(scheduler.totals), scheduler.calls)

    def add(self, metrics) -> None:
        self.window.add(metrics)

    def pending(self) -> bool:
        """Whether hooks ran since the last row."""
        return self.scheduler.calls > self.window_start[2]

    def write(self) -> dict:
        """One row: the window's means, every counter's rate, where the time went, the
        phase, wall time and progress. Reading the metrics waits for the hooks that made them
        (JAX dispatches asynchronously, and rates must count finished work)."""
        sched = self.scheduler
        metrics = self.window.flush()
        now = time.perf_counter()
        start, start_totals, _ = self.window_start
        busy = max(now - start - self.eval_seconds, 1e-9)
        for unit in self.algorithm.counters:  # those that moved: no rate is not a rate of 0
            if sched.totals[unit] > start_totals[unit]:
                name = "charts/SPS" if unit == "env_steps" else f"charts/{unit}_per_s"
                metrics[name] = (sched.totals[unit] - start_totals[unit]) / busy
        metrics.update(self.timer.flush(max(now - start, 1e-9)))
        metrics["charts/phase"] = float(sched.phase_index)
        # For jaxwm.report: curves against wall time, and which runs are still unfinished.
        metrics["charts/wall_seconds"] = self.wall_seconds()
        metrics["charts/progress"] = sched.totals[self.x_axis] / max(
            sched.planned_total(self.x_axis), 1)
        metrics.update({f"counters/{unit}": float(v) for unit, v in sched.totals.items()})
        self.writer.write(sched.totals[self.x_axis], metrics)
        self.window_start, self.eval_seconds = (now, dict(sched.totals), sched.calls), 0.0
        self.last = {**self.last, **{k: v for k, v in metrics.items()
                                     if not isinstance(v, MEDIA)}}
        self.bar.set_postfix(self.postfix(self.last, metrics), refresh=False)
        return metrics

    def close(self) -> None:
        self.bar.close()
        self.writer.close()


def call_hook(algorithm: Algorithm, name: str, state, data, key, timer: HookTimer):
    """One hook call; timed (between two waits) when ``timer`` wants a sample of it."""
    hook = algorithm.hooks[name]
    if timer.wants(name):
        jax.block_until_ready((state, data))
        start = time.perf_counter()
        out = hook.fn(state, data, key)
        jax.block_until_ready(out)
        timer.record(name, time.perf_counter() - start)
    else:
        out = hook.fn(state, data, key)
    timer.count(name)
    return out


def nan_advice(bad: list[str], sched: Scheduler, config, checkpointer: Checkpointer,
               learning_rates: tuple[str, ...]) -> str:
    """The NaN stop's message: what went wrong, which checkpoint is left to resume from (or
    that none is), and this config's ``learning_rates`` (those that may change on resume)."""
    flat = flatten(config_to_json_dict(config))
    rates = [f"--config.{k}={flat[k] / 10:g} (now {flat[k]:g})"
             for k in learning_rates if isinstance(flat.get(k), (int, float))]
    lower = "lower the learning rate" + (f", e.g. {' '.join(rates)}," if rates else "")
    latest = checkpointer.latest_step()
    if latest is None:
        then = (f"No checkpoint was saved before it (checkpoint.every = "
                f"{config.checkpoint.every!r}), so there is nothing to resume: {lower} and start "
                "again in another --workdir.")
    else:
        then = (f"The last checkpoint, step {latest} in {checkpointer.directory}, was kept: "
                f"{lower} and run again with --config.resume=True.")
    return (f"Non-finite losses {bad} at step {sched.calls} ({sched.describe()}); this state "
            f"was not saved. {then}")


class Trainer:
    """Runs ``algorithm``'s phases under ``config`` in ``workdir``. ``resumable``: the
    algorithm's settings that may change on resume (``algos.Entry.resumable``), whose learning
    rates the NaN stop names."""

    def __init__(self, config, algorithm: Algorithm, workdir: str, evaluator=None,
                 resumable: tuple[str, ...] = ()):
        self.config = config
        self.resumable = tuple(resumable)
        self.algorithm = algorithm
        self.workdir = workdir
        self.evaluator = evaluator
        phases = phases_from_config(config, algorithm.phase_hooks)
        check_phases(phases, algorithm, can_evaluate=evaluator is not None,
                     algo=config.get("algo"))
        self.clocks = {"log": Clock.parse(config.log.every, "log.every"),
                       "checkpoint": Clock.parse(config.checkpoint.every, "checkpoint.every")}
        if evaluator is not None:  # an algorithm without a policy needs no eval clock
            self.clocks["eval"] = Clock.parse(config.eval.every, "eval.every")
        for clock in self.clocks.values():
            clock.check(algorithm)
        self.x_axis = config.log.x_axis
        Clock.parse(f"1 {self.x_axis}", "log.x_axis").check(algorithm)
        self.scheduler = Scheduler(phases, algorithm)
        # Several processes: all of them save checkpoints (orbax coordinates them), only the
        # first writes logs, progress and the files beside the checkpoints.
        self.primary = parallel.is_primary()
        self.say = tqdm.write if self.primary else (lambda *_: None)
        prepare_workdir(workdir)
        self.checkpointer = Checkpointer(workdir, keep=config.checkpoint.keep,
                                         primary=self.primary)
        # Settings this resume changes (learning rates, say): allowed, and recorded.
        self.changed = self.checkpointer.check_can_start(config, resume=config.resume,
                                                         settings=self.resumable)
        self.artifacts = Artifacts(workdir, algorithm.artifacts)

    # ------------------------------------------------------------------ state

    def _initial(self):
        key = seeds.loop_key(self.config.seed, self.config.num_seeds, self.config.env.num_envs)
        key, init_key = seeds.split(key)
        state = self.algorithm.init(init_key)
        return state, key

    def _restore_or_init(self):
        """The initial state and key, or the checkpoint's. Returns ``(state, key, resumed)``."""
        state, key = self._initial()
        self.resumed_from = None
        self.wall_before = 0.0  # training wall seconds of the runs this one resumes
        if not self.config.resume:  # check_can_start refused resume=True without a checkpoint
            self.artifacts.start(None)
            return state, key, False
        saved, loop, step, unreadable = self.checkpointer.restore(self.algorithm.persistent(state))
        if loop.get("processes", 1) != jax.process_count():
            raise IncompatibleCheckpointError(
                f"{self.checkpointer.directory}/{step} was saved by a run of {loop.get('processes', 1)} "
                f"process(es); this one has {jax.process_count()}. Resume with the same number "
                "(python -m jaxwm.launch --num_processes=N), or start a new run in another "
                "--workdir; nothing was changed.")
        self.scheduler.load_state_dict(loop["scheduler"])  # may refuse: nothing moved yet
        self.artifacts.start(loop.get("artifacts", {}), loop.get("artifact_digests"))
        note = self.checkpointer.set_aside(unreadable, step) if self.primary else None
        if note:
            self.say(note)
        if unreadable:  # every process lists the steps again, after process 0 moved them
            parallel.wait_for_every_process("jaxwm: unreadable checkpoints set aside")
            self.checkpointer.reopen()
        self.resumed_from = step
        self.wall_before = float(loop.get("wall_seconds", 0.0))
        state = self.algorithm.on_restore(state, saved)
        key = jnp.asarray(np.asarray(loop["key"], np.uint32))
        self.say(f"Resumed from {self.checkpointer.directory} at step "
                 f"{self.scheduler.calls} ({self.scheduler.describe()}).")
        return state, key, True

    def _save(self, state, key, force=False):
        sched = self.scheduler
        if self.checkpointer.latest_step() == sched.calls:
            return  # already saved at this step (periodic save coincided with the final one)
        if self.algorithm.policy is not None:  # several processes: still one model?
            parallel.check_same_on_every_process(self.algorithm.policy_params(state),
                                                 "policy parameters")
        loop = {"key": np.asarray(key).tolist(), "scheduler": sched.state_dict(),
                "processes": jax.process_count(), "artifacts": self.artifacts.state_dict(),
                "artifact_digests": self.artifacts.digests(),
                "wall_seconds": self.wall_seconds()}
        self.checkpointer.save(sched.calls, self.algorithm.persistent(state), loop, force=force)

    def wall_seconds(self) -> float:
        """Wall seconds this run has trained, across resumes (from its first start)."""
        return self.wall_before + time.perf_counter() - self.started

    # ------------------------------------------------------------------ run

    def run(self) -> dict:
        """Trains until every phase is done (or a signal arrives). Returns the last metrics.
        A write that fails for lack of space (a checkpoint, a log row, a plot) stops the run
        with a one-line ``WriteError``."""
        try:
            return self._run()
        except OSError as e:
            if e.errno in WRITE_ERRNOS:
                raise write_failed(f"to {e.filename or self.workdir}", e,
                                   checkpointed=self.checkpointer.latest_step() is not None) from e
            raise

    def _run(self) -> dict:
        self.started = time.perf_counter()
        state, key, resumed = self._restore_or_init()
        self._announce(resumed)
        sched = self.scheduler
        # A resumed run drops what was logged after its checkpoint (that stretch runs again).
        writer = MetricWriter(self.workdir, resumed_at=dict(sched.totals) if resumed else None,
                              x_axis=self.x_axis, enabled=self.primary, config=self.config)
        bar = tqdm(total=sched.planned_total(self.x_axis), initial=sched.totals[self.x_axis],
                   unit=self.x_axis, dynamic_ncols=True, mininterval=2.0,
                   disable=not (self.config.log.progress and self.primary))
        run = RunLog(writer, bar, sched, self.algorithm, self.x_axis, self.wall_seconds,
                     self._postfix)
        clocks = Clocks(self.clocks, sched.totals)
        try:
            with _StopRequested() as stop:
                state, key = self._train(state, key, run, clocks, stop)
                interrupted = stop.signal is not None and not sched.finished
                if interrupted:
                    self.say(f"{stop.signal} received: saving a checkpoint at step "
                             f"{sched.calls} ({sched.describe()}) and exiting; resume with "
                             "--config.resume=True.")
                self._check_finite(run)
                if interrupted and run.pending():
                    run.write()  # what ran since the last log step
                self._save(state, key, force=True)
        finally:
            # Whatever stopped the run, finish writing the checkpoints already started.
            self.checkpointer.wait()
            self.checkpointer.close()
            self.artifacts.close()
            run.close()
        self._plot(writer.path)
        self.state = state
        return {**run.last, "interrupted": interrupted, "calls": sched.calls,
                "counters": dict(sched.totals), **sched.totals}

    def _announce(self, resumed: bool) -> None:
        """The run's first lines, and its config (with what a resume changed) beside it."""
        sched = self.scheduler
        processes = f", {jax.process_count()} processes" if jax.process_count() > 1 else ""
        self.say(f"{self.algorithm.name} on {self.config.env.id} -> {self.workdir} "
                 f"(tensorboard --logdir {self.workdir}){processes}")
        if self.primary:
            self.checkpointer.write_config(self.config, self.changed if resumed else None,
                                           at={"step": sched.calls, **sched.totals})
            if resumed and self.changed:
                self.say("Changed on resume (recorded in config_history.jsonl): " + ", ".join(
                    f"{k} {old} -> {new}" for k, (old, new) in self.changed.items()) + ".")

    def _train(self, state, key, run: RunLog, clocks: Clocks, stop: _StopRequested):
        """Hook calls until every phase is done or a signal stops the run; after each, the
        clocks (evaluation, logging, checkpoints) once no passed data is pending."""
        sched, flow, announced = self.scheduler, {}, False
        while not sched.finished:
            index = sched.phase_index
            phase, name = sched.next_call()
            key, hook_key = seeds.split(key)
            before = sched.totals[self.x_axis]
            state = self._call(run, flow, name, state, hook_key)
            if sched.record(name) and phase.until and \
                    bool(self.algorithm.predicates[phase.until](state)):
                sched.end_phase_early(phase)
            live = sched.live_inputs()
            for pending in [k for k in flow if k not in live]:
                del flow[pending]
            run.bar.update(sched.totals[self.x_axis] - before)
            phase_over = sched.cycle is None and sched.phase_index != index
            if phase_over:
                early = f" (ended early: until={phase.until})" \
                    if sched.ended_early[phase.name] else ""
                self.say(f"Phase {phase.name!r} done at step {sched.calls} "
                         f"({sched.describe()}){early}.")
            if flow:  # passed data in flight: a checkpoint now could not resume
                if stop.signal and not announced:
                    self.say(f"{stop.signal} received: running the hooks that still read "
                             f"{sorted(flow)} before saving.")
                    announced = True
                continue
            if self._stopping(stop):
                break
            self._on_clocks(state, key, run, clocks, phase_over)
        return state, key

    def _stopping(self, stop: _StopRequested) -> bool:
        """Whether a signal stops the run here. Several processes stop together, at the same
        call (else the others would wait for the stopped one in their next all-reduce)."""
        stopping = stop.signal is not None
        if jax.process_count() > 1:
            stopping = bool(parallel.allgather(np.int32(stopping)).any())
            if stopping and stop.signal is None:
                stop.signal = "A signal to another process"
        return stopping

    def _on_clocks(self, state, key, run: RunLog, clocks: Clocks, phase_over: bool) -> None:
        """Evaluation, a log row and a checkpoint, each when its clock is due (a finished
        phase is always logged; the final evaluation when the last phase ends)."""
        sched = self.scheduler
        if self.evaluator is not None and (clocks.due("eval", sched.totals) or (
                sched.finished and self.config.eval.at_end)):
            # A side stream: how often evaluation runs leaves the training keys, and so the
            # training run, unchanged.
            self._evaluate(run, state, seeds.fold_in(key, EVAL_STREAM))
        if clocks.due("log", sched.totals) or phase_over:
            self._check_finite(run)
            run.write()
        if clocks.due("checkpoint", sched.totals):
            self._check_finite(run)
            self._save(state, key)

    def _call(self, run: RunLog, flow: dict, name: str, state, key):
        """One scheduled call: the evaluator, or a hook with its inputs read and its outputs
        routed (``flow``: passed data of this cycle), its metrics into the window."""
        if name == EVALUATE:
            self._evaluate(run, state, key)
            return state
        data = hook_inputs(self.algorithm, self.algorithm.hooks[name], flow, self.artifacts,
                           key)
        state, outputs, metrics = call_hook(self.algorithm, name, state, data, key, run.timer)
        route_outputs(self.algorithm, name, outputs, flow, self.artifacts)
        run.add(self._per_seed(metrics))
        return state

    def _per_seed(self, metrics: dict) -> dict:
        """With N seeds every scalar a hook returns is [N]: logged per seed and as a mean."""
        if self.config.num_seeds == 1:
            return metrics
        return {k: v if isinstance(v, (*MEDIA, PerSeed)) else PerSeed(v)
                for k, v in metrics.items()}

    def _evaluate(self, run: RunLog, state, key) -> None:
        """The evaluator on ``state``, its time kept out of the window's rates."""
        jax.block_until_ready(state)  # queued training work is not evaluation time
        start = time.perf_counter()
        if jax.process_count() > 1:  # every process evaluates alone, on its own copy
            state = parallel.local_replica(state, jax.local_devices()[0])
        run.add(self.evaluator.run(state, key))
        seconds = time.perf_counter() - start
        run.eval_seconds += seconds
        run.timer.record(EVALUATE, seconds, first_apart=False)
        run.timer.count(EVALUATE)

    def _check_finite(self, run: RunLog) -> None:
        """The NaN stop: non-finite ``losses/*`` in the window raise before anything is
        logged or saved, naming the checkpoint left and the learning rates to lower."""
        bad = run.window.nonfinite("losses/")
        if bad:
            raise FloatingPointError(nan_advice(
                bad, self.scheduler, self.config, self.checkpointer,
                tuple(k for k in self.resumable if is_learning_rate(k))))

    def _plot(self, metrics_path: str) -> None:
        """The learning curve, the normalised score where there is one, and ``eval.csv``."""
        if not self.primary:
            return
        title = f"{self.algorithm.name} on {self.config.env.id}"
        plot_learning_curve(metrics_path, os.path.join(self.workdir, "learning_curve.png"),
                            title, self.x_axis)
        plot_learning_curve(metrics_path, os.path.join(self.workdir, "normalized_score.png"),
                            title, self.x_axis, SCORE_SERIES, "D4RL normalised score")
        write_eval_csv(metrics_path, os.path.join(self.workdir, "eval.csv"))

    def _postfix(self, last: dict, latest: dict) -> dict[str, str]:
        sched = self.scheduler
        rate = "charts/SPS" if self.x_axis == "env_steps" else f"charts/{self.x_axis}_per_s"
        postfix = {}
        if rate in last:
            postfix["SPS" if self.x_axis == "env_steps" else f"{self.x_axis}/s"] = \
                f"{last[rate]:,.0f}"
        postfix["phase"] = sched.current.name if not sched.finished else "done"
        if not sched.finished and sched.current.unit != self.x_axis:
            # A phase the bar's x-axis does not measure (MOPO's model epochs): its own count.
            phase = sched.current
            postfix[phase.unit] = f"{sched.progress[phase.name][phase.unit]}/{phase.duration}"
        if "charts/episodic_return" in last:
            postfix["return"] = f"{last['charts/episodic_return']:.1f}"
        if "eval/episodic_return" in last:
            postfix["eval"] = f"{last['eval/episodic_return']:.1f}"
        shares = sorted(((v, k[len("time/"):-len("_fraction")]) for k, v in latest.items()
                         if k.startswith("time/") and k.endswith("_fraction")), reverse=True)
        if shares:
            postfix["time"] = " ".join(f"{name} {share:.0%}" for share, name in shares)
        return postfix

