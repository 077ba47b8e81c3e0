"""The configs that ship with jaxwm, named ``algo:variant`` (``ppo:cartpole``), and what each
of their settings means.

Each module here is one config file: ``get_config(variant)`` builds a variant (an
``ml_collections.ConfigDict`` starting from ``jaxwm.config.base_config``), ``SUMMARIES`` says
in one line what each variant is for (its keys are ``VARIANTS``), and ``FIELDS`` describes
every setting with its valid range (``jaxwm.config``'s field rules), composed from the blocks
its settings come from (an agent's ``config_block`` keeps its own ``FIELDS`` beside its
defaults). ``runner.validate`` checks the ranges; ``jaxwm configs NAME:VARIANT`` prints them.

    >>> import jaxwm
    >>> config = jaxwm.configs.get("ppo:cartpole", {"total_env_steps": 50_000})

A file of your own (``--config=my_ppo.py:cartpole``) works wherever a name does; its
settings are described by the packaged config of its ``algo``.
"""

from __future__ import annotations

import importlib

import ml_collections

from jaxwm import algos
from jaxwm.config import BASE_FIELDS, config_module, field_rule, leaves, load, packaged_configs

__all__ = ["get", "names", "variants", "summary", "fields", "describe", "listing"]


def get(spec: str, overrides: dict | None = None) -> ml_collections.ConfigDict:
    """``"ppo:cartpole"`` (or a path ``"my/ppo.py:cartpole"``) with ``overrides`` applied by
    dotted key (``{"ppo.learning_rate": 1e-3}``), unlocked; raises ``ConfigError`` for an
    unknown name, variant or key."""
    return load(spec, overrides)


def names() -> tuple[str, ...]:
    """The packaged configs: ``diffusion``, ``dreamer``, ..., ``worldmodels``."""
    return packaged_configs()


def _module(name: str):
    return config_module(name)[0]


def variants(name: str) -> tuple[str, ...]:
    return tuple(_module(name).VARIANTS)


def summary(name: str, variant: str) -> str:
    """One line: what the variant is for."""
    return _module(name).SUMMARIES[variant]


def fields(algo: str) -> dict:
    """``{key: (range, description)}`` of every setting of ``algo``'s configs: the shared ones
    (``jaxwm.config.BASE_FIELDS``) and those of the packaged config its contract test runs."""
    name = algos.get(algo).tiny.partition(":")[0]
    return {**BASE_FIELDS, **getattr(importlib.import_module(f"{__name__}.{name}"), "FIELDS", {})}


def undescribed(config: ml_collections.ConfigDict) -> list[str]:
    """The settings of ``config`` that ``fields`` leaves without a description."""
    known = fields(config.algo)
    return [key for key, _ in leaves(config)
            if not (field_rule(known, key) or (None, ""))[1]]


def rule_text(rule: str) -> str:
    """A field's range as a reader says it: ``> 0``, ``in [0, 1]``, ``one of {adam, sgd}``."""
    if rule.startswith("{"):
        return "one of " + rule.replace("{,", "{'',")  # an empty string among the choices
    return f"in {rule}" if rule[0] in "[(" else rule


def describe(config: ml_collections.ConfigDict) -> str:
    """Every setting of ``config``: its value, one-line description and valid range."""
    known = fields(config.algo)
    rows = []
    for key, value in leaves(config):
        rule, text = field_rule(known, key) or (None, "(undescribed)")
        rows.append((key, repr(value), text + (f" ({rule_text(rule)})" if rule else "")))
    width = max(len(r[0]) for r in rows)
    value_width = min(max(len(r[1]) for r in rows), 28)
    return "\n".join(f"{key:<{width}}  {value:<{value_width}}  {text}" for key, value, text in rows)


def listing() -> str:
    """What ``jaxwm configs`` prints: every config's variants, each with its algorithm, env,
    budget and what it is for."""
    lines = []
    for name in names():
        module = _module(name)
        title = module.__doc__.strip().splitlines()[0].split(" Launch:")[0].rstrip(".")
        lines.append(f"{name}  ({title})")
        for variant in module.VARIANTS:
            config = module.get_config(variant)
            budget = f"{int(config.total_env_steps):,} env steps"
            if algos.get(config.algo).offline:  # no env steps: the last phase's length
                last = config.phases[config.phase_order[-1]]
                budget = f"{int(last.duration):,} {last.unit}"
            lines.append(f"  {name}:{variant:<{max(map(len, module.VARIANTS))}}  "
                         f"{config.algo:<11} {config.env.id:<22} {budget:>20}  "
                         f"{module.SUMMARIES[variant]}")
    return "\n".join(lines)
