"""Small matplotlib helpers shared by the plan report and the paper's figure scripts."""

from __future__ import annotations


def log_axis(axis, base: int = 10) -> None:
    """Put `axis` (ax.xaxis or ax.yaxis) on a log scale with plain labels (0.2, not 2 x 10^-1) at
    1, 2 and 5 of every decade, so even a range narrower than a decade has several labelled
    ticks and one spanning decades is not crowded; base 2 labels every power of two."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    if axis.axis_name == "x":
        axis.axes.set_xscale("log", base=base)
    else:
        axis.axes.set_yscale("log", base=base)
    axis.set_major_locator(LogLocator(base=base, subs=(1.0, 2.0, 5.0) if base == 10 else (1.0,)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())
