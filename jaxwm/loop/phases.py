"""Declarative training phases and the scheduler that walks them (after RL Lab).

A phase is ``{hooks, duration, unit}`` in the config, run in ``config.phase_order``:
``hooks`` is a tuple of hook names, each optionally ``name:K`` to call it K times per cycle
(e.g. Dreamer's ``update_model:16`` for a replay ratio); ``unit`` is what ``duration``
counts: ``env_steps``, ``updates`` or ``iterations`` (cycles through the hooks).

The scheduler's state is per-phase progress, checkpointed with the run.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxwm.config import ConfigError
from jaxwm.loop.algorithm import HOOK_NAMES

UNITS = ("env_steps", "updates", "iterations")


@dataclasses.dataclass(frozen=True)
class Phase:
    name: str
    hooks: tuple[tuple[str, int], ...]  # (hook name, repeats)
    duration: int
    unit: str


def parse_hook(text: str) -> tuple[str, int]:
    name, _, repeat = text.partition(":")
    return name, int(repeat) if repeat else 1


def phases_from_config(config) -> list[Phase]:
    """Reads and validates ``config.phase_order`` / ``config.phases``."""
    order = tuple(config.phase_order)
    declared = set(config.phases.keys())
    if not order:
        raise ConfigError("config.phase_order is empty: name at least one phase to run.")
    missing = [name for name in order if name not in declared]
    if missing:
        raise ConfigError(f"config.phase_order names {missing}, which config.phases does not "
                         f"define (defined: {sorted(declared)}).")
    phases = []
    for name in order:
        spec = config.phases[name]
        if spec.unit not in UNITS:
            raise ConfigError(f"phases.{name}.unit={spec.unit!r}; choose one of {UNITS}.")
        if int(spec.duration) <= 0:
            raise ConfigError(f"phases.{name}.duration must be > 0, got {spec.duration}.")
        hooks = []
        for text in spec.hooks:
            try:
                hook, repeat = parse_hook(text)
            except ValueError:
                raise ConfigError(f"phases.{name}.hooks: bad entry {text!r}; write 'name' or "
                                 "'name:K' with K an integer.") from None
            if hook not in HOOK_NAMES or repeat < 1:
                raise ConfigError(f"phases.{name}.hooks: {text!r} is not one of {HOOK_NAMES} "
                                 "(optionally ':K' with K >= 1).")
            hooks.append((hook, repeat))
        if not hooks:
            raise ConfigError(f"phases.{name}.hooks is empty.")
        phases.append(Phase(name, tuple(hooks), int(spec.duration), spec.unit))
    return phases


class Scheduler:
    """Tracks how far each phase and the whole run have gone.

    The current phase is derived, not stored: it is the first phase whose progress (in its
    own unit) is below its duration. So a resumed run whose config lengthens a phase simply
    reopens it. The state is two int64 arrays, which checkpoint as they are.
    """

    def __init__(self, phases: list[Phase]):
        self.phases = phases
        self.totals = np.zeros(len(UNITS), np.int64)  # env_steps, updates, iterations
        self.progress = np.zeros((len(phases), len(UNITS)), np.int64)
        self._cycle_phase: int | None = None  # pinned while a cycle runs

    @property
    def phase_index(self) -> int:
        for i, phase in enumerate(self.phases):
            if self.progress[i, UNITS.index(phase.unit)] < phase.duration:
                return i
        return len(self.phases)

    @property
    def finished(self) -> bool:
        return self.phase_index >= len(self.phases)

    @property
    def current(self) -> Phase:
        return self.phases[self.phase_index]

    @property
    def env_steps(self) -> int:
        return int(self.totals[0])

    def begin_cycle(self) -> Phase:
        """Pins the current phase: a cycle's hooks all count toward the phase it began in."""
        self._cycle_phase = self.phase_index
        return self.phases[self._cycle_phase]

    def record(self, env_steps: int, updates: int) -> None:
        amounts = np.array([env_steps, updates, 0], np.int64)
        self.progress[self._cycle_phase] += amounts
        self.totals += amounts

    def end_cycle(self) -> bool:
        """Counts one iteration of the pinned phase. True if that phase is now done."""
        index, self._cycle_phase = self._cycle_phase, None
        self.progress[index, 2] += 1
        self.totals[2] += 1
        return self.phase_index != index

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"totals": self.totals.copy(), "progress": self.progress.copy()}

    def load_state_dict(self, state) -> None:
        self.totals = np.asarray(state["totals"], np.int64).copy()
        self.progress = np.asarray(state["progress"], np.int64).copy()

    def total_env_steps_planned(self) -> int | None:
        """Env steps the whole run will take, if every phase is measured in env steps."""
        if all(p.unit == "env_steps" for p in self.phases):
            return sum(p.duration for p in self.phases)
        return None
