"""Sessions and closed-loop clients: feeds (pagesim.workload.feeds) whose releases follow ends.

A session is a trace's turns of one `session_id` (docs/traces.md). Turn k + 1 is released when
turn k has ended plus its think time, and its prompt is what turn k sent, then what turn k
generated, then the turn's own new tokens (its record's prompt past the previous turn's prompt
and output): so a slow server delays a session, and a turn's prefix is its predecessor's KV. A
turn that fails (rejected, aborted) ends its session: every later turn is released at once and
turned away with the reason, so nothing is lost silently.

Closed loop (`concurrency` N): N clients, each taking the next session (a request without a
session is a session of one turn) the moment its last one ended, as `vllm bench serve
--max-concurrency` with no rate and guidellm's concurrent profile do. Without it, sessions start
at their first turn's arrival time (open loop).

Stages (StagedFeed): a sweep's load stages one after another, each closed loop with its own
client count or at its recorded gaps, the next starting when the last request of the one before
ended (how `pagesim validate` replays a recorded multi-stage closed-loop run).
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

from pagesim.core import Request
from pagesim.workload.feeds import Outcome, RequestFeed
from pagesim.workload.trace import Trace


@dataclass
class Turn:
    request: Request  # as built from its record (its id, sampling; its recorded prompt)
    think_s: float  # wait after the previous turn ended (0 for turn 0)
    # the recorded prompt and output of the previous turn, where this turn's prompt starts with
    # them (extends_history); 0 otherwise: the turn is sent as recorded
    history_len: int = 0

    @property
    def extends_history(self) -> bool:
        return self.history_len > 0

    @property
    def new_len(self) -> int:
        return self.request.prompt_len - self.history_len


def extends(record, before) -> bool:
    """Whether a turn's recorded prompt is the previous turn's prompt and output, then more: longer
    than both, and, with token ids, starting with the previous prompt's ids."""
    if record.prompt_len <= before.prompt_len + before.output_len:
        return False
    if record.prompt_token_ids is None or before.prompt_token_ids is None:
        return record.prompt_token_ids is None and before.prompt_token_ids is None
    return record.prompt_token_ids[:before.prompt_len] == before.prompt_token_ids


@dataclass
class Session:
    name: str  # the session_id as text ("" for a lone request); "<id>~<c>" in the c-th cycle of a trace
    turns: list[Turn]


def has_sessions(trace: Trace) -> bool:
    return any(r.session_id is not None for r in trace.requests)


def plan_sessions(trace: Trace, requests: list[Request]) -> list[Session]:
    """The sessions of a run's requests (request i comes from record i mod len(trace), as
    build_requests makes them), in the order of their first turns; a request without a session
    is a session of its own."""
    records = trace.requests
    sessions: list[Session] = []
    open_sessions: dict = {}  # (cycle, session_id) -> (session, its last record)
    for i, request in enumerate(requests):
        record = records[i % len(records)]
        if record.session_id is None:
            sessions.append(Session("", [Turn(request, 0.0)]))
            continue
        cycle = i // len(records)
        key = (cycle, record.session_id)
        if record.turn == 0:
            name = str(record.session_id) if cycle == 0 else f"{record.session_id}~{cycle}"
            session = Session(name, [Turn(request, 0.0)])
            sessions.append(session)
        else:  # (load_trace checked that turns come in order from 0)
            session, before = open_sessions[key]
            history = before.prompt_len + before.output_len if extends(record, before) else 0
            think = record.think_time
            if think is None:
                given = record.arrival_time is not None and before.arrival_time is not None
                think = max(0.0, record.arrival_time - before.arrival_time) if given else 0.0
            session.turns.append(Turn(request, think, history))
        open_sessions[key] = (session, record)
    return sessions


def session_labels(trace: Trace, requests: list[Request]) -> dict[int, tuple[str, int]]:
    """request_id -> (session name, turn) for the requests that are turns of a session."""
    if not has_sessions(trace):
        return {}
    return {turn.request.request_id: (s.name, k) for s in plan_sessions(trace, requests) if s.name
            for k, turn in enumerate(s.turns)}


def make_feed(trace: Trace, requests: list[Request], concurrency: int | None, start: float,
              sessions_at_rate: bool = False):
    """The feed a run of these requests takes: the plain one unless the trace has sessions or the
    load is closed-loop. start: when closed-loop clients send their first requests.
    sessions_at_rate: the requests' times come from an arrival process (--rate), which then times
    the sessions' starts: session k starts at the k-th arrival (so --rate counts sessions per second)."""
    if concurrency is None and not has_sessions(trace):
        return RequestFeed(requests)
    sessions = plan_sessions(trace, requests)
    if sessions_at_rate and concurrency is None:
        times = [r.arrival_time for r in requests[:len(sessions)]]
        for session, at in zip(sessions, times):
            session.turns[0].request.arrival_time = at
    return SessionFeed(sessions, concurrency, start)


class SessionFeed:
    """Releases sessions' turns as their predecessors end (see the module's doc)."""

    static = False

    def __init__(self, sessions: list[Session], concurrency: int | None = None, start: float = 0.0) -> None:
        if concurrency is not None and concurrency < 1:
            raise ValueError(f"--concurrency must be >= 1, got {concurrency}")
        self.sessions = sessions
        self.concurrency = concurrency
        self._due: list[tuple[float, int, Request]] = []  # releases scheduled: (time, order, request)
        self._order = itertools.count()
        self._where: dict[int, tuple[int, int]] = {}  # request_id -> (session index, turn) while out or due
        self._rejections: dict[int, str] = {}
        self._remaining = sum(len(s.turns) for s in sessions)
        self._next_session = 0
        self.num_clients_busy = 0  # sessions started and not ended (closed loop: <= concurrency)
        if concurrency is None:
            for _ in sessions:
                self._start_session(sessions[self._next_session].turns[0].request.arrival_time)
        else:
            for _ in range(min(concurrency, len(sessions))):
                self._start_session(start)

    def _start_session(self, at: float) -> None:
        index = self._next_session
        self._next_session += 1
        self.num_clients_busy += 1
        self._schedule(index, 0, self.sessions[index].turns[0].request, at)

    def _schedule(self, session: int, turn: int, request: Request, at: float) -> None:
        self._where[request.request_id] = (session, turn)
        heapq.heappush(self._due, (at, next(self._order), request))

    def next_time(self) -> float:
        return self._due[0][0] if self._due else math.inf

    def pop(self) -> Request:
        at, _, request = heapq.heappop(self._due)
        request.arrival_time = at
        self._remaining -= 1
        return request

    @property
    def exhausted(self) -> bool:
        return self._remaining == 0

    def reject_reason(self, request: Request) -> str | None:
        return self._rejections.pop(request.request_id, None)

    def on_finished(self, request: Request, now: float, outcome: Outcome | None = None) -> None:
        where = self._where.pop(request.request_id, None)
        if where is None:
            return  # a turn turned away after its session ended: nothing follows it
        index, k = where
        session = self.sessions[index]
        outcome = outcome or Outcome(output_len=request.sampling.max_tokens)
        if outcome.failure is not None:
            label = f"session {session.name}" if session.name else "its session"
            for later in session.turns[k + 1:]:
                self._rejections[later.request.request_id] = \
                    f"{label} ended: turn {k} (request {request.request_id}) failed: {outcome.failure}"
                heapq.heappush(self._due, (now, next(self._order), later.request))  # (its end releases nothing)
            self._end_session(now)
        elif k + 1 < len(session.turns):
            turn = session.turns[k + 1]
            self._schedule(index, k + 1, next_turn_request(request, outcome, turn), now + turn.think_s)
        else:
            self._end_session(now)

    def _end_session(self, now: float) -> None:
        self.num_clients_busy -= 1
        if self.concurrency is not None and self._next_session < len(self.sessions):
            self._start_session(now)


def next_turn_request(sent: Request, outcome: Outcome, turn: Turn) -> Request:
    """Turn k + 1 as sent: turn k's sent prompt, its output, then the turn's new tokens, where its
    record extends the history; else as recorded. With token ids, the output's ids are what turn k
    generated (the record's where the driver kept none)."""
    recorded = turn.request
    if not turn.extends_history:
        return recorded
    ids = None
    if recorded.prompt_token_ids is not None and sent.prompt_token_ids is not None:
        output = outcome.output_token_ids
        if output is None:
            output = recorded.prompt_token_ids[turn.history_len - outcome.output_len:turn.history_len]
        ids = sent.prompt_token_ids + list(output) + recorded.prompt_token_ids[turn.history_len:]
    prompt_len = sent.prompt_len + outcome.output_len + turn.new_len
    return Request(recorded.request_id, prompt_len, recorded.sampling, recorded.arrival_time, ids)


class StagedFeed:
    """Load stages run one after another, as a benchmark sweep runs them (guidellm's strategies):
    stage k + 1 starts the moment every request of stage k has ended. A stage is (its requests,
    clients): clients N replays it closed loop (N clients, each request a session of one turn);
    None at its recorded gaps, shifted to start then. So a sweep of concurrencies, or of rates,
    is one replay, each stage meeting the server as the previous one left it."""

    static = False

    def __init__(self, stages: list[tuple[list[Request], int | None]], start: float) -> None:
        self._stages = [(requests, clients) for requests, clients in stages if requests]
        if not self._stages:
            raise ValueError("StagedFeed needs a stage with requests")
        self._index = -1
        self._in_flight = 0  # released by the current stage and not ended
        self._inner: RequestFeed | SessionFeed
        self._open(start)

    @property
    def stage(self) -> int:
        """The stage now releasing (its index among the stages with requests)."""
        return self._index

    def _open(self, at: float) -> None:
        self._index += 1
        requests, clients = self._stages[self._index]
        if clients is None:
            first = requests[0].arrival_time
            for request in requests:
                request.arrival_time = at + (request.arrival_time - first)
            self._inner = RequestFeed(requests)
        else:
            self._inner = SessionFeed([Session("", [Turn(r, 0.0)]) for r in requests], clients, at)

    def next_time(self) -> float:
        return self._inner.next_time()

    def pop(self) -> Request:
        self._in_flight += 1
        return self._inner.pop()

    @property
    def exhausted(self) -> bool:
        return self._index == len(self._stages) - 1 and self._inner.exhausted

    def reject_reason(self, request: Request) -> str | None:
        return self._inner.reject_reason(request)

    def on_finished(self, request: Request, now: float, outcome: Outcome | None = None) -> None:
        self._inner.on_finished(request, now, outcome)
        self._in_flight -= 1
        if not self._in_flight and self._inner.exhausted and self._index + 1 < len(self._stages):
            self._open(now)
