"""What every cost model shares: the step description and the interface.

The simulator describes a step by a ``BatchShape`` (token and sequence counts, swap and copy
traffic) and asks a ``CostModel`` for its duration. The models themselves live beside this module
(``roofline``, ``calibrated``, ``profiled``); ``registry`` is the one place that knows their names.

Speed matters: a replay calls ``iteration_time`` ~1e5 times, so every model precomputes its
per-(model, GPU, TP) factors and a call is a few multiply-adds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Iterator

# The step description lives in the core (SchedulerOutput counts it); the cost models take it from there.
from pagesim.core.step import BatchShape, prefill_attn_pairs  # noqa: F401 (re-exported)


class CostModel(ABC):
    """Duration of one engine iteration. Implementations must be deterministic and pure."""

    name: str = "abstract"
    # Seconds between a request's arrival and its entry into the engine (HTTP, tokenization): an
    # engine profile's; the models of the kernels alone have none.
    request_host_s: float = 0.0
    # Steps by which a token's delivery lags its step (an engine profile's async output: 0 or 1).
    output_delay_steps: int = 0

    @abstractmethod
    def iteration_time(self, shape: BatchShape) -> float:
        """Seconds the step described by `shape` takes."""

    def describe(self) -> dict:
        """Parameters worth writing next to results (reports, calibration)."""
        return {"name": self.name}

    def decode_run_durations(self, num_seqs: int, context_tokens: int, num_steps: int, block_size: int = 16) -> list[float]:
        """Durations of num_steps consecutive plain decode steps of one batch, whose context
        grows by num_seqs tokens a step (the simulator's runs). An override may be faster but must
        give exactly the floats iteration_time gives."""
        return [self.iteration_time(BatchShape(num_decode_seqs=num_seqs, block_size=block_size,
                                               decode_context_tokens=context_tokens + step * num_seqs))
                for step in range(num_steps)]

    def plain_decode_base(self, num_seqs: int, block_size: int = 16) -> float:
        """iteration_time of a plain decode step of num_seqs sequences reading no context: the
        base a decode run's durations add their context terms to. Kept per (num_seqs, block_size):
        a model is pure, and a replay asks for the same few batch sizes thousands of times."""
        key = (num_seqs, block_size)
        try:
            return self._plain_decode_bases[key]
        except AttributeError:  # (the first call: no model's __init__ needs to know of the table)
            self._plain_decode_bases: dict[tuple[int, int], float] = {}
        except KeyError:
            pass
        base = self._plain_decode_bases[key] = self.iteration_time(BatchShape(num_decode_seqs=num_seqs,
                                                                              block_size=block_size))
        return base

    def decode_run_times(self, num_seqs: int, context_tokens: int, block_size: int = 16) -> Iterator[float]:
        """decode_run_durations without an end."""
        chunk = 64
        while True:
            yield from self.decode_run_durations(num_seqs, context_tokens, chunk, block_size)
            context_tokens += chunk * num_seqs


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
