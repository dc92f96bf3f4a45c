"""What every cost model shares: the step description and the interface.

The simulator describes a step by a ``BatchShape`` (token and sequence counts, swap and copy
traffic) and asks a ``CostModel`` for its duration. The models themselves live beside this module
(``roofline``, ``calibrated``, ``profiled``); ``registry`` is the one place that knows their names.

Speed matters: a replay calls ``iteration_time`` ~1e5 times, so every model precomputes its
per-(model, GPU, TP) factors and a call is a few multiply-adds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Iterator


@dataclass(frozen=True, slots=True)
class BatchShape:
    """What one iteration computes and moves; all the cost models look at."""

    num_prefill_tokens: int = 0     # new tokens computed this step for sequences in prefill
    num_prefill_seqs: int = 0       # (a whole prompt, a chunk, or a recompute)
    prefill_attn_pairs: int = 0     # sum over prefill seqs of new*ctx_before + new*(new+1)//2
    num_decode_seqs: int = 0
    decode_context_tokens: int = 0  # sum over decode seqs of their context length (KV read)
    num_swap_blocks: int = 0        # blocks moved host<->device this step (in + out)
    num_copy_blocks: int = 0        # copy-on-write block copies this step
    block_size: int = 16

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_seqs

    @property
    def num_seqs(self) -> int:
        return self.num_prefill_seqs + self.num_decode_seqs


def prefill_attn_pairs(new_tokens: int, context_before: int = 0) -> int:
    """(query, key) pairs under the causal mask for `new_tokens` appended after `context_before`."""
    return new_tokens * context_before + new_tokens * (new_tokens + 1) // 2


class CostModel(ABC):
    """Duration of one engine iteration. Implementations must be deterministic and pure."""

    name: str = "abstract"

    @abstractmethod
    def iteration_time(self, shape: BatchShape) -> float:
        """Seconds the step described by `shape` takes."""

    def describe(self) -> dict:
        """Parameters worth writing next to results (reports, calibration)."""
        return {"name": self.name}

    def decode_run_times(self, num_seqs: int, context_tokens: int, block_size: int = 16) -> Iterator[float]:
        """Durations of consecutive plain decode steps of one batch, whose context grows by
        num_seqs tokens a step (the simulator's runs). An override may be faster but must give
        exactly the floats iteration_time gives."""
        while True:
            yield self.iteration_time(BatchShape(num_decode_seqs=num_seqs, decode_context_tokens=context_tokens,
                                                 block_size=block_size))
            context_tokens += num_seqs


class ConstantCostModel(CostModel):
    """Every step takes `seconds`, whatever it computes. For tests and toy runs."""

    name = "constant"

    def __init__(self, seconds: float = 0.01) -> None:
        if seconds < 0:
            raise ValueError("seconds must be >= 0")
        self.seconds = float(seconds)

    def iteration_time(self, shape: BatchShape) -> float:
        return self.seconds

    def describe(self) -> dict:
        return {"name": self.name, "seconds": self.seconds}


def linear_context_run(base: float, per_ctx: float, num_seqs: int, context_tokens: int) -> Iterator[float]:
    """Decode run times for a model whose plain decode step is `base + context_tokens * per_ctx`
    (`decode_run_times` of the roofline, calibrated and profiled models). The model's
    iteration_time must add that context term last, to the same base, so the floats are equal."""
    while True:
        yield base + context_tokens * per_ctx
        context_tokens += num_seqs
