"""Non-negative least squares on relative error: the one fitting routine of the cost models
(the `profiled` model's step fit and the `calibrated` model's operator fits)."""

from __future__ import annotations

import numpy as np


def nnls(a: np.ndarray, b: np.ndarray, tol: float = 1e-12, max_iter: int = 500) -> np.ndarray:
    """min ||a x - b|| subject to x >= 0 (Lawson & Hanson's active-set method)."""
    m, n = a.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = a.T @ (b - a @ x)
    for _ in range(max_iter):
        if passive.all() or (w[~passive] <= tol * max(1.0, np.abs(w).max())).all():
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                break
            # step back towards x until the first passive coefficient reaches zero
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
        x = z
        w = a.T @ (b - a @ x)
    return x


def fit_relative(rows: list[list[float]], seconds: list[float]) -> np.ndarray:
    """NNLS minimizing the relative error: each row divided by its measured time. Columns are
    scaled to unit norm first so coefficients of very different magnitudes fit alike."""
    a = np.array(rows, dtype=float)
    t = np.array(seconds, dtype=float)
    weight = 1.0 / np.maximum(t, 1e-9)
    aw = a * weight[:, None]
    norms = np.linalg.norm(aw, axis=0)
    norms[norms == 0] = 1.0
    coef = nnls(aw / norms, np.ones(len(t)))
    return coef / norms
