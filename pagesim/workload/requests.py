"""From a trace to the requests a run submits: arrival times, sampling parameters, cycling.
Both drivers (simulator and executor) submit exactly these, so their runs are comparable."""

from __future__ import annotations

import random
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import cycle, islice
from typing import Iterator

from pagesim.core import Request, SamplingParams
from pagesim.core.hashed_prompt import HashedPrompt
from pagesim.workload.arrivals import ArrivalProcess
from pagesim.workload.trace import Trace, TraceRequest


@dataclass
class WorkloadConfig:
    """What a run submits and measures: the arrivals and the per-request overrides. Both drivers'
    run configurations embed it (pagesim.sim.engine.ReplayConfig, executor.run.RunConfig)."""

    rate: float | None = 1.0  # req/s; None: the trace's own arrival times
    burstiness: float = 1.0  # gamma shape; 1.0 is Poisson
    num_requests: int | None = 1000  # as `vllm bench serve --num-prompts`; every command's default (docs/cli.md)
    duration: float | None = None  # seconds of arrivals (instead of a count)
    seed: int = 0  # of the arrival process (and the executor's synthetic prompts)
    n: int | None = None  # override every request's parallel samples
    beam_width: int | None = None  # override every request's beam width
    warmup_s: float = 0.0  # leave requests arriving earlier out of latency statistics
    # closed loop: this many clients, each sending its next request when its last one ended
    # (pagesim.workload.sessions); None: open loop, requests at their arrival times
    concurrency: int | None = None

    def requests(self, trace: Trace, built: bool = True) -> tuple[list[Request] | Workload, list[str]]:
        """build_requests with these settings; built=False: as a Workload (each built when asked for)."""
        workload = Workload(trace, rate=self.rate, burstiness=self.burstiness, num_requests=self.num_requests,
                            duration=self.duration, seed=self.seed, n=self.n, beam_width=self.beam_width)
        return (list(workload) if built else workload), workload.notes


# The workload defaults of every command (replay, run, bench, compare, plan): the same flags
# mean the same requests everywhere. The serving defaults are pagesim.core.config's SERVING_DEFAULTS.
WORKLOAD_DEFAULTS = WorkloadConfig()


def build_requests(trace: Trace, *, rate: float | None, burstiness: float = 1.0, num_requests: int | None = None,
                   duration: float | None = None, seed: int = 0, n: int | None = None,
                   beam_width: int | None = None) -> tuple[list[Request], list[str]]:
    """Requests with arrival times (Poisson at rate, gamma when burstiness != 1, or the trace's own
    times when rate is None), by count or by duration. When more requests are asked for than the
    trace holds, the trace is cycled in its (already shuffled) order, as the paper's artifact does;
    the returned notes say so. Every sequence generates exactly its trace output length.
    n / beam_width, when given, override every record's own (setting one resets the other to 1,
    since a request cannot do both)."""
    workload = Workload(trace, rate=rate, burstiness=burstiness, num_requests=num_requests, duration=duration,
                        seed=seed, n=n, beam_width=beam_width)
    return list(workload), workload.notes


class Workload(Sequence):
    """build_requests' requests, each built when asked for (a new object each time) from its
    arrival time and trace record: 8 bytes a request where a built one costs ~150. For a run
    that takes each request once, as a cluster that routes them all before replaying its
    replicas apart does (pagesim.cluster.independent: each worker builds its replica's only)."""

    def __init__(self, trace: Trace, *, rate: float | None, burstiness: float = 1.0, num_requests: int | None = None,
                 duration: float | None = None, seed: int = 0, n: int | None = None, beam_width: int | None = None):
        if n is not None and beam_width is not None and n > 1 and beam_width > 1:
            raise ValueError(f"n={n} and beam_width={beam_width} cannot be combined")
        if num_requests is not None and num_requests < 1:
            raise ValueError(f"num_requests must be >= 1, got {num_requests} (None: as many as the trace holds)")
        self.notes = []
        cap = trace.metadata.get("context_cap")
        if isinstance(cap, dict) and cap.get("note"):  # a builder's --max-context: say what it changed
            self.notes.append(f"trace built with a context cap: {cap['note']}")
        if rate is None:
            process = ArrivalProcess("trace")
        else:
            process = ArrivalProcess("poisson" if burstiness == 1.0 else "gamma", rate, burstiness, seed)
        count = None if duration is not None else (num_requests if num_requests is not None else len(trace))
        self.arrival_times = array("d", process.times(count=count, duration=duration, trace=trace))
        if len(self.arrival_times) > len(trace):
            self.notes.append(f"trace cycled: {len(self.arrival_times)} requests from {len(trace)} records")
        self._records, self._n, self._beam_width = trace.requests, n, beam_width
        # SamplingParams are frozen: requests asking for the same share one (10k requests hold a few
        # hundred distinct ones; building each costs a validated frozen dataclass)
        self._shared: dict[tuple[int, int, int], SamplingParams] = {}
        self._hash_block = trace.metadata.get("hash_block_tokens")

    def __len__(self) -> int:
        return len(self.arrival_times)

    def __getitem__(self, i: int) -> Request:
        if i < 0:
            i += len(self)
        return self._request(i, self.arrival_times[i])  # (IndexError past the end, as a list's)

    def __iter__(self):
        return map(self._request, range(len(self)), self.arrival_times)

    def records(self) -> Iterator[TraceRequest]:
        """Each request's trace record, in order (the trace cycled): what request i is built from
        (its prompt_len and prompt_token_ids are the record's), for a caller that needs no more."""
        return islice(cycle(self._records), len(self))

    def clear(self) -> None:
        self.arrival_times = array("d")

    def sampling(self, i: int) -> SamplingParams:
        """Request i's sampling parameters (shared by the requests asking for the same)."""
        n, beam_width = self._n, self._beam_width
        rec = self._records[i % len(self._records)]
        req_n = n if n is not None else (rec.n or 1)
        req_beam = beam_width if beam_width is not None else (rec.beam_width or 1)
        if n is not None and n > 1 and beam_width is None:
            req_beam = 1  # the override replaces the record's beam search
        if beam_width is not None and beam_width > 1 and n is None:
            req_n = 1  # and the other way round
        key = (req_n, req_beam, rec.output_len)
        sampling = self._shared.get(key)
        if sampling is None:
            sampling = self._shared[key] = SamplingParams(n=req_n, beam_width=req_beam, max_tokens=rec.output_len,
                                                          ignore_eos=True)
        return sampling

    def samplings(self):
        """The sampling parameters of every trace record the requests take (each once)."""
        return map(self.sampling, range(min(len(self), len(self._records))))

    def _request(self, i: int, arrival_time: float) -> Request:
        rec = self._records[i % len(self._records)]
        hashed = None if rec.hash_ids is None else HashedPrompt(tuple(rec.hash_ids), rec.prompt_len, self._hash_block)
        return Request(i, rec.prompt_len, self.sampling(i), arrival_time, rec.prompt_token_ids, hashed)


def time_origin(requests: list[Request], rate: float | None) -> float:
    """A run's time zero. An arrival process starts at 0 (its first gap is drawn like every
    other); a trace's own timestamps (rate None) start at its first arrival, which may be a Unix
    time. Drivers start their clocks there and count the warm-up from it."""
    return requests[0].arrival_time if rate is None and requests else 0.0


def synthetic_prompt(request: Request, vocab_size: int, seed: int) -> list[int]:
    """Seeded token ids of the right length for a trace record that has only lengths, the same
    for every driver (`pagesim run` in-process, `pagesim bench` over HTTP). Ids avoid the first
    few (special tokens in most vocabularies). A hashed prompt gets its blocks' seeded ids, so
    its sharing with other prompts is kept."""
    if request.hashed_prompt is not None:
        return request.hashed_prompt.vocab_ids(vocab_size, seed)
    rng = random.Random(f"{seed}:{request.request_id}")
    return [rng.randrange(4, vocab_size) for _ in range(request.prompt_len)]
