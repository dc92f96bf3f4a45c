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

import math
import os
import platform
import random
import statistics
import time
from dataclasses import asdict, dataclass, field, replace

import torch

from executor.engine import EngineConfig, LLMEngine
from executor.models.loader import LoadedModel
from executor.noise import NoiseControl
from executor.run import RunClock
from pagesim.core import SamplingParams
from pagesim.metrics import t_quantile_975

PROFILE_FORMAT = "pagesim-profile/1"  # the same string pagesim.sim.cost.profiled reads


@dataclass
class ProfileGrid:
    prefill: list[tuple[int, int]] = field(default_factory=lambda: [
        (1, 8), (1, 32), (1, 64), (1, 128), (1, 256), (2, 16), (2, 64), (4, 8), (4, 32), (8, 16)])  # (seqs, tokens)
    decode: list[tuple[int, int]] = field(default_factory=lambda: [
        (1, 32), (1, 256), (2, 64), (4, 32), (4, 128), (8, 32), (8, 128), (16, 48), (16, 96), (24, 64), (32, 32),
        (32, 96)])  # (batch, context)
    # prefill and decode in one step: (prefill seqs, tokens each, decode batch, context)
    mixed: list[tuple[int, int, int, int]] = field(default_factory=lambda: [(1, 16, 8, 64), (1, 64, 16, 48),
                                                                             (2, 32, 4, 128)])
    # swap-heavy: enough sizes to separate the per-call from the per-block cost
    swap_blocks: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 48])
    copy_blocks: list[int] = field(default_factory=lambda: [1, 4, 16])
    reps: int = 3  # repetitions of every shape at least
    max_reps: int = 8  # more, up to this, while the median's 95 % interval is wider than +-target_ci
    target_ci: float = 0.02

    @classmethod
    def tiny(cls) -> "ProfileGrid":
        """A few seconds on a tiny random model (tests, smoke runs)."""
        return cls(prefill=[(1, 2), (1, 4), (1, 16), (1, 48), (2, 8), (2, 24), (4, 12), (3, 2)],
                   decode=[(1, 8), (1, 40), (2, 16), (3, 24), (4, 8), (4, 32), (6, 12), (8, 16), (8, 40), (16, 8)],
                   mixed=[(1, 8, 2, 16)], swap_blocks=[1, 4], copy_blocks=[1, 4], reps=2, max_reps=2)

    @classmethod
    def gpu(cls) -> "ProfileGrid":
        return cls(prefill=[(1, 128), (1, 512), (1, 2048), (4, 256), (8, 128), (16, 64), (2, 1024)],
                   decode=[(1, 512), (8, 256), (16, 512), (32, 1024), (64, 256), (64, 1024), (128, 512),
                           (256, 256), (256, 1024)],
                   mixed=[(1, 512, 32, 512), (4, 128, 64, 256)],
                   swap_blocks=[16, 64, 256], copy_blocks=[16, 64, 256], reps=5, max_reps=10)

    def merged(self, prefill: list[tuple[int, int]], decode: list[tuple[int, int]]) -> "ProfileGrid":
        """This grid plus more prefill and decode cells (a replay's visited shapes), without repeats."""
        return replace(self, prefill=list(dict.fromkeys(self.prefill + prefill)),
                       decode=list(dict.fromkeys(self.decode + decode)))

    def enough(self, times: list[float]) -> bool:
        """Stop repeating a shape: reps taken and the median known to +-target_ci, or max_reps."""
        n = len(times)
        return n >= max(self.reps, 1) and (n >= self.max_reps or ci95_rel(times) <= self.target_ci)


def ci95_rel(times: list[float]) -> float:
    """Half-width of the 95 % t-interval of the samples' mean, relative to their median (the value
    kept); infinite for fewer than two samples."""
    n = len(times)
    if n < 2:
        return math.inf
    return t_quantile_975(n - 1) * statistics.stdev(times) / math.sqrt(n) / statistics.median(times)


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
    def __init__(self, lm: LoadedModel, grid: ProfileGrid, block_size: int, clock: str, seed: int,
                 noise: NoiseControl):
        self.lm, self.grid, self.bs, self.noise = lm, grid, block_size, noise
        self.clock = RunClock(clock)
        steps = grid.max_reps + 2  # decode tokens a sequence may generate while it is measured
        longest = max([t for _, t in grid.prefill] + [c + steps for _, c in grid.decode]
                      + [max(t, c + steps) for _, t, _, c in grid.mixed])
        blocks_per_seq = -(-longest // block_size) + 1
        most_seqs = max([n for n, _ in grid.prefill] + [b for b, _ in grid.decode] + [n + b for n, _, b, _ in grid.mixed])
        num_blocks = max(most_seqs * blocks_per_seq, 2 * max(grid.swap_blocks + grid.copy_blocks + [1])) + 8
        budget = max([n * t for n, t in grid.prefill] + [b * c for b, c in grid.decode]
                     + [max(n * t + b, b * c) for n, t, b, c in grid.mixed] + [longest + 8])
        self.engine = LLMEngine(lm, EngineConfig(block_size=block_size, num_gpu_blocks=num_blocks,
                                                 num_cpu_blocks=max(grid.swap_blocks + [1]) + 8, max_num_seqs=most_seqs,
                                                 max_num_batched_tokens=budget, max_model_len=longest + 8,
                                                 # a prompt joins running decodes in one step only when chunked
                                                 # (the whole prompt fits the budget: prefill steps are unchanged)
                                                 chunked_prefill=bool(grid.mixed)))
        self.rng = random.Random(seed)
        self.greedy = dict(temperature=0.0, ignore_eos=True)

    def _prompt(self, n: int) -> list[int]:
        return [self.rng.randrange(4, self.lm.vocab_size) for _ in range(n)]

    def _step(self):
        with self.noise.step():
            began = self.clock()
            stats = self.engine.step(self.clock)
            return stats, self.clock() - began

    def _timed(self, fn) -> float:
        with self.noise.step():
            if self.lm.device.type == "cuda":
                torch.cuda.synchronize()
            began = self.clock()
            fn()
            if self.lm.device.type == "cuda":
                torch.cuda.synchronize()
            return self.clock() - began

    def _finish(self, groups) -> None:
        """End requests that were generating only to be measured."""
        for group in groups:
            self.engine.abort_request(group.request_id, self.clock())
        while self.engine.has_unfinished():
            self._step()

    def _add(self, num_seqs: int, prompt_len: int, max_tokens: int) -> list:
        return [self.engine.add_request(self._prompt(prompt_len), SamplingParams(max_tokens=max_tokens, **self.greedy))
                for _ in range(num_seqs)]

    def prefill(self, num_seqs: int, tokens: int) -> dict:
        shapes, times = [], []
        while not self.grid.enough(times):
            self._add(num_seqs, tokens, 1)
            stats, seconds = self._step()
            out = stats.out
            if out.num_prefill_tokens != num_seqs * tokens or out.num_decode_seqs:
                raise RuntimeError(f"prefill ({num_seqs} x {tokens}): the engine scheduled "
                                   f"{out.num_prefill_tokens} prefill tokens and {out.num_decode_seqs} decodes")
            shapes.append(stats.shape)
            times.append(seconds)
            self._finish([])
        return self._record("prefill", shapes, times)

    def decode(self, batch: int, context: int) -> dict:
        # prompts of context - 1 tokens: the first decode step reads `context` tokens
        groups = self._add(batch, context - 1, self.grid.max_reps + 2)
        shapes, times = [], []
        while self.engine.has_unfinished() and not self.grid.enough(times):
            stats, seconds = self._step()
            out = stats.out
            if out.num_prefill_tokens == 0 and out.num_decode_seqs == batch:
                shapes.append(stats.shape)
                times.append(seconds)
        if not self.grid.enough(times):
            raise RuntimeError(f"decode ({batch} x {context}): only {len(times)} full decode steps observed")
        self._finish(groups)
        return self._record("decode", shapes, times)

    def mixed(self, num_prefill: int, tokens: int, batch: int, context: int) -> dict:
        """Steps that prefill num_prefill prompts of `tokens` tokens while `batch` sequences decode."""
        decoders = self._add(batch, context - 1, self.grid.max_reps + 2)
        self._step()  # their prefill
        shapes, times = [], []
        while not self.grid.enough(times):
            if not self.engine.has_unfinished():
                raise RuntimeError(f"mixed ({num_prefill} x {tokens} + {batch} x {context}): decoders ran out")
            self._add(num_prefill, tokens, 1)
            stats, seconds = self._step()
            out = stats.out
            if out.num_prefill_tokens != num_prefill * tokens or out.num_decode_seqs != batch:
                raise RuntimeError(f"mixed ({num_prefill} x {tokens} + {batch} x {context}): the engine scheduled "
                                   f"{out.num_prefill_tokens} prefill tokens and {out.num_decode_seqs} decodes")
            shapes.append(stats.shape)
            times.append(seconds)
        self._finish(decoders)
        return self._record("mixed", shapes, times)

    def block_moves(self, kind: str, blocks: int) -> dict:
        cache = self.engine.cache
        pairs = [(i, i) for i in range(blocks)] if kind != "copy" else [(i, blocks + i) for i in range(blocks)]
        fn = {"swap_out": lambda: cache.swap_out(pairs), "swap_in": lambda: cache.swap_in(pairs),
              "copy": lambda: cache.copy(pairs)}[kind]
        fn()  # warmup
        times = []
        while not self.grid.enough(times):
            times.append(self._timed(fn))
        shape = {"num_swap_blocks": blocks} if kind != "copy" else {"num_copy_blocks": blocks}
        return {"kind": kind, "shape": {**shape, "block_size": self.bs}, "seconds": statistics.median(times),
                "samples": times, "ci95_rel": _finite(ci95_rel(times))}

    @staticmethod
    def _record(kind: str, shapes, times) -> dict:
        middle = shapes[len(shapes) // 2]  # decode contexts grow step by step; the middle one stands for all
        return {"kind": kind, "shape": asdict(middle), "seconds": statistics.median(times), "samples": times,
                "ci95_rel": _finite(ci95_rel(times))}


def _finite(x: float) -> float | None:
    return round(x, 5) if math.isfinite(x) else None  # JSON has no infinity


def profile_engine(lm: LoadedModel, grid: ProfileGrid | None = None, *, block_size: int = 16, clock: str = "cpu",
                   model_spec: str = "", command: str = "", seed: int = 0, progress=None,
                   noise: NoiseControl | None = None, shapes_from: list[str] | None = None) -> dict:
    """Measure the grid; returns the profile (a JSON-ready dict). progress(done, total) if given.
    noise: the clock's noise control (executor.noise; the defaults when None), applied here as a
    trace run applies it. shapes_from: the step-shape files the grid's extra cells came from (recorded)."""
    grid = grid or ProfileGrid()
    noise = noise or NoiseControl()
    noise.apply()
    noise.warm_up(lm, block_size)  # first calls allocate and initialize (not measured)
    p = _Profiler(lm, grid, block_size, clock, seed, noise)
    total = len(grid.prefill) + len(grid.decode) + len(grid.mixed) + 2 * len(grid.swap_blocks) + len(grid.copy_blocks)
    done = 0
    started = time.perf_counter()

    def tick():
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    steps = []
    for n, t in grid.prefill:
        steps.append(p.prefill(n, t))
        tick()
    for b, c in grid.decode:
        steps.append(p.decode(b, c))
        tick()
    for n, t, b, c in grid.mixed:
        steps.append(p.mixed(n, t, b, c))
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
        "noise_control": asdict(noise),
        "shapes_from": list(shapes_from or []),
        "block_size": block_size,
        "model": model_info(lm, model_spec),
        "hardware": hardware_info(lm),
        "grid": asdict(grid),
        "profile_wall_s": round(time.perf_counter() - started, 2),
        "steps": steps,
        "swaps": swaps,
        "copies": copies,
    }
