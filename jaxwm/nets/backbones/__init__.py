"""Memory backbones behind one interface (``base.Backbone``): FF, LSTM, GRU, TrXL, GTrXL,
Mamba and Mamba-2, as compared by BenchNetRL ("RLBenchNet", Smirnov & Gu 2025, arXiv 2505.15040).

``make(config)`` builds the one ``config.backbone`` names, from its block of the network
config; ``validate(config)`` checks the choice and its sizes on the host, with messages that
list the valid values. Used by ``nets.actor_critic`` for PPO; DreamerV3's block GRU, World
Models' MDN-RNN and TD-MPC2 can take the same interface.
"""

from __future__ import annotations

import difflib

from jaxwm.config import ConfigError
from jaxwm.nets.backbones.base import Backbone, zero_where
from jaxwm.nets.backbones.recurrent import RNN
from jaxwm.nets.backbones.ssm import Mamba, Mamba2
from jaxwm.nets.backbones.transformer import TransformerXL
from jaxwm.nets.backbones.window import FeedForward, FrameStack
from jaxwm.ops.selective_scan import METHODS as SCANS

NAMES = ("ff", "lstm", "gru", "trxl", "gtrxl", "mamba", "mamba2")
MEMORY = tuple(name for name in NAMES if name != "ff")


def make(config) -> Backbone:
    """The backbone ``config.backbone`` names (``config``: the ``network`` block)."""
    name = config.backbone
    if name == "ff":
        return FeedForward()
    if name in ("lstm", "gru"):
        return RNN(kind=name, features=config.rnn.hidden)
    if name in ("trxl", "gtrxl"):
        t = config.trxl
        return TransformerXL(features=t.dim, layers=t.layers, heads=t.heads, memory=t.memory,
                             gated=name == "gtrxl")
    if name == "mamba":
        m = config.mamba
        return Mamba(features=m.dim, state=m.state, conv=m.conv, expand=m.expand, scan=m.scan)
    m = config.mamba2
    return Mamba2(features=m.dim, state=m.state, conv=m.conv, expand=m.expand,
                  headdim=m.headdim, chunk=m.chunk)


def learning_rate_scale(config) -> float:
    """The factor on the learning rate of the backbone's parameters (1: the same)."""
    block = {"mamba": config.mamba, "mamba2": config.mamba2}.get(config.backbone)
    return float(block.learning_rate_scale) if block is not None else 1.0


def _positive(block: str, config, *names: str) -> None:
    for name in names:
        if config[name] < 1:
            raise ConfigError(f"network.{block}.{name} must be >= 1, got {config[name]}.")


def validate(config) -> None:
    """Host-side checks of ``config.backbone`` and its sizes."""
    name = config.backbone
    if name not in NAMES:
        close = difflib.get_close_matches(str(name), NAMES, n=1)
        raise ConfigError(f"network.backbone={name!r} is unknown; choose one of {list(NAMES)}."
                          + (f" Did you mean {close[0]!r}?" if close else ""))
    if config.frames < 1:
        raise ConfigError(f"network.frames must be >= 1, got {config.frames}.")
    if name in ("lstm", "gru"):
        _positive("rnn", config.rnn, "hidden")
    elif name in ("trxl", "gtrxl"):
        t = config.trxl
        _positive("trxl", t, "dim", "layers", "heads", "memory")
        if t.dim % t.heads:
            raise ConfigError(f"network.trxl.dim={t.dim} does not split into "
                              f"network.trxl.heads={t.heads} attention heads; choose a dim "
                              f"divisible by the heads (e.g. {t.dim - t.dim % t.heads}).")
    elif name == "mamba":
        _positive("mamba", config.mamba, "dim", "state", "conv", "expand")
        if config.mamba.scan not in ("auto",) + SCANS:
            raise ConfigError(f"network.mamba.scan={config.mamba.scan!r} is unknown; choose one "
                              f"of {['auto', *SCANS]}.")
    elif name == "mamba2":
        m = config.mamba2
        _positive("mamba2", m, "dim", "state", "conv", "expand", "headdim", "chunk")
        if (m.expand * m.dim) % m.headdim:
            raise ConfigError(f"network.mamba2: expand * dim = {m.expand * m.dim} does not split "
                              f"into heads of network.mamba2.headdim={m.headdim}; choose a "
                              "headdim that divides it.")


__all__ = ["MEMORY", "NAMES", "Backbone", "FeedForward", "FrameStack", "Mamba", "Mamba2", "RNN",
           "TransformerXL", "learning_rate_scale", "make", "validate", "zero_where"]
