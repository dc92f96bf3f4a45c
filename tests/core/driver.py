"""A fake model and executor for scheduler tests, with simulated KV memory.

The executor does what the real one does with a SchedulerOutput: swaps and copy-on-write copies
first, then writes each scheduled token's K/V at the slot its block table names. The value it
writes identifies the whole token prefix, so reading a sequence back through its block table
checks that preemption, swapping, forks and prefix hits kept every token where it belongs.

Token ids are a deterministic function of (request, branch, position): the branch is the index
of the sample that created the sequence (0 for the first sequence), so every finished output
can be compared with the sequence it must be, whatever was preempted on the way.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter

from pagesim.core import (
    HybridKVManager, KVLayout, PagedKVManager, Request, ReservationKVManager, Sample, SamplingParams, Scheduler, SchedulerConfig,
    SequenceStatus, StepResult,
)

DEV, HOST = "device", "host"


def copy_blocks(mem: dict, pairs, src_pool: str, dst_pool: str, block_size: int) -> None:
    """Copy whole blocks (src, dst) in a shadow memory {(pool, block, offset): value}. Every source
    is read before any target is written, as one batched swap or copy does; a slot never written
    stays unwritten at the target."""
    snapshot = {(src, off): mem.get((src_pool, src, off)) for src, _ in pairs for off in range(block_size)}
    for src, dst in pairs:
        for off in range(block_size):
            value = snapshot[(src, off)]
            if value is None:
                mem.pop((dst_pool, dst, off), None)
            else:
                mem[(dst_pool, dst, off)] = value


def tables_of(kv, seq) -> list[list[int]]:
    """A sequence's block tables: one per KV cache group's table (a manager without groups has one)."""
    return kv.block_tables(seq) if hasattr(kv, "block_tables") else [seq.block_table]


def windows_of(kv) -> list[int | None]:
    """The sliding window of each block table (None: keeps every token)."""
    layout = getattr(kv, "layout", None)
    return [None] if layout is None else [t.sliding_window for t in layout.tables]


def states_of(kv) -> list[bool]:
    """Whether each block table is a state table (one block holding the sequence's whole state)."""
    layout = getattr(kv, "layout", None)
    return [False] if layout is None else [t.is_state for t in layout.tables]


def token(request_id: int, branch: int, pos: int) -> int:
    return request_id * 1_000_000 + branch * 10_000 + pos


def branch_of(seq) -> int:
    """Which sample a sequence descends from, read from its first output token."""
    if seq.num_output_tokens == 0:
        return 0
    return (seq.token_ids[seq.prompt_len] // 10_000) % 100


class FakeEngine:
    """Runs schedule -> execute -> update with checks after every step."""

    def __init__(self, sched: Scheduler, check_memory: bool = True, explicit_samples: bool = True,
                 check_waste: bool = True):
        self.sched = sched
        self.kv = sched.kv
        self.bs = sched.kv.block_size
        self.check_memory = check_memory
        self.explicit_samples = explicit_samples
        self.check_waste = check_waste
        self.mem: dict[tuple[str, int, int], int] = {}
        self._prefix: dict[int, list[int]] = {}  # seq_id -> hash of each token prefix
        self.groups = []
        self.steps = 0
        self.now = 0.0
        self.admitted_order: list[int] = []  # request ids in the order they were first scheduled
        self.preempt_modes: Counter = Counter()

    # -- the model -------------------------------------------------------------------------
    def result(self, out) -> StepResult:
        if not self.explicit_samples:
            return StepResult(default_token=7)
        samples = {}
        pos = 0
        for group in out.groups:
            due = []
            for seq in group.seqs:
                n = out.num_new_tokens[pos]
                pos += 1
                if seq.num_computed_tokens + n == seq.num_tokens:
                    due.append(seq)
            if not due:
                continue
            rid = group.request_id
            mine = []
            for seq in due:
                if group.sampling.n > 1 and seq.num_output_tokens == 0:
                    assert len(group.seqs) == 1, "a group forks only from its single prompt sequence"
                    mine += [Sample(seq.seq_id, token(rid, b, seq.num_tokens)) for b in range(group.sampling.n)]
                else:
                    mine.append(Sample(seq.seq_id, token(rid, branch_of(seq), seq.num_tokens)))
            samples[rid] = mine
        return StepResult(samples=samples)

    # -- simulated KV memory ---------------------------------------------------------------
    def _key(self, seq, p: int) -> int:
        hashes = self._prefix.setdefault(seq.seq_id, [])
        while len(hashes) <= p:
            prev = hashes[-1] if hashes else 0
            hashes.append(hash((prev, seq.token_ids[len(hashes)])))
        return hashes[p]

    def execute(self, out) -> None:
        copy_blocks(self.mem, out.blocks_to_swap_out, DEV, HOST, self.bs)
        copy_blocks(self.mem, out.blocks_to_swap_in, HOST, DEV, self.bs)
        copy_blocks(self.mem, out.blocks_to_copy, DEV, DEV, self.bs)
        paged = isinstance(self.kv, PagedKVManager)
        for seq, n in zip(out.seqs, out.num_new_tokens):
            c = seq.num_computed_tokens
            assert seq.status is SequenceStatus.RUNNING
            for table, state in zip(tables_of(self.kv, seq), states_of(self.kv)):  # (one, unless KV groups)
                if state:  # the state after the step's last token: one block, never shared when written
                    assert len(table) == 1, f"seq {seq.seq_id} holds {len(table)} blocks in a state table"
                    assert self.kv.device.refcount[table[0]] == 1, f"state block {table[0]} written while shared"
                    if self.check_memory and n:
                        self.mem[(DEV, table[0], 0)] = self._key(seq, c + n - 1)
                    continue
                assert len(table) * self.bs >= c + n, "block table too short for the step"
                for p in range(c, c + n):
                    b = table[p // self.bs]
                    assert b >= 0, f"position {p} of seq {seq.seq_id} is written into a freed (NULL) entry"
                    if paged:
                        if self.kv.device.refcount[b] > 1:
                            self._check_shared_write(seq, b, p)
                        assert self.kv.device.block_hash[b] is None, f"write into cached block {b}"
                    if self.check_memory:
                        self.mem[(DEV, b, p % self.bs)] = self._key(seq, p)

    def _check_shared_write(self, seq, block: int, p: int) -> None:
        """A write into a shared block is only allowed if every sharer wants that very K/V at
        that slot (a re-admitted group's first sequence computing the prompt its siblings share);
        anything else is a missing copy-on-write."""
        for group in self.sched.running:
            for other in group.seqs:
                table = next((t for t in tables_of(self.kv, other) if block in t), None)
                if other is not seq and table is not None:
                    q = table.index(block) * self.bs + p % self.bs
                    assert q < other.num_tokens and self._key(other, q) == self._key(seq, p), (
                        f"seq {seq.seq_id} writes position {p} into block {block} shared with seq {other.seq_id}")

    def read_back(self, out) -> None:
        """After the step's copies and writes: every computed token, and every token written this
        step, reads back through its sequence's block table."""
        written = {id(seq): n for seq, n in zip(out.seqs, out.num_new_tokens)}
        for group in self.sched.running + self.sched.swapped:
            for seq in group.seqs:
                pool = DEV if seq.status is SequenceStatus.RUNNING else HOST
                c = seq.num_computed_tokens
                for table, window, state in zip(tables_of(self.kv, seq), windows_of(self.kv), states_of(self.kv)):
                    if state:  # the state of the whole prefix computed (and written this step)
                        end = c + written.get(id(seq), 0)
                        assert len(table) == 1
                        got = self.mem.get((pool, table[0], 0))
                        assert end == 0 or got == self._key(seq, end - 1), f"seq {seq.seq_id}: wrong state"
                        continue
                    # a sliding window keeps what the next token (at position c) reads
                    first = 0 if window is None else max(0, c - window + 1)
                    for p in range(first, c + written.get(id(seq), 0)):
                        got = self.mem.get((pool, table[p // self.bs], p % self.bs))
                        assert got == self._key(seq, p), f"request {group.request_id} seq {seq.seq_id} pos {p}: wrong K/V"

    # -- checks ----------------------------------------------------------------------------
    def check_pools(self) -> None:
        sched, kv = self.sched, self.kv
        for g in sched.waiting:
            if not g.num_preemptions:
                break  # preempted groups sit at the head; the rest never ran
            assert all(s.block_table == [] and s.num_computed_tokens == 0 for s in g.seqs)
            assert all(s.status is SequenceStatus.WAITING for s in g.seqs)
        for g in sched.running:
            assert all(s.status is SequenceStatus.RUNNING for s in g.seqs), g
        for g in sched.swapped:
            assert all(s.status is SequenceStatus.SWAPPED for s in g.seqs), g
        if isinstance(kv, PagedKVManager):
            for pool, groups in ((kv.device, sched.running), (kv.host, sched.swapped)):
                refs = Counter(b for g in groups for s in g.seqs for t in tables_of(kv, s) for b in t if b >= 0)
                assert [pool.refcount[b] for b in range(pool.num_blocks)] == [refs[b] for b in range(pool.num_blocks)]
                assert set(pool.free_queue) == {b for b in range(pool.num_blocks) if not refs[b]}
        else:
            tables = [s.block_table for g in sched.running for s in g.seqs]
            flat = [b for t in tables for b in t]
            assert len(flat) == len(set(flat)), "two sequences share a reservation"
        if self.check_waste and self.steps % 5 == 0:
            w = kv.waste(sched.running)
            assert w.total == kv.num_device_blocks * self.bs, w

    # -- the loop --------------------------------------------------------------------------
    def add(self, request: Request):
        request.arrival_time = self.now
        group = self.sched.add_request(request)
        self.groups.append(group)
        return group

    def step(self) -> list:
        sched, cfg = self.sched, self.sched.config
        waiting_head = list(itertools.islice(sched.waiting, cfg.max_num_seqs + 1))
        on_device = {id(g) for g in sched.running + sched.swapped}
        out = self.last_out = sched.schedule(self.now)  # (read by checks that extend this engine)
        self.steps += 1
        # budgets
        assert len(out.seqs) <= cfg.max_num_seqs, f"{len(out.seqs)} sequences scheduled, max_num_seqs {cfg.max_num_seqs}"
        assert sched.num_running_seqs <= cfg.max_num_seqs, f"{sched.num_running_seqs} running, max_num_seqs {cfg.max_num_seqs}"
        if cfg.batching == "iteration":
            oversized_readmission = len(out.groups) == 1 and len(out.groups[0].seqs) > 1 and out.groups[0].num_preemptions > 0
            assert sum(out.num_new_tokens) <= cfg.max_num_batched_tokens or oversized_readmission, (sum(out.num_new_tokens), cfg)
        assert out.num_batched_tokens == sum(out.num_new_tokens)
        assert len(out.seqs) == len(out.num_new_tokens) and all(n >= 0 for n in out.num_new_tokens)
        # FCFS: the groups admitted this step are the head of the waiting queue, in order, and
        # only when nothing is left swapped out
        admitted = [g for g in out.groups if id(g) not in on_device]
        assert admitted == waiting_head[:len(admitted)], "admission skipped an older waiting group"
        if admitted:
            assert not sched.swapped, "admitted a new group while a swapped one waits"
            if cfg.batching == "static":
                assert not on_device, "static batching admitted into a batch still running"
        for g in admitted:
            if g.request_id not in self.admitted_order:
                self.admitted_order.append(g.request_id)
        if out.is_empty and not out.preempted:
            assert not sched.has_unfinished, (
                f"scheduler stalled: nothing scheduled with {len(sched.waiting)} waiting "
                f"(head {sched.waiting[0] if sched.waiting else None}), {len(sched.running)} running, "
                f"{len(sched.swapped)} swapped, {self.kv.num_free_blocks} free blocks")
        if out.preempted:
            # the newest running groups are the ones preempted; a recomputed group waits ahead
            # of everything that arrived after it
            newest_kept = max((g.arrival_order for g in sched.running), default=-1)
            assert newest_kept < min(g.arrival_order for g, _ in out.preempted), "preempted an older group"
            order = [g.arrival_order for g in sched.waiting]
            assert order == sorted(order), "waiting queue out of arrival order after preemption"
        for g, mode in out.preempted:
            self.preempt_modes[mode] += 1
            want = SequenceStatus.SWAPPED if mode == "swap" else SequenceStatus.WAITING
            assert all(s.status is want for s in g.seqs), (g, mode)
            assert g not in out.groups
        self.execute(out)
        if self.check_memory:
            self.read_back(out)
        finished = sched.update(out, self.result(out), self.now)
        self.now += 1.0
        self.check_pools()
        return finished

    def run(self, pending: list[Request], rng: random.Random, max_steps: int = 200_000, per_step: float = 1.0):
        """Feed pending requests over time (about per_step arrivals a step) and run to the end."""
        pending = list(pending)
        while pending or self.sched.has_unfinished:
            k = rng.randint(0, int(2 * per_step)) if pending else 0
            for _ in range(min(k, len(pending))):
                self.add(pending.pop(0))
            self.step()
            assert self.steps < max_steps, f"no progress: {self.sched.waiting} {self.sched.running} {self.sched.swapped}"

    # -- end of run --------------------------------------------------------------------------
    def check_finished(self, expected_tokens: bool = True) -> None:
        for group in self.groups:
            if group.reject_reason is not None:
                assert group.first_scheduled_time is None
                continue
            assert group.is_finished and group.finish_time is not None
            n = group.sampling.n
            assert len(group.finished_seqs) == n
            for seq in group.finished_seqs:
                assert seq.status is SequenceStatus.FINISHED
                assert seq.num_output_tokens == group.sampling.max_tokens
                assert seq.block_table == []
                if expected_tokens:
                    b = branch_of(seq)
                    want = [token(group.request_id, b, seq.prompt_len + k) for k in range(group.sampling.max_tokens)]
                    assert seq.output_token_ids == want, f"request {group.request_id} branch {b}: outputs differ"
            if expected_tokens:
                assert sorted(branch_of(s) for s in group.finished_seqs) == list(range(n))

    def check_pool_empty(self) -> None:
        kv = self.kv
        assert kv.num_free_blocks == kv.num_device_blocks
        if isinstance(kv, PagedKVManager):
            assert kv.host.num_free == kv.host.num_blocks
            assert not any(kv.device.refcount) and not any(kv.host.refcount)
            assert not kv._prompt_hashes, "per-sequence prefix hashes leaked"
            assert not kv._offered and not kv._unregistered and not kv._settled, "per-sequence registration state leaked"
            assert not getattr(kv, "_tables", None), "per-sequence block tables leaked"
        else:
            assert kv.allocator.free_chunks() == kv._make_allocator().free_chunks()
            assert not kv._reservation and not kv._spare


def random_requests(rng: random.Random, count: int, max_prompt: int = 48, max_output: int = 24,
                    multi: float = 0.2, max_n: int = 4, vocab: int = 50, prefixes: int = 0,
                    oversize: float = 0.0, max_model_len: int = 128):
    """Random prompts and output lengths; a share `multi` of them with n > 1; a share `oversize`
    that can never be served (too long for max_model_len, or more samples than max_num_seqs)."""
    shared = [[rng.randrange(vocab) for _ in range(max_prompt)] for _ in range(prefixes)]
    reqs = []
    for i in range(count):
        plen = rng.randint(1, max_prompt)
        if shared and rng.random() < 0.6:
            ids = list(rng.choice(shared)[:plen])
            ids[-1] = rng.randrange(vocab)
        else:
            ids = [rng.randrange(vocab) for _ in range(plen)]
        n = rng.randint(2, max_n) if rng.random() < multi else 1
        out_len = rng.randint(1, max_output)
        if rng.random() < oversize:
            if rng.random() < 0.5:
                plen = max_model_len - rng.randint(0, 10)
                out_len = max_model_len - plen + rng.randint(1, 10)
                ids = [rng.randrange(vocab) for _ in range(plen)]
            else:
                n = 64
        reqs.append(Request(i, plen, SamplingParams(n=n, max_tokens=out_len), prompt_token_ids=ids))
    return reqs


def make_scheduler(policy: str, preemption: str = "recompute", chunked: bool = False, *, num_blocks: int = 64,
                   block_size: int = 4, num_host: int = 24, max_model_len: int = 128, max_num_seqs: int = 8,
                   max_tokens: int | None = None, caching: bool = False, allocator: str = "buddy",
                   batching: str = "iteration", kv_groups=None) -> Scheduler:
    if policy == "paged":
        plain = kv_groups is None or KVLayout.of(kv_groups).is_plain
        kv = (PagedKVManager if plain else HybridKVManager)(num_blocks, block_size, num_host,
                                                            enable_prefix_caching=caching, kv_groups=kv_groups)
    else:
        kv = ReservationKVManager(num_blocks, block_size, estimate=policy, max_model_len=max_model_len, allocator=allocator)
    if max_tokens is None:
        max_tokens = 32 if chunked else max_model_len
    cfg = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_tokens, max_model_len=max_model_len,
                          preemption_mode=preemption, chunked_prefill=chunked, batching=batching)
    return Scheduler(cfg, kv)
