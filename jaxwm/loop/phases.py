"""Declarative training phases and the scheduler that walks them (after RL Lab).

A phase is ``{hooks, duration, unit}`` in the config, run in ``config.phase_order``:
``hooks`` is a tuple of hook names, each optionally ``name:K`` to call it K times per cycle
(e.g. Dreamer's ``update_model:16`` for a replay ratio); ``unit`` is what ``duration``
counts: ``env_steps``, ``updates`` or ``iterations`` (cycles through the hooks).

The scheduler's state is a dict of ints so that it checkpoints as is.
"""

from __future__ import annotations

import dataclasses

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
        raise ValueError("config.phase_order is empty: name at least one phase to run.")
    missing = [name for name in order if name not in declared]
    if missing:
        raise ValueError(f"config.phase_order names {missing}, which config.phases does not "
                         f"define (defined: {sorted(declared)}).")
    phases = []
    for name in order:
        spec = config.phases[name]
        if spec.unit not in UNITS:
            raise ValueError(f"phases.{name}.unit={spec.unit!r}; choose one of {UNITS}.")
        if int(spec.duration) <= 0:
            raise ValueError(f"phases.{name}.duration must be > 0, got {spec.duration}.")
        hooks = []
        for text in spec.hooks:
            try:
                hook, repeat = parse_hook(text)
            except ValueError:
                raise ValueError(f"phases.{name}.hooks: bad entry {text!r}; write 'name' or "
                                 "'name:K' with K an integer.") from None
            if hook not in HOOK_NAMES or repeat < 1:
                raise ValueError(f"phases.{name}.hooks: {text!r} is not one of {HOOK_NAMES} "
                                 "(optionally ':K' with K >= 1).")
            hooks.append((hook, repeat))
        if not hooks:
            raise ValueError(f"phases.{name}.hooks is empty.")
        phases.append(Phase(name, tuple(hooks), int(spec.duration), spec.unit))
    return phases


class Scheduler:
    """Tracks which phase runs and how far it and the whole run have gone."""

    def __init__(self, phases: list[Phase]):
        self.phases = phases
        self.state = {"phase": 0, "env_steps": 0, "updates": 0, "iterations": 0,
                      "phase_env_steps": 0, "phase_updates": 0, "phase_iterations": 0}

    @property
    def finished(self) -> bool:
        return self.state["phase"] >= len(self.phases)

    @property
    def current(self) -> Phase:
        return self.phases[self.state["phase"]]

    def record(self, env_steps: int, updates: int) -> None:
        for key, amount in (("env_steps", env_steps), ("updates", updates)):
            self.state[key] += amount
            self.state["phase_" + key] += amount

    def end_cycle(self) -> bool:
        """Counts one iteration; moves to the next phase when due. True if it moved."""
        self.state["iterations"] += 1
        self.state["phase_iterations"] += 1
        phase = self.current
        if self.state["phase_" + phase.unit] >= phase.duration:
            self.state["phase"] += 1
            for key in ("phase_env_steps", "phase_updates", "phase_iterations"):
                self.state[key] = 0
            return True
        return False

    def total_env_steps_planned(self) -> int | None:
        """Env steps the whole run will take, if every phase is measured in env steps."""
        if all(p.unit == "env_steps" for p in self.phases):
            return sum(p.duration for p in self.phases)
        return None
