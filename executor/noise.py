"""Noise control for the executor's step clock: what the profiler and a trace run both apply, so
that a profile and the runs compared against it are measured alike.

Measured by benchmarks/bench_executor_noise.py (reports/executor_noise.md). The controls:

- pin_cpu: bind the process to one CPU (os.sched_setaffinity), so the torch thread is not
  migrated between cores (each move starts on cold caches);
- gc_during_steps=False: the garbage collector is disabled inside a step and re-enabled after,
  so its collections (whose cost grows with every object the process holds) fall between
  steps, not inside a timed one; gc.freeze() after the model loads moves the objects that live
  for the whole run out of the collector's generations (and gc.unfreeze() at exit hands them
  back: frozen objects are never collected, and triton's, which torch imports, then make
  nanobind print ~30 lines of "leaked ..." when the interpreter ends);
- warmup_steps: forward passes on a throwaway engine before t = 0 (the first passes allocate
  tensors and fill caches), never recorded.
"""

from __future__ import annotations

import atexit
import gc
import os
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class NoiseControl:
    pin_cpu: int | None = None  # CPU to bind the process to; None leaves the affinity alone
    gc_during_steps: bool = False  # True lets the collector run inside timed steps
    warmup_steps: int = 4  # untimed steps (a prefill, then decodes) before anything is measured

    def check(self) -> None:
        if self.pin_cpu is not None:
            allowed = os.sched_getaffinity(0)
            if self.pin_cpu not in allowed:
                raise ValueError(f"pin_cpu {self.pin_cpu}: this process may run on CPUs {sorted(allowed)} only")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")

    def apply(self) -> None:
        """Once, after the model has loaded and before anything is timed."""
        self.check()
        if self.pin_cpu is not None:
            os.sched_setaffinity(0, {self.pin_cpu})
        if not self.gc_during_steps:
            gc.collect()
            gc.freeze()
            atexit.unregister(gc.unfreeze)  # once, however many runs a process makes
            atexit.register(gc.unfreeze)

    @contextmanager
    def step(self):
        """Around one timed step: the collector waits until the step is over."""
        if self.gc_during_steps or not gc.isenabled():
            yield
            return
        gc.disable()
        try:
            yield
        finally:
            gc.enable()

    def warm_up(self, lm, block_size: int = 16) -> None:
        """warmup_steps untimed steps on a small throwaway engine sharing lm's weights: a prefill of
        two prompts, then decode steps. Nothing of it reaches a run's engine, clock or metrics."""
        if self.warmup_steps <= 0:
            return
        from executor.engine import EngineConfig, LLMEngine
        from pagesim.core import SamplingParams

        prompt_lens = (16, 24)
        blocks = 2 * (-(-(max(prompt_lens) + self.warmup_steps + 1) // block_size) + 1)
        engine = LLMEngine(lm, EngineConfig(block_size=block_size, num_gpu_blocks=blocks, num_cpu_blocks=blocks,
                                            max_num_seqs=2, max_num_batched_tokens=sum(prompt_lens) + 8,
                                            max_model_len=max(prompt_lens) + self.warmup_steps + 8))
        prompts = [[4 + (7 * i + j) % (lm.vocab_size - 4) for j in range(n)] for i, n in enumerate(prompt_lens)]
        engine.generate(prompts, SamplingParams(max_tokens=self.warmup_steps, temperature=0.0, ignore_eos=True))
