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
- ``modelopt`` (NVIDIA Model Optimizer: nvidia/*-FP8, *-FP4 / *-NVFP4 releases), read as vLLM's
  ModelOptFp8Config / ModelOptNvFp4Config read it: ``quant_algo`` with ``ignore`` (config.json,
  ModelOpt 0.31 on), or nested under ``quantization`` with ``exclude_modules`` (the older
  ``hf_quant_config.json`` beside config.json, which pagesim.models.config reads when config.json
  has no quantization_config). ``FP8``: as ``fp8`` (E4M3 weights, one fp32 scale per tensor and a
  static input scale: W8A8). ``NVFP4``: E2M1 weights packed two a byte and one E4M3 scale per
  ``group_size`` 16 of them, 0.5 + 1/16 = 0.5625 bytes a weight (the two fp32 global scales per
  tensor are left out: 8 bytes against 8 MiB at 4,096 x 4,096); activations quantized to NVFP4
  too (W4A4), so on GPUs with FP4 tensor cores (vLLM's CUTLASS / FlashInfer FP4 GEMMs need SM100
  or SM120: Blackwell) the GEMMs run at the FP4 rate; elsewhere vLLM falls back to Marlin FP4,
  weight-only with 16-bit activations. ``W4A16_NVFP4``: the same weights, always weight-only. The
  modules the list names stay in the serving dtype (kept_modules; fnmatch patterns and vLLM's
  substring rule). ``kv_cache_quant_algo: FP8`` (or a ``kv_cache_scheme`` of 8-bit floats) makes
  vLLM resolve ``--kv-cache-dtype auto`` to fp8_e4m3 (vllm/utils/torch_utils.py,
  resolve_kv_cache_dtype_string): kv_cache_bytes.
Only the decoder's linear layers are quantized (ModelSpec.quantized_params says which).
"""

from __future__ import annotations

import re
from fnmatch import fnmatch

from pagesim.models.config import ConfigFields, ModelConfigError
from pagesim.models.spec import WeightQuant

QUANT_METHODS = ("fp8", "awq", "gptq", "compressed-tensors", "mxfp4", "fbgemm_fp8", "modelopt")
MXFP4_BLOCK = 32     # FP4 values per shared E8M0 scale byte
SCALE_BYTES = 2      # fp16 group scales (AWQ, GPTQ)
FP8_SCALE_BYTES = 4  # fp32 block scales (weight_scale_inv)
NVFP4_GROUP = 16     # E2M1 values per E4M3 scale byte (the NVFP4 format; vLLM's default group_size)
# quant_algo -> (bits, W4A4 on FP4 tensor cores); FP8 is W8A8 as fp8
MODELOPT_ALGOS = {"FP8": (8, False), "NVFP4": (4, True), "W4A16_NVFP4": (4, False)}


def weight_quant(fields: ConfigFields) -> WeightQuant | None:
    q = fields.get("quantization_config")
    if q is None:
        return None
    if not isinstance(q, dict):
        raise fields.error("quantization_config", f"must be an object, got {q!r}")
    qf = ConfigFields(q, f"{fields.where}: quantization_config")
    method = modelopt_method(q) or str(q.get("quant_method", "")).lower()
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
    if method == "modelopt":
        return modelopt(q, qf, fields.int("num_hidden_layers", 0))
    raise qf.error("quant_method", f"is {q.get('quant_method')!r}, an unknown quantization method; "
                   f"supported: {', '.join(QUANT_METHODS)}")


# a module name inside a decoder layer: "[...]layers.<i>.<part>"
LAYER_MODULE = re.compile(r"(?:^|\.)layers\.(\d+)\.(.+)$")
MIXER_PARTS = ("self_attn", "attn", "attention", "mixer", "linear_attn")


# Module names a wildcard (or a name matched as a substring, vLLM's rule for names outside the
# layers) is tried against, one of each kind of linear layer kept_modules tells apart, under the
# prefixes the released checkpoints use
PROBE_PREFIXES = ("model.", "backbone.", "model.language_model.", "language_model.model.")
PROBE_PARTS = ("self_attn.q_proj", "self_attn.o_proj", "mixer.in_proj", "mixer.out_proj", "linear_attn.in_proj_qkvz",
               "mlp.gate_proj", "mlp.down_proj", "mlp.gate", "mlp.shared_expert.gate_proj",
               "mlp.shared_experts.gate_proj", "mlp.experts.0.gate_proj")


def kept_modules(names, qf: ConfigFields, field: str = "modules_to_not_convert",
                 num_layers: int = 0) -> tuple[int, int, int]:
    """The decoder layers whose token mixer, shared experts and dense MLP a list of unquantized
    modules keeps in the serving dtype (a count of each; the model builder checks that mixers and
    shared experts are kept in all layers or none). Modules outside the decoder layers (lm_head,
    embeddings, a vision tower, MTP layers), routers and norms are unquantized anyway; routed
    experts kept unquantized are refused (not modelled). With `num_layers`, an entry that names no
    layer (ModelOpt's fnmatch patterns, "*.self_attn.*"; a plain name, which vLLM matches as a
    substring) stands for every probe module of those layers it matches."""
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise qf.error(field, f"must be a list of module names, got {names!r}")
    if num_layers:
        probes = [f"{pre}layers.{i}.{part}" for pre in PROBE_PREFIXES for i in range(num_layers)
                  for part in PROBE_PARTS]
        names = [found for name in names for found in
                 ([name] if LAYER_MODULE.search(name) and "*" not in name
                  else [p for p in probes if fnmatch(p, name if "*" in name else f"*{name}*")])]
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
            raise qf.error(field, f"keeps routed experts unquantized ({name}): not modelled")
        elif head in ("mlp", "feed_forward", "block_sparse_moe"):
            mlps.add(layer)
    return len(mixers), len(shared), len(mlps)


def modelopt(q: dict, qf: ConfigFields, num_layers: int) -> WeightQuant:
    """A ModelOpt checkpoint's weights (see the module docstring): the fields vLLM's
    ModelOptQuantConfigBase.from_config reads, nested (hf_quant_config.json) or flat (config.json)."""
    if "quantization" in q:
        inner = q["quantization"]
        if not isinstance(inner, dict):
            raise qf.error("quantization", f"must be an object, got {inner!r}")
        qf, q, excluded_field = ConfigFields(inner, f"{qf.where}: quantization"), inner, "exclude_modules"
    else:
        excluded_field = "ignore"
    algo = str(q.get("quant_algo") or "").upper()
    if algo not in MODELOPT_ALGOS:
        raise qf.error("quant_algo", f"is {q.get('quant_algo')!r}; modelled: {', '.join(MODELOPT_ALGOS)}")
    bits, w4a4 = MODELOPT_ALGOS[algo]
    mixers, shared, mlps = kept_modules(q.get(excluded_field) or [], qf, excluded_field, num_layers)
    kept = dict(kept_mixer_layers=mixers, kept_shared_layers=shared, kept_mlp_layers=mlps)
    if bits == 8:
        return WeightQuant("modelopt", 8, None, 1.0, fp8_compute=True, **kept)
    group = qf.int("group_size", NVFP4_GROUP)
    if group != NVFP4_GROUP:  # the format's block: vLLM's FP4 kernels and Marlin take 16
        raise qf.error("group_size", f"is {group}; NVFP4 has one scale per {NVFP4_GROUP} weights")
    return WeightQuant("modelopt", 4, group, 0.5 + 1 / group, fp4_compute=w4a4, **kept)


def kv_cache_bytes(fields: ConfigFields) -> int | None:
    """The KV cache element size a ModelOpt checkpoint sets for --kv-cache-dtype auto: 1 where its
    kv_cache_quant_algo is FP8 (or its kv_cache_scheme 8-bit floats), as vLLM's
    get_kv_cache_quant_algo_string resolves it; None otherwise (vLLM falls back to auto, the model's
    dtype, for any other value, NVFP4 included)."""
    q = fields.get("quantization_config")
    if not isinstance(q, dict) or modelopt_method(q) is None:
        return None
    inner = q.get("quantization") if isinstance(q.get("quantization"), dict) else q
    kv = (inner.get("kv_cache_scheme") or q.get("kv_cache_scheme") or inner.get("kv_cache_quant_algo")
          or q.get("kv_cache_quant_algo"))
    if isinstance(kv, dict):  # vLLM's test: static 8-bit floats
        return 1 if kv.get("dynamic") is False and kv.get("type") == "float" and kv.get("num_bits") == 8 else None
    if kv is not None and not isinstance(kv, str):
        raise fields.error("quantization_config", f"kv_cache_quant_algo must be a string, got {kv!r}")
    return 1 if isinstance(kv, str) and kv.lower() == "fp8" else None


def modelopt_method(q: dict) -> str | None:
    """"modelopt" where a quantization_config is ModelOpt's (quant_method modelopt / modelopt_fp4,
    or an hf_quant_config.json, which vLLM names by its producer), else None."""
    method, producer = str(q.get("quant_method") or "").lower(), q.get("producer")
    if method.startswith("modelopt") or (not method and isinstance(producer, dict)
                                         and producer.get("name") == "modelopt"):
        return "modelopt"
    return None


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


__all__ = ["QUANT_METHODS", "weight_quant", "kv_cache_bytes", "ModelConfigError"]
