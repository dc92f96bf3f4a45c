"""The Triton implementations under the public kernel names, for callers (and tests) that want
them explicitly. Importing this imports triton; on a machine without a GPU set TRITON_INTERPRET=1
before importing it and pass CPU tensors."""

from executor.kernels.cache_ops import copy_blocks, reshape_and_cache, swap_blocks  # noqa: F401
from executor.kernels.paged_attention import (  # noqa: F401
    paged_attention_decode,
    paged_attention_decode_partitioned,
)
from executor.kernels.prefill_attention import (  # noqa: F401
    paged_prefill_attention,
    paged_prefill_attention_tiled,
)
