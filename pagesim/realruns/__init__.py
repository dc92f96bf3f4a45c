"""Readers of recorded real runs (one module per format) into one type, RealRun: the workload a
real server served, its settings where recorded, and the measured per-request latencies.
`load_real_run(path)` tells the format by content; `RealRun.to_trace()` gives the trace a
replay runs; `describe(run)` a short summary. docs/validate.md ("Formats") documents every
format, field and assumption.

This package sits beside the drivers (pagesim.sim, executor): it imports the workload and
metrics layers only, never a driver.
"""

from pagesim.realruns.fields import RealRunError
from pagesim.realruns.load import describe, load_real_run
from pagesim.realruns.measured import measured_summary
from pagesim.realruns.types import RealRequest, RealRun, ServerConfig, Stage

__all__ = ["RealRequest", "RealRun", "RealRunError", "ServerConfig", "Stage", "describe", "load_real_run",
           "measured_summary"]
