"""The simulator: a SimPy replay of a trace through the unchanged engine core.

Two processes share one virtual clock. `arrivals` submits each request at its arrival time;
`engine` loops schedule -> cost -> update, where a step's duration comes from the cost model
and every sequence produces exactly its trace output length (no EOS), as in the paper.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from dataclasses import asdict, dataclass, field, replace
from typing import NamedTuple, Sequence

import simpy

from pagesim.core import SchedulerOutput, StepResult
from pagesim.core.decode_runs import DecodePlan, DecodeRun, advance_decode, plan_decode
from pagesim.core.errors import SchedulerStalled
from pagesim.metrics import MetricsRecorder
from pagesim.metrics.step_log import StepStarts
from pagesim.sim import beam_model
from pagesim.sim.cost import CostModel, make_cost_model
from pagesim.sim.pool import size_pool
from pagesim.sim.releases import Releases
from pagesim.sim.run_times import delay_to, run_times
from pagesim.sim.replay_config import ReplayConfig, shared_workload, with_policy_presets  # noqa: F401 (re-exported)
from pagesim.sim.presets import engine_options, policy_preset  # noqa: F401 (the API imports them from here)
from pagesim.sim.presets import default_chunked_prefill, step_budget
from pagesim.sim.specs import get_model, with_kv_cache_dtype
from pagesim.workload.feeds import Feed, Outcome
from pagesim.workload.sessions import make_feed, session_labels
from pagesim.workload.requests import time_origin
from pagesim.workload.trace import Trace

SIM_TOKEN = 0  # token id the simulator appends; ids do not matter to any decision it makes
SIM_STEP = StepResult(default_token=SIM_TOKEN)  # one token per sequence; n samples fork at their first
MAX_DECODE_RUN = 4096  # steps taken at most in one go (bounds the per-run lists)
DELIVERY_SLACK_S = 1e-12  # async output: a step begun this close after a token's time delivers it at its end
EP_COST_MODELS = ("calibrated", "roofline")  # the cost models that take expert parallelism (ep=)


@dataclass
class ReplayResult:
    config: ReplayConfig
    summary: dict
    metrics: MetricsRecorder
    notes: list[str] = field(default_factory=list)


class Replay:
    """One simulated run. Build with a config and a trace, then call run()."""

    def __init__(self, cfg: ReplayConfig, trace: Trace, cost_model: CostModel | None = None, fast_forward: bool = True,
                 keep_steps: bool = True, feed: Feed | None = None, requests: tuple[list, list[str]] | None = None):
        """keep_steps=False: keep no per-step records (no steps.csv; the summary is the same).
        feed: where requests come from and when (pagesim.workload.feeds); default: the trace's
        requests at their arrival times. A cluster gives its replicas a feed it releases itself.
        requests: (requests, notes, their beam widths) as shared_workload builds them, built once by a
        cluster for all of its replicas (each would otherwise build its own copy of the workload)."""
        model = with_kv_cache_dtype(get_model(cfg.model), cfg.kv_cache_dtype)
        self.max_model_len = cfg.max_model_len or model.max_model_len
        long_context_chunks = False
        if cfg.chunked_prefill is None:
            cfg = replace(cfg, chunked_prefill=default_chunked_prefill(cfg.policy, model, self.max_model_len,
                                                                       cfg.prefix_caching))
            long_context_chunks = cfg.chunked_prefill and cfg.policy != "vllm-v1"
        # the budget the run uses, as the summary reports it
        # (with chunked prefill and no budget given: vLLM v1's for the GPU; a budget of the max
        # length, 131,072 for Llama 3.1, would chunk nothing and size activations for such a step)
        self.cfg = cfg = replace(cfg, max_num_batched_tokens=step_budget(cfg, self.max_model_len, cfg.gpu))
        sized = size_pool(cfg, model)
        if sized.block_size != cfg.block_size:  # linear-attention state: the block size vLLM raises it to
            self.cfg = cfg = replace(cfg, block_size=sized.block_size)
        num_blocks, host_blocks, self.capacity, self.kv_groups = sized.num_blocks, sized.host_blocks, sized.capacity, \
            sized.kv_groups
        self.pool = cfg.pool(num_blocks, host_blocks, self.kv_groups)
        self.scheduler = cfg.make_scheduler(num_blocks, host_blocks, self.max_model_len, kv_groups=self.kv_groups)
        if cfg.ep != 1 and cost_model is None and cfg.cost_model.lower() not in EP_COST_MODELS:
            raise ValueError(f"--ep is priced by the {' and '.join(EP_COST_MODELS)} cost models, not {cfg.cost_model!r}")
        extra = {"force": True} if cfg.force_profile and cfg.cost_model.lower() == "profiled" else {}  # only it takes one
        if cfg.ep != 1:  # only the models that price expert parallelism take it
            extra["ep"] = cfg.ep
        self.cost = cost_model or make_cost_model(cfg.cost_model, model, cfg.gpu, cfg.tp, profile_path=cfg.profile,
                                                  **engine_options(cfg.cost_model, cfg.engine, cfg.max_num_seqs), **extra)
        # host time per request (HTTP, tokenization: the engine profile's) delays its entry into the engine
        self.request_host_s = self.cost.request_host_s
        self.requests, self.notes, widths = shared_workload(cfg, trace) if requests is None else requests
        self.notes = list(self.notes)
        self.notes += sized.notes
        if long_context_chunks:
            self.notes.append(f"chunked prefill on (steps of {cfg.max_num_batched_tokens:,} tokens): max_model_len "
                              f"{self.max_model_len:,} is over 32K, where vLLM turns it on unless told "
                              "--no-chunked-prefill")
        origin = time_origin(self.requests, cfg.rate)
        if feed is None:
            feed = make_feed(trace, self.requests, cfg.concurrency, origin, sessions_at_rate=cfg.rate is not None)
        self.feed = feed
        self.releases = Releases(feed, self.request_host_s)
        self.session_labels = session_labels(trace, self.requests)  # request_id -> (session, turn)

        # Beam groups get explicit samples every step, their ancestry drawn from the measured
        # model with one generator per request (so a request's ancestry does not depend on
        # what else is running); everything else takes SIM_STEP and the decode fast path.
        self.beam = None
        if widths:
            self.beam = beam_model.BeamAncestryModel.load(cfg.beam_ancestry or beam_model.DEFAULT_PATH)
            for width in sorted(widths):
                self.beam.check_width(width)
            self.notes.append(f"beam ancestry drawn from {self.beam.source} (widths {self.beam.widths})")
        self._beam_rngs: dict[int, random.Random] = {}
        self.metrics = MetricsRecorder(num_blocks, cfg.warmup_s, keep_steps=keep_steps,
                                       origin=origin)
        self.num_done = 0  # finished or rejected
        self.num_submitted = 0
        self.fast_forward = fast_forward
        self.on_progress = None  # callable(num_done) for progress bars
        # callables (end, duration, BatchShape) and (ends, durations, num_seqs, context_tokens):
        # every step as it is taken (the engine-profile fit reads the step shapes)
        self.on_step = self.on_decode_run = None
        # per submitted request, in submission order, while its client may still give up (kept only
        # with a client timeout, and dropped as its deadline passes: memory stays flat in requests)
        self._groups: list = []
        self._unheard_ends: list = []  # (request, Outcome) of ends a dynamic feed hears of at the next step's end
        self._next_deadline_index = 0
        # where the engine delivers tokens a step late (async output), _delay_outputs reads every
        # step's end and duration from the step log; a log that keeps no durations keeps instead
        # the few step starts that delivery depends on
        self._output_delayed = bool(self.cost.output_delay_steps)
        self._step_starts = StepStarts(DELIVERY_SLACK_S) if self._output_delayed and not keep_steps else None
        self._pace = 0.0  # the last decode step duration run_times computed (0: none yet)
        self._absorbing = False  # decode runs may go on past finishes (set as the engine starts)

    def _done(self, group, at_once: bool = False) -> None:
        """A group left. Its client hears of it now, or (async output: the engine profile delivers
        tokens a step late) when the next step ends, as _delay_outputs times its last token;
        a refusal or the client's own timeout at once."""
        record = self.metrics.record_request(group)
        label = self.session_labels.get(group.request_id)
        if label is not None:
            record.session_id, record.turn = label
        self.num_done += 1
        if at_once or self.feed.static or not self._output_delayed:
            self._tell_feed(group.request, _outcome(group))
        else:
            self._unheard_ends.append((group.request, _outcome(group)))
        if self.on_progress is not None:
            self.on_progress(self.num_done)

    def _tell_feed(self, request, outcome: Outcome) -> None:
        self.releases.on_finished(request, self.env.now, outcome)

    def _deliver_ends(self) -> None:
        """The ends the clients had not heard of yet reach them now (see _done)."""
        ends, self._unheard_ends = self._unheard_ends, []
        for request, outcome in ends:
            self._tell_feed(request, outcome)

    def run(self) -> ReplayResult:
        env = simpy.Environment()
        env.run(until=self.launch(env))
        return self.finish()

    def launch(self, env: simpy.Environment):
        """Start the feed's arrivals and the engine on env; returns the engine's process. run()
        runs env until it ends; a caller may instead run env in stretches (env.run(until=event)),
        pausing the replay between them without changing what it simulates."""
        env.process(self._arrivals(env))
        return self.start(env)

    def start(self, env: simpy.Environment):
        """Start the engine on env (its process, to wait on); requests come through submit()."""
        self.env = env
        self.idle = env.event()  # triggered by an arrival while the engine has nothing to do
        return env.process(self._engine(env))

    def finish(self) -> ReplayResult:
        """The result, once the engine's process has ended."""
        if self._output_delayed:
            self._delay_outputs()
        return ReplayResult(self.cfg, self.summary(), self.metrics, self.notes)

    def wake(self) -> None:
        """Wake the engine if it waits for work (after a submission, or when its feed ran dry)."""
        if not self.idle.triggered:
            self.idle.succeed()

    def _delay_outputs(self) -> None:
        """Async output (the engine profile's output_delay_steps): a request's first token and its
        last reach the client when the step after theirs ends; with the engine idle after
        their step, at once."""
        for record in self.metrics.requests:
            self.deliver(record)

    def deliver(self, record, next_step: tuple[float, float] | None = None) -> None:
        """Set a finished record's first-token and finish times to when its client hears them
        under async output (see _delay_outputs), from the steps logged so far; next_step: the
        (end, duration) of a step begun but not logged yet (a replay paused as it starts one).
        Apply once per record, and only once the step after its finish has begun (or never will)."""
        if not self._output_delayed or record.status != "finished" or record.first_token_time is None:
            return
        log, starts = self.metrics.step_log, self._step_starts
        ends = log.time

        def delivered(t: float) -> float:
            k = bisect_right(ends, t)  # the step after the one that ended at t
            if k < len(ends):
                if starts is not None:
                    return ends[k] if starts.begun_by(k, t) else t
                end, duration = ends[k], log.duration[k]
            elif next_step is not None:
                end, duration = next_step
            else:
                return t
            return end if end - duration <= t + DELIVERY_SLACK_S else t

        record.first_token_time = delivered(record.first_token_time)
        record.finish_time = max(delivered(record.finish_time), record.first_token_time)

    def _arrivals(self, env: simpy.Environment):
        """Release the feed's requests into the engine (each after the host time per request)."""
        feed = self.feed
        while (yield from self.releases.wait(env)):
            request = feed.pop()
            self.submit(request, feed.reject_reason(request))
        self.wake()  # a dynamic feed can run dry after the last submission: let the engine end

    def submit(self, request, reject_reason: str | None = None) -> None:
        """A request enters the engine now (or, with a reason, is turned away unrun)."""
        if reject_reason is None:
            group = self.scheduler.add_request(request)
        else:
            group = self.scheduler.reject(request, reject_reason)
        if self.cfg.client_timeout_s is not None:
            self._groups.append(group)
        self.num_submitted += 1
        if group.reject_reason:
            self._done(group, at_once=True)
        # Wake an idle engine for a new request, and also after a rejection: if that was
        # the last request, the engine must see that everything is done and end the run.
        self.wake()

    def _engine(self, env: simpy.Environment):
        scheduler, cost, metrics = self.scheduler, self.cost, self.metrics
        waste_every = self.cfg.waste_interval_s
        self.next_waste = 0.0 if waste_every is not None else math.inf
        feed, timeout, fast_forward = self.feed, self.cfg.client_timeout_s, self.fast_forward
        self._absorbing = self._may_absorb_finishes()
        while not (feed.exhausted and self.num_done == self.num_submitted):
            if not scheduler.has_unfinished:
                if self._unheard_ends:
                    self._deliver_ends()  # no step follows theirs: at once
                    continue
                self.idle = env.event()
                yield self.idle
                continue
            if timeout is not None:
                self._abort_timed_out(env.now)
                if not scheduler.has_unfinished:
                    continue
            plan = plan_decode(scheduler, MAX_DECODE_RUN, self._absorbed_steps(env.now)) if fast_forward else None
            while plan is not None:
                # (a run's two halves are plain calls around its timeouts, not a generator of its
                # own: one fewer object and one fewer frame switch per event)
                run = self._take_decode_run(env.now, plan)
                for delay in run.delays:
                    yield env.timeout(delay)
                if self._unheard_ends:  # (the run was one step: see _take_decode_run)
                    self._deliver_ends()
                self._record_decode_run(run)
                if timeout is not None or not scheduler.running:
                    break  # back to the loop's checks
                # (with groups still running, those checks pass: plan the next run at once)
                plan = plan_decode(scheduler, MAX_DECODE_RUN, self._absorbed_steps(env.now))
            if plan is not None:
                continue
            now = env.now
            out = scheduler.schedule(now)
            if out.is_empty:
                # add_request rejects what can never fit, so an empty step with work queued is a core bug
                raise SchedulerStalled(f"t={now:.3f}s: requests are queued but nothing can run "
                                       f"({len(scheduler.waiting)} waiting, {scheduler.kv.num_free_blocks} free blocks)")
            shape = out.batch_shape()
            duration = cost.iteration_time(shape)
            if self.on_step is not None:
                self.on_step(now + duration, duration, shape)
            if self._step_starts is not None:
                self._step_starts.add_one(now + duration, duration)
            yield env.timeout(duration)
            if self._unheard_ends:
                self._deliver_ends()
            now = env.now
            step = self._beam_step(out) if self.beam is not None else SIM_STEP
            finished = scheduler.update(out, step, now)
            metrics.record_step(out, now, duration, scheduler)  # first: it holds their last token times
            for group in finished:
                self._done(group)
                self._beam_rngs.pop(group.request_id, None)
            self._maybe_sample_waste(now)

    def _may_absorb_finishes(self) -> bool:
        """Whether decode runs may go on past the steps in which groups finish
        (plan_decode's absorb_finishes): only where nothing outside the run reads a finish before
        the run's end, as nothing does when the releases are all known in advance (a finish
        releases nobody), no client gives up, and no hook watches the steps or the departures
        (a progress count aside, which only counts them)."""
        progress = self.on_progress
        return (self.fast_forward and self.feed.static and self.cfg.client_timeout_s is None and self.on_step is None
                and self.on_decode_run is None and (progress is None or getattr(progress, "counts_only", False)))

    def _run_until(self, now: float) -> float:
        """When the next decode run must end (with the step during which this comes): the next
        request's entry, waste sample or client deadline; now, where ends not heard of yet are
        heard at the end of the next step, which may release a request."""
        if self._unheard_ends:
            return now
        until = min(self.feed.next_time() + self.request_host_s, self.next_waste)
        if self._groups:  # (kept only under a client timeout)
            until = min(until, self._next_deadline())
        return until

    def _absorbed_steps(self, now: float) -> int:
        """How far a decode run may go past finishes (0: not at all, see _may_absorb_finishes):
        about the steps until it must end anyway (_run_until), at the last step's pace (steps may
        quicken as the batch shrinks: a run that ends early is followed by another, never wrong)."""
        if not self._absorbing:
            return 0
        until = self._run_until(now)
        if until == math.inf:
            return MAX_DECODE_RUN
        pace = self._pace
        return int((until - now) / pace * 1.25) + 16 if pace > 0 else 0

    def _beam_step(self, out: SchedulerOutput) -> StepResult:
        """SIM_STEP plus explicit samples for the beam groups due a token this step."""
        samples = {}
        for group, due in out.due_by_group():
            if due and group.request.sampling.use_beam_search:
                rid = group.request_id
                rng = self._beam_rngs.get(rid)
                if rng is None:
                    rng = self._beam_rngs[rid] = random.Random(f"beam:{self.cfg.seed}:{rid}")
                samples[rid] = beam_model.group_samples(group, due, self.beam, rng, SIM_TOKEN)
        return StepResult(samples=samples, default_token=SIM_TOKEN) if samples else SIM_STEP

    def _take_decode_run(self, now: float, plan: DecodePlan) -> "_TakenRun":
        """Steps that can only be plain decode steps of the same batch, taken in one go up to
        the step during which the next request arrives (or the next waste sample is due): the
        core advanced to the run's end, and the delays that bring the clock there. Times,
        metrics and core state come out exactly as stepping one at a time would give."""
        scheduler = self.scheduler
        durations, ends, self._pace = run_times(self.cost, self.cfg.block_size, plan, now, self._run_until(now),
                                                self._pace)
        if self.on_decode_run is not None:
            self.on_decode_run(ends, durations, plan.num_seqs, plan.context_tokens)
        if self._step_starts is not None:
            self._step_starts.add(ends, durations)
        end = ends[-1]
        queues = (len(scheduler.running), len(scheduler.waiting), len(scheduler.swapped))
        kv = scheduler.kv
        shared_before = kv.num_logical_blocks - kv.num_used_blocks
        run = advance_decode(scheduler, len(ends), SIM_TOKEN, end, plan, ends)
        delay = delay_to(now, end)
        # no single delay lands exactly there (rounding ties): time the steps one by one
        delays = (delay,) if now + delay == end else durations
        # (tuple.__new__: a named tuple's own __new__ is a Python call)
        return tuple.__new__(_TakenRun, (plan, run, durations, ends, delays, queues, shared_before))

    def _record_decode_run(self, taken: "_TakenRun") -> None:
        """The run's step records and finished requests, once the clock reached its end."""
        scheduler, kv = self.scheduler, self.scheduler.kv
        running, waiting_before, swapped = taken.queues
        # queues change only at the run's last step (an arrival during it, or a finish)
        self.metrics.record_decode_run(taken.ends, taken.durations, taken.plan.num_seqs, taken.run.kv_blocks_used,
                                       swapped, (running, waiting_before),
                                       (len(scheduler.running), len(scheduler.waiting)),
                                       (taken.shared_before, kv.num_logical_blocks - kv.num_used_blocks),
                                       taken.plan.request_ids, taken.run)
        for group in taken.run.finished:
            self._done(group)
        self._maybe_sample_waste(self.env.now)

    def _next_deadline(self) -> float:
        """When the oldest request that may still be running runs out of client patience."""
        i, timeout = self._next_deadline_index, self.cfg.client_timeout_s
        if timeout is None or i >= self.num_submitted:
            return math.inf
        return self._groups[i].request.arrival_time + timeout

    def _abort_timed_out(self, now: float) -> None:
        """Between steps: abort every request whose client has given up (deadlines come in
        arrival order, so one pointer walks them)."""
        timeout = self.cfg.client_timeout_s
        while self._next_deadline_index < self.num_submitted:
            group = self._groups[self._next_deadline_index]
            if group.request.arrival_time + timeout > now:
                break
            self._groups[self._next_deadline_index] = None
            self._next_deadline_index += 1
            if self.scheduler.abort(group, now):
                group.reject_reason = f"client timeout: not finished {timeout:g} s after arrival"
                self._done(group, at_once=True)  # (the client itself gave up)

    def _maybe_sample_waste(self, now: float) -> None:
        if now >= self.next_waste:
            self.metrics.record_waste(now, self.scheduler)
            self.next_waste = now + self.cfg.waste_interval_s

    def summary(self) -> dict:
        cfg = self.cfg
        extra = {
            "config": asdict(cfg),
            "num_kv_blocks": self.pool.num_device_blocks,
            "num_host_blocks": self.pool.num_host_blocks,
            "kv_token_slots": self.pool.num_device_blocks * cfg.block_size,
            "max_model_len": self.max_model_len,
            "cost_model": self.cost.describe(),
            "notes": self.notes,
        }
        if self.metrics.waste:
            extra["waste_mean_share"] = _mean_shares(self.metrics.waste, cfg.warmup_s)
        return self.metrics.summary(**extra)


class _TakenRun(NamedTuple):
    """A decode run the core has taken, waiting for the clock to reach its end."""

    plan: DecodePlan
    run: DecodeRun
    durations: list[float]
    ends: list[float]
    delays: Sequence[float]  # the timeouts to its end
    queues: tuple[int, int, int]  # running, waiting, swapped groups before it
    shared_before: int  # logical minus used blocks before it


def _outcome(group) -> Outcome:
    """How a group that left ended, for a feed that releases on ends: its first sequence's output."""
    seqs = group.finished_seqs
    if not seqs:
        return Outcome(group.reject_reason)
    first = seqs[0] if len(seqs) == 1 else min(seqs, key=lambda seq: seq.seq_id)
    return Outcome(group.reject_reason, first.num_output_tokens,
                   first.output_token_ids if first.has_token_ids else None)


def _mean_shares(rows: list[tuple], since: float) -> dict:
    rows = [r for r in rows if r[0] >= since] or rows
    names = ("token_states", "reserved", "internal_fragmentation", "external_fragmentation", "free")
    totals = [sum(r[i + 1] for r in rows) for i in range(len(names))]
    grand = sum(totals)
    return {name: t / grand for name, t in zip(names, totals)} if grand else {}


def replay(cfg: ReplayConfig, trace: Trace, progress=None, fast_forward: bool = True) -> ReplayResult:
    sim = Replay(cfg, trace, fast_forward=fast_forward)
    sim.on_progress = progress
    return sim.run()
