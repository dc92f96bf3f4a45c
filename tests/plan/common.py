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
# A pass there needs 50 measured requests and a probe runs at most 1280 (a p99 needs 800: the planner's defaults, 1000
# and 40,000, judge real capacities; tests/plan/test_steady.py checks those rules).
TINY_RUNS = RunSettings("llama-2-7b", num_requests=80, min_duration_s=0.0, min_measured_requests=50,
                        max_requests_per_probe=1280)
# the same as CLI flags, with one seed and no longer check
TINY_FLAGS = ["--num-requests", "80", "--min-duration", "0", "--min-measured", "50", "--max-requests", "1280",
              "--seeds", "1", "--check-longer", "0"]
