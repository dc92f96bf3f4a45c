"""Workloads: the trace file format, trace builders and arrival processes.

Importing this package is light (numpy only); transformers and the ShareGPT package are
imported inside the builders that need them.
"""

from pagesim.workload.arrivals import ArrivalProcess, gamma_arrivals, poisson_arrivals, trace_arrivals, with_arrivals
from pagesim.workload.trace import Trace, TraceError, TraceRequest, dumps_trace, load_trace, parse_trace, save_trace

__all__ = [
    "ArrivalProcess",
    "Trace",
    "TraceError",
    "TraceRequest",
    "dumps_trace",
    "gamma_arrivals",
    "load_trace",
    "parse_trace",
    "poisson_arrivals",
    "save_trace",
    "trace_arrivals",
    "with_arrivals",
]
