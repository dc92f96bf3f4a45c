"""The configurations a plan compares, and the run settings they share."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from pagesim.core.config import CHOICES, ServingConfig
from pagesim.inputs import BLOCK_SIZE, MAX_REQUESTS, NUM_REQUESTS, SECONDS, SWAP_GIB, TOKENS, TP, NumberRule
from pagesim.models.max_len import check_max_model_len
from pagesim.sim.engine import ReplayConfig
from pagesim.sim.cost import DEFAULT_COST_MODEL
from pagesim.sim.presets import default_chunked_prefill, step_budget
from pagesim.sim.specs import get_gpu, get_model
from pagesim.workload.requests import WORKLOAD_DEFAULTS


POSITIVE_SEQS = NumberRule(lo=1, hi=1_000_000, integer=True)


@dataclass(frozen=True)
class GridPoint:
    """One serving configuration (one replica)."""

    gpu: str
    tp: int
    block_size: int
    preemption: str
    max_num_seqs: int

    @property
    def label(self) -> str:
        return f"{self.gpu} x{self.tp} b{self.block_size} {self.preemption} s{self.max_num_seqs}"


@dataclass(frozen=True)
class RunSettings:
    """How each simulated run is made; the same for every configuration and rate.

    A run at rate r first submits n = max(num_requests, ceil(r * min_duration_s)) Poisson arrivals (the
    trace in its order, cycled if shorter) with the same seed at every rate (common random numbers:
    arrival times at rate r are the unit-rate times / r). The duration floor keeps fast replicas
    from being judged on a few seconds of traffic. Requests arriving in the first
    `warmup_fraction` of the expected arrival span (warmup_fraction * n / r seconds) are simulated
    but left out of every statistic, so the empty-system start does not flatter latency. A probe
    is extended to more requests until its steady state is judged (pagesim.plan.run; one replay
    continued, pagesim.plan.continued), at most max_requests_per_probe.
    """

    model: str
    num_requests: int = WORKLOAD_DEFAULTS.num_requests
    min_duration_s: float = 60.0
    warmup_fraction: float = 0.2
    max_num_batched_tokens: int | None = None  # None: max(2560, the model's max length)
    swap_space_gib: float = 4.0
    cost_model: str = DEFAULT_COST_MODEL
    profile: str | None = None
    seed: int = WORKLOAD_DEFAULTS.seed
    force_profile: bool = False  # use a profile measured on another model or GPU anyway
    kv_cache_dtype: str = "auto"  # "fp8": 1-byte KV cache (vLLM's --kv-cache-dtype)
    max_requests_per_probe: int = 40_000  # a probe not decided by this many requests is "undecided"
    # a pass counts only on at least this many measured requests (short runs flatter near the knee);
    # smaller only where realism does not matter (tests of the search's mechanics)
    min_measured_requests: int = 1000
    # --max-model-len: the longest sequence served (None: the model's); the step's default token
    # budget and activations follow it, so a long-context model can be planned on fewer GPUs
    max_model_len: int | None = None
    # chunked prefill (None: vLLM's default, on for a model longer than 32K tokens: the runs take
    # the GPU's chunk budget then, unless max_num_batched_tokens is given)
    chunked_prefill: bool | None = None

    def __post_init__(self) -> None:
        if self.num_requests < 10:
            raise ValueError("--num-requests must be >= 10")
        NUM_REQUESTS.check(self.num_requests, "--num-requests")
        NUM_REQUESTS.check(self.max_requests_per_probe, "--max-requests")
        NUM_REQUESTS.check(self.min_measured_requests, "--min-measured")
        SECONDS.check(self.min_duration_s, "--min-duration")
        SWAP_GIB.check(self.swap_space_gib, "--swap-space")
        if self.max_model_len is not None:
            TOKENS.check(self.max_model_len, "--max-model-len")
            check_max_model_len(self.max_model_len, get_model(self.model).max_model_len, self.model)
        if not 0 <= self.warmup_fraction < 0.9:
            raise ValueError("warmup_fraction must be in [0, 0.9)")

    @property
    def chunked(self) -> bool:
        """Chunked prefill as the runs take it (default_chunked_prefill where not given)."""
        if self.chunked_prefill is not None:
            return self.chunked_prefill
        model = get_model(self.model)
        return default_chunked_prefill("paged", model, self.max_model_len or model.max_model_len, False)

    def batched_tokens_on(self, gpu: str) -> int:
        """The runs' step budget on `gpu`: the one given, the GPU's chunk budget where the runs
        chunk, else the whole longest prompt (ServingConfig.batched_tokens, as a replay takes it)."""
        return step_budget(ServingConfig(max_num_batched_tokens=self.max_num_batched_tokens, chunked_prefill=self.chunked),
                           self.max_model_len or get_model(self.model).max_model_len, gpu)

    def requests_at(self, rate: float) -> int:
        n = max(self.num_requests, math.ceil(rate * self.min_duration_s))
        if n > MAX_REQUESTS:
            raise ValueError(f"--min-duration {self.min_duration_s:g} s at {rate:g} req/s asks for {n:,} requests, more "
                             f"than the {MAX_REQUESTS:,} one run may hold")
        return n

    def replay_config(self, point: GridPoint, rate: float, num_requests: int | None = None,
                      seed: int | None = None) -> ReplayConfig:
        """The run at `rate` (of requests_at(rate) requests unless given; seed: the settings' unless given)."""
        n = self.requests_at(rate) if num_requests is None else num_requests
        return ReplayConfig(
            model=self.model, gpu=point.gpu, tp=point.tp, policy="paged", block_size=point.block_size,
            preemption=point.preemption, rate=rate, num_requests=n,
            max_num_seqs=point.max_num_seqs, max_num_batched_tokens=self.batched_tokens_on(point.gpu),
            chunked_prefill=self.chunked,
            swap_space_gib=self.swap_space_gib, cost_model=self.cost_model, profile=self.profile,
            seed=self.seed if seed is None else seed, warmup_s=self.warmup_fraction * n / rate, force_profile=self.force_profile,
            kv_cache_dtype=self.kv_cache_dtype, max_model_len=self.max_model_len,
        )


def expand_grid(gpus: list[str], tps: list[int], block_sizes: list[int], preemptions: list[str],
                max_num_seqs: list[int]) -> list[GridPoint]:
    """Every combination, GPU names made canonical (`h200` -> `h200-141gb`), duplicates dropped,
    in a fixed order (the order of the report's table before sorting by cost)."""
    canon = []
    for g in gpus:
        name = get_gpu(g).name  # KeyError lists the catalog
        if name not in canon:
            canon.append(name)
    for mode in preemptions:
        if mode not in CHOICES["preemption"]:
            raise ValueError(f"unknown preemption mode {mode!r}; valid: {', '.join(CHOICES['preemption'])}")
    for what, values, rule in (("--tp", tps, TP), ("--block-size", block_sizes, BLOCK_SIZE),
                               ("--max-num-seqs", max_num_seqs, POSITIVE_SEQS)):
        if not values:
            raise ValueError(f"{what}: no value given")
        for v in values:
            rule.check(v, what)
    points = [GridPoint(g, t, b, p, s) for g, t, b, p, s in
              itertools.product(canon, _unique(tps), _unique(block_sizes), _unique(preemptions), _unique(max_num_seqs))]
    return points


def _unique(values):
    out = []
    for v in values:
        if v not in out:
            out.append(v)
    return out
