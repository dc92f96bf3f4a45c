"""`pagesim model`: what the simulator knows about a model.

    pagesim model list                                   the catalog
    pagesim model inspect MODEL [--tp N] [--gpu GPU] [--kv-cache-dtype auto|fp8] [--json]
"""

from __future__ import annotations

import json
import sys
from typing import Optional

import typer

from pagesim.cli import app
from pagesim.cli.checks import TP, fail

model_app = typer.Typer(no_args_is_help=True, add_completion=False,
                        help="Model descriptions: parameters, weight and KV bytes, the KV pool on a GPU.")
app.add_typer(model_app, name="model")

POOL_COUNTING = ("tokens held in every layer: a token in a sliding-window layer takes that layer's bytes while it is "
                 "in the window, so sequences longer than the window fit more tokens than this")


@model_app.command("list")
def list_models(as_json: bool = typer.Option(False, "--json", help="print the catalog as JSON")) -> None:
    """The catalog's models, with their parameters and KV bytes per token."""
    from pagesim.models import MODELS

    rows = [{"model": name, "params_total": m.params_total, "params_active": m.params_active,
             "kv_bytes_per_token": m.kv_bytes_per_token, "attention": "+".join(g.kind for g in m.kv_groups)}
            for name, m in MODELS.items()]
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("model", "params (B)", "active (B)", "KV B/token", "attention", title="model catalog")
    for r in rows:
        table.add_row(r["model"], f"{r['params_total'] / 1e9:.2f}", f"{r['params_active'] / 1e9:.2f}",
                      f"{r['kv_bytes_per_token']:,}", r["attention"])
    Console().print(table)


@model_app.command()
def inspect(
    model: str = typer.Argument(..., help="catalog name (pagesim model list) or a Hugging Face config.json"),
    tp: int = typer.Option(1, parser=TP, help="tensor-parallel degree"),
    ep: int = typer.Option(1, parser=TP, help="expert parallelism: a MoE's routed experts split over this "
                           "many GPUs"),
    gpu: Optional[str] = typer.Option(None, help="GPU from the catalog: also size the KV pool in tokens"),
    kv_cache_dtype: str = typer.Option("auto", help="KV cache element type: auto (the model's dtype) or fp8"),
    as_json: bool = typer.Option(False, "--json", help="print the result as one JSON object"),
) -> None:
    """Parameters (total, active per token), weight bytes, KV bytes per token per attention kind
    and in all; with --gpu, the KV pool in tokens as the simulator sizes it."""
    from pagesim.core.errors import CannotServe
    from pagesim.models.describe import describe_model
    from pagesim.sim.cost.layer_ops import check_parallelism
    from pagesim.sim.specs import get_gpu, get_model, kv_cache_capacity, with_kv_cache_dtype

    try:
        spec = with_kv_cache_dtype(get_model(model), kv_cache_dtype)
        if ep > 1:
            check_parallelism(spec, tp, ep)
        info = describe_model(spec, tp, ep)
        if gpu is not None:
            cap = kv_cache_capacity(spec, get_gpu(gpu), tp, ep=ep)
            info["gpu"] = cap.gpu
            info["kv_pool"] = {"pool_bytes_per_gpu": cap.pool_bytes_per_gpu, "weight_bytes_per_gpu": cap.weight_bytes_per_gpu,
                               "token_slots": cap.token_slots, "num_blocks_16": cap.num_blocks(16),
                               "counting": POOL_COUNTING if spec.num_sliding_layers else "tokens held in every layer",
                               **max_concurrency(spec, cap, tp)}
    except KeyError as e:
        fail(e.args[0])
    except (ValueError, CannotServe) as e:
        fail(str(e))
    if as_json:
        sys.stdout.write(json.dumps(info, indent=2, allow_nan=False) + "\n")
        return
    _print(info)


def max_concurrency(spec, cap, tp: int) -> dict:
    """vLLM's "maximum concurrency for max_model_len tokens per request": the pool in the blocks
    the model is served in (at --block-size 16, raised for a state layout as vLLM raises it), and
    how many sequences of max_model_len tokens it holds at once, every table counted (a sliding
    window's blocks past the window freed; a state table's one block a sequence)."""
    from pagesim.core.kv_groups import KVLayout
    from pagesim.sim.pool import longest_request, pool_blocks, state_block_size
    from pagesim.sim.specs import DEFAULT_MAX_NUM_BATCHED_TOKENS

    block_size = state_block_size(16, spec, tp)
    blocks = pool_blocks(cap, spec, tp, block_size)
    return {"block_size": block_size, "num_blocks": blocks,
            "max_concurrency": KVLayout.of(spec.kv_groups).sequences_that_fit(blocks, spec.max_model_len, block_size),
            # the longest request one GPU's pool holds (vLLM refuses to start below max_model_len)
            "max_model_len_that_fits": longest_request(spec, tp, spec.max_model_len, block_size,
                                                       DEFAULT_MAX_NUM_BATCHED_TOKENS, cap.pool_bytes_per_gpu)}


def _print(info: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    title = f"{info['model']} · tp {info['tp']}" + (f" · ep {info['ep']}" if info["ep"] > 1 else "")
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    q = info["weight_quantization"]
    rows = [("parameters, total", f"{info['params_total'] / 1e9:,.3f} B"),
            ("parameters, active per token", f"{info['params_active'] / 1e9:,.3f} B"),
            *([("parameters, vision tower + projector", f"{info['params_vision'] / 1e9:,.3f} B")]
              if info["params_vision"] else []),
            ("weight bytes", f"{info['weight_bytes'] / 1e9:,.2f} GB" + (f" ({q['method']}, {q['bits']}-bit{' experts' if q.get('experts_only') else ''})" if q else "")),
            ("weight bytes per GPU", f"{info['weight_bytes_per_gpu'] / 1e9:,.2f} GB")]
    if info["moe"]:
        m = info["moe"]
        rows.append(("experts", f"{m['experts_per_token']} of {m['num_experts']} on {m['num_moe_layers']} layers"
                     + (f", {m['num_shared_experts']} shared" if m["num_shared_experts"] else "")))
    if info["mla"] and info["mla"]["indexer"]:  # DeepSeek-V3.2's sparse attention
        ix = info["mla"]["indexer"]
        rows.append(("sparse attention", f"top {ix['topk']:,} keys, indexer {ix['num_heads']} x {ix['head_dim']}"))
    for g in info["kv_groups"]:
        if g["kind"] == "state":
            rows.append((f"state bytes/sequence, {g['num_layers']} linear-attention layers",
                         f"{info['state_bytes_per_sequence']:,} ({info['state_bytes_per_sequence_per_gpu']:,} per GPU)"))
            continue
        kind = f"{g['kind']} (window {g['sliding_window']:,})" if g["sliding_window"] else g["kind"]
        rows.append((f"KV bytes/token, {kind} x {g['num_layers']} layers", f"{g['kv_bytes_per_token']:,}"))
    rows.append(("KV bytes/token, all layers", f"{info['kv_bytes_per_token']:,}"))
    if info["kv_bytes_per_token_past_windows"] != info["kv_bytes_per_token"]:
        rows.append(("KV bytes/token past the windows", f"{info['kv_bytes_per_token_past_windows']:,}"))
    rows.append(("KV bytes/token per GPU", f"{info['kv_bytes_per_token_per_gpu']:,}"))
    if "kv_pool" in info:
        pool = info["kv_pool"]
        rows.append((f"KV pool on {info['tp']} x {info['gpu']}", f"{pool['token_slots']:,} tokens "
                     f"({pool['pool_bytes_per_gpu'] / 2**30:,.1f} GiB per GPU)"))
        rows.append((f"requests of {info['max_model_len']:,} tokens at once", f"{pool['max_concurrency']:,} "
                     f"({pool['num_blocks']:,} blocks of {pool['block_size']:,})"))
        if pool["max_model_len_that_fits"] < info["max_model_len"]:
            rows.append(("longest request the pool holds", f"{pool['max_model_len_that_fits']:,} tokens "
                         "(vLLM refuses to start at a longer --max-model-len)"))
    for row in rows:
        table.add_row(*row)
    console = Console()
    console.print(table)
    if "kv_pool" in info and info["kv_groups"] and any(g["sliding_window"] for g in info["kv_groups"]):
        console.print(f"note: the pool counts {info['kv_pool']['counting']}")
