"""Where prefix caching's extra time goes: the chat workload of benchmarks/bench_sim.py (paths chat
and chat-prefix) replayed in-process without and with --prefix-caching, the KV manager's and the
block pool's functions timed in both, and how many block keys the replay asked for and hashed.

Usage:  python -m benchmarks.profile_prefix --out reports/profile_prefix.md

The same perf_counter wrappers as benchmarks/profile_sim.py (about a microsecond a call, so the
rows are of the wrapped runs); the plain replay times come first, without wrappers (medians of
alternating runs). Indented rows
are inside another row: _cache_generated inside free, the prompt keys inside the lookups, the keys
after a prompt inside _cache_generated. Issue 30 asks for prefix caching at <= 1.2x the time without it.
"""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path

from benchmarks.profile_sim import machine_line, parse_args, timed_run, timers, write_report

ROOT = Path(__file__).resolve().parent.parent

from pagesim.api import prepare_replay  # noqa: E402
from pagesim.core import kept_keys, paged  # noqa: E402
from pagesim.core.block_pool import BlockPool  # noqa: E402
from pagesim.core.paged import PagedKVManager  # noqa: E402
from pagesim.workload.trace import load_trace  # noqa: E402

ROUNDS = 3  # replays of each mode, alternating, plain and then wrapped; the medians are reported

# bench_sim's chat path: ShareGPT conversations on the chunked workload
CHAT = dict(model="llama-2-7b", gpu="a100-80gb", chunked_prefill=True, max_num_batched_tokens=4096)  # (bench_sim.CHUNKED_ARGS)

# (label, owner, attribute, depth): depth 1 rows are called from the depth 0 row above them
TIMED = [
    ("PagedKVManager.admit", PagedKVManager, "admit", 0),
    ("PagedKVManager._cached_blocks (prefix lookups)", PagedKVManager, "_cached_blocks", 0),
    ("PagedKVManager.on_computed (registering filled prompt blocks)", PagedKVManager, "on_computed", 0),
    ("PagedKVManager.on_decode_run", PagedKVManager, "on_decode_run", 0),
    ("PagedKVManager.free", PagedKVManager, "free", 0),
    ("  _cache_generated (registering the output's blocks)", PagedKVManager, "_cache_generated", 1),
    ("BlockPool.allocate_n (evictions inside)", BlockPool, "allocate_n", 0),
    ("PagedKVManager._prompt_keys (a prompt's block keys; inside lookups)", PagedKVManager, "_prompt_keys", 1),
    ("PagedKVManager._tail_keys (the keys after a prompt; inside _cache_generated)", PagedKVManager, "_tail_keys", 1),
]


class KeyCount:
    """Blocks whose keys a manager asked for (a prompt's, and those after it), and how many
    chain_keys hashed (the rest came from kept keys); counted while the context is open, the
    functions restored after."""

    def __enter__(self):
        self.asked = self.hashed = 0
        self._originals = (PagedKVManager._prompt_keys, PagedKVManager._tail_keys, paged.chain_keys,
                           kept_keys.chain_keys)
        prompt_keys, tail_keys, chain_keys = self._originals[:3]

        def counted_prompt_keys(manager, seq, num_blocks):
            self.asked += num_blocks
            return prompt_keys(manager, seq, num_blocks)

        def counted_tail_keys(manager, seq, parent, start, num_blocks):
            self.asked += num_blocks
            return tail_keys(manager, seq, parent, start, num_blocks)

        def counted_chain_keys(parent, spans, key):
            keys = chain_keys(parent, spans, key)
            self.hashed += len(keys)
            return keys

        PagedKVManager._prompt_keys, PagedKVManager._tail_keys = counted_prompt_keys, counted_tail_keys
        paged.chain_keys = kept_keys.chain_keys = counted_chain_keys
        return self

    def __exit__(self, *exc):
        (PagedKVManager._prompt_keys, PagedKVManager._tail_keys, paged.chain_keys,
         kept_keys.chain_keys) = self._originals


def _replay(trace, num_requests: int, rate: float, prefix_caching: bool):
    return timed_run(prepare_replay(trace, keep_steps=False, num_requests=num_requests, rate=rate,
                                    prefix_caching=prefix_caching, **CHAT))


def main() -> None:
    args = parse_args(__doc__, "profile_prefix.md")

    trace = load_trace(ROOT / "traces" / "sharegpt_chat.json")
    modes = (False, True)
    runs = {mode: [] for mode in modes}
    for _ in range(ROUNDS):  # (alternating, so a slower spell of the machine hits both alike)
        for mode in modes:
            runs[mode].append(_replay(trace, args.num_requests, args.rate, mode)[0])
    plain = {mode: statistics.median(times) for mode, times in runs.items()}
    # the wrapped runs alternate too; per function the median of its rounds' totals
    rounds = {mode: [] for mode in modes}  # (wrapped run time, per-function totals, calls, finished)
    with KeyCount() as keys:  # (opened before the timers, so the key rows' timers include its counts)
        for _ in range(ROUNDS):
            for mode in modes:
                total, count = Counter(), Counter()
                keys.asked = keys.hashed = 0  # (the last run's, with prefix caching, are reported)
                with timers(TIMED, total, count):
                    seconds, result = _replay(trace, args.num_requests, args.rate, mode)
                rounds[mode].append((seconds, total, count, result.summary["completed"]))
    wrapped = {mode: statistics.median(r[0] for r in rounds[mode]) for mode in modes}
    totals = {mode: {label: statistics.median(r[1][label] for r in rounds[mode]) for label, *_ in TIMED}
              for mode in modes}
    calls = {mode: rounds[mode][-1][2] for mode in modes}  # (the same in every round: the replay is deterministic)
    finished = {mode: rounds[mode][-1][3] for mode in modes}

    command = f"python -m benchmarks.profile_prefix --num-requests {args.num_requests} --rate {args.rate}"
    extra = wrapped[True] - wrapped[False]
    lines = [
        "# Where prefix caching's extra time goes (benchmarks/profile_prefix.py)",
        "",
        f"Command: `{command}`",
        "",
        machine_line() + ".",
        "",
        f"traces/sharegpt_chat.json, {args.num_requests:,} requests at {args.rate} req/s, Llama-2-7B on A100-80GB, "
        f"chunked prefill, no step records (bench_sim's chat and chat-prefix paths, in-process): "
        f"{finished[False]:,} / {finished[True]:,} finished.",
        "",
        f"Replay time without wrappers, the median of {ROUNDS} alternating runs each: {plain[False]:.3f} s without "
        f"prefix caching ({' / '.join(f'{t:.3f}' for t in runs[False])}), {plain[True]:.3f} s with it "
        f"({' / '.join(f'{t:.3f}' for t in runs[True])}): **{plain[True] / plain[False]:.2f}x**. With the wrappers "
        f"(medians of {ROUNDS} alternating runs each, per function too): {wrapped[False]:.3f} s and "
        f"{wrapped[True]:.3f} s, {extra:+.3f} s.",
        "",
        "| function | calls without / with | total without (s) | total with (s) | difference (s) | share of the difference |",
        "|---|---|---|---|---|---|",
    ]
    for label, _, _, _ in TIMED:
        t0, t1 = totals[False][label], totals[True][label]
        lines.append(f"| `{label}` | {calls[False][label]:,} / {calls[True][label]:,} | {t0:.3f} | {t1:.3f} | "
                     f"{t1 - t0:+.3f} | {(t1 - t0) / extra:.0%} |")
    inside = sum(totals[True][label] - totals[False][label] for label, _, _, depth in TIMED if depth == 0)
    lines += [
        f"| everything else (the scheduler, the engine loop, chunk sizes after hits) | | | | {extra - inside:+.3f} | "
        f"{(extra - inside) / extra:.0%} |",
        "",
        f"Block keys: {keys.asked:,} asked for, {keys.hashed:,} hashed ({1 - keys.hashed / keys.asked:.0%} taken from "
        "kept keys).",
    ]
    write_report(args.out, lines)


if __name__ == "__main__":
    main()
