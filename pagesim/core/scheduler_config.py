"""The scheduler's knobs (pagesim.core.scheduler), checked when they are set: the limits of a
step and of a sequence, how a group is preempted, and how batches are formed."""

from __future__ import annotations

from dataclasses import dataclass

PREEMPTION_MODES = ("recompute", "swap", "auto")
BATCHING = ("iteration", "static")


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2560
    max_model_len: int = 2048
    preemption_mode: str = "auto"
    chunked_prefill: bool = False
    batching: str = "iteration"
    eos_token_id: int | None = None

    def __post_init__(self):
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption_mode must be one of {PREEMPTION_MODES}, got {self.preemption_mode!r}")
        if self.batching not in BATCHING:
            raise ValueError(f"batching must be one of {BATCHING}, got {self.batching!r}")
        # (the messages name the CLI flags, which carry these fields' names)
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"--max-num-batched-tokens {self.max_num_batched_tokens} is below --max-num-seqs "
                             f"{self.max_num_seqs}: every running sequence decodes one token a step")
        if not self.chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(f"--max-num-batched-tokens {self.max_num_batched_tokens} is below the max model length "
                             f"{self.max_model_len}, so a long prompt could never be scheduled: raise it (or lower "
                             "--max-model-len), or turn on --chunked-prefill")
