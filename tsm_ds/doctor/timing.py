"""Time-boxed, interleaved repetitions: the doctor's one way to time things on a shared machine.

Every timed configuration runs rep 1, then every configuration rep 2, ... in a rotating order
(load changes on a shared machine hit all alike), until each has ``min_reps`` and the time box is
spent, or ``max_reps`` are done. Medians are reported, never single timings. The benches in
:mod:`tsm_ds.bench.models` interleave the same way with a fixed count; the doctor must finish in a
fixed time on any machine, hence the time box.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

__all__ = ["interleaved", "summary"]


def interleaved(fns: dict[str, Callable[[], float | None]], *, budget_s: float, min_reps: int = 2,
                max_reps: int = 50, warmup: int = 1,
                on_rep: Callable[[int], None] | None = None) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Run every function ``warmup`` times untimed, then timed repetitions, interleaved.

    Args:
        fns: name -> function; a function may return its own elapsed seconds (e.g. after a CUDA
            synchronise, or excluding set-up), else its wall time is taken.
        budget_s: time box for the timed repetitions of all functions together (seconds).
        min_reps / max_reps: repetitions per function at least / at most (min wins over the box).
        warmup: untimed calls per function first (compilation, caches, worker start).
        on_rep: called with the repetition number after each round (progress).

    Returns:
        ({name: [seconds per timed call]}, {name: seconds of its first warm-up call}).

    Raises:
        ValueError: no functions, or min_reps < 1.
    """
    if not fns or min_reps < 1:
        raise ValueError("interleaved needs at least one function and min_reps >= 1")
    first: dict[str, float] = {}
    for _ in range(warmup):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            first.setdefault(k, time.perf_counter() - t)
    names = list(fns)
    times: dict[str, list[float]] = {k: [] for k in names}
    t0 = time.perf_counter()
    rep = 0
    while rep < max_reps and (rep < min_reps or time.perf_counter() - t0 < budget_s):
        r = rep % len(names)
        for k in names[r:] + names[:r]:
            t = time.perf_counter()
            got = fns[k]()
            times[k].append(float(got) if got is not None else time.perf_counter() - t)
        rep += 1
        if on_rep is not None:
            on_rep(rep)
    return times, first


def summary(ts: list[float]) -> dict[str, float]:
    """Median, min, max (seconds) and spread ((max - min) / median, %) of timed calls.

    Raises:
        ValueError: no timings.
    """
    if not ts:
        raise ValueError("no timings")
    med = statistics.median(ts)
    return {"median_s": med, "min_s": min(ts), "max_s": max(ts),
            "spread_pct": 100.0 * (max(ts) - min(ts)) / med if med > 0 else 0.0, "reps": len(ts)}
