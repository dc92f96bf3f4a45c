"""Autoscaling: a replica count that follows load.

Every `interval_s` the autoscaler reads what a real one (KEDA on vLLM's gauges, llm-d's variant
autoscaler) reads: per replica waiting requests and KV cache usage. It asks for one more replica
when the load per serving replica is above `up_at`, and for one fewer when below `down_at`, never
beyond [min_replicas, max_replicas] and never within `cooldown_s` of its last change. A new
replica serves only `startup_s` after it was asked for (loading weights, warming CUDA graphs) but
holds its GPUs from the moment it was asked for; a replica let go stops taking requests at once
and gives its GPUs back once its last request has ended (drained). GPU-hours count every GPU held.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from pagesim.cluster.routers.base import ReplicaLoad
from pagesim.inputs import MAX_SIM_SECONDS, SECONDS, NumberRule

METRICS = ("queue", "kv")  # waiting requests per serving replica; mean KV cache usage (0..1)


# The autoscaler is evaluated every interval_s of simulated time whatever happens, so a tiny one
# would run forever (1e-300 s never advances the clock); real ones poll every few seconds.
_SECONDS_RULES = {"interval_s": NumberRule(lo=0.01, hi=MAX_SIM_SECONDS, why="seconds between evaluations; each one "
                                           "is simulated, and real autoscalers poll every few seconds"),
                  "startup_s": SECONDS, "cooldown_s": SECONDS}


@dataclass(frozen=True)
class AutoscalePolicy:
    metric: str = "queue"
    up_at: float = 4.0  # scale up when the metric is above this
    down_at: float = 0.5  # scale down when below this
    min_replicas: int = 1
    max_replicas: int = 8
    interval_s: float = 10.0
    startup_s: float = 60.0
    cooldown_s: float = 120.0

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"autoscale metric must be one of {', '.join(METRICS)}, got {self.metric!r}")
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"need 1 <= min_replicas <= max_replicas, got {self.min_replicas} and {self.max_replicas}")
        if not self.down_at < self.up_at:
            raise ValueError(f"down_at ({self.down_at}) must be below up_at ({self.up_at}), or the count would flap")
        for name, rule in _SECONDS_RULES.items():  # (finite and in range: NaN, inf and negatives fail too)
            problem = rule.problem(getattr(self, name))
            if problem:
                raise ValueError(f"{name} {problem}")

    def load(self, serving: Sequence[ReplicaLoad]) -> float:
        """The metric over the replicas now serving."""
        if not serving:
            return math.inf
        if self.metric == "queue":
            return sum(r.waiting for r in serving) / len(serving)
        return sum(r.kv_usage for r in serving) / len(serving)


@dataclass
class Autoscaler:
    """Decides, at each evaluation, +1, -1 or 0 replicas; the cluster carries the change out."""

    policy: AutoscalePolicy
    last_change: float = -math.inf
    decisions: list[tuple[float, int, float]] = field(default_factory=list)  # (time, change, metric)

    def decide(self, now: float, serving: Sequence[ReplicaLoad], starting: int) -> int:
        """serving: the replicas taking requests now; starting: replicas asked for, not serving yet."""
        policy = self.policy
        count = len(serving) + starting
        if now - self.last_change < policy.cooldown_s:
            return 0
        load = policy.load(serving)
        change = 0
        # while replicas are starting, the load they will take is not known yet: wait for them
        if load > policy.up_at and count < policy.max_replicas and starting == 0:
            change = 1
        elif load < policy.down_at and count > policy.min_replicas and len(serving) > 1:
            change = -1
        if change:
            self.last_change = now
            self.decisions.append((now, change, load))
        return change


@dataclass
class GpuHours:
    """GPUs held over time: replicas count from when they were asked for until drained."""

    held_since: dict[int, float] = field(default_factory=dict)  # replica index -> time its GPUs were taken
    gpus: dict[int, int] = field(default_factory=dict)
    gpu_seconds: float = 0.0

    def take(self, replica: int, num_gpus: int, now: float) -> None:
        self.held_since[replica] = now
        self.gpus[replica] = num_gpus

    def release(self, replica: int, now: float) -> None:
        self.gpu_seconds += (now - self.held_since.pop(replica)) * self.gpus.pop(replica)

    def total_hours(self, now: float) -> float:
        """GPU-hours so far, counting replicas still held up to now."""
        held = sum((now - since) * self.gpus[r] for r, since in self.held_since.items())
        return (self.gpu_seconds + held) / 3600.0


# --autoscale's keys (and a cluster file's [autoscale] table's) -> AutoscalePolicy fields
POLICY_KEYS = {"metric": "metric", "up_at": "up_at", "down_at": "down_at", "min": "min_replicas",
               "max": "max_replicas", "startup": "startup_s", "cooldown": "cooldown_s", "interval": "interval_s"}


def policy_from_mapping(values: dict, where: str) -> AutoscalePolicy:
    """The policy a mapping of POLICY_KEYS gives (strings are parsed); ValueError naming `where`
    and the key on a bad one."""
    kwargs = {}
    for key, value in values.items():
        if key not in POLICY_KEYS:
            raise ValueError(f"{where}: unknown key {key!r}; one of {', '.join(POLICY_KEYS)}")
        name = POLICY_KEYS[key]
        if name == "metric":
            kwargs[name] = str(value)
            continue
        kind = int if name.endswith("replicas") else float
        try:
            if isinstance(value, bool) or (kind is int and isinstance(value, float)):
                raise ValueError
            kwargs[name] = kind(value)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: {key}: {'a whole number' if kind is int else 'a number'}, got {value!r}") from None
        if not math.isfinite(kwargs[name]):
            raise ValueError(f"{where}: {key}: a finite number, got {value!r}")
    try:
        return AutoscalePolicy(**kwargs)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def parse_autoscale(text: str) -> AutoscalePolicy:
    """`--autoscale metric=queue,up_at=4,down_at=0.5,min=1,max=8,startup=60,cooldown=120,interval=10`
    (every key optional: AutoscalePolicy's defaults)."""
    values = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not value.strip():
            raise ValueError(f"--autoscale: {part!r} is not KEY=VALUE (keys: {', '.join(POLICY_KEYS)})")
        if key.strip() in values:
            raise ValueError(f"--autoscale: {key.strip()} given twice")
        values[key.strip()] = value.strip()
    return policy_from_mapping(values, "--autoscale")
