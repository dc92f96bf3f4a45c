"""Beam ancestry on real text: which parent each surviving beam descends from, step by step, in
the executor's own beam search (SmolLM2-135M, real weights, CPU, fp32), for the simulator's
stochastic beam model (pagesim/sim/data/beam_ancestry_smollm2.json).

Prompts: Alpaca instructions (../shared/data/alpaca/alpaca_5000.json, prompt = instruction +
"\\n" + input, the trace builder's rule), taken in the trace builder's seeded order, tokenized
with the SmolLM2 tokenizer from the GGUF file, no chat template. Every beam runs --max-tokens
tokens (EOS never chosen, as transformers' min_new_tokens).

Record format (pagesim-beam-ancestry/1): steps[t][i] is the rank (0 = highest cumulative
log-prob) among the beams alive before step t of the parent of the beam ranked i after step t;
the first output token's step (the prompt forks into the beams) is not listed.

    nice -n 10 .venv/bin/python -m pagesim.experiments.measure_beam_ancestry
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "pagesim" / "sim" / "data" / "beam_ancestry_smollm2.json"
FORMAT = "pagesim-beam-ancestry/1"


def alpaca_prompts(tokenizer, num: int, seed: int, data_dir: Path) -> list[list[int]]:
    from pagesim.workload.builders import alpaca_prompt, seeded_order

    records = json.loads((data_dir / "alpaca" / "alpaca_5000.json").read_text(encoding="utf-8"))
    order = seeded_order(len(records), seed)[:num]
    return [tokenizer.encode(alpaca_prompt(records[i]), add_special_tokens=False) for i in order]


def check_against_transformers(hf, prompt: list[int], width: int, max_tokens: int, outputs: list[list[int]],
                               parent_ranks: list[list[int]]) -> bool:
    """Whether transformers' beam search gives the same k beams, in order, and whether following
    the recorded ancestry back from each final beam gives transformers' beam_indices."""
    import torch

    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), num_beams=width, num_return_sequences=width, do_sample=False,
                          max_new_tokens=max_tokens, min_new_tokens=max_tokens, pad_token_id=0,
                          return_dict_in_generate=True, output_logits=True)
    if [s[len(prompt):].tolist() for s in out.sequences] != outputs:
        return False
    for final_rank, hf_parents in enumerate(out.beam_indices.tolist()):
        rank, chain = final_rank, []
        for step in reversed(parent_ranks):
            rank = step[rank]
            chain.append(rank)
        if [0] + chain[::-1] != hf_parents:
            return False
    return True


def summarize(runs: list[dict]) -> dict[int, dict[str, float]]:
    """Per beam width: mean distinct parents per step, share of steps whose beams all descend
    from one parent, share of new beams whose parent is the best beam, mean parent rank."""
    out = {}
    for k in sorted({r["beam_width"] for r in runs}):
        steps = [s for r in runs if r["beam_width"] == k for s in r["steps"]]
        parents = [p for s in steps for p in s]
        out[k] = {
            "steps": len(steps),
            "mean_distinct_parents": statistics.fmean(len(set(s)) for s in steps),
            "all_from_one_parent": statistics.fmean(len(set(s)) == 1 for s in steps),
            "parent_is_best": statistics.fmean(p == 0 for p in parents),
            "mean_parent_rank": statistics.fmean(parents),
            "keeps_own_rank": statistics.fmean(p == i for s in steps for i, p in enumerate(s)),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[2, 4, 6])
    parser.add_argument("--num-prompts", type=int, default=24, help="prompts per beam width")
    parser.add_argument("--max-tokens", type=int, default=96, help="output tokens per beam")
    parser.add_argument("--seed", type=int, default=0, help="prompt order (the trace builder's seeded order)")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--check", action="store_true",
                        help="also run transformers' generate(num_beams=k) on every prompt and count the runs whose "
                             "k beams and ancestry (beam_indices) equal the engine's (slow: use few prompts)")
    args = parser.parse_args(argv)
    command = shlex.join(["nice", "-n", "10", ".venv/bin/python", "-m", "pagesim.experiments.measure_beam_ancestry", *(sys.argv[1:] if argv is None else argv)])

    import torch
    from rich.progress import Progress

    from executor.engine import EngineConfig, LLMEngine
    from executor.models.loader import load_model
    from pagesim.core import SamplingParams
    from pagesim.workload.builders import default_data_dir

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    hf = None
    if args.check:
        from executor.models.loader import from_hf_model, gguf_tokenizer, hf_from_gguf, smollm2_path

        if args.model != "smollm2":
            raise SystemExit("--check is for --model smollm2")
        hf = hf_from_gguf(smollm2_path()).eval()
        lm = from_hf_model(hf)
        lm.tokenizer = gguf_tokenizer(smollm2_path())
    else:
        lm = load_model(args.model)
    if lm.tokenizer is None:
        raise SystemExit(f"{args.model}: no tokenizer to encode the prompts with")
    print(f"loaded {args.model} in {time.perf_counter() - t0:.1f} s", flush=True)
    prompts = alpaca_prompts(lm.tokenizer, args.num_prompts, args.seed, default_data_dir())

    runs, checked = [], []
    bs = args.block_size
    with Progress() as progress:
        for k in args.widths:
            task = progress.add_task(f"beam width {k}", total=args.max_tokens)
            longest = max(len(p) for p in prompts) + args.max_tokens
            # every beam of every prompt at its longest, plus one block each for copy-on-write
            blocks = sum(k * (-(-(len(p) + args.max_tokens) // bs) + 1) for p in prompts)
            engine = LLMEngine(lm, EngineConfig(block_size=bs, num_gpu_blocks=blocks, num_cpu_blocks=0,
                                                max_num_seqs=k * len(prompts), max_model_len=longest))
            params = SamplingParams(beam_width=k, max_tokens=args.max_tokens, ignore_eos=True)
            groups = [engine.add_request(p, params) for p in prompts]
            now = 0
            while engine.has_unfinished():
                engine.step(float(now))
                now += 1
                progress.update(task, completed=min(now, args.max_tokens))
            if engine.scheduler.num_preemptions:
                raise SystemExit(f"width {k}: {engine.scheduler.num_preemptions} preemptions; the pool was sized to avoid them")
            for prompt, group in zip(prompts, groups):
                beams = engine.finished_beams.pop(group.request_id)
                assert len(beams.parent_ranks) == args.max_tokens - 1
                runs.append({"beam_width": k, "prompt_len": len(prompt), "steps": beams.parent_ranks})
                if hf is not None:
                    same = check_against_transformers(hf, prompt, k, args.max_tokens, beams.outputs(group), beams.parent_ranks)
                    checked.append(same)
                    print(f"width {k} prompt_len {len(prompt)}: transformers {'equal' if same else 'DIFFERENT'}", flush=True)

    record = {
        "format": FORMAT,
        "model": "SmolLM2-135M",
        "source": (f"{args.num_prompts} Alpaca instructions (../shared/data/alpaca/alpaca_5000.json, "
                   f"instruction + \"\\n\" + input, trace-builder seeded order, seed {args.seed}), SmolLM2 "
                   "tokenizer, no chat template; executor beam search (pagesim executor, fp32 CPU, "
                   "SmolLM2-135M-Instruct Q4_1 GGUF dequantized), EOS never chosen"),
        "command": command,
        "max_tokens": args.max_tokens,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, separators=(",", ":")) + "\n")
    print(f"wrote {args.out} ({len(runs)} runs) in {time.perf_counter() - t0:.0f} s")
    if hf is not None:
        print(f"transformers check: {sum(checked)} of {len(checked)} runs equal (beams and ancestry)")
    for k, s in summarize(runs).items():
        print(f"width {k}: " + ", ".join(f"{name} {value:.3f}" if isinstance(value, float) else f"{name} {value}"
                                          for name, value in s.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
