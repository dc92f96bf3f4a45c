"""The real engine: the same scheduler and KV manager as the simulator, with a forward pass in
place of the cost model.

Each step: schedule -> swap/copy blocks in the cache -> one forward over the packed batch ->
sample the sequences that are due a token -> update. Nothing here decides what runs or where a
token's K/V lives; that is all pagesim.core.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from executor.attention import AttentionMetadata, PagedAttention
from executor.beam import BeamSearch
from executor.cache_engine import CacheEngine
from executor.kv_layout import place_layers
from executor.models.loader import LoadedModel
from executor.sampler import make_generator, random_seed, sample
from pagesim.core import (BatchShape, Request, Sample, SamplingParams, SchedulerOutput, SequenceGroup, ServingConfig,
                          StepResult)
from pagesim.core.policies import uses_paged_blocks
from pagesim.core.step import is_due


@dataclass
class EngineConfig(ServingConfig):
    """The serving system (ServingConfig) and the size of the real KV pools."""

    num_gpu_blocks: int = 512
    num_cpu_blocks: int = 512


@dataclass
class StepStats:
    """What one step did, for metrics and profiling."""

    out: SchedulerOutput
    shape: BatchShape  # the step as the simulator's cost models see it
    finished: list[SequenceGroup]
    seconds: float
    # isolate_failures: request_id -> why its sampling failed this step (it was aborted)
    failed: dict[int, str] = field(default_factory=dict)


@dataclass
class RequestOutput:
    request_id: int
    prompt_token_ids: list[int]
    # one token list per finished sequence: sample i of n at index i; beams best first
    outputs: list[list[int]] = field(default_factory=list)
    group: SequenceGroup | None = None
    # beam search: per step after the first, the rank before the step of each new beam's parent
    beam_parent_ranks: list[list[int]] | None = None


class LLMEngine:
    def __init__(self, lm: LoadedModel, config: EngineConfig | None = None, isolate_failures: bool = False):
        """isolate_failures (a server's choice): a request whose sampling raises is aborted and
        reported in StepStats.failed, and the step goes on for the others; otherwise the error
        propagates, as an offline run wants."""
        self.lm = lm
        self.isolate_failures = isolate_failures
        self._failed: dict[int, str] = {}  # this step's sampling failures (isolate_failures)
        self.config = cfg = config or EngineConfig()
        max_model_len = cfg.max_model_len or lm.max_model_len
        # A model whose layers keep KV differently (sliding windows, hybrids) runs on the core's
        # HybridKVManager: one block table per layout table, each layer reading its table's, and
        # one cache tensor per place in a table (executor.kv_layout). Plain models: as always.
        placement = place_layers(lm.kv_groups, lm.layer_groups)
        # (the reservation baselines reserve every layer's KV contiguously: they keep the plain path)
        self.placement = None if placement.is_plain or not uses_paged_blocks(cfg.policy) else placement
        kv_groups = None if self.placement is None else tuple(lm.kv_groups)
        self.scheduler = cfg.make_scheduler(cfg.num_gpu_blocks, cfg.num_cpu_blocks, max_model_len, lm.eos_token_id,
                                            kv_groups=kv_groups)
        self.max_model_len = max_model_len
        slots = None
        if self.placement is not None:
            attention = attention_layers(lm.model)
            if len(attention) != lm.num_layers:
                raise ValueError(f"found {len(attention)} attention layers in a model of {lm.num_layers}")
            for attn, table in zip(attention, self.placement.table):
                attn.kv_table = table  # the same for every engine on this model: it follows from lm alone
            slots = self.placement.slot
        self.cache = CacheEngine(lm.num_layers, lm.num_kv_heads, lm.head_dim, cfg.block_size, cfg.num_gpu_blocks,
                                 cfg.num_cpu_blocks, lm.dtype, lm.device, kv_shared=lm.kv_shared, layer_slots=slots)
        # Parallel sampling: sample i of a request draws from its own generator seeded seed + i
        # (seed drawn at random when the request has none), so it gets exactly the tokens a
        # request of n = 1 with seed + i gets.
        self._seeds: dict[int, int] = {}  # request_id -> seed of sample 0
        self._generators: dict[int, torch.Generator] = {}  # seq_id -> its sampling generator
        self._forks: dict[int, list[torch.Generator | None]] = {}  # request_id -> generators of samples just forked
        self._beams: dict[int, BeamSearch] = {}  # request_id -> its beam search
        self.finished_beams: dict[int, BeamSearch] = {}  # request_id -> the beams of a finished request
        self._groups: dict[int, SequenceGroup] = {}  # request_id -> group, while it is in the scheduler
        self._next_id = 0

    # -- requests --------------------------------------------------------------------------
    def add_request(self, prompt_token_ids: list[int], sampling: SamplingParams, arrival_time: float = 0.0,
                    request_id: int | None = None) -> SequenceGroup:
        if request_id is None:
            request_id = self._next_id
        self._next_id = max(self._next_id, request_id + 1)
        if sampling.use_beam_search and not sampling.ignore_eos:
            raise ValueError(f"request {request_id}: beam search is implemented for ignore_eos=True only "
                             "(every beam runs max_tokens tokens, EOS never chosen)")
        if prompt_token_ids and not 0 <= min(prompt_token_ids) <= max(prompt_token_ids) < self.lm.vocab_size:
            raise ValueError(f"request {request_id}: prompt token ids must lie in [0, {self.lm.vocab_size}), the "
                             f"model's vocabulary; got {min(prompt_token_ids)}..{max(prompt_token_ids)}")
        request = Request(request_id, len(prompt_token_ids), sampling, arrival_time, list(prompt_token_ids))
        group = self.scheduler.add_request(request)
        if group.reject_reason:
            return group
        self._groups[request_id] = group
        if sampling.use_beam_search:
            self._beams[request_id] = BeamSearch(sampling.beam_width, self.lm.eos_token_id)
        elif sampling.temperature > 0:
            seed = sampling.seed if sampling.seed is not None else random_seed()
            self._seeds[request_id] = seed
            self._generators[group.seqs[0].seq_id] = make_generator(seed)
        return group

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    def abort_request(self, request_id: int, now: float) -> SequenceGroup | None:
        """Stop a request between steps, freeing its KV blocks (a server's client went away, or
        its output reached a stop string). Returns its group, or None if it had already left."""
        group = self._groups.get(request_id)
        if group is None or not self.scheduler.abort(group, now):
            return None
        self._forget(group)
        self._beams.pop(request_id, None)
        return group

    def _forget(self, group: SequenceGroup) -> None:
        """Drop the per-request sampling state of a group that left the scheduler."""
        self._groups.pop(group.request_id, None)
        self._seeds.pop(group.request_id, None)
        self._forks.pop(group.request_id, None)
        for seq in group.finished_seqs:
            self._generators.pop(seq.seq_id, None)

    # -- one iteration ---------------------------------------------------------------------
    @torch.inference_mode()
    def step(self, clock: float | Callable[[], float]) -> StepStats:
        """One iteration. clock is the time now, or a function giving it (read at scheduling and
        again when the step's tokens are recorded, so finish times are the step's end)."""
        now = clock if callable(clock) else lambda: clock
        start = time.perf_counter()
        out = self.scheduler.schedule(now())
        # Block moves first: the forward pass reads the blocks where the core now says they are.
        if out.blocks_to_swap_out:
            self.cache.swap_out(out.blocks_to_swap_out)
        if out.blocks_to_swap_in:
            self.cache.swap_in(out.blocks_to_swap_in)
        if out.blocks_to_copy:
            self.cache.copy(out.blocks_to_copy)
        samples = self._execute(out) if not out.is_empty else {}
        if self.lm.device.type == "cuda":
            torch.cuda.synchronize()
        finished = self.scheduler.update(out, StepResult(samples=samples), now())
        failed, self._failed = self._failed, {}
        for request_id in failed:  # their placeholder tokens fork nothing and end no beam search
            self._forks.pop(request_id, None)
            self._beams.pop(request_id, None)
        self._after_update(out)
        for group in finished:
            self._forget(group)
            if group.request_id in self._beams:
                self.finished_beams[group.request_id] = self._beams.pop(group.request_id)
        for request_id in failed:
            self.abort_request(request_id, now())  # None if the placeholder token ended it: already freed
        finished = [g for g in finished if g.request_id not in failed]
        return StepStats(out, out.batch_shape(), finished, time.perf_counter() - start, failed)

    def _execute(self, out: SchedulerOutput) -> dict[int, list[Sample]]:
        lm, bs = self.lm, self.config.block_size
        input_ids, layout, sampled_rows = [], [], []
        row = 0
        by_table = self.placement is not None
        block_tables = self.scheduler.kv.block_tables if by_table else None
        for seq, n in zip(out.seqs, out.num_new_tokens):
            start = seq.num_computed_tokens
            input_ids.extend(seq.token_ids[start:start + n])
            layout.append((block_tables(seq) if by_table else seq.block_table, start, n))
            row += n
            if is_due(seq, n):
                sampled_rows.append(row - 1)
        if by_table:
            md = AttentionMetadata.build_grouped(layout, bs, lm.device, by_table=True)
        else:
            md = AttentionMetadata.build(layout, bs, lm.device)
        ids = torch.tensor(input_ids, dtype=torch.long, device=lm.device)
        hidden = lm.model(ids, md.positions, self.cache.kv_caches, md)
        logits = lm.model.compute_logits(hidden, torch.tensor(sampled_rows, dtype=torch.long, device=lm.device))
        return self._sample(out, logits)

    def _sample(self, out: SchedulerOutput, logits: torch.Tensor) -> dict[int, list[Sample]]:
        """Samples per group, for the sequences due a token (rows of logits, in batch order)."""
        samples: dict[int, list[Sample]] = {}
        row = 0
        for group, due_seqs in out.due_by_group():  # logits rows follow the due sequences in batch order
            if not due_seqs:
                continue
            due = {seq.seq_id: logits[row + i] for i, seq in enumerate(due_seqs)}
            row += len(due_seqs)
            try:
                beams = self._beams.get(group.request_id)
                if beams is not None:
                    samples[group.request_id] = beams.step(group, due)
                else:
                    samples[group.request_id] = self._sample_group(group, due)
            except Exception as e:
                if not self.isolate_failures:
                    raise
                # one token per due sequence keeps the core's update whole; the request is
                # aborted right after it, so the token is never seen
                self._failed[group.request_id] = f"{type(e).__name__}: {e}"
                samples[group.request_id] = [Sample(seq.seq_id, seq.token_ids[-1]) for seq in due_seqs]
        return samples

    def _sample_group(self, group: SequenceGroup, due: dict[int, torch.Tensor]) -> list[Sample]:
        params = group.sampling
        mine = []
        for seq_id, row in due.items():
            seq = next(s for s in group.seqs if s.seq_id == seq_id)
            if params.n > 1 and len(group.seqs) == 1 and seq.num_output_tokens == 0:
                # the prompt's last logits give the first token of all n samples: sample i from a
                # fresh generator seeded seed + i; the core forks the prompt's sequence
                gens = [self._generators.get(seq_id)] + [self._new_generator(group, i) for i in range(1, params.n)]
                for gen in gens:
                    mine.append(Sample(seq_id, *_one(sample(row, params, gen))))
                self._forks[group.request_id] = gens
            else:
                mine.append(Sample(seq_id, *_one(sample(row, params, self._generators.get(seq_id)))))
        return mine

    def _new_generator(self, group: SequenceGroup, index: int) -> torch.Generator | None:
        seed = self._seeds.get(group.request_id)
        return None if seed is None else make_generator(seed + index)  # None: greedy

    def _after_update(self, out: SchedulerOutput) -> None:
        """Give the sequences the core just forked their generators / beam ranks."""
        for group in out.groups:
            # the core says which sequence each sample went into (group.sample_seq_ids)
            gens = self._forks.pop(group.request_id, None)
            if gens is not None:
                for seq_id, gen in zip(group.sample_seq_ids, gens):
                    if gen is not None:
                        self._generators[seq_id] = gen
            beams = self._beams.get(group.request_id)
            if beams is not None and beams.pending is not None:
                beams.after_update(group)

    # -- offline generation ----------------------------------------------------------------
    def generate(self, prompts: list[list[int]], sampling: SamplingParams | list[SamplingParams]) -> list[RequestOutput]:
        """Run prompts (token ids) to completion; outputs in prompt order."""
        params = sampling if isinstance(sampling, list) else [sampling] * len(prompts)
        groups = [self.add_request(p, sp) for p, sp in zip(prompts, params)]
        now = 0.0
        while self.has_unfinished():
            self.step(now)
            now += 1.0  # offline: a step counter is the clock
        results = []
        for prompt, group in zip(prompts, groups):
            if group.reject_reason:
                raise ValueError(f"request {group.request_id} rejected: {group.reject_reason}")
            beams = self.finished_beams.pop(group.request_id, None)
            if beams is not None:
                results.append(RequestOutput(group.request_id, list(prompt), beams.outputs(group), group, beams.parent_ranks))
            else:
                outputs = [seq.output_token_ids for seq in samples_in_order(group)]
                results.append(RequestOutput(group.request_id, list(prompt), outputs, group))
        return results


def attention_layers(model: torch.nn.Module) -> list[PagedAttention]:
    """The model's paged attention layers, in layer order (modules register in that order)."""
    return [m for m in model.modules() if isinstance(m, PagedAttention)]


def samples_in_order(group: SequenceGroup) -> list:
    """A parallel-sampling group's sequences, live or finished, as samples 0..n-1: the prompt's
    sequence is sample 0 and the core numbers the children it forks off in sample order."""
    return sorted(group.seqs + group.finished_seqs, key=lambda s: s.seq_id)


def _one(drawn: tuple[list[int], list[float]]) -> tuple[int, float]:
    tokens, logprobs = drawn
    return tokens[0], logprobs[0]
