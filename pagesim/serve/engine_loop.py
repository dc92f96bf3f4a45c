"""The one engine thread of a server: LLMEngine's own add -> step -> update loop, fed by many
concurrent HTTP requests.

Requests and aborts are queued by the event loop and applied between steps (the core is not
thread-safe and needs no locks this way). After every step each request that advanced gets one
RequestUpdate with the tokens its samples produced, delivered into its asyncio queue.

A request whose sampling raises is failed alone (the engine runs with isolate_failures: it
aborts that request and goes on with the rest of the batch); a step that raises (a forward
failure) fails the requests in that step. Each gets the error (the server answers 500), their
blocks are freed, and the loop goes on with the others. MAX_FAILED_STEPS failures in a row (a
step whose every request failed to sample counts as one), or a failure the core cannot clean up
after, mean the engine cannot run: the loop ends, every waiting client gets the error, and
on_fatal is called (the server then shuts down and exits with status 1; it never lingers
answering 503).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from executor.engine import LLMEngine, samples_in_order
from pagesim.core import SamplingParams, SequenceGroup, SequenceStatus
from pagesim.serve.metrics import ServerStats

log = logging.getLogger("pagesim.serve")
MAX_FAILED_STEPS = 3  # failed steps in a row after which the engine is taken as broken


@dataclass
class SampleDelta:
    index: int  # sample i of n
    token_ids: list[int]
    logprobs: list[float]  # of each new token under the model's unfiltered distribution
    finish_reason: str | None = None  # "stop" (EOS), "length", "abort"; None while running


@dataclass
class RequestUpdate:
    samples: list[SampleDelta] = field(default_factory=list)
    finished: bool = False
    error: str | None = None  # why the request ended without its tokens (see error_kind)
    # "refused": the engine cannot take it (e.g. it can never fit the KV pool), a 400;
    # "step_failed": a step it was in raised, a 500; "engine_failed": the engine stopped, a 503
    error_kind: str = "refused"


@dataclass
class _Tracked:
    group: SequenceGroup | None
    deliver: callable  # called in the engine thread with each RequestUpdate
    sent: dict[int, int] = field(default_factory=dict)  # sample index -> output tokens delivered
    logprob_sum: dict[int, float] = field(default_factory=dict)  # sample index -> their log-probs' sum
    ended: set[int] = field(default_factory=set)  # sample indices whose finish was delivered
    abort_reason: str = "abort"  # how an abort from the server counts in /metrics ("stop": a stop string)


class EngineLoop:
    def __init__(self, engine: LLMEngine, stats: ServerStats):
        self.engine = engine
        self.stats = stats
        self._commands: deque = deque()  # ("add", ...) / ("abort", id), applied between steps
        self._wake = threading.Event()
        self._stop = False
        self._tracked: dict[int, _Tracked] = {}
        self._next_id = 0
        self._id_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="pagesim-engine", daemon=True)
        self.error: BaseException | None = None  # what stopped the loop, if it died
        self.on_fatal = None  # called (in the engine thread) with the error when the loop dies

    # -- called from the event loop -----------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None  # error: set before the thread ends

    def submit(self, prompt_ids: list[int], sampling: SamplingParams) -> tuple[int, asyncio.Queue]:
        """Queue a request; its RequestUpdates arrive on the returned queue."""
        if not self.alive:
            raise RuntimeError(f"the engine thread is not running ({self.error!r})")
        loop = asyncio.get_running_loop()
        updates: asyncio.Queue = asyncio.Queue()
        with self._id_lock:
            request_id = self._next_id
            self._next_id += 1
        deliver = lambda update: loop.call_soon_threadsafe(updates.put_nowait, update)  # noqa: E731
        self._commands.append(("add", request_id, list(prompt_ids), sampling, deliver, time.perf_counter()))
        self._wake.set()
        return request_id, updates

    def abort(self, request_id: int, reason: str = "abort") -> None:
        """Stop a request between steps. reason is how it counts in /metrics: "stop" when the
        server ended it at a stop string, "abort" when the client went away."""
        self._commands.append(("abort", request_id, reason))
        self._wake.set()

    # -- the engine thread --------------------------------------------------------------------
    def _run(self) -> None:
        failed_in_a_row = 0
        while not self._stop:
            try:
                self._apply_commands()
                if not self.engine.has_unfinished():
                    self._wake.wait(0.5)
                    self._wake.clear()
                    continue
                stats = self.engine.step(time.perf_counter)
                self.stats.on_step(self.engine.scheduler)
                # a step whose every request failed to sample (NaN logits from a broken model) is a failed step
                every_one = stats.failed and set(stats.failed) >= {g.request_id for g in stats.out.groups}
                failed_in_a_row = failed_in_a_row + 1 if every_one else 0
                if failed_in_a_row >= MAX_FAILED_STEPS:  # before anyone is told: they learn the engine stopped
                    reason = next(iter(stats.failed.values()))
                    self._die(RuntimeError(f"sampling failed for every request of {failed_in_a_row} steps ({reason})"))
                    return
                self._fail_sampling(stats.failed)
                self._publish(stats.out.groups, stats.finished)
            except Exception as e:  # noqa: BLE001 - one step's failure ends its requests, not the server
                failed_in_a_row += 1
                log.exception("an engine step failed (%d in a row); its requests end with the error", failed_in_a_row)
                if failed_in_a_row >= MAX_FAILED_STEPS or not self._fail_stepped(e):
                    self._die(e)
                    return

    def _fail_sampling(self, failed: dict[int, str]) -> None:
        """End the requests whose sampling failed this step (the engine has aborted them)."""
        for request_id, reason in failed.items():
            tracked = self._tracked.pop(request_id, None)
            if tracked is None:
                continue
            log.error("request %d: sampling failed: %s", request_id, reason)
            tracked.deliver(RequestUpdate(finished=True, error=f"sampling failed: {reason}", error_kind="step_failed"))
            self.stats.on_finish(tracked.group, "abort")
        if failed:
            self.stats.refresh(self.engine.scheduler)

    def _fail_stepped(self, error: Exception) -> bool:
        """End, with the error, every request the failed step may have touched: those running
        (the step's batch) and those that left the scheduler without their last update. False if
        the core could not free them (its state is not to be trusted)."""
        scheduler = self.engine.scheduler
        waiting = {id(g) for g in (*scheduler.waiting, *scheduler.swapped)}
        message = f"the engine step failed: {type(error).__name__}: {error}"
        try:
            for request_id, tracked in list(self._tracked.items()):
                if id(tracked.group) in waiting:
                    continue
                self.engine.abort_request(request_id, time.perf_counter())
                del self._tracked[request_id]
                tracked.deliver(RequestUpdate(finished=True, error=message, error_kind="step_failed"))
                self.stats.on_finish(tracked.group, "abort")
            self.stats.refresh(scheduler)
        except Exception:  # noqa: BLE001 - reported by the caller, which stops the loop
            log.exception("could not free the failed step's requests")
            return False
        return True

    def _die(self, error: Exception) -> None:
        self.error = error
        log.error("the engine cannot run (%s: %s); the server shuts down", type(error).__name__, error)
        if self.on_fatal is not None:  # first: a client told of the failure finds the shutdown under way
            self.on_fatal(error)
        for tracked in self._tracked.values():
            tracked.deliver(RequestUpdate(finished=True, error=f"the engine stopped: {type(error).__name__}: {error}",
                                          error_kind="engine_failed"))
        self._tracked.clear()

    def _apply_commands(self) -> None:
        if not self._commands:
            return
        while self._commands:
            command = self._commands.popleft()
            if command[0] == "add":
                _, request_id, prompt_ids, sampling, deliver, arrival = command
                try:
                    group = self.engine.add_request(prompt_ids, sampling, arrival, request_id)
                except Exception as e:  # noqa: BLE001 - a request the engine cannot take must not stop the thread
                    deliver(RequestUpdate(finished=True, error=f"{type(e).__name__}: {e}"))
                    continue
                if group.reject_reason:
                    deliver(RequestUpdate(finished=True, error=group.reject_reason))
                    continue
                self.stats.on_arrival(len(prompt_ids))
                self._tracked[request_id] = _Tracked(group, deliver)
            else:
                tracked = self._tracked.get(command[1])
                if tracked is None:
                    continue
                tracked.abort_reason = command[2]
                group = self.engine.abort_request(command[1], time.perf_counter())
                if group is not None:
                    self._publish([], [group])
        self.stats.refresh(self.engine.scheduler)

    def _publish(self, stepped: list[SequenceGroup], finished: list[SequenceGroup]) -> None:
        done = {id(g) for g in finished}
        for group in [g for g in stepped if id(g) not in done] + finished:
            tracked = self._tracked.get(group.request_id)
            if tracked is None:
                continue
            update = RequestUpdate(finished=id(group) in done)
            for index, seq in enumerate(samples_in_order(group)):
                if index in tracked.ended:
                    continue
                sent = tracked.sent.get(index, 0)
                new = seq.output_token_ids[sent:]
                reason = _finish_reason(seq, group, self.engine.lm.eos_token_id)
                if not new and reason is None:
                    continue
                if reason is not None:
                    tracked.ended.add(index)
                # one token per sequence per step, so each new token's log-prob is the growth
                # of the sequence's cumulative log-prob since the last delivery
                before = tracked.logprob_sum.get(index, 0.0)
                logprobs = [seq.cumulative_logprob - before] if len(new) == 1 else [0.0] * len(new)
                tracked.sent[index] = sent + len(new)
                tracked.logprob_sum[index] = seq.cumulative_logprob
                self.stats.on_tokens(len(new))
                update.samples.append(SampleDelta(index, new, logprobs, reason))
            if update.finished:
                del self._tracked[group.request_id]
                reason = _finish_reason(samples_in_order(group)[0], group, self.engine.lm.eos_token_id)
                self.stats.on_finish(group, tracked.abort_reason if reason == "abort" else reason)
            if update.samples or update.finished:
                tracked.deliver(update)


def _finish_reason(seq, group: SequenceGroup, eos: int | None) -> str | None:
    if seq.status is SequenceStatus.ABORTED:
        return "abort"
    if seq.status is not SequenceStatus.FINISHED:
        return None
    if not group.sampling.ignore_eos and eos is not None and seq.token_ids and seq.token_ids[-1] == eos:
        return "stop"
    return "length"
