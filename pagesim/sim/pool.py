"""How many KV blocks a replay's device and host pools hold: from the GPU's memory (or a given
--num-gpu-blocks), per layer group for hybrid models, with a note when a given pool is more
than the GPU could hold (a what-if run)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from pagesim.core.errors import CannotServe
from pagesim.core.kv_groups import KVLayout
from pagesim.core.policies import uses_paged_blocks
from pagesim.sim.specs import kv_bytes_per_token_per_gpu, kv_cache_capacity

# The core keeps a few Python objects per KV block (about 130 bytes, 0.35 s per million blocks to
# build); the catalog's largest real pools (OPT-125M on an H200, block size 1) hold about 4M.
MAX_POOL_BLOCKS = 16_000_000


@dataclass
class PoolSize:
    num_blocks: int
    host_blocks: int
    capacity: object | None  # the memory breakdown (None with a given --num-gpu-blocks)
    kv_groups: tuple | None  # the layer groups with their own block tables (None: one table)
    notes: list[str] = field(default_factory=list)
    block_size: int | None = None  # the block size the pools are in (None: the config's)


def size_pool(cfg, model) -> PoolSize:
    """The pools of a run of cfg (a ReplayConfig whose batched-token budget is resolved) on model.
    A model with linear-attention (state) layers may be served at a larger block size than
    cfg's (PoolSize.block_size, with a note): the one vLLM raises it to (state_block_size)."""
    notes: list[str] = []
    if model.linear_attn is not None:
        if not uses_paged_blocks(cfg.policy):
            raise CannotServe(f"{model.name}: its linear-attention state is kept only by the paged (vLLM) KV managers, "
                              f"not by {cfg.policy!r}")
        block_size = state_block_size(cfg.block_size, model, cfg.tp)
        if block_size != cfg.block_size:
            notes.append(f"block size {block_size} (not {cfg.block_size}): {model.name}'s linear-attention state of "
                         f"{model.linear_attn.state_bytes_per_layer(cfg.tp):,} bytes a layer per GPU must fit one "
                         f"attention page, so vLLM raises the block size (HybridAttentionMambaModelConfig) and pads "
                         "the state page to it")
            cfg = replace(cfg, block_size=block_size)
    kwargs = {} if cfg.gpu_memory_utilization is None else {"gpu_memory_utilization": cfg.gpu_memory_utilization}

    def memory_capacity():
        return kv_cache_capacity(model, cfg.gpu, cfg.tp, max_num_batched_tokens=cfg.max_num_batched_tokens,
                                 max_num_seqs=cfg.max_num_seqs, ep=cfg.ep, **kwargs)
    if cfg.num_gpu_blocks is not None:
        num_blocks, capacity = cfg.num_gpu_blocks, None
        host_blocks = int(cfg.swap_space_gib * 2**30) // (kv_bytes_per_token_per_gpu(model, cfg.tp) * cfg.block_size)
    else:
        capacity = memory_capacity()
        num_blocks = capacity.num_blocks(cfg.block_size)
        host_blocks = capacity.num_swap_blocks(cfg.block_size, cfg.swap_space_gib)
    # A hybrid model (sliding-window or linear-attention layers beside full ones) keeps one block
    # table per group over one pool of blocks that each hold a group's worth of layers
    # (pagesim.core.kv_groups): its pool in blocks is worked out from bytes, a sliding table frees
    # what leaves its window, and a state table's block (one per sequence) holds a layer group's
    # state, padded to the attention page (vLLM's kv_cache_utils: one page size for every group).
    layout = KVLayout.of(model.kv_groups)
    kv_groups = None if layout.is_plain or not uses_paged_blocks(cfg.policy) else model.kv_groups
    if kv_groups is not None:
        if cfg.num_gpu_blocks is None:
            num_blocks = pool_blocks(capacity, model, cfg.tp, cfg.block_size)
        host_blocks = layout.num_blocks(int(cfg.swap_space_gib * 2**30), cfg.block_size, _group_layer_bytes(model, cfg.tp))
    for what, blocks in (("num_gpu_blocks", num_blocks), ("swap_space_gib", host_blocks)):
        if blocks > MAX_POOL_BLOCKS:
            raise ValueError(f"{what} gives a pool of {blocks:,} blocks, more than the {MAX_POOL_BLOCKS:,} the "
                             "simulator keeps track of")
    if cfg.num_gpu_blocks is not None:
        notes += _what_if_pool(cfg, num_blocks, memory_capacity, layout, kv_groups, model)
    elif uses_paged_blocks(cfg.policy):
        check_one_request_fits(model, cfg.tp, cfg.max_model_len or model.max_model_len, cfg.block_size,
                               cfg.max_num_batched_tokens, capacity, f"{cfg.tp} x {cfg.gpu}")
    return PoolSize(num_blocks, host_blocks, capacity, kv_groups, notes, cfg.block_size)


def pool_blocks(capacity, model, tp: int, block_size: int) -> int:
    """Device blocks of block_size tokens that a memory breakdown's KV pool (kv_cache_capacity)
    holds for model under the paged managers: pages of a layer group where the model has several
    block tables (KVLayout), else blocks of every layer (what size_pool gives a replay)."""
    layout = KVLayout.of(model.kv_groups)
    if layout.is_plain:
        return capacity.num_blocks(block_size)
    return layout.num_blocks(capacity.pool_bytes_per_gpu, block_size, _group_layer_bytes(model, tp))


def request_kv_bytes(model, tp: int, num_tokens: int, block_size: int, max_num_batched_tokens: int) -> int:
    """The KV memory vLLM sets aside on one GPU for one request of num_tokens tokens: each layer's
    max_memory_usage_bytes (vllm/v1/kv_cache_interface.py) summed, as check_enough_kv_cache_memory
    sums them. A full-attention or MLA layer holds ceil(tokens / block) pages; a sliding-window layer
    the window less one plus a step's tokens (the most a chunked prefill holds before it frees),
    capped at the tokens, plus one page for a window that starts inside a block; a state layer one
    page (its state padded to the attention page)."""
    attention_page = block_size * _group_layer_bytes(model, tp)
    total = 0
    for group in model.kv_groups:
        if group.kind == "state":
            total += group.num_layers * max(attention_page, model.linear_attn.state_bytes_per_layer(tp))
            continue
        page = block_size * _layer_bytes(model, tp, group.kind)
        if group.kind == "sliding":
            held = min(group.sliding_window - 1 + max_num_batched_tokens, num_tokens)
            total += group.num_layers * (-(-held // block_size) + 1) * page
        else:
            total += group.num_layers * -(-num_tokens // block_size) * page
    return total


def longest_request(model, tp: int, max_model_len: int, block_size: int, max_num_batched_tokens: int,
                    available: int) -> int:
    """The longest request (at most max_model_len tokens) whose KV fits `available` bytes a GPU
    (vLLM's estimate_max_model_len: a binary search on request_kv_bytes, which grows with the length)."""
    low, high = 0, max_model_len
    while low < high:
        mid = (low + high + 1) // 2
        if request_kv_bytes(model, tp, mid, block_size, max_num_batched_tokens) <= available:
            low = mid
        else:
            high = mid - 1
    return low


def check_one_request_fits(model, tp: int, max_model_len: int, block_size: int, max_num_batched_tokens: int,
                           capacity, where: str) -> None:
    """Refuse a pool too small for one request of max_model_len tokens, as vLLM refuses to start
    (v1: check_enough_kv_cache_memory, "To serve at least one request with the model's max seq
    len ..."; v0: the max seq len against the tokens the cache can store), with the longest length
    that would fit."""
    available = capacity.pool_bytes_per_gpu
    needed = request_kv_bytes(model, tp, max_model_len, block_size, max_num_batched_tokens)
    if needed <= available:
        return
    longest = longest_request(model, tp, max_model_len, block_size, max_num_batched_tokens, available)
    fix = f"lower --max-model-len to {longest:,} or less, or " if longest else ""
    raise CannotServe(f"{model.name} on {where}: one request of max_model_len {max_model_len:,} tokens needs "
                      f"{needed / 2**30:.2f} GiB of KV cache per GPU, more than the {available / 2**30:.2f} GiB pool "
                      f"holds, so vLLM would refuse to start ({fix}raise --gpu-memory-utilization or --tp)")


def state_block_size(block_size: int, model, tp: int) -> int:
    """The block size model is served at on tp GPUs given --block-size block_size (KVLayout.state_block_size:
    an attention page at least one layer's state page, on one GPU); block_size without state layers."""
    if model.linear_attn is None:
        return block_size
    return KVLayout.of(model.kv_groups).state_block_size(block_size, _group_layer_bytes(model, tp),
                                                        model.linear_attn.state_bytes_per_layer(tp))


def _group_layer_bytes(model, tp: int) -> int:
    """KV bytes per token per GPU of one layer group's block (the largest group's layers)."""
    return max(_layer_bytes(model, tp, g.kind) for g in model.kv_groups)


def _layer_bytes(model, tp: int, kind: str) -> int:
    """KV bytes per token of one layer of `kind` on one GPU of tp (KV heads split as the whole cache is)."""
    return model.kv_bytes_per_token_per_layer_of(kind) * kv_bytes_per_token_per_gpu(model, tp) // model.kv_bytes_per_token


def _what_if_pool(cfg, num_blocks: int, memory_capacity, layout, kv_groups, model) -> list[str]:
    """A note (the CLI warns with it) when --num-gpu-blocks is more than the GPU's memory holds:
    accepted, as a what-if (say, an unbounded prefix cache), but the run is no real GPU's."""
    try:
        capacity = memory_capacity()
    except ValueError:  # the model does not fit the GPU at all: nothing to compare the pool with
        return []
    fits = pool_blocks(capacity, model, cfg.tp, cfg.block_size) if kv_groups is not None else \
        capacity.num_blocks(cfg.block_size)
    if num_blocks <= fits:
        return []
    return [f"what-if KV pool: --num-gpu-blocks {num_blocks:,} is {num_blocks / max(fits, 1):.1f}x the {fits:,} blocks "
            f"{cfg.tp} x {cfg.gpu}'s memory holds for {cfg.model}; the results assume memory no such GPU has"]
