"""A cluster run's results: the requests as the clients saw them (one record each, with the
replica, and under P/D the decode replica, that served it), the cluster summary (the single
replay's schema, pooled over the replicas, plus a `cluster` section: load imbalance, per-replica
figures, and under P/D the TTFT split into queue, prefill and transfer; autoscaled, an `autoscale`
section: GPU-hours and the replica count over time), and the files.

Files (`write`): requests.csv (requests.csv's columns, then `replica` and `decode_replica`),
summary.json, replicas.csv (one row per replica), steps_replica<K>.csv, each replica's steps.csv
(what `pagesim view` plots as per-replica load over time), and waste_replica<K>.csv where the
KV waste was sampled; autoscaled, fleet.csv (each replica asked for, serving, draining, released).
"""

from __future__ import annotations

import json
import statistics
from array import array
from dataclasses import asdict, replace
from operator import attrgetter
from pathlib import Path

from pagesim.metrics import (REQUEST_FIELDS, WASTE_FIELDS, RequestColumns, RequestRecord, summarize_requests,
                             summarize_steps)
from pagesim.cluster.fleet import FLEET_COLUMNS
from pagesim.metrics import files

CLUSTER_COLUMNS = ("replica", "decode_replica")
REPLICA_COLUMNS = ("replica", "group", "role", "model", "gpu", "tp", "requests", "finished", "rejected", "busy_s",
                   "num_steps", "mean_batched_requests", "mean_kv_utilization", "peak_kv_utilization",
                   "num_preemptions", "prefix_hit_rate", "ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99")
# the summary keys a replica's own summary holds that describe its configuration, not its requests
CONFIG_KEYS = ("config", "num_kv_blocks", "num_host_blocks", "kv_token_slots", "max_model_len", "cost_model", "notes")


class ClusterResult:
    def __init__(self, cluster, results: list) -> None:
        self.cluster = cluster
        self.results = results  # each replica's ReplayResult, in replica order
        # (replicas replayed apart: spill.MergedRecords, read from files as needed, a record built when asked for)
        records = cluster.records
        self.requests = records if isinstance(records, RequestColumns) else [client_record(r) for r in records]
        self._replica, self._decode_replica = cluster.record_replica, cluster.record_decode
        self.summary = self._summary()

    @property
    def replica(self) -> array:
        """Each request's replica (under P/D its prefill replica), in the order of `requests`."""
        if self._replica is None:  # (replayed apart: the merge's, built when first asked for)
            self._replica = array("i", self.requests.replicas().tobytes())
        return self._replica

    @property
    def decode_replica(self) -> array:
        """Each request's decode replica under P/D, -1 otherwise."""
        if self._decode_replica is None:  # (replayed apart: no P/D)
            self._decode_replica = array("i", [-1]) * len(self.requests)
        return self._decode_replica

    def _summary(self) -> dict:
        results, cluster = self.results, self.cluster
        if len(results) == 1:
            summary = dict(results[0].summary)  # one replica: the single replay's summary, as it is
        else:
            first = results[0]
            summary = summarize_requests(self.requests, first.config.warmup_s, first.metrics.origin,
                                         [r.metrics.span_tally for r in results if r.metrics.span_tally is not None])
            summary.update(summarize_steps([r.metrics for r in results]))
            summary.update({key: first.summary[key] for key in CONFIG_KEYS})
            for key in ("num_kv_blocks", "num_host_blocks", "kv_token_slots"):
                summary[key] = sum(r.summary[key] for r in results)
            summary["notes"] = _unique(note for r in results for note in r.summary["notes"])
        summary["cluster"] = self._cluster_section()
        if cluster.fleet is not None:
            summary["autoscale"] = cluster.fleet.section(cluster.end_time)
        return summary

    def _cluster_section(self) -> dict:
        cluster, spec = self.cluster, self.cluster.spec
        per_replica = [len(r.metrics.requests) for r in self.results]
        busy = [r.metrics.step_log.duration_sum for r in self.results]
        resolved = {}
        for r in reversed(cluster.replicas):
            resolved[r.group] = r.sim.cfg
        section = {
            "num_replicas": len(self.results),
            "router": spec.router,
            "router_params": spec.router_params,
            "staleness_s": spec.staleness_s,
            # (each group's configuration as its replicas run it: resolved, as summary["config"] is)
            "groups": [{"name": g.name, "count": g.count, "role": g.role, "config": asdict(resolved[g.name])}
                       for g in spec.groups],
            "links": [asdict(link) for link in spec.links],
            "requests_per_replica": per_replica,
            "busy_s_per_replica": busy,
            "imbalance": {**imbalance("requests", per_replica), **imbalance("busy", busy)},
        }
        if cluster.pd:
            section["ttft_split"] = _ttft_split(cluster.pd_done, self.cluster.records)
        return section

    def replica_rows(self) -> list[tuple]:
        rows = []
        for r, result in zip(self.cluster.replicas, self.results):
            s, cfg = result.summary, result.config
            rows.append((r.index, r.group, r.role, cfg.model, cfg.gpu, cfg.tp, s["num_requests"], s["num_finished"],
                         s["num_rejected"], result.metrics.step_log.duration_sum, s["num_steps"],
                         s["mean_batched_requests"], s["mean_kv_utilization"], s["peak_kv_utilization"],
                         s["num_preemptions"], s["prefix_hit_rate"], s["ttft_p50"], s["ttft_p99"], s["e2e_p50"],
                         s["e2e_p99"]))
        return rows

    def write(self, out: Path, summary: dict, steps: str = "all") -> None:
        """The results folder's files (into a folder pagesim.results stages)."""
        out = Path(out)
        files.write_rows_csv(out / "requests.csv", REQUEST_FIELDS + CLUSTER_COLUMNS, self._request_rows())
        files.write_rows_csv(out / "replicas.csv", REPLICA_COLUMNS, self.replica_rows())
        for k, result in enumerate(self.results):
            if steps != "none":
                files.write_steps_csv(out / f"steps_replica{k}.csv", result.metrics.step_log, steps)
            if result.metrics.waste:
                files.write_rows_csv(out / f"waste_replica{k}.csv", WASTE_FIELDS, result.metrics.waste)
        if self.cluster.fleet is not None:
            files.write_rows_csv(out / "fleet.csv", FLEET_COLUMNS, self.cluster.fleet.events)
        (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")

    def _request_rows(self):
        """requests.csv's rows, in order (replayed apart: merged from the replicas' files a stretch
        at a time, none with a decode replica)."""
        get = attrgetter(*REQUEST_FIELDS)
        if self._replica is None:
            for records, replicas in self.requests.chunks():
                for record, replica in zip(records, replicas.tolist()):
                    yield get(record) + (replica, None)
            return
        for record, replica, decode in zip(self.requests, self.replica, self.decode_replica):
            yield get(record) + (replica, None if decode < 0 else decode)

    def written(self, steps: str) -> list[str]:
        names = ["requests.csv", "replicas.csv", "summary.json"] + (["fleet.csv"] if self.cluster.fleet else [])
        names += [f"steps_replica{k}.csv" for k in range(len(self.results))] if steps != "none" else []
        return names + [f"waste_replica{k}.csv" for k, r in enumerate(self.results) if r.metrics.waste]


def client_record(record: RequestRecord | tuple[RequestRecord, RequestRecord]) -> RequestRecord:
    """A cluster's record (Cluster.records) as its client saw the request: a P/D pair merged
    (_merged), any other as it is."""
    return _merged(record) if isinstance(record, tuple) else record


def _merged(pair: tuple[RequestRecord, RequestRecord]) -> RequestRecord:
    """One P/D request as its client saw it: the decode replica's record (its first token and
    every later one come from there), with the queue it met and the prefix hits, preemptions and
    swaps of both sides."""
    prefill, decode = pair
    return replace(decode, first_scheduled_time=prefill.first_scheduled_time,
                   num_preemptions=prefill.num_preemptions + decode.num_preemptions,
                   num_swaps=prefill.num_swaps + decode.num_swaps,
                   cached_prompt_tokens=prefill.cached_prompt_tokens + decode.cached_prompt_tokens)


def imbalance(name: str, values: list[float]) -> dict:
    """max / mean and the coefficient of variation (population standard deviation / mean)."""
    mean = sum(values) / len(values) if values else 0.0
    return {f"{name}_max_over_mean": max(values) / mean if mean else None,
            f"{name}_cv": statistics.pstdev(values) / mean if mean else None}


def _ttft_split(handoffs: list, records: list) -> dict:
    """Per finished P/D request, TTFT's parts: queue (arrival to its prefill starting), prefill
    (to its token on the prefill replica), link wait (for the prefill replica's link), transfer
    (the KV on the link), decode wait (for room on the decode replica: back-pressure) and the
    decode replica's first step (which gives the client its first token)."""
    parts = {name: [] for name in ("queue", "prefill", "link_wait", "transfer", "decode_wait", "first_step")}
    pairs = {p[1].request_id: p for p in records if isinstance(p, tuple)}
    for h in handoffs:
        prefill, decode = pairs[h.prefill_record.request_id]
        if decode.status != "finished":
            continue
        parts["queue"].append(prefill.first_scheduled_time - prefill.arrival_time)
        parts["prefill"].append(h.prefill_end - prefill.first_scheduled_time)
        parts["link_wait"].append(h.link_start - h.prefill_end)
        parts["transfer"].append(h.link_end - h.link_start)
        parts["decode_wait"].append(decode.first_scheduled_time - h.link_end)
        parts["first_step"].append(decode.first_token_time - decode.first_scheduled_time)
    return {f"{name}_mean_s": sum(v) / len(v) if v else None for name, v in parts.items()}


def _unique(items) -> list:
    return list(dict.fromkeys(items))
