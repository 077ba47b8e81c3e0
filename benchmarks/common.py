"""Shared benchmark plumbing: command line, hardware description, timing, memory and output.

Every benchmark reports compile time (the first call: trace, compile and run) apart from the
steady state, takes the median of repeated measurements (these machines are noisy), names the
hardware, and writes ``results/<name>_<backend>.json`` and ``results/<name>_<backend>.md``
(``_quick`` is appended for ``--quick`` smoke runs, so they never overwrite real results).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from functools import partial

import jax
import jax.extend
import jax.numpy as jnp

from jaxwm.loop import seeds

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")


# ----------------------------------------------------------------------------- command line


def parser(doc: str, repeats: int) -> argparse.ArgumentParser:
    """An argument parser with the options every benchmark shares: ``--quick``, ``--repeats``."""
    p = argparse.ArgumentParser(description=doc.strip().splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="smoke run, not a measurement: tiny sizes, one repeat, results suffixed "
                        "_quick (15 s to 1 min on 2 CPU cores; backbones.py ~3 min)")
    p.add_argument("--repeats", type=int, default=repeats,
                   help=f"timed repeats; the median is reported (default {repeats})")
    return p


# ----------------------------------------------------------------------------- hardware


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _commit() -> str:
    """The commit measured: ``JAXWM_COMMIT`` where the tree was copied without its git folder
    (benchmarks/gpu.sh on a device machine), else git's HEAD, marked ``+changes`` when the
    working tree differs from it."""
    if os.environ.get("JAXWM_COMMIT"):
        return os.environ["JAXWM_COMMIT"]
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return (head + ("+changes" if dirty else "")) or "unknown"


def _gpu_driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def hardware() -> dict:
    """What the numbers were measured on: backend, devices, CPU, library versions, the commit,
    date (and the driver on a GPU)."""
    import envpool
    import jaxlib

    devices = jax.devices()
    driver = _gpu_driver() if jax.default_backend() == "gpu" else None
    return {
        "platform": platform.platform(),
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind,
        "device_kinds": sorted({d.device_kind for d in devices}),
        "device_count": len(devices),
        "cpu": _cpu_model(),
        "logical_cores": os.cpu_count(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "envpool": envpool.__version__,
        "python": platform.python_version(),
        "commit": _commit(),
        **({"driver": driver} if driver else {}),
        "date": datetime.date.today().isoformat(),
    }


def hardware_line(hw: dict) -> str:
    """One readable line for the markdown output."""
    return (f"{', '.join(hw['device_kinds'])} x{hw['device_count']} (backend {hw['backend']}); "
            f"CPU {hw['cpu']}, {hw['logical_cores']} logical cores; jax {hw['jax']} "
            f"(jaxlib {hw['jaxlib']}), envpool {hw['envpool']}, Python {hw['python']}; "
            + (f"driver {hw['driver']}; " if hw.get("driver") else "")
            + f"{hw['platform']}; commit {hw.get('commit', 'unknown')}; {hw['date']}")


# ----------------------------------------------------------------------------- timing


def block(tree):
    """Waits for every array in ``tree`` (JAX dispatch is asynchronous)."""
    return jax.block_until_ready(tree)


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if len(xs) else math.nan


def seconds(fn: Callable[[], object]) -> float:
    """Wall seconds of one call of ``fn``, its result blocked on."""
    start = time.perf_counter()
    block(fn())
    return time.perf_counter() - start


@dataclasses.dataclass
class Timing:
    """``compile_s``: the first call (trace + compile + first run); ``samples``: the others."""

    compile_s: float
    samples: list[float]

    @property
    def median(self) -> float:
        return median(self.samples)


def timed(fn: Callable[[], object], repeats: int) -> Timing:
    """Times a first call of ``fn`` on its own (compile), then ``repeats`` more calls."""
    compile_s = seconds(fn)
    return Timing(compile_s, [seconds(fn) for _ in range(repeats)])


def iterations_for(window_s: float, seconds_per_iteration: float, minimum: int = 1) -> int:
    """How many iterations of the given cost fill a measurement window of ``window_s``."""
    return max(minimum, math.ceil(window_s / max(seconds_per_iteration, 1e-9)))


# ----------------------------------------------------------------------------- PPO


def ppo_iteration(algo, state, key, timed: bool = True):
    """One collect + update_agent; returns ``(state, collect_s, update_s)``. ``timed``: each hook
    is timed between two waits (queued work drained before, results ready after); otherwise
    both are only dispatched, as the training loop does between its log windows, and the
    times are None. On a JAX env PPO's one hook is ``iterate`` (collect and update in one
    program, ``iterations_per_call`` of them): its call is ``collect_s``, ``update_s`` 0."""
    if "iterate" in algo.hooks:
        iterate = algo.hooks["iterate"].fn
        if timed:
            block(state)
        start = time.perf_counter()
        state, _, metrics = iterate(state, {}, key)
        if not timed:
            return state, None, None
        block((state, metrics))
        return state, time.perf_counter() - start, 0.0
    collect, update = algo.hooks["collect"].fn, algo.hooks["update_agent"].fn
    k1, k2 = seeds.split(key)
    if not timed:
        state, passed, _ = collect(state, {}, k1)
        state, _, _ = update(state, passed, k2)
        return state, None, None
    block(state)
    start = time.perf_counter()
    state, passed, metrics = collect(state, {}, k1)
    block((state, passed, metrics))
    middle = time.perf_counter()
    state, _, metrics = update(state, passed, k2)
    block((state, metrics))
    return state, middle - start, time.perf_counter() - middle


def ppo_end_to_end(config, window_s: float, repeats: int, max_iterations: int,
                   probe: Callable | None = None) -> dict:
    """Compile + first iteration, then ``repeats`` windows of N steady-state iterations, where N
    fills ``window_s`` seconds (at least 1, at most ``max_iterations``). ``probe(algo, state)``,
    if given, runs after the windows and adds its dict to the result. With
    ``config.num_seeds`` > 1, ``steps_per_s`` counts each seed's steps (loop.seeds).

    Windows are timed as ``jaxwm.train`` times its log windows (``loop/trainer.py``): the first
    iteration of a window is timed hook by hook between waits (``collect_s``, ``update_s``), the
    others are only dispatched, and the window ends when all its work is done. So the rate
    pays for one host-device sync per window, not two per iteration (which on a GPU leave the
    device idle while the host dispatches the next program)."""
    from jaxwm.algos import ppo as ppo_algo

    start = time.perf_counter()
    algo = ppo_algo.build(config)
    key = seeds.loop_key(config.seed, config.num_seeds, config.env.num_envs)
    key, init_key = seeds.split(key)
    state = block(algo.init(init_key))
    build_s = time.perf_counter() - start
    extra = {}
    try:
        key, sub = seeds.split(key)
        state, first_collect, first_update = ppo_iteration(algo, state, sub)
        key, sub = seeds.split(key)
        state, c, u = ppo_iteration(algo, state, sub)  # sizes the window
        n = min(max_iterations, iterations_for(window_s, c + u))
        steps_per_iteration = algo.hooks[
            "iterate" if "iterate" in algo.hooks else "collect"].counts["env_steps"]
        sps, collect_s, update_s = [], [], []
        for _ in range(repeats):
            window = time.perf_counter()
            key, sub = seeds.split(key)
            state, c, u = ppo_iteration(algo, state, sub)  # the window's timed iteration
            collect_s.append(c)
            update_s.append(u)
            for _ in range(n - 1):
                key, sub = seeds.split(key)
                state, _, _ = ppo_iteration(algo, state, sub, timed=False)
            block(state)
            sps.append(n * steps_per_iteration / (time.perf_counter() - window))
        if probe is not None:
            extra = probe(algo, state)
    finally:
        algo.close()
    memory, memory_kind = peak_memory()
    return {"steps_per_s": median(sps), "compile_s": first_collect + first_update,
            "compile_collect_s": first_collect, "compile_update_s": first_update,
            "build_init_s": build_s, "collect_s": median(collect_s), "update_s": median(update_s),
            "iterations": f"{repeats} x {n}", "steps_per_iteration": steps_per_iteration,
            "samples_steps_per_s": sps, "peak_mem_mib": memory, "mem_kind": memory_kind,
            **extra}


def run_peer(command: str, timeout: float | None = None, tries: int = 1) -> dict:
    """Runs a peer benchmark (the original code, outside this repository) by its shell
    ``command`` and returns the JSON object its last printed line holds. ``timeout``: seconds
    after which a try is ended (XLA:CPU programs have hung on a futex here) and, while
    ``tries`` remain, started again."""
    try:
        out = subprocess.run(command, shell=True, capture_output=True, text=True,
                             timeout=timeout)
    except subprocess.TimeoutExpired:
        if tries > 1:
            print(f"peer command hung for {timeout:.0f} s; trying again: {command}", flush=True)
            return run_peer(command, timeout, tries - 1)
        raise SystemExit(f"peer command did not finish in {timeout:.0f} s: {command}") from None
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        tail = "\n".join((out.stderr or out.stdout).strip().splitlines()[-15:])
        raise SystemExit(f"peer command failed (exit {out.returncode}): {command}\n{tail}")
    try:
        return json.loads(lines[-1])
    except json.JSONDecodeError:
        raise SystemExit(f"peer command's last line is not JSON: {command}\n"
                         f"{lines[-1][:500]}") from None


def between_peer_runs(command: str, measure: Callable[[], list[dict]]):
    """``(rows, peers)``: ``measure()``'s rows, with the peer ``command`` (when given) run once
    before and once after them, so both sides see the host in the same state."""
    peers = [run_peer(command)] if command else []
    rows = measure()
    if command:
        peers.append(run_peer(command))
    return rows, peers


def attach_peer(rows: list[dict], peers: list[dict],
                peer_seconds: Callable[[dict, dict], float | None]) -> None:
    """Adds ``peer_s`` (the median over ``peers`` of ``peer_seconds(row, peer)``, None where
    the peer has no such row), ``speedup`` and ``peer_matmul_share`` (the row's matmul time
    alone over the peer's time: the same products) to each row the peer measured."""
    for r in rows:
        samples = [s for s in (peer_seconds(r, p) for p in peers) if s is not None]
        if samples:
            r["peer_s"] = median(samples)
            r["speedup"] = r["peer_s"] / r["s_per_call"]
            r["peer_matmul_share"] = r["matmul_alone_s"] / r["peer_s"]


# ----------------------------------------------------------------------------- matmuls


def _primitive_shapes(fn: Callable, args: tuple, primitive: str, key: Callable) -> collections.Counter:
    """``{key(eqn): count}`` over every ``primitive`` equation that ``fn(*args)`` runs, with
    scans counted ``length`` times (read from the jaxpr, so loops count as XLA's cost analysis,
    which sees a loop's body once, does not)."""
    counts: collections.Counter = collections.Counter()

    def visit(jaxpr, times: int) -> None:
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == primitive:
                counts[key(eqn)] += times
                continue
            if eqn.primitive.name in ("while", "cond"):
                raise ValueError(f"{primitive} shapes: a {eqn.primitive.name} runs an unknown "
                                 "number of its bodies.")
            repeat = eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1
            for value in eqn.params.values():
                for sub in value if isinstance(value, (tuple, list)) else (value,):
                    if isinstance(sub, jax.extend.core.ClosedJaxpr):
                        visit(sub.jaxpr, times * repeat)
                    elif isinstance(sub, jax.extend.core.Jaxpr):
                        visit(sub, times * repeat)

    visit(jax.make_jaxpr(fn)(*args).jaxpr, 1)
    return counts


def dot_shapes(fn: Callable, *args) -> collections.Counter:
    """Every ``dot_general`` that ``fn(*args)`` runs, as ``{(lhs shape, rhs shape, dimension
    numbers, dtype): count}`` (``_primitive_shapes``: scans counted by their length)."""
    def key(eqn):
        lhs, rhs = (v.aval for v in eqn.invars)
        return lhs.shape, rhs.shape, eqn.params["dimension_numbers"], str(lhs.dtype)
    return _primitive_shapes(fn, args, "dot_general", key)


_CONV_PARAMS = ("window_strides", "padding", "lhs_dilation", "rhs_dilation",
                "dimension_numbers", "feature_group_count", "batch_group_count")


def conv_shapes(fn: Callable, *args) -> collections.Counter:
    """Every ``conv_general_dilated`` that ``fn(*args)`` runs, as ``{(lhs shape, rhs shape,
    parameters, dtype): count}``; the parameters are ``_CONV_PARAMS`` in order."""
    def key(eqn):
        lhs, rhs = (v.aval for v in eqn.invars)
        params = tuple(tuple(map(tuple, eqn.params[p])) if p == "padding" else eqn.params[p]
                       for p in _CONV_PARAMS)
        return lhs.shape, rhs.shape, params, str(lhs.dtype)
    return _primitive_shapes(fn, args, "conv_general_dilated", key)


def _conv(lhs, rhs, params):
    return jax.lax.conv_general_dilated(lhs, rhs, **dict(zip(_CONV_PARAMS, params, strict=True)))


def conv_flops(shapes: collections.Counter) -> float:
    """2 x multiply-adds of every convolution in ``shapes`` (``conv_shapes``): per output element,
    the kernel's window times its input features (a dilated input's zeros included, as XLA's
    cost analysis counts them)."""
    total = 0.0
    for (lhs, rhs, params, dtype), count in shapes.items():
        out = jax.eval_shape(partial(_conv, params=params), jax.ShapeDtypeStruct(lhs, dtype),
                             jax.ShapeDtypeStruct(rhs, dtype))
        rhs_spec = params[_CONV_PARAMS.index("dimension_numbers")].rhs_spec
        per_output = math.prod(rhs[i] for i in rhs_spec[1:])  # input features x window
        total += 2.0 * math.prod(out.shape) * per_output * count
    return total


def _products_alone(shapes: collections.Counter, product: Callable, jit: Callable
                    ) -> Callable[[], list]:
    """A call that runs exactly the products of ``shapes`` (``{(lhs shape, rhs shape, params,
    dtype): count}``), ``product(lhs, rhs, params)`` each ``count`` times in a ``lax.scan``.
    Each product's operand and output are carried through an optimisation barrier, so XLA
    cannot hoist the product out of the loop as loop-invariant, and every output is written
    whole, as in the program."""
    plan = [(params, count) for (_, _, params, _), count in shapes.items()]
    tensors = [(jnp.full(lhs, 0.01, dtype), jnp.full(rhs, 0.01, dtype))
               for (lhs, rhs, _, dtype) in shapes]

    @jit
    def run(tensors):
        outputs = []
        for (lhs, rhs), (params, count) in zip(tensors, plan, strict=True):
            def body(carry, _, rhs=rhs, params=params):
                lhs, _ = carry
                return jax.lax.optimization_barrier((lhs, product(lhs, rhs, params))), None

            first = jax.eval_shape(partial(product, params=params), lhs, rhs)
            carry = (lhs, jnp.zeros(first.shape, first.dtype))
            outputs.append(jax.lax.scan(body, carry, None, length=count)[0][1])
        return outputs

    return lambda: run(tensors)


def convs_alone(shapes: collections.Counter) -> Callable[[], list]:
    """``matmuls_alone`` for convolutions (``_products_alone`` of ``conv_shapes``), compiled by
    ``backend.jit``, as the programs are, so each runs on the same XLA:CPU path (not
    YNNPACK's, ``jaxwm/backend.py``)."""
    from jaxwm import backend

    return _products_alone(shapes, _conv, backend.jit)


def dot_flops(shapes: collections.Counter) -> float:
    """2 x multiply-adds of every dot in ``shapes`` (``dot_shapes``)."""
    total = 0.0
    for (lhs, rhs, ((lc, _), (lb, _)), _), count in shapes.items():
        contracted = math.prod(lhs[i] for i in lc)
        batch = math.prod(lhs[i] for i in lb)
        free_l = math.prod(lhs) // (contracted * batch)
        free_r = math.prod(rhs) // (contracted * batch)
        total += 2.0 * batch * free_l * free_r * contracted * count
    return total


def matmuls_alone(shapes: collections.Counter) -> Callable[[], list]:
    """A call that runs exactly the dots of ``shapes`` and nothing else (``_products_alone``):
    its time is this machine's time for a program's matrix products, their best case. (Until
    2026-11-28 each input depended on the last output through an elementwise add over the
    left operand, a pass of its own that made a 512 x 512 x 512 product 14% slower on a host
    that runs it at 340 GFLOP/s: matmul times and shares came out too high.)"""
    def dot(lhs, rhs, params):
        return jax.lax.dot_general(lhs, rhs, params)
    return _products_alone(shapes, dot, jax.jit)


_PRODUCTS = {"matmul": (dot_shapes, dot_flops, matmuls_alone),
             "conv": (conv_shapes, conv_flops, convs_alone)}


def program_row(fn: Callable, args: tuple, repeats: int, carry_first: bool = False,
                products: str = "matmul") -> dict:
    """One jitted program's row: ``fn(*args)`` compiled as training compiles it
    (``backend.jit``), compile time apart, the median of ``repeats`` calls, its matrix
    products' GFLOP (``dot_shapes``) and their time run alone (``matmuls_alone``); with
    ``products="conv"`` its convolutions' instead (``conv_shapes``, ``convs_alone``), and the
    keys say ``conv`` where they say ``matmul``.

    The program and its products alone are timed in turn, one call of each per repeat, and
    ``matmul_share`` is the median over repeats of matmul time / program time. Timed apart (all
    the program's calls, then all the matmuls'), the share moved by 20 points between runs on
    a shared VM, as the host's speed drifted between the two batches; in turn, both sides of
    each ratio see the same host. ``carry_first``: the first output replaces the first
    argument between calls (a learner that goes on, as in training)."""
    from jaxwm import backend

    shapes_of, flops_of, alone_of = _PRODUCTS[products]
    jitted = backend.jit(fn)
    state = {"args": args}

    def call():
        out = jitted(*state["args"])
        if carry_first:
            state["args"] = (out[0],) + state["args"][1:]
        return out

    shapes = shapes_of(fn, *args)
    alone = alone_of(shapes)
    compile_s = seconds(call)
    seconds(alone)  # its compile
    pairs = [(seconds(call), seconds(alone)) for _ in range(repeats)]
    program_s = median([p for p, _ in pairs])
    flops = flops_of(shapes)
    return {"s_per_call": program_s, f"{products}_gflop": flops / 1e9,
            "gflops": flops / program_s / 1e9, f"{products}_alone_s": median([m for _, m in pairs]),
            f"{products}_share": median([m / p for p, m in pairs]), "compile_s": compile_s,
            "samples_s": [p for p, _ in pairs],
            f"{products}_alone_samples_s": [m for _, m in pairs]}


# ----------------------------------------------------------------------------- memory


def peak_memory() -> tuple[float, str]:
    """``(MiB, label)``: the device's peak bytes in use where the backend reports it (GPU), else
    the process's peak resident set size (CPU; everything the process allocated, host side).
    Both are peaks since the process started, so later rows include earlier ones."""
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        return stats["peak_bytes_in_use"] / 2**20, "device peak_bytes_in_use"
    # ru_maxrss is KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "process peak RSS"


# ----------------------------------------------------------------------------- output


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def columns_of(rows: list[dict]) -> list[str]:
    """Every key that holds a value in some row, in order of first appearance."""
    seen: dict[str, None] = {}
    for row in rows:
        for k, v in row.items():
            if _fmt(v) != "":
                seen.setdefault(k)
    return list(seen)


def markdown_table(rows: list[dict], columns: Sequence[str] | None = None) -> str:
    """Rows as a markdown table of ``columns`` (default: all), leaving out empty columns."""
    filled = columns_of(rows)
    columns = [c for c in columns if c in filled] if columns else filled
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def write_results(name: str, rows: list[dict], hardware: dict, notes: Sequence[str],
                  columns: Sequence[str] | None = None, quick: bool = False,
                  directory: str = RESULTS) -> str:
    """Writes ``<directory>/<name>_<backend>[_quick].{json,md}``, prints the markdown, returns
    the path stem. The JSON keeps every key of every row; the markdown shows ``columns``."""
    os.makedirs(directory, exist_ok=True)
    stem = os.path.join(directory, f"{name}_{hardware['backend']}" + ("_quick" if quick else ""))
    with open(stem + ".json", "w") as f:
        json.dump(_json_safe({"name": name, "quick": quick, "hardware": hardware, "rows": rows,
                              "notes": list(notes)}), f, indent=2)
        f.write("\n")
    text = (f"# {name}{' (quick smoke run)' if quick else ''}\n\n"
            f"Hardware: {hardware_line(hardware)}\n\n{markdown_table(rows, columns)}\n\n"
            + "".join(f"- {n}\n" for n in notes))
    with open(stem + ".md", "w") as f:
        f.write(text)
    print(text)
    print(f"wrote {stem}.json and {stem}.md")
    return stem
