"""One module per model family; FAMILIES maps a config.json's `model_type` to its builder,
`build(fields, name, quant) -> ModelSpec`."""

from __future__ import annotations

from pagesim.models.families import (deepseek, gemma, llama, mistral, mixtral, opt, phi3, qwen2, qwen2_moe, qwen3,
                                     qwen3_moe)
from pagesim.models.families import glm4_moe, gpt_oss, granitemoehybrid, llama4, olmo2, olmoe, phimoe, qwen3_next
from pagesim.models.families import falcon_h1, jamba, nemotron_h, smollm3
from pagesim.models.families import cohere2, ernie4_5_moe, exaone4, minimax, minimax_m2, seed_oss
from pagesim.models.families import qwen_vl
from pagesim.models.families import hunyuan
from pagesim.models.families import cohere, dbrx, ernie4_5, glm4, olmo3, starcoder2

FAMILIES = {
    "opt": opt.build,
    "llama": llama.build,
    "llama4": llama4.build,
    "llama4_text": llama4.build,
    "mistral": mistral.build,
    "mixtral": mixtral.build,
    "qwen2": qwen2.build,
    "qwen2_moe": qwen2_moe.build,
    "qwen3": qwen3.build,
    "qwen3_moe": qwen3_moe.build,
    "qwen3_next": qwen3_next.build,
    "deepseek_v2": deepseek.build,
    "deepseek_v3": deepseek.build,
    "deepseek_v32": deepseek.build,
    "gemma2": gemma.build_gemma2,
    "gemma3": gemma.build_gemma3,
    "gemma3_text": gemma.build_gemma3,
    "gpt_oss": gpt_oss.build,
    "phi3": phi3.build,
    "glm4_moe": glm4_moe.build,
    "phimoe": phimoe.build,
    "olmoe": olmoe.build_olmoe,
    "granitemoe": olmoe.build_granitemoe,
    "olmo2": olmo2.build,
    "gemma": gemma.build_gemma,
    "granite": llama.build,
    "granitemoehybrid": granitemoehybrid.build,
    "nemotron_h": nemotron_h.build,
    "falcon_h1": falcon_h1.build,
    "jamba": jamba.build,
    "smollm3": smollm3.build,
    "mistral3": mistral.build_mistral3,
    "minimax": minimax.build,
    "minimax_m1": minimax.build,
    "minimax_m2": minimax_m2.build,
    "ernie4_5_moe": ernie4_5_moe.build,
    "exaone4": exaone4.build,
    "cohere2": cohere2.build,
    "seed_oss": seed_oss.build,
    "qwen2_5_vl": qwen_vl.build_qwen2_5_vl,
    "qwen3_vl": qwen_vl.build_qwen3_vl,
    "qwen3_vl_moe": qwen_vl.build_qwen3_vl_moe,
    "hunyuan_v1_dense": hunyuan.build_dense,
    "hunyuan_v1_moe": hunyuan.build_moe,
    "glm4": glm4.build,
    "cohere": cohere.build,
    "starcoder2": starcoder2.build,
    "dbrx": dbrx.build,
    "olmo3": olmo3.build,
    "ernie4_5": ernie4_5.build,
}
