"""The GPU check's engine sections (pagesim/experiments/gpu_check.py): the model build, 3. end-to-end
throughput against transformers, 4. the step-time profile, 5. calibration of the profiled cost model."""

from __future__ import annotations

import gc
import json
import math
import random
import time
import traceback

from pagesim.experiments.gpu_check_base import Ctx, OuterTimeout, ROOT, llama_config


# ------------------------------------------------------------------------------------- 3. end to end (the model both runs use)

def build_models(ctx: Ctx, sec: dict) -> None:
    """HF LlamaForCausalLM built directly on the device in the run's dtype (no fp32 copy), seeded by
    loader.random_init, and ours from it (loader.from_hf_model). Falls back to ours alone
    (loader.from_config) when HF cannot be built."""
    import torch

    from executor.models.loader import default_dtype, from_config, from_hf_model, random_init

    device = ctx.device
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = llama_config(ctx.S["model"])
    info = dict(model=ctx.S["model"], dtype=str(dtype).replace("torch.", ""))
    t = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        from transformers import LlamaForCausalLM

        with torch.device(device), default_dtype(dtype):
            hf = LlamaForCausalLM(config)
        hf.eval().requires_grad_(False)
        random_init(hf, config, seed=0)
        info["hf_build_s"] = round(time.perf_counter() - t, 2)
        info["hf_param_dtypes"] = sorted({str(p.dtype).replace("torch.", "") for p in hf.parameters()})
        t2 = time.perf_counter()
        lm = from_hf_model(hf, dtype=dtype, device=device)
        info["ours_from_hf_s"] = round(time.perf_counter() - t2, 2)
        ctx.hf = hf
    except OuterTimeout:
        raise
    except Exception:
        sec["notes"].append("building the HF model failed; ours is built alone (from_config), no HF comparison:\n"
                            + traceback.format_exc(limit=3))
        ctx.hf = None
        lm = from_config(config, seed=0, dtype=dtype, device=device)
    info["num_params"] = sum(p.numel() for p in lm.model.parameters())
    info["our_param_dtypes"] = sorted({str(p.dtype).replace("torch.", "") for p in lm.model.parameters()})
    info["build_s"] = round(time.perf_counter() - t, 2)
    if device.type == "cuda":
        info["peak_mem_after_build_GiB"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        info["weights_GiB_each"] = round(info["num_params"] * 2 / 2**30, 2)
    ctx.lm = lm
    sec["data"]["model"] = info
    sec["notes"].append(
        f"model {info['model']}: {info['num_params'] / 1e6:,.1f} M params, {info['dtype']}, random weights, built in "
        f"{info['build_s']} s" + (f"; peak GPU memory after building HF + ours {info['peak_mem_after_build_GiB']} GiB "
                                  f"(2 x {info['weights_GiB_each']} GiB of weights: no fp32 copy)"
                                  if device.type == "cuda" else ""))


def load_requests(ctx: Ctx) -> list[tuple[list[int], int]]:
    """(prompt ids, output length) for the first N ShareGPT records, lengths divided by the mode's
    scale; prompts are seeded random ids (the trace has lengths only)."""
    data = json.loads((ROOT / "traces" / "sharegpt.json").read_text())
    recs = data["requests"][: ctx.S["num_requests"]]
    scale = ctx.S["length_scale"]
    vocab = ctx.lm.vocab_size
    out = []
    for i, r in enumerate(recs):
        p = max(1, r["prompt_len"] // scale)
        o = max(1, r["output_len"] // scale)
        rng = random.Random(i)
        out.append(([rng.randrange(4, vocab) for _ in range(p)], o))
    return out


def run_engine(ctx: Ctx, sec: dict) -> dict:
    import torch

    from executor.cache_engine import CacheEngine, num_gpu_blocks
    from executor.engine import EngineConfig, LLMEngine
    from pagesim.core import SamplingParams

    lm, device, reqs = ctx.lm, ctx.device, ctx.requests
    bs = 16
    block_bytes = CacheEngine.bytes_per_block(lm.num_layers, lm.num_kv_heads, lm.head_dim, bs, lm.dtype)
    if device.type == "cuda":
        # The HF copy stays resident during the run; 8 GiB kept back for activations.
        n_blocks = num_gpu_blocks(block_bytes, device, fraction=0.9, reserve_bytes=8 << 30)
        how = "num_gpu_blocks(fraction=0.9, reserve 8 GiB) from free GPU memory"
    else:
        need = sum(math.ceil((len(p) + o) / bs) for p, o in reqs) + 64
        n_blocks = num_gpu_blocks(block_bytes, device, fraction=0.9, budget_bytes=int(need * block_bytes / 0.9) + 1)
        how = "num_gpu_blocks(budget_bytes = what the requests need) (CPU: no device memory to measure)"
    cfg = EngineConfig(block_size=bs, num_gpu_blocks=n_blocks, num_cpu_blocks=64, max_num_seqs=ctx.S["max_num_seqs"])
    engine = LLMEngine(lm, cfg)
    engine.generate([[5] * 20, [6] * 33], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))  # warmup
    budget = min(ctx.S["engine_cap_s"], max(5.0, ctx.deadline.remaining() - (0.35 * ctx.deadline.remaining())))
    groups = [engine.add_request(p, SamplingParams(max_tokens=o, temperature=0.0, ignore_eos=True)) for p, o in reqs]
    step_log = []
    t0 = time.perf_counter()
    now = 0.0
    cut = False
    while engine.has_unfinished():
        st = engine.step(now)
        now += 1.0
        step_log.append([st.out.num_prefill_tokens, st.out.num_decode_seqs, round(st.seconds, 6)])
        if time.perf_counter() - t0 > budget:
            cut = True
            break
    wall = time.perf_counter() - t0
    out_tokens = sum(s.num_output_tokens for g in groups for s in list(g.seqs) + list(g.finished_seqs))
    finished = sum(g.is_finished for g in groups)
    prompt_tokens = sum(len(p) for p, _ in reqs)
    res = dict(num_requests=len(reqs), finished=finished, complete=not cut, budget_s=round(budget, 1),
               num_gpu_blocks=n_blocks, kv_token_slots=n_blocks * bs, pool_sizing=how,
               max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=engine.scheduler.config.max_num_batched_tokens
               if hasattr(engine.scheduler, "config") else None,
               steps=len(step_log), preemptions=engine.scheduler.num_preemptions, wall_s=wall,
               output_tokens=out_tokens, prompt_tokens=prompt_tokens, output_tok_per_s=out_tokens / wall,
               mean_step_ms=1e3 * sum(s[2] for s in step_log) / max(1, len(step_log)))
    ctx.engine_outputs = {i: (g.finished_seqs[0].output_token_ids if g.finished_seqs else []) for i, g in enumerate(groups)}
    sec["data"]["engine_step_log"] = step_log  # [prefill tokens, decode seqs, seconds] per step
    del engine
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return res


def run_hf(ctx: Ctx, sec: dict) -> dict:
    import torch

    from executor.timing import synchronize

    hf, device, reqs = ctx.hf, ctx.device, ctx.requests
    bsz = ctx.S["hf_batch"]
    budget = min(ctx.S["hf_cap_s"], max(3.0, ctx.deadline.remaining() - 12))
    # warmup (cuBLAS, kernels)
    hf.generate(torch.tensor([[5] * 8], device=device), attention_mask=torch.ones(1, 8, dtype=torch.long, device=device),
                max_new_tokens=2, min_new_tokens=2, do_sample=False, pad_token_id=0)
    synchronize(device)
    batches = [list(range(i, min(len(reqs), i + bsz))) for i in range(0, len(reqs), bsz)]
    done, outputs = [], {}
    spent = 0.0
    for idx in batches:
        m = max(reqs[i][1] for i in idx)
        if done:
            per_step = spent / sum(b["generated_steps"] for b in done)
            if spent + per_step * m > budget:
                break
        L = max(len(reqs[i][0]) for i in idx)
        ids = torch.zeros(len(idx), L, dtype=torch.long)
        mask = torch.zeros(len(idx), L, dtype=torch.long)
        for j, i in enumerate(idx):  # left padding
            p = reqs[i][0]
            ids[j, L - len(p):] = torch.tensor(p)
            mask[j, L - len(p):] = 1
        ids, mask = ids.to(device), mask.to(device)
        synchronize(device)
        t = time.perf_counter()
        # max_time: HF's own stopping criterion, so even a first batch slower than expected ends
        # inside the budget; a cut batch counts only the tokens it produced.
        out = hf.generate(ids, attention_mask=mask, max_new_tokens=m, min_new_tokens=m, do_sample=False, pad_token_id=0,
                          max_time=max(1.0, budget - spent))
        synchronize(device)
        dt = time.perf_counter() - t
        spent += dt
        new = out[:, L:].cpu()
        steps = int(new.shape[1])
        for j, i in enumerate(idx):
            outputs[i] = new[j, :reqs[i][1]].tolist()
        done.append(dict(size=len(idx), max_new_tokens=m, generated_steps=steps, cut=steps < m,
                         useful_tokens=sum(min(reqs[i][1], steps) for i in idx), padded_tokens=len(idx) * steps,
                         seconds=dt))
        if steps < m:
            break
    useful = sum(b["useful_tokens"] for b in done)
    steps_done = sum(b["generated_steps"] for b in done)
    per_step = spent / steps_done
    all_steps = sum(max(reqs[i][1] for i in idx) for idx in batches)
    total_useful = sum(o for _, o in reqs)
    est_time = per_step * all_steps
    res = dict(batch_size=bsz, batches_run=len(done), batches_total=len(batches),
               last_batch_cut=bool(done and done[-1]["cut"]),
               requests_run=sum(b["size"] for b in done), budget_s=round(budget, 1), wall_s=spent,
               useful_tokens=useful, useful_tok_per_s=useful / spent,
               padded_tok_per_s=sum(b["padded_tokens"] for b in done) / spent, per_step_ms=per_step * 1e3,
               est_full_s=est_time, est_full_useful_tok_per_s=total_useful / est_time,
               useful_fraction_all_batches=total_useful / sum(len(idx) * max(reqs[i][1] for i in idx) for idx in batches),
               batches=done)
    # Greedy agreement with the engine (information only: bf16 and padding change the numerics).
    eng = getattr(ctx, "engine_outputs", {})
    pref, full = [], 0
    for i, toks in outputs.items():
        e = eng.get(i)
        if not e:
            continue
        n = 0
        while n < min(len(e), len(toks)) and e[n] == toks[n]:
            n += 1
        pref.append(n / max(1, len(toks)))
        full += n == len(toks) == len(e)
    if pref:
        res["greedy_agree_full"] = f"{full}/{len(pref)}"
        res["greedy_agree_mean_prefix_frac"] = sum(pref) / len(pref)
    return res


def section_end_to_end(ctx: Ctx, sec: dict) -> None:
    if ctx.lm is None:
        raise RuntimeError("no model: building it failed (see notes)")
    S = ctx.S
    ctx.requests = load_requests(ctx)
    reqs = ctx.requests
    sec["notes"].append(
        f"{len(reqs)} ShareGPT requests (traces/sharegpt.json, first {len(reqs)}; lengths"
        + (f" divided by {S['length_scale']}" if S["length_scale"] > 1 else " as in the trace")
        + f"; seeded random prompt ids), all submitted at once, greedy, ignore_eos, max_tokens = the trace's "
        f"output length. Prompt tokens {sum(len(p) for p, _ in reqs)}, output tokens {sum(o for _, o in reqs)}.")
    errors = []
    rows = []
    eng = hf = None
    try:
        eng = run_engine(ctx, sec)
        sec["data"]["engine"] = eng
        rows.append(dict(system="pagesim executor (LLMEngine, paged KV)", requests=f"{eng['finished']}/{eng['num_requests']}",
                         wall_s=eng["wall_s"], useful_tok_per_s=eng["output_tok_per_s"],
                         detail=f"{eng['steps']} steps, mean {eng['mean_step_ms']:.1f} ms/step, "
                                f"{eng['preemptions']} preemptions, {eng['kv_token_slots']} KV slots, "
                                f"max_num_seqs {eng['max_num_seqs']}" + ("" if eng["complete"] else
                                                                          f"; CUT at the {eng['budget_s']} s budget")))
        sec["notes"].append(f"engine KV pool: {eng['num_gpu_blocks']} blocks of 16 tokens, sized by {eng['pool_sizing']}.")
    except OuterTimeout:
        raise
    except Exception:
        errors.append("engine:\n" + traceback.format_exc())
    if ctx.hf is None:
        sec["notes"].append("transformers generate: not run (no HF model).")
    else:
        try:
            hf = run_hf(ctx, sec)
            sec["data"]["hf"] = hf
            rows.append(dict(system=f"transformers generate (static batches of {hf['batch_size']}, left padding)",
                             requests=f"{hf['requests_run']}/{len(reqs)}", wall_s=hf["wall_s"],
                             useful_tok_per_s=hf["useful_tok_per_s"],
                             detail=f"{hf['batches_run']}/{hf['batches_total']} batches (trace order"
                                    f"{'; the last one cut by max_time' if hf['last_batch_cut'] else ''}), "
                                    f"{hf['per_step_ms']:.1f} ms/step, padded tok/s {hf['padded_tok_per_s']:.1f}"))
            rows.append(dict(system="transformers generate, extrapolated to all batches", requests=f"{len(reqs)}",
                             wall_s=hf["est_full_s"], useful_tok_per_s=hf["est_full_useful_tok_per_s"],
                             detail=f"measured ms/step x sum of every batch's longest output; useful/padded tokens "
                                    f"over all batches {hf['useful_fraction_all_batches']:.2f}"))
            if hf["batches_run"] < hf["batches_total"] or hf["last_batch_cut"]:
                sec["notes"].append(
                    f"HF ran {hf['batches_run']} of {hf['batches_total']} batches (first ones in trace order) within "
                    f"{hf['budget_s']} s; its tokens/s counts only useful tokens (each request's own output length, "
                    "not the padding up to the batch's longest). The extrapolation assumes the measured time per "
                    "decode step holds for the other batches (longer batches would be slower per step: optimistic for HF).")
            if "greedy_agree_full" in hf:
                sec["notes"].append(f"greedy tokens engine vs HF (info only): {hf['greedy_agree_full']} requests identical, "
                                    f"mean matching prefix {hf['greedy_agree_mean_prefix_frac']:.2f} of the output.")
        except OuterTimeout:
            raise
        except Exception:
            errors.append("transformers:\n" + traceback.format_exc())
    if eng and hf:
        sec["data"]["speedup_vs_hf_measured"] = eng["output_tok_per_s"] / hf["useful_tok_per_s"]
        sec["data"]["speedup_vs_hf_extrapolated"] = eng["output_tok_per_s"] / hf["est_full_useful_tok_per_s"]
        sec["notes"].append(f"engine / HF useful tokens/s: {sec['data']['speedup_vs_hf_measured']:.2f}x measured "
                            f"subset, {sec['data']['speedup_vs_hf_extrapolated']:.2f}x extrapolated.")
    sec["tables"].append(dict(title=None, columns=["system", "requests", "wall_s", "useful_tok_per_s", "detail"], rows=rows))
    if errors:
        raise RuntimeError("\n".join(errors))


# ------------------------------------------------------------------------------------- 4. profile

def section_profile(ctx: Ctx, sec: dict) -> None:
    """Step times of the section 3 model at a few shapes, measured by executor.profiler (the same
    code that profiles for the simulator's `profiled` cost model), on the wall clock."""
    import torch

    from executor.profiler import ProfileGrid, profile_engine

    if ctx.lm is None:
        raise RuntimeError("no model: building it failed (see section 3)")
    device, P = ctx.device, ctx.S["profile"]
    grid = ProfileGrid(prefill=[(1, n) for n in P["prefill"]], decode=[(b, P["decode_ctx"]) for b in P["decode_batch"]],
                       mixed=[], swap_blocks=[], copy_blocks=[], reps=P["reps"], max_reps=P["reps"])
    data = profile_engine(ctx.lm, grid, clock="wall", model_spec=ctx.S["model"])
    raw = []
    for step in data["steps"]:
        shape, times = step["shape"], step["samples"]
        decode_seqs = shape["num_decode_seqs"]
        raw.append(dict(kind=step["kind"], num_seqs=shape["num_prefill_seqs"] or decode_seqs,
                        prefill_tokens=shape["num_prefill_tokens"], decode_seqs=decode_seqs,
                        context=shape["decode_context_tokens"] // decode_seqs if decode_seqs else shape["num_prefill_tokens"],
                        median_ms=step["seconds"] * 1e3, min_ms=min(times) * 1e3, reps=len(times), step_s=times))
    rows = [{k: v for k, v in r.items() if k != "step_s"} for r in raw]
    sec["notes"].append(f"LLMEngine.step() wall time (schedule + forward + sampling; synchronised on CUDA) on the "
                        f"section 3 model ({ctx.S['model']}), block 16, measured by executor.profiler (untimed warm-up "
                        f"steps first; {P['reps']} steps per shape, median): one sequence per prefill shape; decode "
                        f"batches after prompts of {P['decode_ctx'] - 1} tokens (context = the middle timed step's, "
                        "per sequence).")
    sec["tables"].append(dict(title=None, columns=["kind", "num_seqs", "prefill_tokens", "decode_seqs", "context",
                                                   "median_ms", "min_ms", "reps"], rows=rows))
    sec["data"]["shapes"] = raw
    sec["data"]["profile_wall_s"] = data["profile_wall_s"]
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------- 5. calibration

def section_calibration(ctx: Ctx, sec: dict) -> None:
    """The fidelity protocol of pagesim/experiments/fidelity_cpu.py on this device, with a smaller K: profile
    the section 3 model (executor.profiler), the five runs (paged + recompute, paged + swap, Orca
    (Oracle), chunked prefill, n=4) near the simulated capacity, K interleaved rounds (re-profiled),
    the simulator on the pooled profile; step-level error and the executor's 95 % bands. K shrinks
    (to 2 at least) to fit the time left, from the simulated run times."""
    from dataclasses import replace

    from executor.profiler import ProfileGrid
    from pagesim.experiments.fidelity_cpu import Protocol, estimate_s, run_specs
    from pagesim.compare import CompareSettings, compare_repeated, profile_round, scaled_trace, write_repeated_results
    from pagesim.sim.cost.profiled import ProfiledCostModel
    from pagesim.workload.trace import load_trace

    if ctx.lm is None:
        raise RuntimeError("no model: building it failed (see section 3)")
    C = ctx.S["calibration"]
    grid = {"gpu": ProfileGrid.gpu, "tiny": ProfileGrid.tiny, "default": ProfileGrid}[C["grid"]]()
    out = ctx.report.md_path
    data_dir = out.with_name(out.stem + "_fidelity")
    started = time.perf_counter()
    first = profile_round(ctx.lm, data_dir / "profiles" / "round1.json", C["clock"], 16, grid,
                          command=ctx.report.meta["command"])
    profile_s = time.perf_counter() - started
    fit = ProfiledCostModel.from_profile(first).describe()
    sec["data"]["profile"] = str(first)
    sec["data"]["fit"] = {k: fit[k] for k in ("coefficients", "train_error", "held_out_error", "swap_error", "copy_error")}
    held = fit["held_out_error"]
    sec["notes"].append(f"profile: {C['clock']} clock, {profile_s:.0f} s, written to {data_dir.name}/profiles/; fit "
                        f"error on held-out shapes: mean {held['mean_abs'] * 100:.1f} %, max {held['max_abs'] * 100:.1f} %.")
    trace = scaled_trace(load_trace(ROOT / "traces" / "sharegpt.json"), C["length_scale"])
    proto = Protocol(ctx.S["model"], "traces/sharegpt.json", C["length_scale"], C["num_requests"], C["repeat"], True,
                     C["grid"], CompareSettings(num_requests=C["num_requests"], num_gpu_blocks=C["num_gpu_blocks"],
                                                num_cpu_blocks=C["num_cpu_blocks"], max_num_seqs=C["max_num_seqs"],
                                                max_num_batched_tokens=C["max_num_batched_tokens"],
                                                max_model_len=C["max_model_len"], clock=C["clock"],
                                                sim_model=C["sim_model"]))
    specs, caps = run_specs(trace, proto, str(first))
    repeat = C["repeat"]
    while repeat > 2 and estimate_s(trace, specs, replace(proto, repeat=repeat), str(first), profile_s) > \
            ctx.deadline.remaining():
        repeat -= 1
    estimate = estimate_s(trace, specs, replace(proto, repeat=repeat), str(first), profile_s)
    sec["data"].update(repeat=repeat, estimate_s=round(estimate, 1), capacities=caps)
    sec["notes"].append(f"{C['num_requests']} ShareGPT requests (lengths / {C['length_scale']}; the n=4 run "
                        f"{specs[-1].settings.num_requests}), Poisson at 0.9 x the simulated capacity: "
                        + ", ".join(f"{sp.label} {sp.settings.rate} req/s" for sp in specs)
                        + f"; pool {C['num_gpu_blocks']} blocks, host {C['num_cpu_blocks']}; K = {repeat} rounds "
                        f"(asked {C['repeat']}), estimated {estimate:.0f} s.")
    if estimate > ctx.deadline.remaining():
        sec["notes"].append(f"skipped: K = 2 needs about {estimate:.0f} s, {ctx.deadline.remaining():.0f} s left")
        return
    results, used = compare_repeated(ctx.lm, trace, specs, None, repeat, data_dir, reprofile=True, profile_grid=grid,
                                     round1_profile=str(first), log=lambda msg: print(f"[gpu_check] {msg}", flush=True))
    write_repeated_results(results, data_dir, {"command": ctx.report.meta["command"], "capacities": caps,
                                               "simulator_profile": used, "repeat": repeat})
    sec["notes"].append(f"data: {data_dir.name}/ (compare.json, compare.md, every run's step_shapes.csv); the simulator "
                        "used the rounds' pooled profile.")
    step_rows, band_rows = [], []
    for r in results:
        for kind, e in r.step_fidelity.items():
            step_rows.append(dict(system=r.label, step_kind=kind, steps=e["count"],
                                  median_abs=e["median_abs"], p90_abs=e["p90_abs"], bias=e["bias"]))
        for b in r.bands:
            band_rows.append(dict(system=r.label, metric=b["label"], executor_mean=b["mean"], low=b["low"],
                                  high=b["high"], simulator=b["simulator"],
                                  target="-" if b["target_met"] is None else ("met" if b["target_met"] else "missed")))
        sec["data"][r.label] = {"bands": r.bands, "step_fidelity": r.step_fidelity,
                                "speed_vs_profile": [run["speed_vs_profile"] for run in r.runs]}
    sec["tables"].append(dict(title="step-level error (all runs pooled)", columns=list(step_rows[0]), rows=step_rows))
    sec["tables"].append(dict(title="executor mean and 95 % band vs simulator", columns=list(band_rows[0]),
                              rows=band_rows))
