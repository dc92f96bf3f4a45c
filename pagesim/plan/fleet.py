"""Fleets sized by simulating the whole cluster (`pagesim plan --fleet`; docs/plan.md).

The plan's ideal fleet multiplies one replica: replicas = ceil(target / capacity) assumes a
router that balances perfectly. Here, for one configuration and one fleet shape (a router, the
delay of its view of the loads, and co-located replicas or a P:D ratio of prefill to decode
replicas), the cluster (pagesim.cluster)
is simulated at the target rate with the plan's own steady-state probe
(pagesim.plan.run.probe_steady over checkpoints of one continued cluster run per count:
pagesim.plan.continued_cluster), and the smallest count
that sustains the target within the SLOs is searched for:
- the count moves in units: one replica co-located, P + D replicas for a P:D ratio;
- the search starts at the ideal (in units, rounded up) and steps down while the count below
  still sustains the target, or up until one does, at most MAX_UNITS_FACTOR x the start;
- router cost = (replicas found - ideal replicas) x tp x price: what the router and the load
  imbalance cost against perfect balancing (negative where a router does better than
  independent replicas, e.g. round-robin smoothing Poisson arrivals).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from pagesim.cluster.results import imbalance
from pagesim.cluster.routers import ROUTERS
from pagesim.cluster.spec import ClusterSpec, LinkSpec, ReplicaGroup
from pagesim.core.errors import CannotServe
from pagesim.plan.cache import RunCache, checkpoint_key, code_tag
from pagesim.plan.continued_cluster import ContinuedCluster
from pagesim.plan.run import LIVE_REPLAYS, Evaluation, checkpoint_record, probe_steady, record_problem

DEFAULT_ROUTERS = ("round-robin", "least-outstanding", "prefix-affinity")
MAX_UNITS_FACTOR = 4  # the count search gives up above this many times its start (plus one)
_PD = re.compile(r"^(\d+):(\d+)$")
_FLEET_CODE = ("cluster",), ("plan/run.py", "plan/steady.py", "plan/cache.py", "plan/fleet.py", "plan/continued.py",
                             "plan/continued_cluster.py")


@dataclass(frozen=True)
class FleetShape:
    """A router in front of co-located replicas (pd None) or of P:D prefill and decode replicas.
    staleness_s: the router's view of the loads is refreshed this often (ClusterSpec.staleness_s,
    `replay --staleness`; 0: read at every decision)."""

    router: str
    pd: tuple[int, int] | None = None
    staleness_s: float = 0.0

    @property
    def label(self) -> str:
        stale = f", view {self.staleness_s:g} s stale" if self.staleness_s else ""
        return f"{self.router}, " + ("co-located" if self.pd is None else f"P:D {self.pd[0]}:{self.pd[1]}") + stale

    @property
    def unit(self) -> int:
        """Replicas per step of the count search."""
        return 1 if self.pd is None else sum(self.pd)

    def groups(self, cfg, units: int) -> list[ReplicaGroup]:
        if self.pd is None:
            return [ReplicaGroup("replicas", cfg, units)]
        return [ReplicaGroup("prefill", cfg, self.pd[0] * units, "prefill"),
                ReplicaGroup("decode", cfg, self.pd[1] * units, "decode")]

    def spec(self, cfg, units: int) -> ClusterSpec:
        links = [] if self.pd is None else [LinkSpec("prefill", "decode")]
        return ClusterSpec(self.groups(cfg, units), self.router, {}, self.staleness_s, links)

    def counts(self, units: int) -> str:
        return f"{units}" if self.pd is None else f"{self.pd[0] * units}P + {self.pd[1] * units}D"


def parse_fleet(routers: str, pds: str, staleness_s: float = 0.0) -> list[FleetShape]:
    """Every router x P:D choice from the flags' comma lists (`none`: co-located), each router
    seeing the loads staleness_s late; ValueError naming the flag and the value."""
    if not staleness_s >= 0 or math.isinf(staleness_s):
        raise ValueError(f"--staleness: must be a finite number of seconds >= 0, got {staleness_s!r}")
    names = [r.strip() for r in routers.split(",") if r.strip()]
    if not names:
        raise ValueError("--router: no router given")
    for name in names:
        if name not in ROUTERS:
            raise ValueError(f"--router: unknown router {name!r}; known: {', '.join(sorted(ROUTERS))}")
    ratios: list[tuple[int, int] | None] = []
    for text in (p.strip() for p in pds.split(",")):
        if text == "none":
            ratios.append(None)
            continue
        match = _PD.match(text)
        if not match or int(match[1]) < 1 or int(match[2]) < 1:
            raise ValueError(f"--pd: {text!r} is neither none nor P:D with two whole numbers >= 1 (e.g. 1:3)")
        ratios.append((int(match[1]), int(match[2])))
    shapes = [FleetShape(r, pd, staleness_s) for r in names for pd in ratios]
    return list(dict.fromkeys(shapes))


@dataclass
class FleetResult:
    """The smallest fleet of one shape found to sustain the target (FleetResult.replicas None:
    none up to the search's cap, or the configuration cannot run as a cluster)."""

    shape: FleetShape
    ideal_replicas: int  # ceil(target / single-replica capacity), as the plan computes
    units: int | None
    replicas: int | None
    evaluation: Evaluation | None  # at the count found
    below: Evaluation | None  # at one unit fewer (why not fewer), None at one unit
    tried: dict[int, bool] = field(default_factory=dict)  # units -> sustainable
    reason: str | None = None
    num_simulated: int = 0
    # filled by price_fleet()
    cost_per_hour: float | None = None
    router_cost_per_hour: float | None = None  # against the ideal fleet

    @property
    def extra_replicas(self) -> int | None:
        return None if self.replicas is None else self.replicas - self.ideal_replicas

    @property
    def imbalance(self) -> dict:
        return (self.evaluation.stats.get("imbalance") or {}) if self.evaluation else {}

    def to_dict(self) -> dict:
        return {"router": self.shape.router, "pd": list(self.shape.pd) if self.shape.pd else None,
                "staleness_s": self.shape.staleness_s, "label": self.shape.label, "ideal_replicas": self.ideal_replicas, "units": self.units,
                "replicas": self.replicas, "extra_replicas": self.extra_replicas, "imbalance": self.imbalance,
                "tried": {str(k): v for k, v in sorted(self.tried.items())}, "reason": self.reason,
                "cost_per_hour": self.cost_per_hour, "router_cost_per_hour": self.router_cost_per_hour,
                "evaluation": self.evaluation.to_dict() if self.evaluation else None,
                "below": self.below.to_dict() if self.below else None}


class FleetEvaluator:
    """evaluate(units): the steady-state probe of one shape's cluster at the job's target rate,
    over cached checkpoints of one continued cluster run per count (pagesim.plan.continued_cluster,
    as a replica's probe continues one replay). cost_models: {group name: CostModel} instead of
    the settings' (tests)."""

    def __init__(self, job, shape: FleetShape, cost_models: dict | None = None):
        self.job, self.shape, self.cost_models = job, shape, cost_models
        self.cache = RunCache(job.cache_dir if cost_models is None else None)
        self.num_simulated = 0
        self.runs: dict[int, ContinuedCluster] = {}  # units -> its continued run, oldest first

    def record(self, units: int, num_requests: int) -> dict:
        """The record of the first num_requests of the continued cluster run of `units` over the
        probe's cap of arrivals, from the cache or simulated (and cached)."""
        job, rate = self.job, self.job.target_rate
        cfg = job.settings.replay_config(job.point, rate, max(num_requests, job.settings.max_requests_per_probe))
        shape = self.shape
        what = (f"{job.trace_digest} fleet {shape.router} {shape.counts(units)} staleness {shape.staleness_s!r} "
                f"code {code_tag(*_FLEET_CODE)}")
        key = checkpoint_key(cfg, what, num_requests)
        record = self.cache.get(key)
        if record is None or record_problem(record, rate) is not None:
            record = self._checkpoint(cfg, units, num_requests)
            self.cache.put(key, record)
            self.num_simulated += 1
        return record

    def _checkpoint(self, cfg, units: int, num_requests: int) -> dict:
        run = self.runs.pop(units, None)
        if run is None or run.cfg != cfg:
            try:  # (a ValueError here: a trace the cluster cannot replay, e.g. n > 1 under P/D)
                run = ContinuedCluster(self.shape.spec(cfg, units), self.job.trace, self.job.settings.warmup_fraction,
                                       self.cost_models)
            except (CannotServe, ValueError) as e:
                return {"rate": cfg.rate, "error": str(e)}
        try:
            checkpoint = run.checkpoint(num_requests)
        except CannotServe as e:
            return {"rate": cfg.rate, "error": str(e)}
        self.runs[units] = run
        while len(self.runs) > LIVE_REPLAYS:
            self.runs.pop(next(iter(self.runs)))
        record = checkpoint_record(cfg.rate, checkpoint)
        record["imbalance"] = self._imbalance(checkpoint.summary["cluster"])
        return record

    def _imbalance(self, section: dict) -> dict:
        """The cluster summary's imbalance figures; under P:D each role's own (a prefill replica
        serves every request once, a decode replica a share), and of each figure the larger."""
        if self.shape.pd is None:
            return section["imbalance"]
        by_role = {}
        start = 0
        for group in section["groups"]:
            end = start + group["count"]
            by_role[group["role"]] = {**imbalance("requests", section["requests_per_replica"][start:end]),
                                      **imbalance("busy", section["busy_s_per_replica"][start:end])}
            start = end
        keys = by_role["prefill"].keys()
        return {k: max((v[k] for v in by_role.values() if v[k] is not None), default=None) for k in keys}

    def __call__(self, units: int) -> Evaluation:
        settings, rate = self.job.settings, self.job.target_rate
        first = settings.requests_at(rate)
        return probe_steady(lambda n: self.record(units, n), first, max(first, settings.max_requests_per_probe),
                            self.job.slos, self.job.search.tolerance, settings.min_measured_requests)


def size_fleet(job, shape: FleetShape, ideal_replicas: int, cost_models: dict | None = None) -> FleetResult:
    """The smallest count of `shape` sustaining job.target_rate (module docstring). `job` is a
    pagesim.plan.planner.ConfigJob."""
    evaluate = FleetEvaluator(job, shape, cost_models)
    memo: dict[int, Evaluation] = {}

    def at(units: int) -> Evaluation:
        if units not in memo:
            memo[units] = evaluate(units)
        return memo[units]

    def done(units: int | None, reason: str | None = None) -> FleetResult:
        ev = memo.get(units) if units else None
        below = memo.get(units - 1) if units else None
        return FleetResult(shape, ideal_replicas, units, units * shape.unit if units else None, ev, below,
                           {u: e.sustainable for u, e in memo.items()}, reason, evaluate.num_simulated)

    start = max(1, math.ceil(ideal_replicas / shape.unit))
    units = start
    if at(units).error is not None:
        return done(None, at(units).error)
    if at(units).sustainable:
        while units > 1 and at(units - 1).sustainable:
            units -= 1
        return done(units)
    while units < MAX_UNITS_FACTOR * start + 1:
        units += 1
        if at(units).sustainable:
            return done(units)
    worst = at(units)
    return done(None, f"not sustained with up to {shape.counts(units)} replicas (fails {', '.join(worst.violations)})")


def price_fleet(fleet: list[FleetResult], usd_per_gpu_hour: float | None, tp: int) -> None:
    if usd_per_gpu_hour is None:
        return
    for f in fleet:
        if f.replicas is not None:
            f.cost_per_hour = f.replicas * tp * usd_per_gpu_hour
            f.router_cost_per_hour = f.extra_replicas * tp * usd_per_gpu_hour
