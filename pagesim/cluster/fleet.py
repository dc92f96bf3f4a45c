"""An autoscaled fleet inside a cluster: which replicas hold GPUs, which take requests, and the
process that asks the Autoscaler (pagesim.cluster.autoscale) every interval_s.

The cluster builds max_replicas replicas of its one group up front (an unchanged Replay each);
the fleet decides which of them exist at a time. A replica moves through
    off -> starting (asked for: holds its GPUs, accepting=False) -> serving (after startup_s)
        -> draining (let go: accepting=False at once) -> off (its last request ended: GPUs freed)
A scale-up when no replica is off (all held, some draining) takes back the draining replica
with the most requests left: it is still loaded and warm, so it serves again at once.
The cool-down counts from the last change's effect (a replica asked for: when it serves).
A scale-down lets go of the serving replica with the fewest requests outstanding (ties: the
highest index), so the drain is short.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pagesim.cluster.autoscale import AutoscalePolicy, Autoscaler, GpuHours
from pagesim.cluster.routers.base import ReplicaLoad

FLEET_COLUMNS = ("time", "replica", "event", "serving", "held")  # fleet.csv
EVENTS = ("asked", "serving", "draining", "released", "taken_back")


def gpus_per_replica(cfg) -> int:
    """GPUs one replica holds: its tensor-parallel group, or its expert-parallel ranks (ep / tp
    data-parallel ranks of tp GPUs each)."""
    return max(cfg.tp, cfg.ep)


@dataclass
class Fleet:
    policy: AutoscalePolicy
    num_gpus: list[int]  # per replica (all max_replicas of them)
    initial: int  # replicas serving from t = 0
    state: list[str] = field(init=False)
    hours: GpuHours = field(default_factory=GpuHours)
    events: list[tuple[float, int, str, int, int]] = field(default_factory=list)  # FLEET_COLUMNS rows

    def __post_init__(self) -> None:
        if not self.policy.min_replicas <= self.initial <= self.policy.max_replicas:
            raise ValueError(f"autoscale: the cluster starts with {self.initial} replicas, outside min={self.policy.min_replicas} "
                             f"and max={self.policy.max_replicas}")
        self.scaler = Autoscaler(self.policy)
        self.state = ["serving"] * self.initial + ["off"] * (len(self.num_gpus) - self.initial)
        for k in range(self.initial):
            self.hours.take(k, self.num_gpus[k], 0.0)
            self._log(0.0, k, "serving")

    def accepting(self, index: int) -> bool:
        return self.state[index] == "serving"

    def count(self, state: str) -> int:
        return self.state.count(state)

    def _log(self, now: float, index: int, event: str) -> None:
        held = len(self.state) - self.count("off")
        self.events.append((now, index, event, self.count("serving"), held))

    # -- the process --------------------------------------------------------------------------
    def process(self, env, cluster):
        """Every interval_s: the serving replicas' loads (as fresh as a /metrics scrape), a
        decision, and its execution. Runs until the cluster's engines end (env.run stops it)."""
        interval = self.policy.interval_s
        while True:
            yield env.timeout(interval)
            now = env.now
            # read now, into views of its own: the router's keep their staleness
            serving = [_load(k, cluster._gauges(k), now) for k, state in enumerate(self.state) if state == "serving"]
            outstanding = [load.outstanding for load in cluster.board.loads]
            change = self.scaler.decide(now, serving, self.count("starting"))
            if change > 0:
                self._scale_up(env, now, outstanding)
            elif change < 0:
                self._scale_down(now, outstanding)

    def _scale_up(self, env, now: float, outstanding: list[int]) -> None:
        if "off" in self.state:
            k = self.state.index("off")
            self.state[k] = "starting"
            self.hours.take(k, self.num_gpus[k], now)
            self._log(now, k, "asked")
            timer = env.timeout(self.policy.startup_s)
            timer.callbacks.append(lambda event, k=k: self._started(k, env.now))
            return
        draining = [k for k, s in enumerate(self.state) if s == "draining"]
        if draining:  # every replica is held: take back the fullest one still draining
            k = max(draining, key=lambda i: (outstanding[i], -i))
            self.state[k] = "serving"
            self._log(now, k, "taken_back")

    def _started(self, index: int, now: float) -> None:
        self.state[index] = "serving"
        self._log(now, index, "serving")
        # the cool-down runs from when the change took effect: a cool-down shorter than the
        # start-up would otherwise let the next evaluation drop the replica just started
        self.scaler.last_change = max(self.scaler.last_change, now)

    def _scale_down(self, now: float, outstanding: list[int]) -> None:
        serving = [k for k, s in enumerate(self.state) if s == "serving"]
        k = min(serving, key=lambda i: (outstanding[i], -i))
        self.state[k] = "draining"
        self._log(now, k, "draining")
        self.check_drained(k, outstanding[k], now)

    def check_drained(self, index: int, outstanding: int, now: float) -> None:
        """A draining replica whose last request has ended gives its GPUs back."""
        if self.state[index] == "draining" and outstanding == 0:
            self.state[index] = "off"
            self.hours.release(index, now)
            self._log(now, index, "released")

    # -- the summary --------------------------------------------------------------------------
    def section(self, end: float) -> dict:
        """summary.json's `autoscale` section: the policy, GPU-hours, the replica count over time."""
        p = self.policy
        serving_s = self._time_weighted(end, column=3)
        return {
            "policy": {"metric": p.metric, "up_at": p.up_at, "down_at": p.down_at, "min": p.min_replicas,
                       "max": p.max_replicas, "startup_s": p.startup_s, "cooldown_s": p.cooldown_s,
                       "interval_s": p.interval_s},
            "gpu_hours": self.hours.total_hours(end),
            "end_s": end,
            "mean_serving_replicas": serving_s,
            "peak_held_replicas": max(e[4] for e in self.events),
            "decisions": [{"time": t, "change": c, "metric": m} for t, c, m in self.scaler.decisions],
            # (time, replicas serving, replicas holding GPUs) after each change
            "replicas_over_time": [[t, serving, held] for t, _, _, serving, held in self.events],
            # (time, replica, event): what the load picture marks (pagesim.view.cluster)
            "replica_events": [[t, k, event] for t, k, event, _, _ in self.events],
        }

    def _time_weighted(self, end: float, column: int) -> float | None:
        if end <= 0:
            return None
        total, events = 0.0, self.events
        for (t, *row), nxt in zip(events, events[1:] + [(end,)]):
            total += (min(nxt[0], end) - t) * row[column - 1]
        return total / end


def _load(index: int, gauges, now: float) -> ReplicaLoad:
    return ReplicaLoad(index, gauges.waiting, gauges.running, gauges.kv_usage, info_time=now)
