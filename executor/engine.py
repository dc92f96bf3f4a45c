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

from executor.attention import AttentionMetadata
from executor.cache_engine import CacheEngine
from executor.models.loader import LoadedModel
from executor.sampler import make_generator, sample
from pagesim.core import (PoolConfig, Request, Sample, SamplingParams, SchedulerConfig, SchedulerOutput, SequenceGroup,
                          StepResult, make_scheduler)


@dataclass
class EngineConfig:
    policy: str = "paged"
    block_size: int = 16
    num_gpu_blocks: int = 512
    num_cpu_blocks: int = 512
    max_num_seqs: int = 64
    max_num_batched_tokens: int | None = None  # default: max(2048, max_model_len)
    max_model_len: int | None = None  # default: the model's
    preemption: str = "auto"
    chunked_prefill: bool = False
    prefix_caching: bool = False
    allocator: str = "buddy"


@dataclass
class StepStats:
    """What one step did, for metrics and profiling."""

    out: SchedulerOutput
    finished: list[SequenceGroup]
    seconds: float


@dataclass
class RequestOutput:
    request_id: int
    prompt_token_ids: list[int]
    outputs: list[list[int]] = field(default_factory=list)  # one token list per finished sequence
    group: SequenceGroup | None = None


class LLMEngine:
    def __init__(self, lm: LoadedModel, config: EngineConfig | None = None):
        self.lm = lm
        self.config = cfg = config or EngineConfig()
        max_model_len = cfg.max_model_len or lm.max_model_len
        budget = cfg.max_num_batched_tokens or max(2048, max_model_len)
        pool = PoolConfig(cfg.num_gpu_blocks, cfg.num_cpu_blocks, cfg.block_size, cfg.prefix_caching, cfg.allocator)
        sched_cfg = SchedulerConfig(max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=budget, max_model_len=max_model_len,
                                    preemption_mode=cfg.preemption, chunked_prefill=cfg.chunked_prefill,
                                    eos_token_id=lm.eos_token_id)
        self.scheduler = make_scheduler(cfg.policy, pool, sched_cfg)
        self.cache = CacheEngine(lm.num_layers, lm.num_kv_heads, lm.head_dim, cfg.block_size, cfg.num_gpu_blocks,
                                 cfg.num_cpu_blocks, lm.dtype, lm.device)
        self._generators: dict[int, torch.Generator] = {}  # request_id -> its sampling generator
        self._next_id = 0

    # -- requests --------------------------------------------------------------------------
    def add_request(self, prompt_token_ids: list[int], sampling: SamplingParams, arrival_time: float = 0.0,
                    request_id: int | None = None) -> SequenceGroup:
        if request_id is None:
            request_id = self._next_id
        self._next_id = max(self._next_id, request_id + 1)
        if sampling.temperature > 0:
            self._generators[request_id] = make_generator(sampling.seed)
        request = Request(request_id, len(prompt_token_ids), sampling, arrival_time, list(prompt_token_ids))
        return self.scheduler.add_request(request)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

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
        for group in finished:
            self._generators.pop(group.request_id, None)
        return StepStats(out, finished, time.perf_counter() - start)

    def _execute(self, out: SchedulerOutput) -> dict[int, list[Sample]]:
        lm, bs = self.lm, self.config.block_size
        input_ids, layout, sampled_rows = [], [], []
        row = 0
        for seq, n in zip(out.seqs, out.num_new_tokens):
            start = seq.num_computed_tokens
            input_ids.extend(seq.token_ids[start:start + n])
            layout.append((seq.block_table, start, n))
            row += n
            if start + n == seq.num_tokens:  # reaches its end: due a token
                sampled_rows.append(row - 1)
        md = AttentionMetadata.build(layout, bs, lm.device)
        ids = torch.tensor(input_ids, dtype=torch.long, device=lm.device)
        hidden = lm.model(ids, md.positions, self.cache.kv_caches, md)
        logits = lm.model.compute_logits(hidden, torch.tensor(sampled_rows, dtype=torch.long, device=lm.device))
        return self._sample(out, logits)

    def _sample(self, out: SchedulerOutput, logits: torch.Tensor) -> dict[int, list[Sample]]:
        """Samples per group, in the order the due sequences appear in the batch."""
        samples: dict[int, list[Sample]] = {}
        i = pos = 0
        for group in out.groups:  # a group's sequences sit together in the batch, in group order
            params = group.sampling
            gen = self._generators.get(group.request_id)
            for seq in group.seqs:
                pos += 1
                if seq.num_computed_tokens + out.num_new_tokens[pos - 1] != seq.num_tokens:
                    continue
                # a parallel-sampling group draws its n samples from the prompt's last logits
                num = params.n if params.n > 1 and len(group.seqs) == 1 and seq.num_output_tokens == 0 else 1
                tokens, logprobs = sample(logits[i], params, gen, num)
                i += 1
                samples.setdefault(group.request_id, []).extend(Sample(seq.seq_id, t, lp) for t, lp in zip(tokens, logprobs))
        return samples

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
            outputs = [seq.output_token_ids for seq in group.finished_seqs]
            results.append(RequestOutput(group.request_id, list(prompt), outputs, group))
        return results
