"""Declarative training phases, the scheduler that walks them, and clocks (after RL Lab).

A phase is ``{hooks, duration, unit, until}`` in the config, run in ``config.phase_order``:

* ``hooks``: hook names, each optionally ``name:K`` to call it K times back to back per
  cycle (a replay ratio: ``update_model:16``); ``evaluate`` runs the loop's evaluator;
* ``unit``: what ``duration`` counts: any counter a hook of the algorithm declares
  (``env_steps``, ``model_updates``, ...) or ``iterations`` (cycles through the hooks);
* ``until`` (optional): the name of one of the algorithm's predicates; the phase also ends
  after a cycle at whose end the predicate holds (``duration`` is then a cap).

The scheduler advances one hook call at a time, so everything the loop schedules (logs,
evaluations, checkpoints, signals) is checked after every call, not once per cycle. Its
state (counter totals, per-phase progress, the position inside the current cycle) is plain
JSON, saved with every checkpoint: a run stopped in the middle of a cycle resumes there.

A clock (``log.every``, ``checkpoint.every``, ``eval.every``) is written ``"N unit"``, or
several separated by commas (``"10000 env_steps, 500 model_updates"``): it fires whenever
one of those counters crosses a multiple of its N. ``""`` or ``"never"``: never.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Mapping

from jaxwm.config import ConfigError
from jaxwm.loop.algorithm import EVALUATE, ITERATIONS, Algorithm


@dataclasses.dataclass(frozen=True)
class Phase:
    name: str
    hooks: tuple[tuple[str, int], ...]  # (hook name, calls back to back)
    duration: int
    unit: str
    until: str = ""

    @property
    def cycle_length(self) -> int:
        return sum(repeats for _, repeats in self.hooks)

    def hook_at(self, position: int) -> str:
        """The hook of the ``position``-th call of a cycle (0-based)."""
        for name, repeats in self.hooks:
            if position < repeats:
                return name
            position -= repeats
        raise IndexError(f"Phase {self.name!r} has {self.cycle_length} calls per cycle.")

    def calls_before(self, position: int) -> list[tuple[str, int]]:
        """A cycle's first ``position`` calls, as (hook name, calls) runs."""
        out, start = [], 0
        for name, repeats in self.hooks:
            taken = min(repeats, position - start)
            if taken > 0:
                out.append((name, taken))
            start += repeats
        return out

    def calls_from(self, position: int) -> list[tuple[str, int]]:
        """The calls of a cycle from ``position`` on, as (hook name, calls) runs."""
        out, start = [], 0
        for name, repeats in self.hooks:
            left = min(repeats, start + repeats - position)
            if left > 0:
                out.append((name, left))
            start += repeats
        return out


def parse_hook(text: str) -> tuple[str, int]:
    name, _, repeat = text.partition(":")
    return name, int(repeat) if repeat else 1


def phases_from_config(config, derived: Mapping[str, tuple[str, ...]] | None = None
                       ) -> list[Phase]:
    """Reads ``config.phase_order`` / ``config.phases`` (syntax only; ``check_phases``
    checks them against an algorithm). ``derived``: hooks for phases whose ``hooks`` the
    config leaves empty (``Algorithm.phase_hooks``); an empty tuple there leaves the phase
    out for this algorithm."""
    order = tuple(config.phase_order)
    declared = set(config.phases.keys())
    if not order:
        raise ConfigError("config.phase_order is empty: name at least one phase to run.")
    missing = [name for name in order if name not in declared]
    if missing:
        raise ConfigError(f"config.phase_order names {missing}, which config.phases does not "
                          f"define (defined: {sorted(declared)}).")
    phases = []
    derived = derived or {}
    for name in order:
        spec = config.phases[name]
        if int(spec.duration) <= 0:
            raise ConfigError(f"phases.{name}.duration must be > 0, got {spec.duration}.")
        if not tuple(spec.hooks) and name in derived and not derived[name]:
            continue  # the algorithm leaves this phase out (MOPO has no density to fit)
        hooks = []
        for text in tuple(spec.hooks) or tuple(derived.get(name, ())):
            try:
                hook, repeat = parse_hook(text)
            except ValueError:
                raise ConfigError(f"phases.{name}.hooks: bad entry {text!r}; write 'name' or "
                                  "'name:K' with K an integer.") from None
            if repeat < 1:
                raise ConfigError(f"phases.{name}.hooks: {text!r} repeats a hook {repeat} times; "
                                  "K must be >= 1.")
            hooks.append((hook, repeat))
        if not hooks:
            raise ConfigError(f"phases.{name}.hooks is empty.")
        phases.append(Phase(name, tuple(hooks), int(spec.duration), str(spec.unit),
                            str(spec.get("until", "") or "")))
    return phases


def _runs(runs) -> list[str]:
    """(hook, calls) runs as the config writes them: ``['update_model:2', 'update_agent']``."""
    return [name if calls == 1 else f"{name}:{calls}" for name, calls in runs]


def _unknown(what: str, value: str, known) -> str:
    close = difflib.get_close_matches(value, list(known), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return f"{what} {value!r} is unknown; choose one of {sorted(known)}.{hint}"


def check_hook_names(phases: list[Phase], hooks, algo: str) -> None:
    """Every phase's hooks are among ``hooks`` (or ``evaluate``): the one message for a
    typo'd hook, from a run (``check_phases``) and from ``--dry_run`` alike."""
    known = set(hooks) | {EVALUATE}
    for phase in phases:
        for name, _ in phase.hooks:
            if name not in known:
                raise ConfigError(f"phases.{phase.name}.hooks: "
                                  + _unknown(f"{algo} hook", name, known))


def check_phases(phases: list[Phase], algorithm: Algorithm, can_evaluate: bool,
                 algo: str | None = None) -> None:
    """Every check that needs the algorithm, on the host before anything compiles: hook
    names (``algo``: the config's name for the algorithm, in the message), units, a unit
    none of the phase's hooks advance, inputs nothing provides, and predicates."""
    hooks = algorithm.hooks
    check_hook_names(phases, hooks, algo or algorithm.name)
    units = set(algorithm.counters) | {ITERATIONS}
    for phase in phases:
        where = f"phases.{phase.name}"
        for name, _ in phase.hooks:
            if name == EVALUATE and not can_evaluate:
                raise ConfigError(f"{where} asks for '{EVALUATE}' but {algorithm.name} has no "
                                  "policy to evaluate.")
        if phase.unit not in units:
            raise ConfigError(f"{where}.unit: no hook of {algorithm.name} counts "
                              f"{phase.unit!r}. " + _unknown("The unit", phase.unit, units))
        per_cycle = counts_of(phase.hooks, hooks)
        if phase.unit != ITERATIONS and per_cycle.get(phase.unit, 0) == 0:
            raise ConfigError(f"Phase {phase.name!r} lasts {phase.duration} {phase.unit} but "
                              f"none of its hooks {[h for h, _ in phase.hooks]} advance "
                              f"{phase.unit}.")
        written: dict[str, str] = {}
        for name, _ in phase.hooks:
            if name == EVALUATE:
                continue
            for needed in hooks[name].reads:
                if needed not in written and needed not in algorithm.data and \
                        needed not in algorithm.artifacts:
                    writers = [n for n, h in hooks.items() if needed in h.writes]
                    raise ConfigError(
                        f"{where}: hook {name!r} reads {needed!r}, which no earlier hook of the "
                        f"phase writes" + (f" (written by {writers}: list it before {name!r})."
                                           if writers else "."))
            written.update(dict.fromkeys(hooks[name].writes, name))
        if phase.until and phase.until not in algorithm.predicates:
            raise ConfigError(f"{where}.until: " + _unknown(f"{algorithm.name} predicate",
                                                            phase.until, algorithm.predicates))


def counts_of(runs, hooks: Mapping) -> dict[str, int]:
    """Counters advanced by ``runs`` of (hook name, calls)."""
    total: dict[str, int] = {}
    for name, calls in runs:
        if name == EVALUATE:
            continue
        for counter, amount in hooks[name].counts.items():
            total[counter] = total.get(counter, 0) + amount * calls
    return total


class Scheduler:
    """Tracks counters, each phase's progress and the position inside the current cycle.

    The current phase is derived: the first phase that is neither ended early, nor at its
    duration, nor followed by a phase that has started. So a resumed run whose config
    lengthens its last phase reopens it, while lengthening a phase the run has moved past
    changes nothing (phases never run backwards). A cycle, once begun, runs to its end in the
    phase it began in (its hooks all count toward that phase).
    """

    def __init__(self, phases: list[Phase], algorithm: Algorithm):
        self.phases = phases
        self._hooks = algorithm.hooks
        self.units = tuple(algorithm.counters) + (ITERATIONS,)
        self.totals = dict.fromkeys(self.units, 0)
        self.progress = {p.name: dict.fromkeys(self.units, 0) for p in phases}
        self.ended_early = dict.fromkeys((p.name for p in phases), False)
        self.started = dict.fromkeys((p.name for p in phases), False)
        self.calls = 0  # hook calls so far: the checkpoint step, which always increases
        self.cycle: tuple[int, int] | None = None  # (phase index, calls done in the cycle)

    def _phase_done(self, i: int) -> bool:
        phase = self.phases[i]
        return (self.ended_early[phase.name]
                or self.progress[phase.name][phase.unit] >= phase.duration
                or any(self.started[later.name] for later in self.phases[i + 1:]))

    @property
    def phase_index(self) -> int:
        if self.cycle is not None:
            return self.cycle[0]
        return next((i for i in range(len(self.phases)) if not self._phase_done(i)),
                    len(self.phases))

    @property
    def finished(self) -> bool:
        return self.phase_index >= len(self.phases)

    @property
    def current(self) -> Phase:
        return self.phases[self.phase_index]

    def next_call(self) -> tuple[Phase, str]:
        """The phase and hook of the next call (beginning a cycle if none is running)."""
        if self.cycle is None:
            self.cycle = (self.phase_index, 0)
            self.started[self.phases[self.cycle[0]].name] = True
        index, position = self.cycle
        return self.phases[index], self.phases[index].hook_at(position)

    def record(self, hook: str) -> bool:
        """Counts the call just made. True if it ended the cycle."""
        index, position = self.cycle
        phase = self.phases[index]
        counts = {} if hook == EVALUATE else self._hooks[hook].counts
        for counter, amount in counts.items():
            self.progress[phase.name][counter] += amount
            self.totals[counter] += amount
        self.calls += 1
        if position + 1 < phase.cycle_length:
            self.cycle = (index, position + 1)
            return False
        self.progress[phase.name][ITERATIONS] += 1
        self.totals[ITERATIONS] += 1
        self.cycle = None
        return True

    def end_phase_early(self, phase: Phase) -> None:
        self.ended_early[phase.name] = True

    def live_inputs(self) -> set[str]:
        """Inputs the rest of the current cycle still reads (a checkpoint taken while any is
        pending could not resume, since passed data is not saved)."""
        if self.cycle is None:
            return set()
        index, position = self.cycle
        return {name for hook, _ in self.phases[index].calls_from(position) if hook != EVALUATE
                for name in self._hooks[hook].reads}

    def planned_total(self, unit: str) -> int:
        """Where ``unit`` will stand when the run ends (an upper bound if a phase may end
        early)."""
        total = self.totals[unit]
        for i, phase in enumerate(self.phases):
            progress = dict(self.progress[phase.name])
            if self.cycle is not None and self.cycle[0] == i:
                rest = counts_of(phase.calls_from(self.cycle[1]), self._hooks)
                rest[ITERATIONS] = 1
                for counter, amount in rest.items():
                    progress[counter] += amount
                total += rest.get(unit, 0)
            elif self._phase_done(i):
                continue
            if self.ended_early[phase.name]:
                continue
            per_cycle = counts_of(phase.hooks, self._hooks)
            per_cycle[ITERATIONS] = 1
            cycles = math.ceil(max(phase.duration - progress[phase.unit], 0)
                               / per_cycle[phase.unit])
            total += cycles * per_cycle.get(unit, 0)
        return total

    def describe(self) -> str:
        return ", ".join(f"{unit} {self.totals[unit]:,}" for unit in self.units)

    # ---------------------------------------------------------------- checkpointed state

    def state_dict(self) -> dict:
        cycle = None
        if self.cycle is not None:
            index, position = self.cycle
            cycle = {"phase": self.phases[index].name, "position": position,
                     "done": self.phases[index].calls_before(position)}
        return {"calls": self.calls, "totals": dict(self.totals), "cycle": cycle,
                "phases": {name: {"progress": dict(self.progress[name]),
                                  "ended_early": self.ended_early[name],
                                  "started": self.started[name]}
                           for name in self.progress}}

    def load_state_dict(self, state: dict) -> None:
        """Restores a saved state into this config's phases. Raises ConfigError (nothing
        changed) where the config can no longer continue it."""
        names = [p.name for p in self.phases]
        dropped = sorted(set(state["phases"]) - set(names))
        if dropped:
            raise ConfigError(f"The checkpoint has progress in phases {dropped}, which the config "
                              "no longer defines; add them back to config.phases/phase_order.")
        cycle = state["cycle"]
        if cycle is not None:
            self._check_cycle_continues(cycle)
        self.calls = int(state["calls"])
        self.totals = {u: int(state["totals"].get(u, 0)) for u in self.units}
        for name, saved in state["phases"].items():
            self.progress[name] = {u: int(saved["progress"].get(u, 0)) for u in self.units}
            self.ended_early[name] = bool(saved["ended_early"])
            self.started[name] = bool(saved["started"])
        self.cycle = None
        if cycle is not None:
            index, position = names.index(cycle["phase"]), int(cycle["position"])
            if position < self.phases[index].cycle_length:
                self.cycle = (index, position)
            else:  # the hooks it ran were the whole (shortened) cycle: count it as done
                self.progress[cycle["phase"]][ITERATIONS] += 1
                self.totals[ITERATIONS] += 1

    def _check_cycle_continues(self, cycle: dict) -> None:
        """A run saved inside a cycle continues with the config's hooks from that position,
        which needs the hooks already run to be the config's first ones, and none of the rest
        to read what those wrote (passed data is not saved)."""
        phase = self.phases[[p.name for p in self.phases].index(cycle["phase"])]
        position = int(cycle["position"])
        done = phase.calls_before(position)
        if done != [tuple(run) for run in cycle["done"]]:
            raise ConfigError(
                f"The run stopped inside a cycle of phase {phase.name!r} after "
                f"{_runs(cycle['done'])}; with phases.{phase.name}.hooks={_runs(phase.hooks)} "
                f"the cycle would have begun {_runs(done)}. Resume with the hooks it was saved "
                "with.")
        written = {n for hook, _ in done if hook != EVALUATE for n in self._hooks[hook].writes}
        lost = sorted(written & {n for hook, _ in phase.calls_from(position) if hook != EVALUATE
                                 for n in self._hooks[hook].reads})
        if lost:
            raise ConfigError(
                f"The run stopped inside a cycle of phase {phase.name!r}; with the config's hooks "
                f"the rest of that cycle reads {lost}, written before the stop and not saved. "
                "Resume with the hooks it was saved with.")


@dataclasses.dataclass(frozen=True)
class Clock:
    """``every`` = ((N, unit), ...): fires when any unit crosses a multiple of its N."""

    name: str
    every: tuple[tuple[int, str], ...]

    @classmethod
    def parse(cls, text, name: str) -> Clock:
        text = str(text).strip()
        if text in ("", "never", "0"):
            return cls(name, ())
        every = []
        for part in text.split(","):
            match = re.fullmatch(r"\s*(\d[\d_]*)\s*([A-Za-z_]\w*)\s*", part)
            if not match or int(match.group(1)) <= 0:
                raise ConfigError(f"{name}={text!r}: write 'N unit' (e.g. '10000 env_steps'), "
                                  "several separated by commas, or 'never'.")
            every.append((int(match.group(1)), match.group(2)))
        return cls(name, tuple(every))

    def check(self, algorithm: Algorithm) -> None:
        units = set(algorithm.counters) | {ITERATIONS}
        for _, unit in self.every:
            if unit not in units:
                raise ConfigError(f"{self.name}: no hook of {algorithm.name} counts {unit!r}. "
                                  + _unknown("The unit", unit, units))

    def marks(self, totals: Mapping[str, int]) -> tuple[int, ...]:
        """How many times each of its intervals has elapsed; the clock fires when this changes."""
        return tuple(totals[unit] // n for n, unit in self.every)


def plan(phases: list[Phase], hook_counts: Mapping[str, Mapping[str, int]]) -> list[dict]:
    """Each phase run from the start: ``{"phase", "cycles", "counts"}``, the cycles it takes
    and what it adds to every counter (``iterations`` included); an upper bound for a phase
    with ``until``. What ``python -m jaxwm.train --dry_run`` prints."""
    rows = []
    for phase in phases:
        per_cycle: dict[str, int] = {ITERATIONS: 1}
        for name, calls in phase.hooks:
            for counter, amount in ({} if name == EVALUATE else hook_counts[name]).items():
                per_cycle[counter] = per_cycle.get(counter, 0) + amount * calls
        cycles = math.ceil(phase.duration / per_cycle[phase.unit]) if per_cycle.get(phase.unit) \
            else 0
        rows.append({"phase": phase, "cycles": cycles,
                     "counts": {k: v * cycles for k, v in per_cycle.items()}})
    return rows
