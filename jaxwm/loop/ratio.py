"""A replay ratio as a phase's hooks: ``collect:M, update:K``.

World-model agents train at a fixed ratio of replayed steps to env steps (DreamerV3's
``train_ratio``; Hafner et al. 2023, sec. "Replay ratio"). The loop runs hooks, not ratios,
so the ratio becomes K updates per M collects: K / M = ratio x env steps per collect /
replayed steps per update, M <= ``MAX_HOOK_REPEATS``. ``phase_hooks`` derives them for a
phase a config leaves empty, ``check`` refuses hooks a config writes out that miss the ratio
by more than 1%, and ``achieved`` is what a number of calls gives (logged beside the target).
"""

from __future__ import annotations

import dataclasses
import fractions

from jaxwm.config import ConfigError
from jaxwm.loop.phases import parse_hook

MAX_HOOK_REPEATS = 64  # M of collect:M, update:K (collects per cycle)


@dataclasses.dataclass(frozen=True)
class TrainRatio:
    """``ratio`` replayed steps per env step, with ``env_steps`` per call of ``collect`` and
    ``replayed`` steps per call of ``update`` (its batch x length); ``name`` is the setting
    the ratio comes from, for messages."""

    ratio: float
    env_steps: int
    replayed: int
    name: str = "train_ratio"
    collect: str = "collect"
    update: str = "update_model"

    def repeats(self) -> tuple[int, int]:
        """(M, K) with K / M closest to the ratio, M <= ``MAX_HOOK_REPEATS`` (K is what the
        ratio needs: DreamerV3's dmc_proprio 1024 with 16 envs gives K = 16)."""
        best = fractions.Fraction(self.ratio * self.env_steps / self.replayed
                                  ).limit_denominator(MAX_HOOK_REPEATS)
        return best.denominator, best.numerator

    def achieved(self, collects: int, updates: int) -> float:
        return updates * self.replayed / (collects * self.env_steps)

    def phase_hooks(self) -> tuple[str, str]:
        """``(collect:M, update:K)``; refuses a ratio below one update per M collects."""
        m, k = self.repeats()
        if k == 0:
            raise ConfigError(f"{self.name}={self.ratio} is below one update per "
                              f"{MAX_HOOK_REPEATS} collects; raise it, or write the phase's "
                              "hooks yourself.")
        return f"{self.collect}:{m}", f"{self.update}:{k}"

    def check(self, hooks, phase: str = "train") -> None:
        """Refuses a phase's written-out ``hooks`` whose calls miss the ratio by over 1%."""
        derived = self.phase_hooks()  # refuses a ratio no hooks can meet
        calls = {}
        for name, repeats in map(parse_hook, tuple(hooks) or derived):
            calls[name] = calls.get(name, 0) + repeats
        m, k = calls.get(self.collect, 0), calls.get(self.update, 0)
        if not (m and k):
            return
        got = self.achieved(m, k)
        if abs(got - self.ratio) > 0.01 * self.ratio:
            best_m, best_k = self.repeats()
            raise ConfigError(
                f"phases.{phase}.hooks {tuple(hooks)} give a train ratio of {got:g}, not "
                f"{self.name}={self.ratio}; leave the hooks empty to derive them (nearest: "
                f"{self.collect}:{best_m}, {self.update}:{best_k} gives "
                f"{self.achieved(best_m, best_k):g}), or change the ratio.")
