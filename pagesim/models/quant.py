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
Only the decoder's linear layers are quantized (ModelSpec.quantized_params says which).
"""

from __future__ import annotations

from pagesim.models.config import ConfigFields, ModelConfigError
from pagesim.models.spec import WeightQuant

QUANT_METHODS = ("fp8", "awq", "gptq")
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
    raise qf.error("quant_method", f"is {q.get('quant_method')!r}, an unknown quantization method; "
                   f"supported: {', '.join(QUANT_METHODS)}")


__all__ = ["QUANT_METHODS", "weight_quant", "ModelConfigError"]
