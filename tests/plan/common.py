"""Small, fast plan inputs shared by the plan tests."""

from __future__ import annotations

from pathlib import Path

from pagesim.plan import RunSettings, SearchSettings
from pagesim.workload.trace import Trace, load_trace

ROOT = Path(__file__).resolve().parents[2]
SHAREGPT = load_trace(ROOT / "traces" / "sharegpt.json")
# The first 200 ShareGPT requests (real lengths).
SMALL_TRACE = Trace(dict(SHAREGPT.metadata, name="sharegpt-first-200", count=200), SHAREGPT.requests[:200])
COARSE = SearchSettings(start_rate=2.0, tolerance=0.05)
# For properties of the search and the backends, where realism does not matter: ~0.05 s a run.
TINY_RUNS = RunSettings("llama-2-7b", num_requests=80, min_duration_s=0.0)
