"""Profiling the real engine for the simulator's `profiled` cost model.

Runs LLMEngine over a grid of iteration shapes and writes a JSON profile (format in
pagesim/sim/cost/profiled.py and docs/calibration.md):

- prefill steps: `num_seqs` prompts of `tokens` tokens admitted together (one step each);
- decode steps: `batch` sequences decoding at a context of about `context` tokens;
- swap out / swap in of `blocks` KV blocks, and copy-on-write copies of `blocks` blocks.

Every measured step is described by the BatchShape the simulator builds for the same
SchedulerOutput (SchedulerOutput.batch_shape), so the fit sees
exactly what the simulator will ask for. Each point is repeated, the first repetition of each kind is a warmup, and the median is
kept. Durations come from executor.run.RunClock: "cpu" (this thread's CPU time; use with one
torch thread on a shared machine) or "wall" (use on a GPU, where the step synchronizes).
"""

from __future__ import annotations

import os
import platform
import random
import statistics
import time
from dataclasses import asdict, dataclass, field

import torch

from executor.engine import EngineConfig, LLMEngine
from executor.models.loader import LoadedModel
from executor.run import RunClock
from pagesim.core import SamplingParams

PROFILE_FORMAT = "pagesim-profile/1"  # the same string pagesim.sim.cost.profiled reads


@dataclass
class ProfileGrid:
    prefill: list[tuple[int, int]] = field(default_factory=lambda: [
        (1, 8), (1, 32), (1, 64), (1, 128), (1, 256), (2, 16), (2, 64), (4, 8), (4, 32), (8, 16)])  # (seqs, tokens)
    decode: list[tuple[int, int]] = field(default_factory=lambda: [
        (1, 32), (1, 256), (2, 64), (4, 32), (4, 128), (8, 32), (8, 128), (16, 48), (16, 96), (24, 64), (32, 32),
        (32, 96)])  # (batch, context)
    swap_blocks: list[int] = field(default_factory=lambda: [1, 4, 16])
    copy_blocks: list[int] = field(default_factory=lambda: [1, 4, 16])
    reps: int = 3

    @classmethod
    def tiny(cls) -> "ProfileGrid":
        """A few seconds on a tiny random model (tests, smoke runs)."""
        return cls(prefill=[(1, 2), (1, 4), (1, 16), (1, 48), (2, 8), (2, 24), (4, 12), (3, 2)],
                   decode=[(1, 8), (1, 40), (2, 16), (3, 24), (4, 8), (4, 32), (6, 12), (8, 16), (8, 40), (16, 8)],
                   swap_blocks=[1, 4], copy_blocks=[1, 4], reps=2)

    @classmethod
    def gpu(cls) -> "ProfileGrid":
        return cls(prefill=[(1, 128), (1, 512), (1, 2048), (4, 256), (8, 128), (16, 64), (2, 1024)],
                   decode=[(1, 512), (8, 256), (16, 512), (32, 1024), (64, 256), (64, 1024), (128, 512),
                           (256, 256), (256, 1024)],
                   swap_blocks=[16, 64, 256], copy_blocks=[16, 64, 256], reps=5)


def hardware_info(lm: LoadedModel) -> dict:
    info = {"device": lm.device.type, "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "dtype": str(lm.dtype).replace("torch.", ""), "python": platform.python_version()}
    if lm.device.type == "cuda":
        info["device_name"] = torch.cuda.get_device_name(lm.device)
    else:
        name = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
        except OSError:
            pass
        info["device_name"] = f"{name} ({os.cpu_count()} cores visible)"
    return info


def model_info(lm: LoadedModel, spec: str) -> dict:
    return {"spec": spec, "name": lm.name,
            "num_layers": lm.num_layers, "num_kv_heads": lm.num_kv_heads, "head_dim": lm.head_dim,
            "vocab_size": lm.vocab_size, "num_params": sum(p.numel() for p in lm.model.parameters())}


class _Profiler:
    def __init__(self, lm: LoadedModel, grid: ProfileGrid, block_size: int, clock: str, seed: int):
        self.lm, self.grid, self.bs = lm, grid, block_size
        self.clock = RunClock(clock)
        longest = max([t for _, t in grid.prefill] + [c + grid.reps + 2 for _, c in grid.decode])
        blocks_per_seq = -(-longest // block_size) + 1
        most_seqs = max([n for n, _ in grid.prefill] + [b for b, _ in grid.decode])
        num_blocks = max(most_seqs * blocks_per_seq, 2 * max(grid.swap_blocks + grid.copy_blocks + [1])) + 8
        budget = max(max(n * t for n, t in grid.prefill), max(b * c for b, c in grid.decode), longest + 8)
        self.engine = LLMEngine(lm, EngineConfig(block_size=block_size, num_gpu_blocks=num_blocks,
                                                 num_cpu_blocks=max(grid.swap_blocks + [1]) + 8, max_num_seqs=most_seqs,
                                                 max_num_batched_tokens=budget, max_model_len=longest + 8))
        self.rng = random.Random(seed)
        self.greedy = dict(temperature=0.0, ignore_eos=True)

    def _prompt(self, n: int) -> list[int]:
        return [self.rng.randrange(4, self.lm.vocab_size) for _ in range(n)]

    def _step(self):
        began = self.clock()
        stats = self.engine.step(self.clock)
        return stats, self.clock() - began

    def _timed(self, fn) -> float:
        if self.lm.device.type == "cuda":
            torch.cuda.synchronize()
        began = self.clock()
        fn()
        if self.lm.device.type == "cuda":
            torch.cuda.synchronize()
        return self.clock() - began

    def prefill(self, num_seqs: int, tokens: int) -> dict:
        shapes, times = [], []
        for _ in range(self.grid.reps):
            for _ in range(num_seqs):
                self.engine.add_request(self._prompt(tokens), SamplingParams(max_tokens=1, **self.greedy))
            stats, seconds = self._step()
            out = stats.out
            if out.num_prefill_tokens != num_seqs * tokens or out.num_decode_seqs:
                raise RuntimeError(f"prefill ({num_seqs} x {tokens}): the engine scheduled "
                                   f"{out.num_prefill_tokens} prefill tokens and {out.num_decode_seqs} decodes")
            shapes.append(stats.shape)
            times.append(seconds)
            while self.engine.has_unfinished():
                self._step()
        return self._record("prefill", shapes, times)

    def decode(self, batch: int, context: int) -> dict:
        # prompts of context - 1 tokens: the first decode step reads `context` tokens
        for _ in range(batch):
            self.engine.add_request(self._prompt(context - 1), SamplingParams(max_tokens=self.grid.reps + 2, **self.greedy))
        shapes, times = [], []
        while self.engine.has_unfinished():
            stats, seconds = self._step()
            out = stats.out
            if out.num_prefill_tokens == 0 and out.num_decode_seqs == batch and len(times) < self.grid.reps:
                shapes.append(stats.shape)
                times.append(seconds)
        if len(times) < self.grid.reps:
            raise RuntimeError(f"decode ({batch} x {context}): only {len(times)} full decode steps observed")
        return self._record("decode", shapes, times)

    def block_moves(self, kind: str, blocks: int) -> dict:
        cache = self.engine.cache
        pairs = [(i, i) for i in range(blocks)] if kind != "copy" else [(i, blocks + i) for i in range(blocks)]
        fn = {"swap_out": lambda: cache.swap_out(pairs), "swap_in": lambda: cache.swap_in(pairs),
              "copy": lambda: cache.copy(pairs)}[kind]
        fn()  # warmup
        times = [self._timed(fn) for _ in range(self.grid.reps)]
        shape = {"num_swap_blocks": blocks} if kind != "copy" else {"num_copy_blocks": blocks}
        return {"kind": kind, "shape": {**shape, "block_size": self.bs}, "seconds": statistics.median(times),
                "samples": times}

    @staticmethod
    def _record(kind: str, shapes, times) -> dict:
        middle = shapes[len(shapes) // 2]  # decode contexts grow step by step; the middle one stands for all
        return {"kind": kind, "shape": asdict(middle), "seconds": statistics.median(times), "samples": times}


def profile_engine(lm: LoadedModel, grid: ProfileGrid | None = None, *, block_size: int = 16, clock: str = "cpu",
                   model_spec: str = "", command: str = "", seed: int = 0, progress=None) -> dict:
    """Measure the grid; returns the profile (a JSON-ready dict). progress(done, total) if given."""
    grid = grid or ProfileGrid()
    p = _Profiler(lm, grid, block_size, clock, seed)
    total = len(grid.prefill) + len(grid.decode) + 2 * len(grid.swap_blocks) + len(grid.copy_blocks)
    done = 0
    started = time.perf_counter()

    def tick():
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    # warmup: first calls allocate and initialize (not measured)
    p.engine.generate([p._prompt(16), p._prompt(24)], SamplingParams(max_tokens=3, **p.greedy))
    steps = []
    for n, t in grid.prefill:
        steps.append(p.prefill(n, t))
        tick()
    for b, c in grid.decode:
        steps.append(p.decode(b, c))
        tick()
    swaps, copies = [], []
    for blocks in grid.swap_blocks:
        swaps.append(p.block_moves("swap_out", blocks))
        tick()
        swaps.append(p.block_moves("swap_in", blocks))
        tick()
    for blocks in grid.copy_blocks:
        copies.append(p.block_moves("copy", blocks))
        tick()
    return {
        "format": PROFILE_FORMAT,
        "created": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": command,
        "clock": clock,
        "block_size": block_size,
        "model": model_info(lm, model_spec),
        "hardware": hardware_info(lm),
        "grid": asdict(grid),
        "profile_wall_s": round(time.perf_counter() - started, 2),
        "steps": steps,
        "swaps": swaps,
        "copies": copies,
    }
