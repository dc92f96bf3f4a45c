"""Confidence intervals of a mean over a few runs (seeds, repeats): Student's t, and for a
quantity that cannot be negative, t on the logs."""

from __future__ import annotations

import math
import statistics


# two-sided 95 % quantiles of Student's t (t_{0.975, df}), df = 1..30; beyond, the Cornish-Fisher
# expansion around the normal's 1.96 (error below 1e-4 there)
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_quantile_975(df: int) -> float:
    if df < 1:
        raise ValueError(f"a t interval needs at least 2 values (df >= 1), got df={df}")
    if df <= len(T_975):
        return T_975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def mean_interval(values: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): the 95 % Student t interval of the mean of `values` (at least 2)."""
    n = len(values)
    mean = sum(values) / n
    half = t_quantile_975(n - 1) * statistics.stdev(values) / math.sqrt(n)
    return mean, mean - half, mean + half


def nonnegative_interval(values: list[float]) -> tuple[float, float, float, str]:
    """(mean, low, high, how) for a quantity that cannot be negative (a rate, a latency, a count):
    where every value is > 0, the 95 % t interval of the logs, exponentiated (never below 0: with
    two runs the plain t interval's 12.7 x spread reached -0.01 req/s); where some are 0 (no
    preemptions in one run), the plain t interval with its low end clipped at 0, said so."""
    n = len(values)
    mean = sum(values) / n
    if all(v > 0 for v in values):
        logs = [math.log(v) for v in values]
        centre = sum(logs) / n
        half = t_quantile_975(n - 1) * statistics.stdev(logs) / math.sqrt(n)
        return mean, math.exp(centre - half), math.exp(centre + half), "log-scale t"
    _, low, high = mean_interval(values)
    return mean, max(low, 0.0), high, "t, clipped at 0" if low < 0 else "t"
