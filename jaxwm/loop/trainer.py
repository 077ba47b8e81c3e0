"""The one training loop: phases -> hooks, plus everything algorithms must not do.

Per cycle of the current phase, the trainer splits its key, calls each hook's pure function
with ``(state, key)``, counts the hook's declared env steps and updates, and collects the
metrics it returns. It owns, and nothing below it does: the progress bar, TensorBoard and
``metrics.jsonl``, orbax checkpoints (periodic, final, on SIGINT/SIGTERM), resumption, the
evaluation schedule and the learning-curve PNG.

Metrics stay on the device until a log step, so hooks are dispatched asynchronously and the
host only waits once per ``log.every_env_steps``. Non-finite losses stop the run at that log
step with the last good checkpoint untouched.

What is checkpointed: ``{"algo": state, "loop": {"key", scheduler progress}}``. After a
restore the algorithm's ``on_restore`` re-attaches its envs (their episodes restart; envpool
cannot save its C++ state), and the run continues from the same step with the same
parameters, optimiser state, RNG key and counters.
"""

from __future__ import annotations

import os
import signal
import time

import jax
from tqdm import tqdm

from jaxwm.config import ConfigError
from jaxwm.loop.algorithm import Algorithm
from jaxwm.loop.checkpoint import Checkpointer
from jaxwm.loop.metrics import MetricWindow, MetricWriter, plot_learning_curve
from jaxwm.loop.phases import Scheduler, phases_from_config


class _StopRequested:
    """Turns SIGINT/SIGTERM into a flag checked between hooks (then save and exit)."""

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


class Trainer:
    def __init__(self, config, algorithm: Algorithm, workdir: str, evaluator=None):
        self.config = config
        self.algorithm = algorithm
        self.workdir = workdir
        self.evaluator = evaluator
        self.scheduler = Scheduler(phases_from_config(config))
        self._check_hooks()
        os.makedirs(workdir, exist_ok=True)
        self.checkpointer = Checkpointer(workdir, keep=config.checkpoint.keep)
        self.checkpointer.check_can_start(config, resume=config.resume)

    def _check_hooks(self) -> None:
        for phase in self.scheduler.phases:
            for name, _ in phase.hooks:
                if name == "evaluate":
                    if self.evaluator is None and self.algorithm.policy is None:
                        raise ConfigError(f"Phase {phase.name!r} asks for 'evaluate' but "
                                         f"{self.algorithm.name} has no policy to evaluate.")
                elif name not in self.algorithm.hooks:
                    raise ConfigError(
                        f"Phase {phase.name!r} uses hook {name!r}, which {self.algorithm.name} "
                        f"does not provide (it has: {sorted(self.algorithm.hooks)}).")
            per_cycle = {
                "env_steps": sum(self.algorithm.hooks[n].env_steps * r
                                 for n, r in phase.hooks if n != "evaluate"),
                "updates": sum(self.algorithm.hooks[n].updates * r
                               for n, r in phase.hooks if n != "evaluate"),
            }
            if phase.unit in per_cycle and per_cycle[phase.unit] == 0:
                raise ConfigError(f"Phase {phase.name!r} lasts {phase.duration} {phase.unit} but "
                                 f"none of its hooks {phase.hooks} advance {phase.unit}.")

    # ------------------------------------------------------------------ state

    def _initial(self):
        key = jax.random.PRNGKey(self.config.seed)
        key, init_key = jax.random.split(key)
        state = self.algorithm.init(init_key)
        return state, key

    def _restore_or_init(self):
        state, key = self._initial()
        if self.config.resume and self.checkpointer.latest_step() is not None:
            template = {"algo": state, "loop": self._loop_tree(key)}
            restored = self.checkpointer.restore(template)
            state = self.algorithm.on_restore(restored["algo"])
            key = restored["loop"]["key"]
            self.scheduler.load_state_dict(restored["loop"]["scheduler"])
            tqdm.write(f"Resumed from {self.checkpointer.directory} at env step "
                       f"{self.scheduler.env_steps}.")
        return state, key

    def _loop_tree(self, key):
        return {"key": key, "scheduler": self.scheduler.state_dict()}

    def _save(self, state, key, force=False):
        if self.checkpointer.latest_step() == self.scheduler.env_steps:
            return  # already saved at this step (periodic save coincided with the final one)
        tree = {"algo": state, "loop": self._loop_tree(key)}
        self.checkpointer.save(self.scheduler.env_steps, tree, force=force)

    # ------------------------------------------------------------------ run

    def run(self) -> dict[str, float]:
        """Trains until every phase is done (or a signal arrives). Returns the last metrics."""
        state, key = self._restore_or_init()
        sched = self.scheduler
        tqdm.write(f"{self.algorithm.name} on {self.config.env.id} -> {self.workdir} "
                   f"(tensorboard --logdir {self.workdir})")
        self.checkpointer.write_config(self.config)
        writer = MetricWriter(self.workdir)
        window = MetricWindow()
        log_cfg, ckpt_cfg, eval_cfg = self.config.log, self.config.checkpoint, self.config.eval
        next_log = sched.env_steps + log_cfg.every_env_steps
        next_ckpt = sched.env_steps + ckpt_cfg.every_env_steps
        next_eval = None
        if eval_cfg.every_env_steps:
            next_eval = sched.env_steps + eval_cfg.every_env_steps
        last = {}
        bar = tqdm(total=sched.total_env_steps_planned(), initial=sched.env_steps,
                   unit="step", dynamic_ncols=True, mininterval=2.0, disable=not log_cfg.progress)
        window_start = (time.perf_counter(), sched.env_steps)
        eval_seconds = 0.0  # excluded from SPS

        def check_finite():
            bad = window.nonfinite("losses/")
            if bad:
                raise FloatingPointError(
                    f"Non-finite losses {bad} before env step {sched.env_steps}. The last "
                    f"good checkpoint in {self.checkpointer.directory} was kept (this state was "
                    "not saved); lower the learning rate or enable normalisation, then resume.")

        def log():
            nonlocal window_start, last, eval_seconds
            # Reading the metrics waits for the hooks that made them: JAX dispatches
            # asynchronously, and SPS must count finished work, not queued work.
            check_finite()
            metrics = window.flush()
            now, steps = time.perf_counter(), sched.env_steps
            sps = (steps - window_start[1]) / max(now - window_start[0] - eval_seconds, 1e-9)
            window_start, eval_seconds = (now, steps), 0.0
            metrics["charts/SPS"] = sps
            metrics["charts/phase"] = float(sched.phase_index)
            writer.write(steps, metrics)
            last = {**last, **metrics}
            postfix = {"SPS": f"{sps:,.0f}", "phase": sched.current.name
                       if not sched.finished else "done"}
            if "charts/episodic_return" in last:
                postfix["return"] = f"{last['charts/episodic_return']:.1f}"
            if "eval/episodic_return" in last:
                postfix["eval"] = f"{last['eval/episodic_return']:.1f}"
            bar.set_postfix(postfix, refresh=False)

        def evaluate(state, key):
            nonlocal eval_seconds
            jax.block_until_ready(state)  # queued training work is not evaluation time
            start = time.perf_counter()
            video = None
            if eval_cfg.video:
                video = os.path.join(self.workdir, "videos", f"eval_{sched.env_steps}.gif")
            window.add(self.evaluator.run(state, key, video))
            eval_seconds += time.perf_counter() - start

        try:
            with _StopRequested() as stop:
                while not sched.finished and stop.signal is None:
                    phase = sched.begin_cycle()
                    steps_before = sched.env_steps
                    for name, repeats in phase.hooks:
                        for _ in range(repeats):
                            key, hook_key = jax.random.split(key)
                            if name == "evaluate":
                                evaluate(state, hook_key)
                                continue
                            hook = self.algorithm.hooks[name]
                            state, metrics = hook.fn(state, hook_key)
                            window.add(metrics)
                            sched.record(hook.env_steps, hook.updates)
                    sched.end_cycle()
                    bar.update(sched.env_steps - steps_before)
                    steps = sched.env_steps
                    finished = sched.finished
                    scheduled = next_eval is not None and steps >= next_eval
                    if self.evaluator is not None and (scheduled or (finished and eval_cfg.at_end)):
                        key, eval_key = jax.random.split(key)
                        evaluate(state, eval_key)
                        while next_eval is not None and next_eval <= steps:
                            next_eval += eval_cfg.every_env_steps
                    if steps >= next_log or finished:
                        log()
                        while next_log <= steps:
                            next_log += log_cfg.every_env_steps
                    if steps >= next_ckpt:
                        check_finite()
                        self._save(state, key)
                        while next_ckpt <= steps:
                            next_ckpt += ckpt_cfg.every_env_steps

                if stop.signal is not None:
                    tqdm.write(f"{stop.signal} received: saving a checkpoint at env step "
                               f"{sched.env_steps} and exiting; resume with "
                               "--config.resume=True.")
                    if sched.env_steps > window_start[1]:
                        log()  # what ran since the last log step
                check_finite()
                self._save(state, key, force=True)
        finally:
            # Whatever stopped the run, finish writing the checkpoints already started.
            self.checkpointer.wait()
            self.checkpointer.close()
            bar.close()
            writer.close()
        png = os.path.join(self.workdir, "learning_curve.png")
        plot_learning_curve(writer.path, png, f"{self.algorithm.name} on {self.config.env.id}")
        self.state = state
        return {**last, "interrupted": stop.signal is not None, "env_steps": sched.env_steps}
