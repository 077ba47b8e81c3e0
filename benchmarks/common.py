"""Shared benchmark plumbing: hardware description, timing, memory, JSON + markdown output.

Every benchmark reports compile (first call) time apart from steady-state time, takes the
median of repeated measurements (these machines are noisy), and names the hardware.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import resource
import statistics
import time
from collections.abc import Callable

import jax

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def hardware() -> dict:
    import envpool
    import jaxlib

    cpu = "unknown"
    if os.path.exists("/proc/cpuinfo"):
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    device = jax.devices()[0]
    return {
        "backend": jax.default_backend(),
        "device": getattr(device, "device_kind", str(device)),
        "device_count": jax.device_count(),
        "cpu": cpu,
        "cpu_cores": os.cpu_count(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "envpool": envpool.__version__,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
    }


def hardware_line(hw: dict) -> str:
    return (f"{hw['device']} x{hw['device_count']} ({hw['backend']}), {hw['cpu']}, "
            f"{hw['cpu_cores']} logical cores; jax {hw['jax']}, envpool {hw['envpool']}, "
            f"Python {hw['python']}, {hw['date']}")


def block(tree):
    return jax.block_until_ready(tree)


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    block(fn())
    return time.perf_counter() - start


def median(xs):
    return float(statistics.median(xs))


def peak_memory() -> tuple[float, str]:
    """Peak device memory in MiB where the backend reports it (GPU), else the process's peak
    resident set size (CPU; includes everything the process allocated)."""
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        return stats["peak_bytes_in_use"] / 2**20, "device peak"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "process peak RSS"


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}"
        return "" if v is None else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def write_results(name: str, rows: list[dict], columns: list[str], hw: dict, notes: list[str],
                  suffix: str = "") -> str:
    os.makedirs(RESULTS, exist_ok=True)
    stem = os.path.join(RESULTS, f"{name}_{hw['backend']}{suffix}")
    with open(stem + ".json", "w") as f:
        json.dump({"hardware": hw, "rows": rows, "notes": notes}, f, indent=2)
    text = (f"# {name}\n\nHardware: {hardware_line(hw)}\n\n{markdown_table(rows, columns)}\n\n"
            + "\n".join(f"- {n}" for n in notes) + "\n")
    with open(stem + ".md", "w") as f:
        f.write(text)
    print(text)
    return stem
