"""Does a finished run say its server was overloaded? The planner's steady-state test, on any run.

A replay offered more than its server completes builds a queue that grows for as long as the run
lasts: its latencies then measure the run's length as much as the server, and a longer run of the
same load gives larger ones. `replay` and `run` say so in the summary's notes when the planner's
own test (pagesim.plan.run.trend_record and steadiness: warm-up left out, a window of enough service
times, the trend of the number of requests in the system) finds the queue growing. A run too short
to judge, or one whose queue is flat or undecided, gets no note.
"""

from __future__ import annotations

from pagesim.metrics import RequestColumns
from pagesim.plan.grid import RunSettings
from pagesim.plan.run import steadiness, trend_record
from pagesim.plan.steady import GROWS
from pagesim.sim.rate_search import SearchSettings

# the planner's defaults: the first fifth of arrivals left out; growth beyond 2 % of the rate
WARMUP_FRACTION = RunSettings.warmup_fraction
TOLERANCE = SearchSettings.tolerance


def overload_note(requests: list, summary: dict, warmup_s: float = 0.0) -> str | None:
    """The note for a run whose queue grew (requests: pagesim.metrics.RequestRecord, or
    RequestColumns), else None. warmup_s: the run's own warm-up; the test leaves out at least the
    first fifth of arrivals."""
    # (packed once, for this and trend_record: a long run's records are never built)
    requests = RequestColumns.of(requests)
    arrivals = requests.column("arrival_time")
    if len(arrivals) < 2:
        return None
    first, last = float(arrivals.min()), float(arrivals.max())
    if last <= first:
        return None
    start = max(warmup_s, first + WARMUP_FRACTION * (last - first))
    in_window = int((arrivals >= start).sum())
    del arrivals  # (trend_record reads its own: one column at a time)
    if last <= start or in_window < 2:
        return None
    offered = in_window / (last - start)  # req/s arriving over the window
    record = trend_record(offered, start, requests)
    if steadiness(record, TOLERANCE, []) != GROWS:
        return None
    trend = record["trend"]
    served = summary.get("request_throughput")
    served_text = f", completing {served:.3g} req/s over the whole run" if isinstance(served, (int, float)) else ""
    fact = (f"overloaded: requests in the system grew by {trend['slope']:.3g}/s (95 % interval {trend['low']:.3g} "
            f"to {trend['high']:.3g}/s) from {start:.0f} s to the last arrival at {last:.0f} s, "
            f"{offered:.3g} req/s arriving{served_text}")
    rate = (summary.get("config") or {}).get("rate")
    if not (isinstance(rate, (int, float)) and rate > 0):  # the trace's own times: the load itself may vary
        return fact + ": arrivals outran completions over that window"
    return (fact + ": at a constant rate the queue grows as long as the run lasts, so these latencies grow with "
            "the run's length; `pagesim plan` finds the rate one replica sustains")
