"""A model's size facts as one dict: what `pagesim model inspect` prints (and --json writes)."""

from __future__ import annotations

from dataclasses import asdict

from pagesim.models.spec import ModelSpec


def describe_model(model: ModelSpec, tp: int = 1, ep: int = 1) -> dict:
    """Parameters (total, active per token), weight bytes and KV bytes per token, per attention
    kind and in all; per GPU of a `tp` group (and `ep` expert-parallel GPUs) where that differs."""
    groups = [{"kind": g.kind, "num_layers": g.num_layers, "sliding_window": g.sliding_window,
               "kv_bytes_per_token_per_layer": model.kv_bytes_per_token_per_layer_of(g.kind),
               "kv_bytes_per_token": g.num_layers * model.kv_bytes_per_token_per_layer_of(g.kind)}
              for g in model.kv_groups]
    info = {
        "model": model.name,
        "num_layers": model.num_layers,
        "hidden_size": model.hidden_size,
        "params_total": model.params_total,
        "params_active": model.params_active,
        "params_vision": model.num_vision_params,  # vision tower + projector, within params_total (0: text only)
        "params_embedding": model.vocab_size * model.hidden_size,
        "weight_bytes": model.weight_bytes,
        "weight_quantization": asdict(model.quant) if model.quant else None,
        "moe": asdict(model.moe) if model.moe else None,
        "mla": asdict(model.mla) if model.mla else None,
        "kv_element_bytes": model.kv_element_bytes,
        "kv_groups": groups,
        "kv_bytes_per_token": model.kv_bytes_per_token,
        # once a sequence is past every window, a further token costs only the layers that keep all
        "kv_bytes_per_token_past_windows": model.kv_bytes_per_token_full_layers,
        "tp": tp,
        "ep": ep,
        "weight_bytes_per_gpu": model.weight_bytes_per_gpu(tp, ep),
        "kv_bytes_per_token_per_gpu": model.kv_bytes_per_token_per_gpu(tp),
        "max_model_len": model.max_model_len,
    }
    if model.linear_attn is not None:  # (only then: the other models' JSON stays as it was)
        info["state_bytes_per_sequence"] = model.state_bytes_per_sequence()
        info["state_bytes_per_sequence_per_gpu"] = model.state_bytes_per_sequence(tp)
    if model.num_mlp_only_layers:  # one block a layer (Nemotron-H): the layers that are an MLP alone
        info["num_mlp_only_layers"] = model.num_mlp_only_layers
    if model.num_parallel_mixer_layers:  # attention and a Mamba mixer side by side (Falcon-H1)
        info["num_parallel_mixer_layers"] = model.num_parallel_mixer_layers
    return info
