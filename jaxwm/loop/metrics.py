"""Metric sinks owned by the loop: TensorBoard (tensorboardX), JSON lines, learning curve.

``metrics.jsonl`` holds one object per log step: ``{"step": env_steps, "<name>": value}``,
with the same names as the TensorBoard scalars (``charts/episodic_return``, ``losses/...``).
Non-finite values (e.g. no episode finished in the window) are left out, not written as NaN.
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict

import numpy as np


class MetricWindow:
    """Accumulates per-hook metrics between log steps; averages on read (NaN-aware)."""

    def __init__(self):
        self._values = defaultdict(list)

    def add(self, metrics) -> None:
        for name, value in metrics.items():
            self._values[name].append(value)

    def nonfinite(self, prefix: str) -> list[str]:
        """Names under ``prefix`` with any non-finite value in the window."""
        return sorted(name for name, values in self._values.items() if name.startswith(prefix)
                      and not all(np.all(np.isfinite(np.asarray(v))) for v in values))

    def flush(self) -> dict[str, float]:
        out = {}
        for name, values in self._values.items():
            arr = np.asarray([np.asarray(v, dtype=np.float64) for v in values]).ravel()
            finite = arr[np.isfinite(arr)]
            if finite.size:
                out[name] = float(finite.mean())
        self._values.clear()
        return out


class MetricWriter:
    def __init__(self, workdir: str):
        from tensorboardX import SummaryWriter

        self.path = os.path.join(workdir, "metrics.jsonl")
        self._tb = SummaryWriter(workdir)
        self._jsonl = open(self.path, "a")

    def write(self, step: int, metrics: dict[str, float]) -> None:
        metrics = {k: float(v) for k, v in metrics.items() if math.isfinite(float(v))}
        for name, value in metrics.items():
            self._tb.add_scalar(name, value, step)
        self._jsonl.write(json.dumps({"step": int(step), **metrics}) + "\n")
        self._jsonl.flush()

    def close(self) -> None:
        self._tb.close()
        self._jsonl.close()


def read_jsonl(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_learning_curve(jsonl_path: str, png_path: str, title: str) -> bool:
    """Training and evaluation return against env steps. False if nothing to plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_jsonl(jsonl_path) if os.path.exists(jsonl_path) else []
    series = {
        "train (episodic return)": "charts/episodic_return",
        "eval": "eval/episodic_return",
    }
    fig, ax = plt.subplots(figsize=(7, 4))
    plotted = False
    for label, name in series.items():
        points = [(r["step"], r[name]) for r in rows if name in r]
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker="o" if label == "eval" else None, markersize=3, label=label)
            plotted = True
    if plotted:
        ax.set_xlabel("environment steps")
        ax.set_ylabel("return")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(png_path, dpi=120)
    plt.close(fig)
    return plotted
