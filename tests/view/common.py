"""Run folders for the view tests: a real replay (swap preemptions, waste samples) written as
`pagesim replay --out` writes it, and a hand-made cluster run whose numbers are known."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pagesim
from pagesim.metrics import REQUEST_FIELDS, STEP_FIELDS

ROOT = Path(__file__).resolve().parents[2]
SHAREGPT = ROOT / "traces" / "sharegpt.json"
# a pool small enough that swapping happens, waste sampled every half simulated second
SWAPPING = dict(num_requests=120, rate=4.0, num_gpu_blocks=300, preemption="swap", waste_interval_s=0.5, seed=1)


def replay_run(folder: Path, **options) -> dict:
    """A replay written to `folder`; returns its summary."""
    run = pagesim.replay(str(SHAREGPT), **{**SWAPPING, **options})
    run.write(folder)
    return json.loads((folder / "summary.json").read_text())


def write_csv(path: Path, columns, rows) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(rows)


# (replay, decode replica, arrival, first token, finish): replica 0 and 1 prefill; request 2 is
# handed over to replica 2 for decoding; request 3 was rejected
CLUSTER_REQUESTS = ((0, None, 0.0, 0.5, 4.0), (1, None, 1.0, 1.5, 3.0), (0, 2, 2.0, 2.5, 6.0), (1, None, 2.0, None, None))


def cluster_run(folder: Path, with_replica_steps: bool = True) -> None:
    """A cluster run as the cluster replay writes it: requests.csv with `replica` and
    `decode_replica` columns after pagesim's own, and per-replica steps files."""
    folder.mkdir(parents=True, exist_ok=True)
    columns = list(REQUEST_FIELDS) + ["replica", "decode_replica"]
    rows = []
    for rid, (replica, decode, arrival, first, finish) in enumerate(CLUSTER_REQUESTS):
        done = finish is not None
        row = {"request_id": rid, "status": "finished" if done else "rejected",
               "reject_reason": "" if done else "prompt too long", "arrival_time": arrival,
               "first_scheduled_time": arrival if done else "", "first_token_time": first if done else "",
               "finish_time": finish if done else "", "prompt_len": 10, "output_len": 11 if done else 0, "num_seqs": 1,
               "num_preemptions": 0, "num_swaps": 0, "cached_prompt_tokens": 0, "replica": replica,
               "decode_replica": "" if decode is None else decode}
        rows.append([row.get(c, "") for c in columns])
    write_csv(folder / "requests.csv", columns, rows)
    if with_replica_steps:
        for replica in (0, 1, 2):
            steps = [[t, 0.5, 1 + replica, 1, 0, 1, 0, 0, 2, 2, 0.1, 0, 0, 0, 0] for t in (0.5, 1.0, 1.5, 2.0)]
            write_csv(folder / f"steps_replica{replica}.csv", STEP_FIELDS, steps)
    summary = {"num_requests": 4, "num_finished": 3, "num_rejected": 1, "duration_s": 6.0, "request_throughput": 0.5,
               "cost_model": {"name": "constant"}, "config": {"policy": "paged", "replicas": 3}}
    (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
