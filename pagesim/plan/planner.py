"""A whole plan: each configuration's capacity (a search), replicas and cost, and the pick.

Definitions (also in docs/plan.md and every report):
- capacity: the highest sustainable rate of one replica (pagesim.plan.search, pagesim.plan.run);
- replicas = ceil(target / (capacity * (1 - min_headroom)));
- headroom = 1 - target / (replicas * capacity): the spare share of the deployed capacity;
- operating point: one replica at target / replicas req/s, simulated once more; its KV
  utilization, preemptions per request and latencies are the ones reported;
- cost per hour = replicas * tp * price per GPU-hour;
- cost per million output tokens = cost per hour / (target * mean output tokens per request
  * 3600) * 1e6.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from pagesim.plan.cache import RunCache
from pagesim.plan.grid import GridPoint, RunSettings
from pagesim.plan.prices import PriceTable
from pagesim.plan.run import Evaluation, RateEvaluator
from pagesim.plan.search import SearchSettings, bracket_search
from pagesim.plan.slo import SLO
from pagesim.workload.trace import Trace


@dataclass
class ConfigJob:
    """Everything one configuration's search needs; picklable (process pool, Ray)."""

    point: GridPoint
    settings: RunSettings
    search: SearchSettings
    slos: list[SLO]
    target_rate: float
    min_headroom: float
    trace: Trace
    trace_digest: str
    cache_dir: str | None


@dataclass
class ConfigResult:
    point: GridPoint
    capacity: float | None  # req/s per replica; None: infeasible
    reason: str | None  # why infeasible
    limiting: list[str]  # what failed just above the capacity (or at the lowest rate tried)
    capped: bool
    replicas: int | None
    headroom: float | None
    operating: Evaluation | None
    points: list[Evaluation]  # every evaluated rate, sorted by rate
    num_simulated: int
    num_cached: int
    # filled by price_results()
    usd_per_gpu_hour: float | None = None
    cost_per_hour: float | None = None
    cost_per_m_output_tokens: float | None = None

    @property
    def feasible(self) -> bool:
        return self.capacity is not None

    @property
    def num_gpus(self) -> int | None:
        return None if self.replicas is None else self.replicas * self.point.tp

    def best_values(self) -> dict[str, float | None]:
        """The SLO values at the lowest rate evaluated (what an infeasible one came closest to)."""
        ok = [p for p in self.points if p.error is None]
        return ok[0].values if ok else {}

    def to_dict(self) -> dict:
        """What the search found; not how many runs the cache supplied (so plan.json reproduces)."""
        skip = ("operating", "points", "num_simulated", "num_cached")
        d = {k: v for k, v in asdict(self).items() if k not in skip}
        d["operating"] = self.operating.to_dict() if self.operating else None
        d["points"] = [p.to_dict() for p in self.points]
        return d


def plan_config(job: ConfigJob) -> ConfigResult:
    """Search one configuration. Deterministic: the same job gives the same result anywhere."""
    evaluator = RateEvaluator(job.settings, job.point, job.trace, job.trace_digest, job.slos, RunCache(job.cache_dir))
    memo: dict[float, Evaluation] = {}

    def evaluate(rate: float) -> Evaluation:
        if rate not in memo:
            memo[rate] = evaluator(rate)
        return memo[rate]

    first = evaluate(job.search.start_rate)
    if first.error is not None:  # does not fit, or cannot run at all: no point searching
        return ConfigResult(job.point, None, first.error, ["error"], False, None, None, None, [first],
                            evaluator.num_simulated, evaluator.num_cached)
    found = bracket_search(evaluate, job.search)
    points = sorted(memo.values(), key=lambda e: e.rate)
    if found.rate is None:
        lowest = found.upper
        reason = f"no rate >= {job.search.min_rate:g} req/s meets every condition (fails {', '.join(lowest.violations)})"
        return ConfigResult(job.point, None, reason, lowest.violations, False, None, None, None, points,
                            evaluator.num_simulated, evaluator.num_cached)
    capacity = found.rate
    replicas = math.ceil(job.target_rate / (capacity * (1 - job.min_headroom)))
    headroom = 1 - job.target_rate / (replicas * capacity)
    operating = evaluate(job.target_rate / replicas)
    points = sorted(memo.values(), key=lambda e: e.rate)
    limiting = found.upper.violations if found.upper is not None else []
    return ConfigResult(job.point, capacity, None, limiting, found.capped, replicas, headroom, operating, points,
                        evaluator.num_simulated, evaluator.num_cached)


def price_results(results: list[ConfigResult], prices: PriceTable, target_rate: float) -> None:
    for r in results:
        r.usd_per_gpu_hour = prices.price(r.point.gpu)
        if not r.feasible or r.usd_per_gpu_hour is None:
            continue
        r.cost_per_hour = r.replicas * r.point.tp * r.usd_per_gpu_hour
        mean_out = r.operating.stats.get("mean_output_len") if r.operating and r.operating.error is None else None
        if mean_out:
            tokens_per_hour = target_rate * mean_out * 3600
            r.cost_per_m_output_tokens = r.cost_per_hour / tokens_per_hour * 1e6


def ranked(results: list[ConfigResult]) -> list[ConfigResult]:
    """Feasible and priced configurations, cheapest first; ties broken by more headroom, then
    fewer GPUs, then grid order (stable), so the pick is deterministic."""
    ok = [r for r in results if r.feasible and r.cost_per_hour is not None]
    return sorted(ok, key=lambda r: (round(r.cost_per_hour, 9), -r.headroom, r.num_gpus))


@dataclass
class Plan:
    model: str
    trace_path: str
    trace_digest: str
    trace_name: str
    target_rate: float
    slos: list[SLO]
    settings: RunSettings
    search: SearchSettings
    min_headroom: float
    prices: PriceTable
    command: str
    results: list[ConfigResult]
    backend: str = "local"

    @property
    def ranking(self) -> list[ConfigResult]:
        return ranked(self.results)

    @property
    def recommendation(self) -> ConfigResult | None:
        r = self.ranking
        return r[0] if r else None

    @property
    def runner_up(self) -> ConfigResult | None:
        """The cheapest on other hardware (another GPU or tp) than the recommendation: the real
        alternative; variants of the recommended hardware (block size, preemption mode, max
        sequences) are in the table and the sensitivity section. Falls back to the second
        cheapest when every feasible configuration shares the recommendation's hardware."""
        r = self.ranking
        if len(r) < 2:
            return None
        hardware = (r[0].point.gpu, r[0].point.tp)
        return next((x for x in r[1:] if (x.point.gpu, x.point.tp) != hardware), r[1])

    def table(self) -> list[dict]:
        """The all-configurations table (what the backends must agree on)."""
        rows = []
        for r in self.results:
            op = r.operating
            rows.append({
                "gpu": r.point.gpu, "tp": r.point.tp, "block_size": r.point.block_size,
                "preemption": r.point.preemption, "max_num_seqs": r.point.max_num_seqs,
                "capacity_rps": r.capacity, "replicas": r.replicas, "gpus": r.num_gpus,
                "cost_per_hour": r.cost_per_hour, "cost_per_m_output_tokens": r.cost_per_m_output_tokens,
                "headroom": r.headroom,
                "kv_utilization": op.stats.get("mean_kv_utilization") if op else None,
                "preemptions_per_request": op.preemptions_per_request if op else None,
                "limiting": r.limiting, "reason": r.reason,
                "operating_values": op.values if op else None,
            })
        return rows

    def to_dict(self) -> dict:
        return {
            "command": self.command, "model": self.model, "trace": self.trace_path, "trace_sha256": self.trace_digest,
            "target_rate": self.target_rate, "slos": [s.describe() for s in self.slos],
            "settings": asdict(self.settings), "search": asdict(self.search), "min_headroom": self.min_headroom,
            "prices": {"file": self.prices.path, "retrieved": self.prices.retrieved,
                       "usd_per_gpu_hour": self.prices.usd_per_gpu_hour},
            "recommendation": self.recommendation.point.label if self.recommendation else None,
            "runner_up": self.runner_up.point.label if self.runner_up else None,
            "table": self.table(),
            "results": [r.to_dict() for r in self.results],
        }
