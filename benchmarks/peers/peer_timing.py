"""What the peer scripts share: they run under another Python (the reference's torch), so
they import nothing from jaxwm or benchmarks/common.py."""
import statistics
import time


def timed(fn, warmup, repeats):
    """``(median seconds, every sample)`` of ``repeats`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts), ts
