"""Matplotlib figures as inline SVG, and the two shapes every panel is built from: a quantity over
time (each run's steps, thinned into time bins when there are many) and a distribution
(histogram beside CDF).

SVG text stays text (svg.fonttype none: the titles and numbers are in the page's DOM, and a
figure is a few kB), and the ids matplotlib writes are salted with a constant, so the same run
gives the same page byte for byte.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

MAX_RAW_POINTS = 2000  # steps drawn one by one up to this many; beyond, BINS time bins
BINS = 400
WIDTH, HEIGHT = 9.0, 2.8  # inches: one panel across the page
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


def new_figure(columns: int = 1, height: float = HEIGHT, rows: int = 1):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "pagesim-view", "font.size": 9,
                         "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True,
                         "grid.alpha": 0.3, "legend.frameon": False})
    fig, axes = plt.subplots(rows, columns, figsize=(WIDTH, height * rows), squeeze=False, layout="constrained",
                             sharex=rows > 1)
    return fig, [ax for row in axes for ax in row]


def legend_outside(ax, handles=None, labels=None) -> None:
    """The legend to the right of the axes, where it covers no line."""
    kwargs = {} if handles is None else {"handles": handles, "labels": labels}
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, **kwargs)


def to_svg(fig) -> str:
    """The figure as an <svg> element to put in HTML (no XML prolog or doctype)."""
    import matplotlib.pyplot as plt

    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", metadata={"Date": None})
    plt.close(fig)
    text = buffer.getvalue()
    return text[text.index("<svg"):]


def color(i: int) -> str:
    return COLORS[i % len(COLORS)]


@dataclass
class Series:
    """One line over time: x (seconds from the run's time zero), y; lo / hi: each bin's range when
    the steps were thinned into bins (None when every step is drawn)."""

    x: list
    y: list
    lo: list | None = None
    hi: list | None = None


def over_time(end_times: list, durations: list, values: list, origin: float, span: float) -> Series:
    """A per-step quantity over time. Each step's value holds over the step (from its end time
    minus its duration to its end time). Past MAX_RAW_POINTS steps, BINS bins of span / BINS
    seconds each show the time-weighted mean of the steps ending in them and their min and max."""
    import numpy as np

    t = np.asarray(end_times, dtype=float) - origin
    y = np.asarray([0.0 if v is None else v for v in values], dtype=float)
    if len(t) <= MAX_RAW_POINTS:
        return Series(t.tolist(), y.tolist())
    d = np.asarray(durations, dtype=float)
    width = max(span, float(t[-1])) / BINS
    index = np.minimum((t / width).astype(int), BINS - 1)
    weight = np.bincount(index, weights=d, minlength=BINS)
    total = np.bincount(index, weights=y * d, minlength=BINS)
    count = np.bincount(index, minlength=BINS)
    lo = np.full(BINS, np.inf)
    hi = np.full(BINS, -np.inf)
    np.minimum.at(lo, index, y)
    np.maximum.at(hi, index, y)
    plain = np.bincount(index, weights=y, minlength=BINS) / np.maximum(count, 1)  # (bins of zero-length steps)
    mean = np.where(weight > 0, total / np.where(weight > 0, weight, 1), plain)
    has = count > 0
    x = (np.arange(BINS) + 1) * width
    return Series(x[has].tolist(), mean[has].tolist(), lo[has].tolist(), hi[has].tolist())


def counts_over_time(end_times: list, values: list, origin: float, span: float) -> tuple[list, list, float]:
    """Events per time bin (preemptions, swapped blocks): (bin starts, sums, bin width in s)."""
    import numpy as np

    t = np.asarray(end_times, dtype=float) - origin
    y = np.asarray([0.0 if v is None else v for v in values], dtype=float)
    bins = min(BINS, max(10, len(t) // 4))
    width = max(span, float(t[-1]) if len(t) else 0.0, 1e-9) / bins
    index = np.minimum((t / width).astype(int), bins - 1)
    sums = np.bincount(index, weights=y, minlength=bins)
    return (np.arange(bins) * width).tolist(), sums.tolist(), width


def draw_series(ax, series: Series, label: str, color_: str, style: str = "-") -> None:
    if series.lo is None:
        ax.plot(series.x, series.y, style, color=color_, lw=1, label=label, drawstyle="steps-pre")
        return
    ax.fill_between(series.x, series.lo, series.hi, color=color_, alpha=0.15, lw=0, step="pre")
    ax.plot(series.x, series.y, style, color=color_, lw=1, label=label, drawstyle="steps-pre")


def distribution(samples: list[tuple], unit: str, title: str, counted: str = "requests") -> str:
    """Histogram (left) and CDF (right) of each run's values, runs overlaid in their colours:
    samples are (label, colour, values, weights or None). The histogram's bins are shared by all
    runs, on a log axis where the values span more than two decades; its heights are shares of
    what is counted (requests, or tokens for weighted gaps)."""
    import numpy as np

    fig, (hist, cdf) = new_figure(2)
    values = np.concatenate([np.asarray(v, dtype=float) for _, _, v, _ in samples])
    positive = values[values > 0]
    log = positive.size and positive.size == values.size and positive.max() / positive.min() > 100
    if log:
        edges = np.geomspace(positive.min(), positive.max(), 41)
    else:
        edges = np.histogram_bin_edges(values, bins=40)
    for label, color_, v, w in samples:
        v = np.asarray(v, dtype=float)
        w = np.ones(v.size) if w is None else np.asarray(w, dtype=float)
        order = np.argsort(v, kind="stable")
        v, w = v[order], w[order]
        hist.hist(v, bins=edges, histtype="step", color=color_, lw=1.2, label=label, weights=w * (100.0 / w.sum()))
        cdf.plot(v, np.cumsum(w) / w.sum() * 100, color=color_, lw=1.2, label=label, drawstyle="steps-post")
    for ax in (hist, cdf):
        ax.set_xlabel(f"{title} ({unit})")
        if log:
            ax.set_xscale("log")
    hist.set_ylabel(f"share of {counted} (%)")
    cdf.set_ylabel("at or below (%)")
    cdf.set_ylim(0, 100.5)
    if len(samples) > 1:
        legend_outside(cdf)
    return to_svg(fig)

