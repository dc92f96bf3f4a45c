"""Replicas on one clock behind a router: each replica an unchanged single-replica simulation
(pagesim.sim.engine.Replay: its own scheduler, KV manager, model, GPU, TP and engine), all on one
SimPy environment, with a router process in front. Replicas that cannot affect one another (a
router that reads no load, nothing else linking them) are replayed apart instead, with the same
outputs (run(): pagesim.cluster.independent).

When the router routes. A request reaches the router when the replicas' front end has taken it
in (its arrival plus the smallest host time per request of the replicas, the time a single
replay submits it at: tokenization, which a prefix-aware router needs too); a replica whose
host time is longer receives it that much later. The router picks a replica from ReplicaLoad
views: waiting and running requests and KV usage read from each replica's scheduler, and the
requests it sent there that have not ended (its own count, always current), through the LoadBoard
(pagesim.cluster.routers.board) that `pagesim route` uses too.

What the router sees, and when:
- staleness_s = 0: the loads are read at every routing decision. Every replica's feed reports
  the cluster's next arrival as its next_time(), so its runs of decode steps end at the step
  during which a request could arrive; a replica's state read at an arrival is therefore that
  at the end of its step in progress, up to one step ahead of the arrival: the router's view
  lags by up to a step, as a real router's (scraping /metrics) does.
- staleness_s = S > 0: the loads are refreshed when the first request at or after the last
  refresh plus S reaches the router, and the router routes then every request that reaches it
  within S, from that view and its own counts as of then plus what it routed since: finishes
  within the window are seen at the next refresh. Replicas then stop only at refreshes and at
  their own requests, so a cluster of N costs about what one replica costs per request. A
  router that reads no load (round-robin) decides the same at any staleness.

P/D disaggregation: a request goes first to a prefill replica as a one-token request (the
prompt and the first token, which vLLM's P/D proxy discards); when it ends there, the router
picks a decode replica, the prompt's KV moves over the link (pagesim.cluster.links: time from
the KV bytes, one transfer at a time per prefill replica) and the decode replica admits it with
its prompt KV present (Request.prompt_kv_moved: blocks allocated for the prompt, only its last
token computed there, which gives the client its first token). A decode replica without room
keeps it waiting in its queue (back-pressure: it waits, nothing is lost). The prefill replica
frees its blocks when its one token is out (the KV's wait for the link is not held against its
pool: a simplification).

Sessions and closed-loop clients (--concurrency): the cluster holds one feed for the whole run
(pagesim.workload.sessions.make_feed, the one a single replay takes): turn k + 1 is released
when turn k ends, on whichever replica, and routed then, with its session id (session-affinity
keys on it). A turn turned away because its session ended is given to the first replica that
takes arrivals, unrouted. Such a release can come at the end of any replica's step, so a
replica's next_time() is also bounded by the earliest step end of the others (or now, for one
that has work and has not started its step): its decode runs then never pass a release that
another replica's finish creates, and outputs equal stepping one step at a time
(fast_forward=False). Under P/D a request ends for its client when it ends on its decode replica:
that end (plus the think time) releases the session's next turn or the client's next request,
which is routed to a prefill stage again (session affinity keys the prefill choice on the session;
the decode stage's router instance picks as it does for any hand-off). A prefill that finishes
releases nothing; one that fails (refused, aborted) ends the session there, as a failure on a
co-located replica does.
"""

from __future__ import annotations

import heapq
import math
from array import array
from dataclasses import dataclass, replace

import simpy

from pagesim.cluster.independent import in_clock_order
from pagesim.cluster.links import LinkQueue, make_link, moved_bytes_per_token
from pagesim.cluster.routers import Gauges, LoadBoard, RoutedRequest, make_router, prefix_keys
from pagesim.cluster.spec import ClusterSpec
from pagesim.core import SamplingParams
from pagesim.sim.engine import Replay, shared_workload
from pagesim.sim.releases import Releases, event_at
from pagesim.workload.feeds import RequestFeed
from pagesim.workload.requests import time_origin
from pagesim.workload.sessions import has_sessions, make_feed, session_labels
from pagesim.workload.trace import Trace

PREFILL_SAMPLING = {}  # max_tokens=1 sampling params, shared


@dataclass
class Replica:
    index: int
    group: str
    role: str
    sim: Replay
    feed: "ReplicaFeed"


@dataclass(slots=True)
class Handoff:
    """A P/D request between its prefill and its decode."""

    prefill: int  # replica indices
    decode: int
    prefill_record: object  # its RequestRecord on the prefill replica
    prefill_end: float  # when its token was out there
    link_start: float
    link_end: float


class ReplicaFeed:
    """A replica's feed (pagesim.workload.feeds.Feed): the requests the cluster routed to it, each
    at the time it enters; and, as next_time(), the earliest time one could still enter."""

    static = False

    def __init__(self, cluster: "Cluster", index: int, host_offset: float) -> None:
        self.cluster, self.index = cluster, index
        self.host_s = 0.0  # its own host time per request (set once the replica is built)
        self.host_offset = host_offset  # the router's host time minus this replica's (<= 0)
        self.pending: list = []  # heap of (enters at, order, request) routed here, not entered yet
        self.decode = False  # receives hand-offs (P/D): they may come whenever a prefill ends

    def next_time(self) -> float:
        """(The replica adds its own host time to this.)"""
        cluster = self.cluster
        t = cluster.feed.next_time()
        if cluster.dynamic:
            t = min(t, cluster.next_release_bound(self.index) - self.host_s)
        if self.decode:
            # a hand-off enters after a prefill step ends, and a prefill step starts at the
            # earliest when a request reaches a prefill replica: the earliest of those bounds it
            t = min(t, cluster.next_prefill_end()) - self.host_s
        elif self.host_offset:
            t += self.host_offset
        if self.pending:
            t = min(t, self.pending[0][0] - self.host_s)
        return t

    def pop(self):
        return heapq.heappop(self.pending)[2]

    @property
    def exhausted(self) -> bool:
        cluster = self.cluster
        return cluster.feed.exhausted and not self.pending and not (self.decode and cluster.num_prefilling)

    def on_finished(self, request, now: float, outcome=None) -> None:
        self.cluster.on_finished(self.index, request, now, outcome)

    def reject_reason(self, request) -> str | None:
        return None  # (the cluster submits its requests itself)


class Cluster:
    """Build with the spec and the trace, then run(): a ClusterResult (pagesim.cluster.results)."""

    def __init__(self, spec: ClusterSpec, trace: Trace, keep_steps: bool = True, cost_models: dict | None = None,
                 fast_forward: bool = True, independent: bool = True):
        """cost_models: {group name: CostModel} to use instead of the configurations' (tests).
        fast_forward=False: every replica takes its decode steps one at a time (tests).
        independent=False: one clock even where the replicas cannot affect one another (tests;
        run() otherwise replays such replicas one by one: pagesim.cluster.independent)."""
        spec.check()
        self.spec = spec
        first = spec.groups[0].cfg
        self.pd = any(g.role == "prefill" for g in spec.groups)
        # releases follow ends (sessions, closed loop)
        self.dynamic = has_sessions(trace) or first.concurrency is not None
        self.router = make_router(spec.router, **spec.router_params)
        self.coupled_by = _coupled_by(spec, self.router, self.pd, self.dynamic)
        self.independent = independent and self.coupled_by is None  # (run() replays them apart)
        # built once, shared by every replica; apart: each built where it is replayed
        # (pagesim.workload.requests.Workload)
        self.workload = shared_workload(first, trace, built=not self.independent)
        self.requests = self.workload[0]
        self.feed = make_feed(trace, self.requests, first.concurrency, time_origin(self.requests, first.rate),
                              sessions_at_rate=first.rate is not None) if self.dynamic else RequestFeed(self.requests)
        self.session_of = {rid: name for rid, (name, _turn) in session_labels(trace, self.requests).items()}
        self._unrouted: set[int] = set()  # turns turned away unrouted (their session ended)
        if self.pd:
            _check_pd_requests(self.requests)
        self.replicas: list[Replica] = []
        for group in spec.groups:
            # A group's replicas share one cost model: it is a pure function of the group's model,
            # GPU and engine (its memos of step parts fill once, not once per replica)
            cost = (cost_models or {}).get(group.name)
            # autoscaled: every replica the fleet may hold is built; the fleet says which exist
            for _ in range(spec.autoscale.max_replicas if spec.autoscale else group.count):
                index = len(self.replicas)
                feed = ReplicaFeed(self, index, 0.0)
                sim = Replay(group.cfg, trace, cost_model=cost, keep_steps=keep_steps,
                             feed=feed, requests=self.workload, fast_forward=fast_forward and not spec.lockstep)
                cost = sim.cost
                feed.host_s = sim.request_host_s
                sim.on_progress = lambda done, k=index: self._recorded(k)
                feed.decode = group.role == "decode"
                self.replicas.append(Replica(index, group.name, group.role, sim, feed))
        if spec.lockstep:
            from pagesim.cluster.lockstep import LockstepCost, LockstepGroup

            group = LockstepGroup(len(self.replicas))
            for r in self.replicas:
                r.sim.cost = LockstepCost(r.sim.cost, group, r.index, lambda: self.env.now)
        entry = [r for r in self.replicas if r.role != "decode"]
        self.entry_index = entry[0].index  # where a turn turned away unrouted is recorded
        self.host_s = min(r.sim.request_host_s for r in entry)  # when a request reaches the router
        self.releases = Releases(self.feed, self.host_s)
        for r in self.replicas:
            if r.role != "decode":
                r.feed.host_offset = self.host_s - r.sim.request_host_s
        # P/D: the decode replica is chosen by a second instance (each stage's choices its own memory)
        self.decode_router = make_router(spec.router, **spec.router_params) if self.pd else None
        # the loads as the router sees them, and its outstanding counts (the board pagesim route uses
        # too); the cluster refreshes it on its own schedule (_refresh), never through route()
        self.board = LoadBoard(len(self.replicas), spec.staleness_s)
        self._accepting_for: tuple | None = None  # (roles, fleet states) the board's accepting flags were set for
        self.block_size = first.block_size
        self.fleet = None
        if spec.autoscale is not None:
            from pagesim.cluster.fleet import Fleet, gpus_per_replica

            self.fleet = Fleet(spec.autoscale, [gpus_per_replica(r.sim.cfg) for r in self.replicas], spec.groups[0].count)
        # finished requests in the order they left, with their replicas (decode: -1 where none)
        self.records: list = []  # a RequestRecord, or (prefill's, decode's) for a P/D request
        self.record_replica, self.record_decode = array("i"), array("i")
        self.record_time = array("d")  # when each left
        self.handoffs: dict[int, Handoff] = {}  # request id -> its P/D hand-off, once it is on a decode replica
        self.pd_done: list[Handoff] = []
        self.num_prefilling = 0  # requests routed to a prefill replica that have not left it
        self._originals: dict[int, object] = {}  # request id -> the request, while it prefills
        self._order = 0
        self.on_progress = None  # callable(requests done) for progress bars
        self.end_time = None  # when the run ended (its last engine), once it has
        self._prefill_step_end = {r.index: -math.inf for r in self.replicas if r.role == "prefill"}
        self._links = {}
        if self.pd:
            for r in self.replicas:
                if r.role == "prefill":
                    r.sim.on_step = self._prefill_step_hook(r.index)
            self._link_queues = {r.index: LinkQueue() for r in self.replicas if r.role == "prefill"}
        # the end of each replica's step (or decode run) in progress, where a finish may release a turn
        self._step_end = [-math.inf] * len(self.replicas)
        if self.dynamic:
            for r in self.replicas:
                r.sim.on_step = self._step_hook(r.index)
                r.sim.on_decode_run = self._decode_run_hook(r.index)

    # -- the run ----------------------------------------------------------------------------
    def run(self, jobs: int | None = None):
        """jobs: processes to replay independent replicas in (default: the CPUs this process may use)."""
        if self.independent:
            from pagesim.cluster.independent import run_apart

            return run_apart(self, jobs)
        env = simpy.Environment()
        env.run(until=self.launch(env))
        return self.finish()

    def launch(self, env: simpy.Environment):
        """Start the router, the replicas' engines (and the autoscaler) on env; returns the event
        the run ends with (every engine done). run() runs env until it; a caller may instead run
        env in stretches (env.run(until=event)), pausing the cluster between them without
        changing what it simulates (pagesim.plan.continued.ContinuedCluster)."""
        self.env = env
        env.process(self._route(env))  # (first, as a single replay starts its arrivals first)
        engines = [r.sim.start(env) for r in self.replicas]
        if self.fleet is not None:
            env.process(self.fleet.process(env, self))
        return simpy.AllOf(env, engines)

    def finish(self):
        """The ClusterResult, once the run has ended."""
        from pagesim.cluster.results import ClusterResult

        in_clock_order(self, self.records, self.record_time, self.record_replica, self.record_decode)
        self.end_time = self.env.now
        return ClusterResult(self, [r.sim.finish() for r in self.replicas])

    def _route(self, env: simpy.Environment):
        """Route each request when it reaches the router (as Replay's own arrivals process
        submits them: the same arithmetic, so a one-replica cluster runs the same events)."""
        feed, staleness = self.feed, self.spec.staleness_s
        while (yield from self.releases.wait(env)):
            now = env.now
            self._refresh(now)
            self._take(feed.pop(), now)
            if staleness:  # the rest of the window, from the same view
                until = now + staleness
                while not feed.exhausted and (enters := feed.next_time() + self.host_s) < until:
                    self._take(feed.pop(), max(now, enters))
        for r in self.replicas:
            r.sim.wake()  # the feeds ran dry: idle engines see that they are done

    def _take(self, request, enters: float) -> None:
        """A released request: routed, or (a turn whose session ended) turned away on replica 0."""
        reason = self.feed.reject_reason(request)
        if reason is None:
            self._route_arrival(request, enters)
            return
        self._unrouted.add(request.request_id)
        self.replicas[self.entry_index].sim.submit(request, reason)

    def _refresh(self, now: float) -> None:
        self.board.refresh(now, self._gauges)

    def _gauges(self, index: int) -> Gauges:
        sched = self.replicas[index].sim.scheduler
        kv = sched.kv
        return Gauges(len(sched.waiting), len(sched.running),
                      kv.num_used_blocks / kv.num_device_blocks if kv.num_device_blocks else 0.0)

    def _choose(self, routed: RoutedRequest, roles: tuple[str, ...], now: float) -> int:
        # which replicas accept follows from the roles asked for and the fleet's states alone: the
        # board's flags are set again only when those changed (not N flags for every request)
        accepting_for = (roles, tuple(self.fleet.state) if self.fleet is not None else None)
        if accepting_for != self._accepting_for:
            self._accepting_for = accepting_for
            for r in self.replicas:
                self.board.set_accepting(r.index, r.role in roles and (self.fleet is None or self.fleet.accepting(r.index)))
        router = self.decode_router if roles == ("decode",) else self.router
        index = self.board.route(router, routed, now)
        if not self.board.loads[index].accepting:
            raise RuntimeError(f"router {self.spec.router!r} chose replica {index}, which does not take "
                               f"{'/'.join(roles)} requests now")
        return index

    def _routed_request(self, request) -> RoutedRequest:
        return self.routed_request(request.request_id, request.prompt_len, request.prompt_token_ids)

    def routed_request(self, request_id: int, prompt_len: int, prompt_token_ids) -> RoutedRequest:
        """What the router knows of a request, from its fields (without it: pagesim.cluster.independent)."""
        keys = prefix_keys(prompt_token_ids, self.block_size) if prompt_token_ids else ()
        return RoutedRequest(request_id, prompt_len, keys, self.session_of.get(request_id))

    def _route_arrival(self, request, enters: float) -> None:
        self._deliver(*self.place(request, enters))

    def place(self, request, enters: float) -> tuple[Replica, object, float]:
        """Route a request that reaches the router at `enters`: the replica, the request as it
        enters there (a prefill replica's: one token) and when it enters (the replica's host time)."""
        replica, at = self.entry(self._routed_request(request), enters)
        if replica.role == "prefill":
            self._originals[request.request_id] = request
            self.num_prefilling += 1
            request = replace(request, sampling=_prefill_sampling(request.sampling))
        return replica, request, at

    def entry(self, routed: RoutedRequest, enters: float) -> tuple[Replica, float]:
        """The replica (mixed or prefill) a request reaching the router at `enters` goes to, and when it enters."""
        replica = self.replicas[self._choose(routed, ("mixed", "prefill"), enters)]
        return replica, enters - replica.feed.host_offset

    def _deliver(self, replica: Replica, request, at: float) -> None:
        """The request enters the replica at `at` (now, or later through a timeout)."""
        env = self.env
        if at <= env.now and not replica.feed.pending:
            replica.sim.submit(request)
            return
        self._order += 1
        heapq.heappush(replica.feed.pending, (at, self._order, request))
        timer = event_at(env, at)
        timer.callbacks.append(lambda _event, r=replica: r.sim.submit(r.feed.pop()))

    # -- ends -------------------------------------------------------------------------------
    def on_finished(self, index: int, request, now: float, outcome=None) -> None:
        """The end of a request on replica `index` reached its client (and the router, which
        proxies it): at once, or where the engine delivers tokens a step late, when the next step
        ends (Replay._done). A session's next turn may be released by it."""
        replica = self.replicas[index]
        if request.request_id in self._unrouted:
            self._unrouted.discard(request.request_id)
        else:
            self.board.finished(self.decode_router if replica.role == "decode" else self.router, request.request_id,
                                index, now)
        if self.fleet is not None:
            self.fleet.check_drained(index, self.board.loads[index].outstanding, now)
        if self.dynamic and (replica.role != "prefill" or (outcome is not None and outcome.failure is not None)):
            # (a finished prefill is no end for its client: its decode replica's end is)
            self.releases.on_finished(request, now, outcome)

    def _recorded(self, index: int) -> None:
        """Replica `index` just recorded a request that left it (its on_progress hook): the
        cluster's records keep that order, and a finished prefill hands its KV off now, when its
        step ended (the KV is ready then, whenever the client hears of the token)."""
        replica = self.replicas[index]
        record = replica.sim.metrics.requests[-1]
        rid = record.request_id
        if replica.role == "prefill":
            original = self._originals.pop(rid, None)  # (None: a turn turned away unrouted)
            if original is not None:
                self.num_prefilling -= 1
                if record.status == "finished":
                    self._hand_off(index, original, record, self.env.now)
                    return
            if not self.num_prefilling and self.feed.exhausted:
                self._wake_decoders()
        if replica.role == "decode":
            handoff = self.handoffs.pop(rid)
            self.pd_done.append(handoff)
            self._keep((handoff.prefill_record, record), handoff.prefill, index)
            return
        self._keep(record, index, -1)

    def _keep(self, record, replica: int, decode: int) -> None:
        self.records.append(record)
        self.record_replica.append(replica)
        self.record_decode.append(decode)
        self.record_time.append(self.env.now)
        if self.on_progress is not None:
            self.on_progress(len(self.records))

    def _hand_off(self, prefill: int, request, record, now: float) -> None:
        if self.spec.staleness_s == 0:
            self._refresh(now)
        decode = self._choose(self._routed_request(request), ("decode",), now)
        source, target = self.replicas[prefill], self.replicas[decode]
        link = self._link(source, target)
        duration = link.transfer_time(request.prompt_len, moved_bytes_per_token(source.sim.cfg, target.sim.cfg))
        start, end = self._link_queues[prefill].schedule(now, duration)
        self.handoffs[request.request_id] = Handoff(prefill, decode, record, now, start, end)
        self._deliver(target, replace(request, prompt_kv_moved=True), end)
        if not self.num_prefilling and self.feed.exhausted:
            self._wake_decoders()

    def _link(self, source: Replica, target: Replica):
        key = (source.group, target.group)
        if key not in self._links:
            spec = self.spec.link_between(*key)
            self._links[key] = make_link(spec.kind, source.sim.cfg.gpu, spec.bandwidth, spec.latency_s)
        return self._links[key]

    def _wake_decoders(self) -> None:
        for r in self.replicas:
            if r.role == "decode":
                r.sim.wake()

    def _prefill_step_hook(self, index: int):
        ends = self._prefill_step_end

        def on_step(end: float, duration: float, shape) -> None:
            ends[index] = end
        return on_step

    def _step_hook(self, index: int):
        ends, pd_hook = self._step_end, self.replicas[index].sim.on_step

        def on_step(end: float, duration: float, shape) -> None:
            ends[index] = end
            if pd_hook is not None:
                pd_hook(end, duration, shape)
        return on_step

    def _decode_run_hook(self, index: int):
        ends = self._step_end

        def on_decode_run(run_ends, durations, num_seqs, context_tokens) -> None:
            ends[index] = run_ends[-1]  # (a run's requests finish only at its last step)
        return on_decode_run

    def next_release_bound(self, index: int) -> float:
        """No release that a finish on another replica creates can come before this: the earliest
        end of another replica's step in progress; now, where one has work and has not started
        its step yet (it was just woken: its step ends after now); the earliest request waiting to
        enter another replica (an idle one starts a step only then)."""
        return self._next_event((r, self._step_end[r.index]) for r in self.replicas if r.index != index)

    def next_prefill_end(self) -> float:
        """The earliest end of a prefill step in progress, or request about to enter a prefill
        replica (math.inf: none); now, where a prefill replica has work and has not started its
        step yet (a request just entered it): no hand-off can come sooner (an idle prefill replica
        starts a step only when a request enters it)."""
        return self._next_event((self.replicas[i], end) for i, end in self._prefill_step_end.items())

    def _next_event(self, replicas_and_step_ends) -> float:
        """The earliest moment any of these replicas can end a step: a step in progress ends at
        its end; one with work and no step started may end now; an idle one starts a step only
        when its next request enters it (math.inf: none)."""
        now, bound = self.env.now, math.inf
        for replica, end in replicas_and_step_ends:
            if end >= now:
                bound = min(bound, end)
            elif replica.sim.scheduler.has_unfinished:
                return now
            if replica.feed.pending:
                bound = min(bound, replica.feed.pending[0][0])
        return bound


def _coupled_by(spec: ClusterSpec, router, pd: bool, dynamic: bool) -> str | None:
    """What makes the replicas affect one another (None: nothing; pagesim.cluster.independent)."""
    if router.reads_load:
        return f"router {spec.router} reads their loads"
    if pd:
        return "P/D hands each request from a prefill replica to a decode replica"
    if dynamic:
        return "sessions or a closed loop release requests as others end"
    if spec.autoscale is not None:
        return "autoscaling follows their loads"
    if spec.lockstep:
        return "lockstep ranks step together"
    return None


def _prefill_sampling(sampling: SamplingParams) -> SamplingParams:
    shared = PREFILL_SAMPLING.get(sampling.ignore_eos)
    if shared is None:
        shared = PREFILL_SAMPLING[sampling.ignore_eos] = SamplingParams(max_tokens=1, ignore_eos=sampling.ignore_eos)
    return shared


def _check_pd_requests(requests) -> None:
    for r in requests:
        if r.sampling.num_seqs > 1:
            raise ValueError(f"request {r.request_id}: P/D disaggregation serves single-sequence requests; this one "
                             f"asks for {r.sampling.num_seqs} sequences (n or beam width)")
