"""The executor (continuous batching over the paged KV cache) against transformers `generate` with
static padded batches, on CPU, with SmolLM2-135M in fp32.

    python -m benchmarks.bench_executor --out reports/bench_executor.md

Workload: the first --num-requests requests of traces/sharegpt.json with both lengths divided by
--scale (at least 1 token), prompts as seeded synthetic token ids shared by both systems.

  - HF: the requests in trace order, in static batches of --batch-size (FasterTransformer-like):
    left padding + attention mask, greedy, max_new_tokens = min_new_tokens = the longest output in
    the batch, so every sequence of a batch runs as long as its longest one.
  - executor: all requests at once, max_num_seqs = --num-requests, greedy, ignore_eos, each
    request's own output length as max_tokens.

Both count only useful tokens: each request's own output length. Threads are set with
torch.set_num_threads(--threads) before anything runs (default 1: on a 2-core machine that other
processes load, a second OpenMP thread spins and makes small ops many times slower).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def workload(path: Path, num: int, scale: int, vocab_size: int, seed: int):
    """(prompt token ids, output length) per request."""
    from pagesim.workload.trace import load_trace

    requests = load_trace(path).requests[:num]
    if len(requests) < num:
        raise SystemExit(f"{path} has only {len(requests)} requests")
    out = []
    for i, r in enumerate(requests):
        prompt_len, output_len = max(1, r.prompt_len // scale), max(1, r.output_len // scale)
        rng = random.Random(f"{seed}:{i}")  # pagesim.workload.requests.synthetic_prompt's recipe
        out.append(([rng.randrange(4, vocab_size) for _ in range(prompt_len)], output_len))
    return out


def loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


# ------------------------------------------------------------------ the two systems


@torch.inference_mode()
def run_hf(hf, reqs, batch_size: int, pad_id: int, log):
    """Static batches in trace order. Returns (wall s, process CPU s, generated tokens incl. waste,
    outputs)."""
    outputs: list[list[int]] = []
    generated = 0
    start, cpu = time.perf_counter(), time.process_time()
    for b in range(0, len(reqs), batch_size):
        batch = reqs[b:b + batch_size]
        width = max(len(p) for p, _ in batch)
        steps = max(o for _, o in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, (p, _) in enumerate(batch):
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        t = time.perf_counter()
        seqs = hf.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=steps,
                           min_new_tokens=steps, pad_token_id=pad_id, num_beams=1)
        new = seqs[:, width:]
        assert new.shape[1] == steps, new.shape
        generated += new.numel()
        outputs.extend(new[i, :o].tolist() for i, (_, o) in enumerate(batch))
        log(f"  hf batch {b // batch_size}: {len(batch)} seqs, prompt width {width}, {steps} steps, "
            f"{time.perf_counter() - t:.1f}s")
    return time.perf_counter() - start, time.process_time() - cpu, generated, outputs


def run_executor(lm, reqs, max_num_seqs: int, block_size: int, log):
    """All requests at once. Returns (wall s, process CPU s, outputs, step stats)."""
    from executor.engine import EngineConfig, LLMEngine
    from pagesim.core import SamplingParams

    blocks = sum(-(-(len(p) + o) // block_size) for p, o in reqs) + max_num_seqs
    engine = LLMEngine(lm, EngineConfig(block_size=block_size, num_gpu_blocks=blocks, num_cpu_blocks=16,
                                        max_num_seqs=max_num_seqs))
    params = [SamplingParams(max_tokens=o, ignore_eos=True, temperature=0.0) for _, o in reqs]
    groups = [engine.add_request(p, sp) for (p, _), sp in zip(reqs, params)]
    steps = []  # (num seqs, num new tokens, seconds, prefill?)
    start, cpu = time.perf_counter(), time.process_time()
    clock = 0.0
    while engine.has_unfinished():
        st = engine.step(clock)
        clock += 1.0
        steps.append((len(st.out.seqs), sum(st.out.num_new_tokens), st.seconds,
                      any(n > 1 for n in st.out.num_new_tokens)))
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    outputs = []
    for g in groups:
        if g.reject_reason:
            raise SystemExit(f"request {g.request_id} rejected: {g.reject_reason}")
        outputs.append(list(g.finished_seqs[0].output_token_ids))
    log(f"  executor: {len(steps)} steps, {seconds:.1f}s")
    return seconds, cpu, outputs, steps


def _engine_after_prefill(lm, reqs, max_num_seqs, block_size):
    from executor.engine import EngineConfig, LLMEngine
    from pagesim.core import SamplingParams

    blocks = sum(-(-(len(p) + o) // block_size) for p, o in reqs) + max_num_seqs
    engine = LLMEngine(lm, EngineConfig(block_size=block_size, num_gpu_blocks=blocks, num_cpu_blocks=16,
                                        max_num_seqs=max_num_seqs))
    for p, o in reqs:
        engine.add_request(p, SamplingParams(max_tokens=o, ignore_eos=True, temperature=0.0))
    engine.step(0.0)  # the prefill
    return engine


def compare_kernels(lm, reqs, max_num_seqs, block_size, steps: int = 6):
    """Decode ms/step right after the prefill with the vectorized CPU kernels and with the
    per-sequence reference (PAGESIM_KERNELS), alternated: what Task A's torch_ops buys."""
    from executor import kernels

    old = os.environ.get("PAGESIM_KERNELS")
    result = {}
    try:
        for name in ("torch", "reference", "torch"):
            os.environ["PAGESIM_KERNELS"] = name
            assert kernels.backend("cpu") == name
            engine = _engine_after_prefill(lm, reqs, max_num_seqs, block_size)
            t = time.perf_counter()
            for i in range(steps):
                st = engine.step(float(i + 1))
            result.setdefault(name, []).append((time.perf_counter() - t) / steps)
    finally:
        if old is None:
            os.environ.pop("PAGESIM_KERNELS", None)
        else:
            os.environ["PAGESIM_KERNELS"] = old
    return {k: min(v) for k, v in result.items()}, len(st.out.seqs)


def profile_executor(lm, reqs, max_num_seqs, block_size, steps: int = 12):
    """Self CPU time by op over a few decode-heavy steps: where the executor's time goes."""
    from torch.profiler import profile

    engine = _engine_after_prefill(lm, reqs, max_num_seqs, block_size)  # the prefill is not profiled
    with profile() as prof:
        t = time.perf_counter()
        for i in range(steps):
            st = engine.step(float(i + 1))
        wall = time.perf_counter() - t
    batch = len(st.out.seqs)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14), wall / steps, batch


# ------------------------------------------------------------------ main


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="write the Markdown report here")
    ap.add_argument("--trace", type=Path, default=ROOT / "traces" / "sharegpt.json")
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--scale", type=int, default=8, help="divide prompt and output lengths by this")
    ap.add_argument("--batch-size", type=int, default=8, help="HF static batch size")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads for both systems")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", type=int, default=8, help="requests whose greedy outputs are compared")
    ap.add_argument("--no-profile", action="store_true",
                    help="skip the profile of executor steps and the torch_ops vs reference kernel timing")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    lines: list[str] = []

    def log(msg=""):
        print(msg, flush=True)

    from executor import kernels
    from executor.models.loader import from_hf_model, hf_from_gguf, smollm2_path

    log(f"torch {torch.__version__}, threads {torch.get_num_threads()} (OMP_NUM_THREADS="
        f"{os.environ.get('OMP_NUM_THREADS', 'unset')}), {os.cpu_count()} CPUs, load {loadavg()}")
    t = time.perf_counter()
    path = smollm2_path()
    hf = hf_from_gguf(path).eval()
    # The same weights as load_model("smollm2") (which is hf_from_gguf + from_hf_model), without
    # dequantising the GGUF file a second time.
    lm = from_hf_model(hf, dtype=torch.float32)
    log(f"models loaded in {time.perf_counter() - t:.1f}s; attention kernels: {kernels.backend('cpu')}")
    pad_id = hf.config.pad_token_id if hf.config.pad_token_id is not None else hf.config.eos_token_id
    if isinstance(pad_id, (list, tuple)):
        pad_id = pad_id[0]

    reqs = workload(args.trace, args.num_requests, args.scale, lm.vocab_size, args.seed)
    useful = sum(o for _, o in reqs)
    prompt_lens = [len(p) for p, _ in reqs]
    out_lens = [o for _, o in reqs]

    # Warm-up: one short request through each system (first-call allocations, lazy imports).
    warm = [(reqs[0][0][:8], 4), (reqs[1][0][:5], 4)]
    run_hf(hf, warm, 2, pad_id, lambda _: None)
    run_executor(lm, warm, 2, args.block_size, lambda _: None)

    # A-B-A: executor, HF, executor again, so a change in the machine's load during the long HF
    # run shows up as a difference between the two executor runs instead of skewing the ratio.
    loads = [loadavg()]
    log(f"executor run 1, continuous batching, max_num_seqs {args.num_requests} (load {loads[-1]})")
    ex1_s, ex1_cpu, ex_out, steps = run_executor(lm, reqs, args.num_requests, args.block_size, log)
    loads.append(loadavg())
    log(f"HF generate, static batches of {args.batch_size} (load {loads[-1]})")
    hf_s, hf_cpu, hf_generated, hf_out = run_hf(hf, reqs, args.batch_size, pad_id, log)
    loads.append(loadavg())
    log(f"executor run 2 (load {loads[-1]})")
    ex2_s, ex2_cpu, ex_out2, _ = run_executor(lm, reqs, args.num_requests, args.block_size, log)
    loads.append(loadavg())
    if ex_out2 != ex_out:
        log("  WARNING: the two executor runs produced different outputs")
    ex_s, ex_cpu = (ex1_s + ex2_s) / 2, (ex1_cpu + ex2_cpu) / 2

    hf_tps, ex_tps = useful / hf_s, useful / ex_s
    ratio = ex_tps / hf_tps
    cpu_ratio = hf_cpu / ex_cpu
    log(f"HF {hf_tps:.1f} tok/s ({hf_s:.1f}s wall, {hf_cpu:.1f}s CPU), executor {ex_tps:.1f} tok/s "
        f"({ex1_s:.1f}s / {ex2_s:.1f}s wall, {ex_cpu:.1f}s CPU): ratio {ratio:.2f} (by CPU time {cpu_ratio:.2f})")

    # Sanity: greedy outputs of both systems on the tokens both produce.
    checks = []
    for i in range(min(args.check, len(reqs))):
        a, b = hf_out[i], ex_out[i]
        same = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
        checks.append((i, len(reqs[i][0]), len(a), same))
        log(f"  request {i}: prompt {len(reqs[i][0])}, output {len(a)}, first {same} tokens agree"
            + ("" if same == len(a) else f" (hf {a[same]} vs executor {b[same]} at {same})"))
    diverged = []
    for i, (a, b) in enumerate(zip(hf_out, ex_out)):
        if a != b:
            diverged.append((i, len(a), next(j for j, (x, y) in enumerate(zip(a, b)) if x != y)))
    all_agree = len(reqs) - len(diverged)
    log(f"  identical outputs: {all_agree}/{len(reqs)} requests; diverging (request, output len, first "
        f"differing token): {diverged}")

    prefill_s = sum(s for _, _, s, pre in steps if pre)
    decode_steps = [(n, s) for n, _, s, pre in steps if not pre]
    decode_s = sum(s for _, s in decode_steps)
    mean_batch = sum(n for n, _ in decode_steps) / max(1, len(decode_steps))
    prof_table, prof_step_s, prof_batch = ("", 0.0, 0) if args.no_profile else profile_executor(
        lm, reqs, args.num_requests, args.block_size)
    kernel_cmp = None
    if not args.no_profile:
        kernel_cmp = compare_kernels(lm, reqs, args.num_requests, args.block_size)
        log(f"decode ms/step after the prefill ({kernel_cmp[1]} seqs): "
            + ", ".join(f"{k} {1e3 * v:.0f}" for k, v in kernel_cmp[0].items()))

    # ---------------------------------------------------------------- report
    w = lines.append
    w("# Executor vs transformers `generate` (CPU, SmolLM2-135M, fp32)")
    w("")
    w("Produced by `python -m benchmarks.bench_executor" + (f" --out {args.out}" if args.out else "") + "`.")
    w("")
    w("## Setup")
    w("")
    w(f"- torch {torch.__version__}, transformers {__import__('transformers').__version__}, Python "
      f"{platform.python_version()}, {os.cpu_count()} CPUs; `torch.set_num_threads({args.threads})` "
      f"(OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}) for both systems.")
    w(f"- Load average (1/5/15 min) before executor run 1 / HF / executor run 2 / after: "
      + " | ".join(loads) + ". Other processes share this machine, so the runs go executor, HF, "
      "executor in one process, and CPU time (process time, {} thread) is reported next to wall "
      "time.".format(args.threads))
    w(f"- Threads: {args.threads} (`torch.get_num_threads()` = {torch.get_num_threads()}, interop "
      f"{torch.get_num_interop_threads()}). Chosen deliberately: with other processes loading this "
      "2-core machine, a second OpenMP thread spins waiting for a core and small ops get many times "
      "slower; `--threads` changes it.")
    w(f"- Model: SmolLM2-135M-Instruct (GGUF Q4_1 dequantised to fp32 by transformers); the executor "
      f"gets the same weights (`from_hf_model`, what `load_model(\"smollm2\")` does). Executor "
      f"attention kernels: `{kernels.backend('cpu')}`.")
    w(f"- Workload: the first {len(reqs)} requests of `{args.trace.relative_to(ROOT) if args.trace.is_relative_to(ROOT) else args.trace}`, "
      f"prompt and output lengths divided by {args.scale} (at least 1 token): prompts mean "
      f"{sum(prompt_lens) / len(reqs):.1f} / max {max(prompt_lens)} tokens, outputs mean "
      f"{useful / len(reqs):.1f} / max {max(out_lens)}; {useful} useful output tokens. Prompts are "
      f"seeded synthetic token ids (seed {args.seed}), the same for both systems.")
    w(f"- HF: `AutoModelForCausalLM` + `generate`, static batches of {args.batch_size} in trace order "
      "(FasterTransformer-like), left padding with an attention mask, greedy, max_new_tokens = "
      "min_new_tokens = the batch's longest output, default (dynamic) KV cache.")
    w(f"- Executor: `LLMEngine`, all {len(reqs)} requests at once, max_num_seqs {args.num_requests}, "
      f"block size {args.block_size}, greedy, ignore_eos, max_tokens = each request's own output length.")
    w("- Throughput counts useful tokens only (each request's own output length) for both.")
    w("")
    w("## Results")
    w("")
    w("| system | wall s | CPU s | tokens generated | useful tokens | useful tok/s (wall) |")
    w("|---|---:|---:|---:|---:|---:|")
    w(f"| HF generate, static batch {args.batch_size} | {hf_s:.1f} | {hf_cpu:.1f} | {hf_generated} | {useful} | {hf_tps:.1f} |")
    w(f"| executor run 1 | {ex1_s:.1f} | {ex1_cpu:.1f} | {useful} | {useful} | {useful / ex1_s:.1f} |")
    w(f"| executor run 2 | {ex2_s:.1f} | {ex2_cpu:.1f} | {useful} | {useful} | {useful / ex2_s:.1f} |")
    w(f"| executor, mean of the two | {ex_s:.1f} | {ex_cpu:.1f} | {useful} | {useful} | {ex_tps:.1f} |")
    w("")
    w(f"**Executor / HF throughput: {ratio:.2f}x by wall time, {cpu_ratio:.2f}x by CPU time** (target >= 3).")
    w("")
    w(f"- HF generated {hf_generated} tokens for {useful} useful ones ({useful / hf_generated:.0%} "
      "useful): static batches run to their longest output.")
    hf_per_tok, ex_per_tok = hf_cpu / hf_generated, ex_cpu / useful
    w(f"- Where the ratio comes from (CPU time): HF spends {1e3 * hf_per_tok:.1f} ms per generated token "
      f"and generates {hf_generated / useful:.2f}x the useful tokens; the executor spends "
      f"{1e3 * ex_per_tok:.1f} ms per token ({hf_per_tok / ex_per_tok:.2f}x less: larger batches make "
      f"the weight matmuls, which dominate on a CPU, more efficient per token). "
      f"{hf_generated / useful:.2f} x {hf_per_tok / ex_per_tok:.2f} = {cpu_ratio:.2f}.")
    w("- Wall times on this shared 2-core machine move with other processes' load (the two executor "
      "runs show by how much); the CPU-time ratio is the steadier figure.")
    w(f"- Executor run 1: {len(steps)} steps; prefill steps {prefill_s:.1f}s, {len(decode_steps)} decode "
      f"steps {decode_s:.1f}s (mean {1e3 * decode_s / max(1, len(decode_steps)):.0f} ms/step, mean "
      f"batch {mean_batch:.1f} sequences).")
    w("")
    w("## Greedy outputs agree (sanity check)")
    w("")
    w("| request | prompt | output | leading tokens equal |")
    w("|---:|---:|---:|---:|")
    for i, p, o, same in checks:
        w(f"| {i} | {p} | {o} | {same} |")
    w("")
    w(f"Identical outputs over all requests: {all_agree}/{len(reqs)}; diverging (request, output "
      f"length, first differing token): {diverged or 'none'}. Both run fp32; a divergence after "
      "many equal tokens comes from near-tied logits on random-token prompts, where padding and "
      "batch shape change the summation order.")
    if kernel_cmp:
        times, batch = kernel_cmp
        w("")
        w("## CPU attention kernels: vectorized `torch_ops` vs the per-sequence reference")
        w("")
        w(f"Executor decode steps right after the prefill ({batch} sequences), best of the runs, "
          "same process: " + ", ".join(f"`PAGESIM_KERNELS={k}` {1e3 * v:.0f} ms/step" for k, v in times.items())
          + f" ({times['reference'] / times['torch']:.2f}x).")
    if prof_table:
        w("")
        w(f"## Where the executor's time goes (torch profiler, 12 decode steps right after the prefill, "
          f"ending at {prof_batch} sequences, {1e3 * prof_step_s:.0f} ms/step under the profiler)")
        w("")
        w("```")
        w(prof_table.strip())
        w("```")
    report = "\n".join(lines) + "\n"
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)
        log(f"wrote {args.out}")
    else:
        print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
