"""`pagesim replay TRACE --replicas N | --pd P:D | --cluster FILE`: the trace through a simulated
cluster (pagesim.cluster; docs/cluster.md). The command line's options describe every replica
(--replicas, --pd) or are the defaults a cluster file's groups override."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from pagesim.cli.checks import check_workload, fail, progress_bar, warn

PD = re.compile(r"^(\d+):(\d+)$")
CLUSTER_FLAGS = ("replicas", "router", "staleness", "pd", "link", "cluster", "autoscale", "lockstep")  # replay's flags that make it a cluster


def cluster_spec(ctx, options: dict, flags: dict):
    """The ClusterSpec the flags describe; a bad combination or file is one line (exit 2)."""
    from pagesim.api import replay_config
    from pagesim.cluster.cluster_file import ClusterFileError, read_cluster_file
    from pagesim.cluster.routers import make_router
    from pagesim.cluster.spec import ClusterSpec, LinkSpec, ReplicaGroup

    replicas, pd, file = flags["replicas"], flags["pd"], flags["cluster"]
    if sum(x is not None for x in (replicas, pd, file)) > 1:
        fail("--replicas, --pd and --cluster each describe the whole cluster: give one of them")
    if flags["link"] is not None and pd is None:
        fail("--link is the link of a --pd cluster (a cluster file names its links)")
    try:
        if file is not None:
            for flag in ("router", "staleness"):
                if flags[flag] is not None:
                    fail(f"--{flag}: the cluster file {file} sets the router ([router] in the file)")
            if flags["lockstep"]:
                fail(f"--lockstep: the cluster file {file} describes the cluster (lockstep = true in the file)")
            if flags["autoscale"] is not None:
                fail(f"--autoscale: the cluster file {file} describes the cluster (an [autoscale] table in the file)")
            return read_cluster_file(file, lambda group: replay_config(**_over(options, group)))
        autoscale = None
        if flags["autoscale"] is not None:
            from pagesim.cluster.autoscale import parse_autoscale

            if pd is not None:
                fail("--autoscale scales a group of mixed replicas, not a --pd cluster")
            autoscale = parse_autoscale(flags["autoscale"])
            replicas = replicas or autoscale.min_replicas  # (--replicas: how many serve at t = 0)
        cfg = replay_config(**options)
        router = flags["router"] or "round-robin"
        make_router(router)
        staleness = flags["staleness"] or 0.0
        if pd is None:
            spec = ClusterSpec([ReplicaGroup("replicas", cfg, replicas or 1)], router, {}, staleness, autoscale=autoscale,
                               lockstep=bool(flags["lockstep"]))
            spec.check()
            return spec
        match = PD.match(pd)
        if not match or int(match[1]) < 1 or int(match[2]) < 1:
            fail(f"--pd {pd}: P:D, two whole numbers of replicas >= 1 (e.g. 2:6)")
        links = [LinkSpec("prefill", "decode", flags["link"] or "infiniband")]
        spec = ClusterSpec([ReplicaGroup("prefill", cfg, int(match[1]), "prefill"),
                            ReplicaGroup("decode", cfg, int(match[2]), "decode")], router, {}, staleness, links)
        spec.check()
        return spec
    except ClusterFileError as e:
        fail(str(e))
    except (KeyError, ValueError, TypeError) as e:
        fail(str(e.args[0] if isinstance(e, KeyError) else e))


def _over(options: dict, group: dict) -> dict:
    """The command line's options with a group's keys over them; a group's `swap_space_gib` replaces
    the command line's `swap_space` (one option under two names: summary.json's and the flag's)."""
    from pagesim.api import RENAMED_OPTIONS

    merged = dict(options)
    for flag, field in RENAMED_OPTIONS.items():
        if flag in group or field in group:
            merged.pop(flag, None)
            merged.pop(field, None)
    return {**merged, **group}


def replay_cluster(ctx, trace: Path, loaded, options: dict, flags: dict, out: Path | None, steps: str, as_json: bool,
                   warmup: float, duration: float | None, jobs: int = 0) -> None:
    from pagesim.cli.replay import emit_results, hardware_label
    from pagesim.cluster.cluster import Cluster

    spec = cluster_spec(ctx, options, flags)
    try:
        cluster = Cluster(spec, loaded, keep_steps=out is not None and steps != "none")
    except (KeyError, ValueError, OSError) as e:
        fail(str(e.args[0] if isinstance(e, KeyError) else e))
    check_workload(cluster.requests, warmup, duration)
    if jobs > 1 and not cluster.independent:
        warn(f"--jobs {jobs}: this cluster's replicas affect one another ({cluster.coupled_by}): they run together "
             "on one clock, in one process")
    with progress_bar("replay", "requests", len(cluster.requests), quiet=as_json) as advance:
        cluster.on_progress = advance
        result = cluster.run(jobs=jobs or None)
    summary = dict(result.summary, trace=str(trace))
    if flags["cluster"] is not None:  # the options the file's groups override (so --config re-creates the run)
        from dataclasses import asdict

        from pagesim.api import replay_config

        summary["config"] = asdict(replay_config(**options))
    if out is not None:
        summary["reproduce"] = reproduce_line(ctx, trace, steps)
    first = spec.groups[0].cfg
    groups = " + ".join(f"{g.count} x {g.role}" for g in spec.groups)
    if spec.autoscale is not None:  # (its KV blocks below are those of all max replicas it may hold)
        groups = (f"{spec.groups[0].count} x {spec.groups[0].role} autoscaled to {spec.autoscale.min_replicas}-"
                  f"{spec.autoscale.max_replicas}, KV pool at {spec.autoscale.max_replicas}")
    hardware = hardware_label(first, result.results[0].summary)
    title = f"cluster {groups} · router {spec.router} · {first.policy} · {hardware}"
    reproduce = None if out is None else summary["reproduce"].replace("SUMMARY_JSON", str(out / "summary.json"))
    emit_results(summary, result, out, as_json, title, steps, reproduce=reproduce, written=result.written(steps))


def reproduce_line(ctx, trace: Path, steps: str) -> str:
    """The command that re-creates the run: the base options from summary.json's config (the
    first group's), the cluster flags as given."""
    words = ["pagesim", "replay", str(trace), "--config", "SUMMARY_JSON"]
    for name in CLUSTER_FLAGS:
        value = ctx.params.get(name)
        if value is True:
            words.append(f"--{name}")
        elif value is not None:
            words += [f"--{name}", str(value)]
    words += ["--steps", steps] if steps != "all" else []
    return shlex.join(words + ["--out"]) + " NEW_FOLDER"
