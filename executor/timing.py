"""The one timer for work measured on a device (kernels, block moves, recomputes): the checks in
pagesim/experiments/gpu_check.py, Figs. 18a and 19a, and benchmarks/bench_kernels.py all time with it."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def time_calls(fn: Callable[[], object], device, reps: int, warmup: int = 1) -> list[float]:
    """Seconds of each of `reps` calls of fn(), after `warmup` untimed calls. On a GPU each call
    is timed by CUDA events around it (the device's time, not the launch's); on a CPU by
    perf_counter."""
    device = torch.device(device)
    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    else:
        for _ in range(reps):
            began = time.perf_counter()
            fn()
            times.append(time.perf_counter() - began)
    return times


def median_ms(fn: Callable[[], object], device, reps: int, warmup: int = 1) -> float:
    """Median milliseconds per call (time_calls)."""
    return 1e3 * statistics.median(time_calls(fn, device, reps, warmup))


def synchronize(device) -> None:
    """Wait for the device's queued work (a no-op on a CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
