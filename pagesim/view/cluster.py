"""Per-replica panels of a cluster run: requests.csv names each request's `replica` (and, with
prefill/decode disaggregation, its `decode_replica`); steps_replica<K>.csv, where written, holds
replica K's steps."""

from __future__ import annotations

from pagesim.metrics import percentile
from pagesim.view.charts import color, draw_series, legend_outside, new_figure, over_time, to_svg
from pagesim.view.panels import Panel, request_latencies, time_axis_label
from pagesim.view.runs import Run

MAX_LINES = 8  # replicas drawn as lines; more: one heat-map row each
GRID = 400  # instants at which the requests in flight are counted


def is_cluster(run: Run) -> bool:
    q = run.requests
    return bool(run.replica_steps) or bool(q and "replica" in q and any(v is not None for v in q["replica"]))


def replica_of_request(run: Run) -> list[tuple[int | None, int | None]]:
    """(replica computing the prompt, replica decoding) of each request; the same replica twice
    where the request was not handed over."""
    q = run.requests
    decode = q.get("decode_replica") or [None] * len(q["status"])
    pairs = []
    for r, d in zip(q["replica"], decode):
        first = None if r is None else int(r)
        pairs.append((first, first if d is None else int(d)))
    return pairs


def in_flight(run: Run) -> tuple[list[float], dict[int, list[int]]]:
    """Requests in flight on each replica at GRID instants: a request is on its replica from its
    arrival to its first token, then on its decode replica (the same one unless handed over)
    until it finishes. Rejected and unfinished requests are left out."""
    import numpy as np

    q = run.requests
    intervals: dict[int, tuple[list, list]] = {}
    for (first, decode), status, arrival, token, finish in zip(replica_of_request(run), q["status"], q["arrival_time"],
                                                              q["first_token_time"], q["finish_time"]):
        if status != "finished" or first is None or token is None or finish is None:
            continue
        for replica, start, end in ((first, arrival, token), (decode, token, finish)) if first != decode else \
                ((first, arrival, finish),):
            starts, ends = intervals.setdefault(replica, ([], []))
            starts.append(start - run.origin)
            ends.append(end - run.origin)
    last = max((max(e) for _, e in intervals.values()), default=1.0)
    grid = np.linspace(0, last, GRID)
    counts = {}
    for replica in sorted(intervals):
        starts, ends = (np.sort(np.asarray(v)) for v in intervals[replica])
        counts[replica] = (np.searchsorted(starts, grid, side="right") - np.searchsorted(ends, grid, side="right")).tolist()
    return grid.tolist(), counts


def cluster_panels(run: Run) -> list[Panel]:
    if not (run.requests and "replica" in run.requests):
        panels = []
    else:
        panels = [_load_panel(run), _latency_panel(run)]
    if isinstance(run.summary.get("autoscale"), dict):
        panels.insert(0, _fleet_panel(run))
    if run.replica_steps:
        panels.append(_replica_steps_panel(run))
    else:
        panels.append(Panel(f"Batch size per replica: {run.label}", None,
                            "No steps_replica<K>.csv files: the per-replica step logs were not written."))
    return panels


def _load_panel(run: Run) -> Panel:
    grid, counts = in_flight(run)
    fig, (ax,) = new_figure(height=2.8 if len(counts) <= MAX_LINES else 0.8 + 0.25 * len(counts))
    if len(counts) <= MAX_LINES:
        for k, replica in enumerate(counts):
            ax.plot(grid, counts[replica], color=color(k), lw=1, label=f"replica {replica}")
        marks = _mark_fleet_events(ax, run, {replica: k for k, replica in enumerate(counts)})
        ax.set_ylabel("requests in flight")
        legend_outside(ax)
        ax.set_ylim(bottom=0)
    else:
        image = ax.imshow([counts[r] for r in counts], aspect="auto", cmap="viridis", interpolation="nearest",
                          extent=(grid[0], grid[-1], len(counts) - 0.5, -0.5))
        ax.set_yticks(range(len(counts)), [str(r) for r in counts])
        ax.set_ylabel("replica")
        ax.grid(False)
        fig.colorbar(image, ax=ax, label="requests in flight")
        marks = ""
    ax.set_xlabel(time_axis_label([run]))
    pd = any(a != b for a, b in replica_of_request(run))
    how = (" A handed-over request counts on its prefill replica until its first token, then on its decode replica."
           if pd else "")
    return Panel(f"Load per replica: {run.label}", to_svg(fig),
                 f"Finished requests between arrival and finish, per replica (requests.csv's replica column).{how}{marks}")


FLEET_MARKS = {"serving": "--", "released": ":"}  # an autoscaled replica starts serving / gives its GPUs back


def _mark_fleet_events(ax, run: Run, colour_of: dict[int, int]) -> str:
    """Vertical lines where an autoscaled replica started serving or was released (summary.json's
    autoscale.replica_events; t = 0 left out); a sentence for the caption, or ''."""
    section = run.summary.get("autoscale")
    if not isinstance(section, dict):
        return ""
    for t, replica, event in section.get("replica_events", []):
        if event in FLEET_MARKS and t > 0:
            ax.axvline(t - run.origin, color=color(colour_of.get(replica, replica)), ls=FLEET_MARKS[event], lw=0.8)
    return " Autoscaled: a dashed line where a replica starts serving, a dotted one where it gives its GPUs back."


def _fleet_panel(run: Run) -> Panel:
    section = run.summary["autoscale"]
    points = section["replicas_over_time"]
    end = section["end_s"]
    fig, (ax,) = new_figure(height=2.4)
    times = [p[0] - run.origin for p in points] + [end - run.origin]
    for column, label, k in ((1, "serving", 0), (2, "holding GPUs", 1)):
        ax.step(times, [p[column] for p in points] + [points[-1][column]], where="post", color=color(k), label=label)
    ax.set_xlabel(time_axis_label([run]))
    ax.set_ylabel("replicas")
    ax.set_ylim(bottom=0)
    legend_outside(ax)
    return Panel(f"Autoscaled fleet: {run.label}", to_svg(fig),
                 f"Replicas serving and replicas holding GPUs (asked for and starting, or draining) over time; "
                 f"{section['gpu_hours']:.3f} GPU-hours, {len(section['decisions'])} scaling decisions.")


def _latency_panel(run: Run) -> Panel:
    q = run.requests
    by_replica: dict[int, dict[str, list]] = {}
    pairs = replica_of_request(run)
    finished = [i for i, s in enumerate(q["status"]) if s == "finished" and q["first_token_time"][i] is not None
                and q["finish_time"][i] is not None]
    lat = request_latencies(run)  # (in the order of `finished`)
    for k, i in enumerate(finished):
        first, decode = pairs[i]
        if first is not None:
            by_replica.setdefault(first, {"ttft": [], "e2e": []})["ttft"].append(lat["ttft"][k])
        if decode is not None:
            by_replica.setdefault(decode, {"ttft": [], "e2e": []})["e2e"].append(lat["e2e"][k])
    replicas = sorted(by_replica)
    fig, axes = new_figure(3)
    served = [len(by_replica[r]["e2e"]) for r in replicas]
    axes[0].bar(range(len(replicas)), served, color="#7f7f7f")
    axes[0].set_ylabel("requests finished")
    for ax, key, word in ((axes[1], "ttft", "TTFT"), (axes[2], "e2e", "E2E")):
        for stat, marker in ((50, "o"), (99, "^")):
            xs = [k for k, r in enumerate(replicas) if by_replica[r][key]]
            ax.plot(xs, [percentile(by_replica[replicas[k]][key], stat) for k in xs], marker, ls="none",
                    color="#1f77b4" if stat == 50 else "#d62728", label=f"p{stat}")
        ax.set_ylabel(f"{word} (s)")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    for ax in axes:
        ax.set_xticks(range(len(replicas)), [str(r) for r in replicas])
        ax.set_xlabel("replica")
    return Panel(f"Latency per replica: {run.label}", to_svg(fig),
                 "Requests finished, and the median and 99th percentile of TTFT (by the replica that computed the "
                 "prompt) and of end-to-end latency (by the replica that finished the request).")


def _replica_steps_panel(run: Run) -> Panel:
    steps = run.replica_steps
    span = max((s["time"][-1] - run.origin for s in steps.values() if s["time"]), default=1.0)
    fig, (ax,) = new_figure()
    for k, replica in enumerate(sorted(steps)):
        s = steps[replica]
        if s["time"]:
            draw_series(ax, over_time(s["time"], s["duration"], s["num_running_requests"], run.origin, span),
                        f"replica {replica}", color(k))
    ax.set_xlabel(time_axis_label([run]))
    ax.set_ylabel("requests running")
    ax.set_xlim(0, span)
    ax.set_ylim(bottom=0)
    legend_outside(ax)
    return Panel(f"Batch size per replica: {run.label}", to_svg(fig),
                 f"From steps_replica<K>.csv, {len(steps)} replicas" + (" (colours repeat after 8)" if len(steps) > 8
                                                                         else "") + ".")
