"""Weight bytes from a config.json's `quantization_config`.

- ``fp8`` (vLLM's Fp8Config; DeepSeek-V3 and the "-FP8" checkpoints): one byte per weight, plus
  one fp32 scale per ``weight_block_size`` block where the checkpoint is block-quantized
  (DeepSeek-V3: 128 x 128). Activations are quantized on the fly (W8A8), so the GEMMs can use FP8
  tensor cores where the GPU has them; elsewhere vLLM runs them weight-only (Marlin).
- ``awq`` (AutoAWQ GEMM format) and ``gptq``: ``bits``-bit weights (4 or 8) packed in int32, per
  group of ``group_size`` input rows one fp16 scale and one packed ``bits``-bit zero point per
  output column (GPTQ stores its qzeros even when symmetric; AWQ only with ``zero_point``).
  Weight-only: the GEMMs compute in fp16. GPTQ's g_idx (one int32 per input row, under 0.1 % of a
  4096-wide layer) is left out.
- ``compressed-tensors`` (llm-compressor's format: the RedHatAI / neuralmagic "-FP8-dynamic",
  "-quantized.w4a16" and "-quantized.w8a8" checkpoints): the Linear layers' scheme in
  ``config_groups``. 8-bit float weights as ``fp8``; ``int`` weights of ``num_bits`` with, per
  ``group_size`` weights, a 16-bit scale (and a packed zero point unless ``symmetric``). With 8-bit
  input activations the GEMMs run W8A8 (int8 ones priced at the FP8 rate, where a GPU has one).
- ``mxfp4`` (OCP microscaling FP4; gpt-oss): the routed experts' weights as 4-bit E2M1 values with
  one shared 8-bit (E8M0) scale per block of 32, i.e. 4.25 bits = 0.53125 bytes a weight. Only the
  experts: vLLM's Mxfp4Config quantizes FusedMoE layers and leaves every other linear layer
  unquantized, which is what the released ``modules_to_not_convert`` (self_attn, router,
  embed_tokens, lm_head) say too. Weight-only on Hopper (the GEMMs compute in bf16).
- ``fbgemm_fp8`` (Meta's FP8 releases: Llama-3.1-405B-Instruct-FP8, Llama-4-Maverick-FP8): FP8
  weights with one fp32 scale per output row (under 0.03 % of a weight at 4,096 inputs: left out)
  and FP8 activations quantized per token as they come (W8A8). What stays in the serving dtype is
  what ``modules_to_not_convert`` lists (vLLM's FBGEMMFp8Config skips those layers): the
  attention of every layer, the shared experts of every MoE layer, the MLPs of some layers (the
  Llama 3.1 paper, section 6.2: not the self-attention, not the first and last layers).
Only the decoder's linear layers are quantized (ModelSpec.quantized_params says which).
"""

from __future__ import annotations

import re

from pagesim.models.config import ConfigFields, ModelConfigError
from pagesim.models.spec import WeightQuant

QUANT_METHODS = ("fp8", "awq", "gptq", "compressed-tensors", "mxfp4", "fbgemm_fp8")
MXFP4_BLOCK = 32     # FP4 values per shared E8M0 scale byte
SCALE_BYTES = 2      # fp16 group scales (AWQ, GPTQ)
FP8_SCALE_BYTES = 4  # fp32 block scales (weight_scale_inv)


def weight_quant(fields: ConfigFields) -> WeightQuant | None:
    q = fields.get("quantization_config")
    if q is None:
        return None
    if not isinstance(q, dict):
        raise fields.error("quantization_config", f"must be an object, got {q!r}")
    qf = ConfigFields(q, f"{fields.where}: quantization_config")
    method = str(q.get("quant_method", "")).lower()
    if method == "fp8":
        block = q.get("weight_block_size")
        if block is None:
            return WeightQuant("fp8", 8, None, 1.0, fp8_compute=True)
        if (not isinstance(block, list) or len(block) != 2
                or any(isinstance(b, bool) or not isinstance(b, int) or b <= 0 for b in block)):
            raise qf.error("weight_block_size", f"must be two positive integers, got {block!r}")
        return WeightQuant("fp8", 8, block[0] * block[1], 1.0 + FP8_SCALE_BYTES / (block[0] * block[1]),
                           fp8_compute=True)
    if method in ("awq", "gptq"):
        bits = qf.int("bits", qf.int("w_bit", 4))
        if bits not in (4, 8):
            raise qf.error("bits", f"must be 4 or 8, got {bits}")
        size = q.get("group_size", q.get("q_group_size", 128))
        if size == -1:  # GPTQ's per-channel scales
            group = None
        elif isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise qf.error("group_size", f"must be a positive integer or -1, got {size!r}")
        else:
            group = size
        zeros = method == "gptq" or qf.bool("zero_point", True)
        per_group = SCALE_BYTES + (bits / 8 if zeros else 0.0)
        return WeightQuant(method, bits, group, bits / 8 + (per_group / group if group else 0.0))
    if method == "compressed-tensors":
        return compressed_tensors(q, qf)
    if method == "mxfp4":
        return WeightQuant("mxfp4", 4, MXFP4_BLOCK, 0.5 + 1 / MXFP4_BLOCK, experts_only=True)
    if method == "fbgemm_fp8":
        mixers, shared, mlps = kept_modules(q.get("modules_to_not_convert") or [], qf)
        return WeightQuant("fbgemm_fp8", 8, None, 1.0, fp8_compute=True, kept_mixer_layers=mixers,
                           kept_shared_layers=shared, kept_mlp_layers=mlps)
    raise qf.error("quant_method", f"is {q.get('quant_method')!r}, an unknown quantization method; "
                   f"supported: {', '.join(QUANT_METHODS)}")


# a module name inside a decoder layer: "[...]layers.<i>.<part>"
LAYER_MODULE = re.compile(r"(?:^|\.)layers\.(\d+)\.(.+)$")
MIXER_PARTS = ("self_attn", "attn", "attention", "mixer", "linear_attn")


def kept_modules(names, qf: ConfigFields) -> tuple[int, int, int]:
    """The decoder layers whose token mixer, shared experts and dense MLP a `modules_to_not_convert`
    list keeps unquantized (a count of each; the model builder checks that mixers and shared
    experts are kept in all layers or none). Modules outside the decoder layers (lm_head,
    embeddings, a vision tower), routers and norms are unquantized anyway; routed experts kept
    unquantized are refused (not modelled)."""
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise qf.error("modules_to_not_convert", f"must be a list of module names, got {names!r}")
    mixers, shared, mlps = set(), set(), set()
    for name in names:
        found = LAYER_MODULE.search(name)
        if found is None or any(tower in name for tower in ("vision", "visual", "multi_modal")):
            continue  # (not a decoder layer: an image encoder's layers are never quantized here)
        layer, part = int(found.group(1)), found.group(2)
        head, tail = part.split(".")[0], part.split(".")[-1]
        if "shared_expert" in part:
            shared.add(layer)
        elif "router" in part or tail == "gate" or head.endswith("norm"):
            continue
        elif head in MIXER_PARTS:
            mixers.add(layer)
        elif ".experts" in f".{part}":
            raise qf.error("modules_to_not_convert", f"keeps routed experts unquantized ({name}): not modelled")
        elif head in ("mlp", "feed_forward", "block_sparse_moe"):
            mlps.add(layer)
    return len(mixers), len(shared), len(mlps)


def compressed_tensors(q: dict, qf: ConfigFields) -> WeightQuant:
    """The weights of the one scheme every config group uses (see the module docstring)."""
    groups = q.get("config_groups")
    if not isinstance(groups, dict) or not groups or not all(isinstance(g, dict) for g in groups.values()):
        raise qf.error("config_groups", f"must be an object of quantization schemes, got {groups!r}")
    schemes = {key: g.get("weights") for key, g in groups.items()}
    if len({repr(w) for w in schemes.values()}) > 1:  # e.g. attention in 8 bits, the MLP in 4
        raise qf.error("config_groups", "gives different layers different weight schemes: mixed precision is not "
                       "modelled")
    key, weights = next(iter(schemes.items()))
    if not isinstance(weights, dict):
        raise qf.error(f"config_groups: {key}: weights", f"must be an object, got {weights!r}")
    wf = ConfigFields(weights, f"{qf.where}: config_groups: {key}: weights")
    bits, kind, strategy = wf.int("num_bits"), weights.get("type", "int"), weights.get("strategy")
    acts = groups[key].get("input_activations")
    w8a8 = isinstance(acts, dict) and acts.get("num_bits") == 8
    if kind == "float" and bits == 8:
        block = weights.get("block_structure") if strategy == "block" else None
        if block is None:
            return WeightQuant("compressed-tensors", 8, None, 1.0, fp8_compute=w8a8)
        if (not isinstance(block, list) or len(block) != 2
                or any(isinstance(b, bool) or not isinstance(b, int) or b <= 0 for b in block)):
            raise wf.error("block_structure", f"must be two positive integers, got {block!r}")
        return WeightQuant("compressed-tensors", 8, block[0] * block[1],
                           1.0 + FP8_SCALE_BYTES / (block[0] * block[1]), fp8_compute=w8a8)
    if kind != "int" or bits not in (4, 8):
        raise wf.error("num_bits", f"is {bits} ({kind}): only 8-bit float and 4- or 8-bit int weights are modelled")
    group = wf.int("group_size") if strategy == "group" else None
    zeros = not wf.bool("symmetric", True)
    per_group = SCALE_BYTES + (bits / 8 if zeros else 0.0)
    return WeightQuant("compressed-tensors", bits, group, bits / 8 + (per_group / group if group else 0.0),
                       fp8_compute=w8a8)


__all__ = ["QUANT_METHODS", "weight_quant", "ModelConfigError"]
