"""What a cluster is made of: groups of replicas (each replica an unchanged single-replica
simulation with its own configuration), the router in front, and the links between groups."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pagesim.cluster.autoscale import AutoscalePolicy
from pagesim.cluster.links import DEFAULT_LINK, LINK_KINDS

ROLES = ("mixed", "prefill", "decode")  # mixed: the whole request; prefill / decode: P/D disaggregation
MAX_REPLICAS = 1024


@dataclass
class ReplicaGroup:
    """`count` identical replicas. cfg: the ReplayConfig they run (model, GPU, TP, engine, policy...)."""

    name: str
    cfg: Any  # pagesim.sim.engine.ReplayConfig
    count: int = 1
    role: str = "mixed"


@dataclass
class LinkSpec:
    """The link KV moves over from a prefill group to a decode group (pagesim.cluster.links)."""

    source: str  # prefill group name
    target: str  # decode group name
    kind: str = DEFAULT_LINK
    bandwidth: float | None = None  # bytes/s per GPU; None: the kind's
    latency_s: float | None = None


@dataclass
class ClusterSpec:
    groups: list[ReplicaGroup]
    router: str = "round-robin"
    router_params: dict = field(default_factory=dict)
    # the router's view of each replica's load (waiting, running, KV usage) is refreshed this often;
    # 0: read at every routing decision (see pagesim.cluster.cluster)
    staleness_s: float = 0.0
    links: list[LinkSpec] = field(default_factory=list)
    # a replica count that follows load (pagesim.cluster.fleet): the one group's count is the
    # number serving at t = 0; up to autoscale.max_replicas are built
    autoscale: AutoscalePolicy | None = None
    # data-parallel ranks of a MoE with expert parallelism: the group's replicas step in lockstep
    # (pagesim.cluster.lockstep)
    lockstep: bool = False

    def check(self) -> None:
        """ValueError naming the problem: roles that cannot serve a request, links to nowhere."""
        names = [g.name for g in self.groups]
        if not self.groups:
            raise ValueError("a cluster needs at least one replica group")
        if len(set(names)) != len(names):
            raise ValueError(f"replica group names repeat: {names}")
        total = sum(g.count for g in self.groups)
        if total > MAX_REPLICAS:
            raise ValueError(f"{total} replicas, more than the {MAX_REPLICAS} a cluster may hold")
        roles = {g.role for g in self.groups}
        if roles - set(ROLES):
            raise ValueError(f"unknown role(s) {sorted(roles - set(ROLES))}; one of {', '.join(ROLES)}")
        if "mixed" in roles and roles != {"mixed"}:
            raise ValueError("mixed replicas cannot be combined with prefill/decode ones in one cluster")
        if roles & {"prefill", "decode"} and roles != {"prefill", "decode"}:
            missing = ({"prefill", "decode"} - roles).pop()
            raise ValueError(f"P/D disaggregation needs both prefill and decode groups; no {missing} group")
        if self.staleness_s < 0:
            raise ValueError(f"staleness_s must be >= 0, got {self.staleness_s}")
        if self.autoscale is not None:
            if len(self.groups) != 1 or self.groups[0].role != "mixed":
                raise ValueError("autoscale scales one group of mixed replicas (not P/D or several groups yet)")
            p, count = self.autoscale, self.groups[0].count
            if not p.min_replicas <= count <= p.max_replicas:
                raise ValueError(f"autoscale: the cluster starts with {count} replicas, outside min={p.min_replicas} "
                                 f"and max={p.max_replicas}")
            if p.max_replicas > MAX_REPLICAS:
                raise ValueError(f"autoscale: max={p.max_replicas}, more than the {MAX_REPLICAS} a cluster may hold")
        if self.lockstep and (len(self.groups) != 1 or self.groups[0].role != "mixed" or self.autoscale):
            raise ValueError("lockstep: one group of mixed replicas (the DP ranks), not P/D, several groups or autoscaled")
        role_of = {g.name: g.role for g in self.groups}
        for link in self.links:
            for end, want in ((link.source, "prefill"), (link.target, "decode")):
                if end not in role_of:
                    raise ValueError(f"link {link.source} -> {link.target}: no group named {end!r}")
                if role_of[end] != want:
                    raise ValueError(f"link {link.source} -> {link.target}: {end!r} is a {role_of[end]} group, "
                                     f"a link goes from a prefill group to a decode group")
            if link.kind not in LINK_KINDS:
                raise ValueError(f"link {link.source} -> {link.target}: unknown kind {link.kind!r}; one of "
                                 f"{', '.join(LINK_KINDS)}")

    def link_between(self, source: str, target: str) -> LinkSpec:
        for link in self.links:
            if link.source == source and link.target == target:
                return link
        return LinkSpec(source, target)  # the default kind
