"""Microbenchmarks of the engine core: time per scheduler step (schedule + update) with N
running sequences in steady decode, and paged block-manager operations per second.

    python -m benchmarks.bench_core [--out reports/bench_core.md]

Runs on one core; numbers are medians of several repeats, measured side by side in one run.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

from pagesim.core import BlockPool, PagedKVManager, Request, SamplingParams, Scheduler, SchedulerConfig, Sequence, StepResult
from pagesim.core.decode_runs import advance_decode, decode_horizon


def steady_decode_scheduler(num_seqs: int, block_size: int = 16) -> Scheduler:
    """num_seqs single-sequence requests, all prefilled and decoding, in a pool big enough that
    nothing is preempted, with outputs long enough that nothing finishes while measured."""
    blocks = num_seqs * (2048 // block_size) + 64
    cfg = SchedulerConfig(max_num_seqs=max(num_seqs, 256), max_num_batched_tokens=100_000, max_model_len=100_000)
    sched = Scheduler(cfg, PagedKVManager(blocks, block_size))
    for i in range(num_seqs):
        sched.add_request(Request(i, 100 + i % 50, SamplingParams(max_tokens=50_000, ignore_eos=True)))
    result = StepResult(default_token=0)
    while sched.waiting:  # prefill everyone
        out = sched.schedule(0.0)
        sched.update(out, result, 0.0)
    return sched


def time_steps(num_seqs: int, steps: int, repeats: int = 5) -> float:
    """Median microseconds per schedule + update."""
    result = StepResult(default_token=0)
    samples = []
    for _ in range(repeats):
        sched = steady_decode_scheduler(num_seqs)
        for _ in range(20):  # warm up
            sched.update(sched.schedule(0.0), result, 0.0)
        t0 = time.perf_counter()
        for _ in range(steps):
            out = sched.schedule(0.0)
            sched.update(out, result, 0.0)
        samples.append((time.perf_counter() - t0) / steps * 1e6)
        assert len(out.seqs) == num_seqs
    return statistics.median(samples)


def time_decode_runs(num_seqs: int, steps: int, run_len: int = 16, repeats: int = 5) -> float:
    """Median microseconds per step when the same steady decode is taken in runs of run_len
    steps through decode_horizon() + advance_decode() (the simulator's fast path)."""
    samples = []
    for _ in range(repeats):
        sched = steady_decode_scheduler(num_seqs)
        t0 = time.perf_counter()
        done = 0
        while done < steps:
            k = min(decode_horizon(sched, run_len), steps - done)
            advance_decode(sched, k, 0, 0.0)
            done += k
        samples.append((time.perf_counter() - t0) / steps * 1e6)
    return statistics.median(samples)


def operations_per_second(loop, n: int) -> float:
    """loop(n) performs n operations; how many it managed per second of wall time."""
    t0 = time.perf_counter()
    loop(n)
    return n / (time.perf_counter() - t0)


def prefilled(kv: PagedKVManager, seq_id: int, prompt_len: int) -> Sequence:
    """A sequence whose prompt's K/V is already in kv's blocks."""
    seq = Sequence(seq_id, prompt_len, None)
    kv.allocate_slots(seq, prompt_len)
    seq.num_computed_tokens = prompt_len
    return seq


def block_ops_per_second(repeats: int = 5) -> dict[str, float]:
    """Throughput of the manager's hot operations on a 4096-block pool."""
    results: dict[str, list[float]] = {"allocate+free block": [], "fork+free (8 blocks)": [], "append 1 token": []}
    for _ in range(repeats):
        kv = PagedKVManager(4096, 16)
        pool = kv.device

        def allocate_free(n: int) -> None:
            for _ in range(n):
                pool.decref(pool.allocate())

        results["allocate+free block"].append(operations_per_second(allocate_free, 200_000))

        parent = prefilled(kv, 0, 128)

        def fork_free(n: int) -> None:
            for i in range(n):
                child = parent.copy_as(i + 1)
                kv.fork(parent, child)
                kv.free(child)

        results["fork+free (8 blocks)"].append(operations_per_second(fork_free, 50_000))

        seq = prefilled(kv, 1, 1)

        def append_token(n: int) -> None:
            for _ in range(n):
                seq.append_token(0)
                kv.allocate_slots(seq, kv.blocks_needed(seq, 1) and 1 or 1)
                seq.num_computed_tokens += 1

        results["append 1 token"].append(operations_per_second(append_token, 50_000))
    return {k: statistics.median(v) for k, v in results.items()}


def batch_allocation_us(sizes=(1, 16, 64), rounds: int = 20_000, repeats: int = 5) -> list[tuple[int, float, float, float]]:
    """Median microseconds to allocate n blocks and free them again (a 4096-block pool, caching
    on but nothing cached), three ways side by side: the previous pool's one OrderedDict
    operation per block (the reference pool of tests/core/test_block_pool.py), n calls to
    allocate() and decref(), and one allocate_n(n) and one release() of the n blocks."""
    from tests.core.test_block_pool import ReferencePool  # the pool before allocate_n

    def per_block(pool, n: int) -> None:
        for block in [pool.allocate() for _ in range(n)][::-1]:
            pool.decref(block)

    def batched(pool, n: int) -> None:
        pool.release(pool.allocate_n(n)[::-1])

    def per_round(pool, cycle, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(rounds):
            cycle(pool, n)
        return (time.perf_counter() - t0) / rounds * 1e6

    ways = {
        "ordered dict": (lambda: ReferencePool(4096), per_block),
        "allocate() x n": (lambda: BlockPool(4096, True), per_block),
        "allocate_n(n)": (lambda: BlockPool(4096, True), batched),
    }
    rows = []
    for n in sizes:
        samples: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(repeats):  # interleaved, so machine load hits all three alike
            for name, (make, take) in ways.items():
                samples[name].append(per_round(make(), take, n))
        rows.append((n, *(statistics.median(samples[name]) for name in ways)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="write a markdown report here")
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    rows = [(n, time_steps(n, args.steps), time_decode_runs(n, args.steps * 4)) for n in (64, 256, 1024)]
    ops = block_ops_per_second()
    batch = batch_allocation_us()
    lines = [
        "# Engine core benchmark",
        "",
        f"Command: `python -m benchmarks.bench_core --out reports/bench_core.md` "
        f"(Python {platform.python_version()}, {platform.machine()}, one process)",
        "",
        "Scheduler step = `schedule()` + `update()` in steady decode (paged, no preemption, nothing finishing); "
        "run step = the same steps taken 16 at a time by `decode_horizon()` + `advance_decode()`, as the simulator "
        "does between events; median of 5 runs each. Machine load at start: "
        f"{' / '.join(f'{x:.2f}' for x in os.getloadavg())} (1 / 5 / 15 min; 2 cores).",
        "",
        "| running sequences | us per step | us per sequence | us per step in runs of 16 | speed-up |",
        "|---:|---:|---:|---:|---:|",
        *[f"| {n} | {us:.1f} | {us / n:.3f} | {run_us:.1f} | {us / run_us:.1f}x |" for n, us, run_us in rows],
        "",
        "| block-manager operation | per second |",
        "|---|---:|",
        *[f"| {k} | {v:,.0f} |" for k, v in ops.items()],
        "",
        "Allocating n blocks and freeing them again (4096-block pool, median of 5 interleaved runs of "
        "20,000 rounds): the previous pool's OrderedDict free queue (one dict operation per block), "
        "n calls to `allocate()` and `decref()` on today's pool, and one `allocate_n(n)` (a slice off a list) "
        "and one `release()` of the n blocks (one extend of the free queue).",
        "",
        "| n | ordered dict (us) | allocate() x n (us) | allocate_n(n) (us) | allocate_n / ordered dict |",
        "|---:|---:|---:|---:|---:|",
        *[f"| {n} | {od:.2f} | {single:.2f} | {batch_us:.2f} | {batch_us / od:.2f}x |" for n, od, single, batch_us in batch],
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    sys.exit(main())
