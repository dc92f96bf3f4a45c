"""A whole plan: each configuration's capacity (a search), replicas and cost, and the pick.

Definitions (also in docs/plan.md and every report):
- capacity: the highest sustainable rate of one replica (pagesim.plan.search, pagesim.plan.run);
- replicas = ceil(target / (capacity * (1 - min_headroom)));
- headroom = 1 - target / (replicas * capacity): the spare share of the deployed capacity;
- operating point: one replica at target / replicas req/s, simulated once more; its KV
  utilization, preemptions per request and latencies are the ones reported;
- cost per hour = replicas * tp * price per GPU-hour;
- cost per million output tokens = cost per hour / (target * mean output tokens per request
  * 3600) * 1e6;
- capacity interval: pagesim.plan.uncertainty (seeds and the cost model's measured error);
- longer check: one replica at the operating point, and at capacity x (1 + LONGER_MARGIN), each
  replayed with `longer_factor` x the run length the plan starts a probe at (requests_at); the
  first must meet the SLOs, the second must not.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from pagesim.plan.cache import RunCache
from pagesim.plan.fleet import FleetResult, FleetShape, price_fleet, size_fleet
from pagesim.plan.grid import GridPoint, RunSettings
from pagesim.plan.prices import PriceTable
from pagesim.plan.run import Evaluation, RateEvaluator, meets_slos
from pagesim.plan.search import SearchSettings, scouted_search
from pagesim.plan.slo import SLO
from pagesim.plan import uncertainty
from pagesim.workload.trace import Trace

LONGER_MARGIN = 0.10  # the longer check's rate above the capacity, which must fail


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
    seeds: int = 3  # arrival seeds the capacity is searched for (settings.seed, +1, ...)
    longer_factor: float = 10.0  # the longer check's run length / a probe's first; 0: no check
    fleet: tuple[FleetShape, ...] = ()  # fleet shapes sized by simulating the cluster (pagesim.plan.fleet)


@dataclass
class LongerCheck:
    """The recommended configuration replayed `factor` x longer (planner module docstring)."""

    factor: float
    operating: Evaluation  # must be sustainable
    above: Evaluation  # at capacity x (1 + LONGER_MARGIN): must not be

    @staticmethod
    def meets(ev: Evaluation) -> bool:
        """The SLOs hold, nothing is rejected and the queue does not grow (one run, so its steady
        state may stay undecided: that is no failure of the check)."""
        return meets_slos(ev)

    @property
    def holds(self) -> bool:
        return self.meets(self.operating) and not self.meets(self.above)

    def to_dict(self) -> dict:
        return {"factor": self.factor, "holds": self.holds, "operating": self.operating.to_dict(),
                "above": self.above.to_dict()}


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
    knee: float | None = None  # the lowest unsustainable rate probed (the bracket is [capacity, knee])
    num_probes: int = 0  # rates the first seed's search judged with full probes
    num_scouts: int = 0  # short scouting probes that located the knee first (pagesim.plan.search)
    seed_capacities: list[float] = field(default_factory=list)  # one per seed, the first seed's first
    capacity_low: float | None = None  # the interval (pagesim.plan.uncertainty)
    capacity_high: float | None = None
    model_error: float | None = None
    model_error_basis: str = ""
    costs: str = ""  # "measured", "scaled from <gpu>" or the cost model
    longer: LongerCheck | None = None
    fleet: list[FleetResult] = field(default_factory=list)  # one per ConfigJob.fleet shape
    # filled by price_results()
    usd_per_gpu_hour: float | None = None
    cost_per_hour: float | None = None
    cost_per_m_output_tokens: float | None = None

    @property
    def feasible(self) -> bool:
        return self.capacity is not None

    @property
    def uncertain_headroom(self) -> bool:
        """The headroom is inside the uncertainty: the operating rate per replica (capacity x
        (1 - headroom) = target / replicas) exceeds the low end of the capacity's interval."""
        return self.capacity_low is not None and self.capacity_low < self.capacity * (1 - self.headroom)

    @property
    def num_gpus(self) -> int | None:
        return None if self.replicas is None else self.replicas * self.point.tp

    def best_values(self) -> dict[str, float | None]:
        """The SLO values at the lowest rate evaluated (what an infeasible one came closest to)."""
        ok = [p for p in self.points if p.error is None]
        return ok[0].values if ok else {}

    def to_dict(self) -> dict:
        """What the search found; not how many runs the cache supplied (so plan.json reproduces)."""
        skip = ("operating", "points", "num_simulated", "num_cached", "longer", "fleet")
        d = {k: v for k, v in asdict(self).items() if k not in skip}
        d["operating"] = self.operating.to_dict() if self.operating else None
        d["longer"] = self.longer.to_dict() if self.longer else None
        d["points"] = [p.to_dict() for p in self.points]
        if self.fleet:  # (a plan without --fleet writes what it wrote before)
            d["fleet"] = [f.to_dict() for f in self.fleet]
        return d


@dataclass
class FirstSearch:
    """What the first seed's search leaves for the stages after it (picklable: a stage may run in
    another process): its result, its full probes by rate, the run lengths its passes were decided
    on, and its run counts; `early`: the configuration's result when the search already decided it
    (it does not fit, or sustains no rate)."""

    found: object  # pagesim.plan.search.SearchResult
    memo: dict[float, Evaluation]
    lengths: dict[float, int]
    counts: tuple[int, int]  # (simulated, cached)
    early: ConfigResult | None = None


@dataclass(frozen=True)
class Stage:
    """One task of a configuration's plan after its first seed's search: the search for another
    arrival seed (seed = its offset, 1, 2 ...), or the operating point and fleets (seed None).
    The seeds' searches start from the first search's state alone, so they run in any order or in
    parallel (pagesim.plan.backends) with the same results; the operating point follows them, its
    probe starting from every seed's run lengths (`lengths`: NEAR rule, pagesim.plan.run)."""

    job: ConfigJob
    first: FirstSearch
    seed: int | None = None
    lengths: dict[float, int] | None = None  # the operating point's: every search's run lengths


@dataclass
class StageAnswer:
    """What a stage hands back: a seed's capacity, or (operating Evaluation, fleet results); its
    run counts (simulated, cached); the run lengths its evaluator's passes were decided on."""

    value: object
    counts: tuple[int, int]
    lengths: dict[float, int]


def _evaluator(job: ConfigJob, lengths: dict[float, int] | None = None) -> RateEvaluator:
    evaluator = RateEvaluator(job.settings, job.point, job.trace, job.trace_digest, job.slos, RunCache(job.cache_dir),
                              job.search.tolerance)
    evaluator.lengths.update(lengths or {})
    return evaluator


def search_first_seed(job: ConfigJob) -> FirstSearch:
    """The scouted search for the plan's own seed (pagesim.plan.search)."""
    evaluator = _evaluator(job)
    memo: dict[float, Evaluation] = {}
    scouts: dict[float, Evaluation] = {}

    def evaluate(rate: float) -> Evaluation:
        if rate not in memo:
            memo[rate] = evaluator(rate)
        return memo[rate]

    def scout(rate: float) -> Evaluation:
        if rate not in scouts:
            scouts[rate] = evaluator.scout(rate)
        return scouts[rate]

    def early(*args, **extra) -> FirstSearch:
        counts = (evaluator.num_simulated, evaluator.num_cached)
        result = ConfigResult(job.point, None, *args, False, None, None, None, sorted(memo.values(), key=lambda e: e.rate),
                              *counts, costs=uncertainty.costs_source(job.point.gpu, job.settings.cost_model), **extra)
        return FirstSearch(None, memo, evaluator.lengths, counts, result)

    first = scout(job.search.start_rate)
    if first.error is not None:  # does not fit, or cannot run at all: no point searching
        memo[first.rate] = first
        return early(first.error, ["error"])
    found = scouted_search(evaluate, scout, job.search)
    if found.rate is None:
        lowest = found.upper
        reason = f"no rate >= {job.search.min_rate:g} req/s meets every condition (fails {', '.join(lowest.violations)})"
        return early(reason, lowest.violations, num_probes=len(found.points), num_scouts=len(found.scouts))
    return FirstSearch(found, memo, evaluator.lengths, (evaluator.num_simulated, evaluator.num_cached))


def stages(job: ConfigJob, first: FirstSearch) -> list[Stage]:
    """The tasks after the first search: one per other seed (side by side); the operating point
    follows them (operating_stage)."""
    if first.early is not None:
        return []
    return [Stage(job, first, s) for s in range(1, job.seeds)]


def operating_stage(job: ConfigJob, first: FirstSearch, seeds: list[StageAnswer]) -> Stage:
    """The operating point's task, once every seed's search has answered: its probe starts at the
    longest length a pass near its rate was decided on in any seed's search (docs/plan.md)."""
    lengths = dict(first.lengths)
    for answer in seeds:
        for rate, n in answer.lengths.items():
            lengths[rate] = max(n, lengths.get(rate, 0))
    return Stage(job, first, None, lengths)


def replicas_needed(job: ConfigJob, capacity: float) -> int:
    """Replicas of `capacity` req/s each for the job's target with its minimum headroom (module docstring)."""
    return math.ceil(job.target_rate / (capacity * (1 - job.min_headroom)))


def run_stage(stage: Stage) -> StageAnswer:
    """A seed's capacity, or (seed None) the operating point and the fleets."""
    job, first = stage.job, stage.first
    evaluator = _evaluator(job, first.lengths if stage.lengths is None else stage.lengths)
    capacity = first.found.rate
    if stage.seed is not None:
        seed = job.settings.seed + stage.seed
        value = uncertainty.seed_capacity(lambda r: evaluator(r, seed).sustainable, capacity, job.search)
    else:
        replicas = replicas_needed(job, capacity)
        rate = job.target_rate / replicas
        operating = first.memo[rate] if rate in first.memo else evaluator(rate)
        value = (operating, [size_fleet(job, shape, replicas) for shape in job.fleet])
    return StageAnswer(value, (evaluator.num_simulated, evaluator.num_cached), evaluator.lengths)


def assemble(job: ConfigJob, first: FirstSearch, done: list[StageAnswer]) -> ConfigResult:
    """The configuration's result from its first search and its stages' answers: the seeds' in
    stages' order, then the operating point's."""
    if first.early is not None:
        return first.early
    found, capacity = first.found, first.found.rate
    seeds = [capacity] + [answer.value for answer in done[:-1]]
    operating, fleet = done[-1].value
    simulated = first.counts[0] + sum(a.counts[0] for a in done)
    cached = first.counts[1] + sum(a.counts[1] for a in done)
    error = uncertainty.model_error(job.point.gpu, job.settings.cost_model)
    low, high = uncertainty.interval([c for c in seeds if c is not None] or [0.0], error.relative)
    if None in seeds:
        low = 0.0
    replicas = replicas_needed(job, capacity)
    headroom = 1 - job.target_rate / (replicas * capacity)
    memo = dict(first.memo)
    memo.setdefault(operating.rate, operating)
    limiting = found.upper.violations if found.upper is not None else []
    return ConfigResult(job.point, capacity, None, limiting, found.capped, replicas, headroom, operating,
                        sorted(memo.values(), key=lambda e: e.rate), simulated, cached,
                        knee=found.upper.rate if found.upper else None, num_probes=len(found.points),
                        num_scouts=len(found.scouts), seed_capacities=seeds,
                        capacity_low=low, capacity_high=high, model_error=error.relative, model_error_basis=error.basis,
                        costs=uncertainty.costs_source(job.point.gpu, job.settings.cost_model), fleet=fleet)


def plan_config(job: ConfigJob) -> ConfigResult:
    """Search one configuration, its stages one after another. Deterministic: the same job gives
    the same result anywhere, and the same as its stages run in parallel (pagesim.plan.backends)."""
    first = search_first_seed(job)
    if first.early is not None:
        return first.early
    seeds = [run_stage(stage) for stage in stages(job, first)]
    return assemble(job, first, seeds + [run_stage(operating_stage(job, first, seeds))])


def check_longer(job: ConfigJob, result: ConfigResult) -> LongerCheck:
    """The longer check of a feasible result (module docstring), with the job it was searched by."""
    evaluator = _evaluator(job)
    length = lambda rate: math.ceil(job.longer_factor * job.settings.requests_at(rate))  # noqa: E731
    at, above = job.target_rate / result.replicas, result.capacity * (1 + LONGER_MARGIN)
    return LongerCheck(job.longer_factor, evaluator.single(at, length(at)), evaluator.single(above, length(above)))


def price_results(results: list[ConfigResult], prices: PriceTable, target_rate: float) -> None:
    for r in results:
        r.usd_per_gpu_hour = prices.price(r.point.gpu)
        price_fleet(r.fleet, r.usd_per_gpu_hour, r.point.tp)
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
    seeds: int = 3
    longer_factor: float = 10.0

    @property
    def ranking(self) -> list[ConfigResult]:
        return ranked(self.results)

    @property
    def fleet_ranking(self) -> list[tuple[ConfigResult, FleetResult]]:
        """Every simulated fleet that sustains the target and has a price, cheapest first (ties:
        fewer replicas, then grid and shape order)."""
        found = [(r, f) for r in self.results for f in r.fleet if f.cost_per_hour is not None]
        return sorted(found, key=lambda rf: (round(rf[1].cost_per_hour, 9), rf[1].replicas))

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
                "capacity_rps": r.capacity, "capacity_low": r.capacity_low, "capacity_high": r.capacity_high,
                "knee_rps": r.knee, "probes": r.num_probes, "costs": r.costs, "replicas": r.replicas, "gpus": r.num_gpus,
                "cost_per_hour": r.cost_per_hour, "cost_per_m_output_tokens": r.cost_per_m_output_tokens,
                "headroom": r.headroom,
                "kv_utilization": op.stats.get("mean_kv_utilization") if op else None,
                "preemptions_per_request": op.preemptions_per_request if op else None,
                "limiting": r.limiting, "reason": r.reason,
                "operating_values": op.values if op else None,
            })
        return rows

    def to_dict(self) -> dict:
        fleet = self.fleet_ranking
        extra = {"fleet_recommendation": {"configuration": fleet[0][0].point.label, **fleet[0][1].to_dict()}} \
            if fleet else {}
        return extra | {
            "command": self.command, "model": self.model, "trace": self.trace_path, "trace_sha256": self.trace_digest,
            "target_rate": self.target_rate, "slos": [s.describe() for s in self.slos],
            "settings": asdict(self.settings), "search": asdict(self.search), "min_headroom": self.min_headroom,
            "seeds": self.seeds, "longer_factor": self.longer_factor,
            "prices": {"file": self.prices.path, "retrieved": self.prices.retrieved,
                       "usd_per_gpu_hour": self.prices.usd_per_gpu_hour},
            "recommendation": self.recommendation.point.label if self.recommendation else None,
            "runner_up": self.runner_up.point.label if self.runner_up else None,
            "table": self.table(),
            "results": [r.to_dict() for r in self.results],
        }
