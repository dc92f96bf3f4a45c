"""KV cache groups: layers that keep their KV the same way share one block table per sequence.

This module is the contract between a model's description (pagesim.models, which says which
layers use which attention kind) and the KV managers in the core (which keep one block table per
group over one shared pool, as vLLM v1's hybrid KV cache manager does).

Kinds:
- ``full``: every token's K and V stay for the whole sequence (standard attention).
- ``sliding``: only the last ``sliding_window`` tokens are attended to; blocks that fall wholly
  outside the window can be freed as the sequence grows.
- ``mla``: multi-head latent attention (DeepSeek-V2/V3): one compressed latent vector per token
  per layer instead of K and V per head; kept like ``full``.
- ``state``: linear attention / state-space layers (Qwen3-Next's Gated DeltaNet, Mamba): a
  constant-size state per sequence instead of per-token KV (vLLM v1's MambaSpec). A sequence
  holds exactly one block per state table from admission to finish, whatever its length; the
  model layer makes a block at least one layer-group's state (vLLM raises the attention block
  size until an attention page is at least a state page). A layout needs one token kind beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

KV_GROUP_KINDS = ("full", "sliding", "mla", "state")


@dataclass(frozen=True, slots=True)
class KVGroupSpec:
    """One attention kind and how many layers use it."""

    kind: str
    num_layers: int
    sliding_window: int | None = None  # tokens; only for kind "sliding"

    def __post_init__(self) -> None:
        if self.kind not in KV_GROUP_KINDS:
            raise ValueError(f"KV group kind must be one of {KV_GROUP_KINDS}, got {self.kind!r}")
        if self.num_layers <= 0:
            raise ValueError(f"KV group of kind {self.kind!r}: num_layers must be positive, got {self.num_layers}")
        if (self.kind == "sliding") != (self.sliding_window is not None):
            raise ValueError("a KV group has a sliding_window exactly when its kind is 'sliding'")
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise ValueError(f"sliding_window must be positive, got {self.sliding_window}")


# The smallest block FlashAttention's paged kernels take (vLLM's FlashAttentionBackend:
# MultipleOf(16)): the grain vLLM raises a hybrid model's attention block size by.
STATE_KERNEL_BLOCK_ALIGNMENT = 16

NULL_BLOCK = -1  # a block-table entry whose block was freed (outside a sliding window): vLLM's null block


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True, slots=True)
class BlockTableGroup:
    """The layers that share one block table per sequence: up to layers_per_block layers of one
    attention kind (vLLM's KV cache group). A pool block given to this table holds its tokens
    for these layers; a table with fewer real layers than layers_per_block pads the rest."""

    kind: str
    sliding_window: int | None
    num_layers: int  # real layers, at most the layout's layers_per_block
    first_layer: int  # index of its first layer among the layers of its kind and window

    @property
    def is_state(self) -> bool:
        """A constant-size state per sequence: one block, never grown (kind ``state``)."""
        return self.kind == "state"

    def blocks_held(self, num_computed: int, block_size: int) -> int:
        """Blocks a sequence holds in this table once num_computed tokens are computed (before
        the next one): a sliding window has freed those wholly before the next token's window;
        a state table holds its one block from admission on."""
        if self.kind == "state":
            return 1
        return _cdiv(num_computed, block_size) - self.blocks_skipped(num_computed, block_size)

    def blocks_skipped(self, num_computed: int, block_size: int) -> int:
        """Leading blocks wholly outside the window of the token at position num_computed."""
        if self.sliding_window is None:
            return 0
        return max(0, num_computed - self.sliding_window + 1) // block_size

    def peak_blocks(self, length: int, chunk: int, block_size: int) -> int:
        """At most this many blocks in this table while a sequence grows to length computed tokens,
        at most chunk of them computed in one step (all of a step's tokens are written first)."""
        if self.kind == "state":
            return 1
        whole = _cdiv(length, block_size)
        if self.sliding_window is None:
            return whole
        # a step computing [c, c + n) keeps [c - W + 1, c + n): at most W - 1 + n tokens
        return min(whole, _cdiv(self.sliding_window - 1 + chunk, block_size) + 1)


@dataclass(frozen=True)
class KVLayout:
    """How a model's layers map onto one pool of equal KV blocks (vLLM v1's uniform-page layout).

    Every pool block holds block_size tokens for layers_per_block layers: its bytes are
    block_size x layers_per_block x (KV bytes of one token in one layer). Each attention kind's
    layers are cut into tables of layers_per_block layers (the last padded), and each sequence
    keeps one block table per table group. layers_per_block is vLLM's group size: the fewest
    layers of any kind (so an n:1 hybrid gets n + 1 tables), or the most where the kinds are within
    25 % of each other (less padding). One kind alone is one table of all the layers: the plain
    paged layout, where a block holds every layer.
    """

    specs: tuple[KVGroupSpec, ...]  # one per (kind, window), full and MLA first
    layers_per_block: int
    tables: tuple[BlockTableGroup, ...]

    @classmethod
    def of(cls, groups) -> KVLayout:
        """The layout of these groups; specs of the same kind and window are merged."""
        merged: dict[tuple[str, int | None], int] = {}
        for spec in groups:
            if not isinstance(spec, KVGroupSpec):
                raise TypeError(f"KV groups must be KVGroupSpec, got {type(spec).__name__}")
            key = (spec.kind, spec.sliding_window)
            merged[key] = merged.get(key, 0) + spec.num_layers
        if not merged or all(kind == "state" for kind, _ in merged):
            raise ValueError("a KV layout needs at least one KV group of attention layers")
        # full-size kinds first, so that a sequence's first table (seq.block_table) covers every
        # token; state tables last (they hold no tokens)
        keys = sorted(merged, key=lambda k: (k[0] == "state", k[1] is not None))
        specs = tuple(KVGroupSpec(kind, merged[kind, window], window) for kind, window in keys)
        counts = [s.num_layers for s in specs]
        per_block = min(counts) if max(counts) >= 1.25 * min(counts) else max(counts)
        tables = tuple(BlockTableGroup(s.kind, s.sliding_window, min(per_block, s.num_layers - first), first)
                       for s in specs for first in range(0, s.num_layers, per_block))
        return cls(specs, per_block, tables)

    @property
    def num_tables(self) -> int:
        return len(self.tables)

    @property
    def num_layers(self) -> int:
        return sum(s.num_layers for s in self.specs)

    @property
    def num_token_tables(self) -> int:
        """Tables that take a block each time a sequence opens a new one (all but the state tables)."""
        return sum(1 for t in self.tables if not t.is_state)

    @property
    def padding_layers(self) -> int:
        """Layer slots of the pool's blocks that no layer uses (vLLM pads the same way)."""
        return self.num_tables * self.layers_per_block - self.num_layers

    @property
    def is_plain(self) -> bool:
        """One full or MLA table: the single-table paged manager serves it unchanged."""
        return self.num_tables == 1 and self.tables[0].sliding_window is None

    def block_bytes(self, block_size: int, layer_bytes_per_token: int) -> int:
        """Bytes of one pool block; layer_bytes_per_token is one token's KV in one layer (on one
        GPU). One page size serves every table, so with kinds of different sizes pass the largest."""
        return block_size * self.layers_per_block * layer_bytes_per_token

    @property
    def has_state(self) -> bool:
        return any(t.is_state for t in self.tables)

    def state_block_size(self, block_size: int, layer_bytes_per_token: int, state_bytes_per_layer: int,
                         kernel_alignment: int = STATE_KERNEL_BLOCK_ALIGNMENT) -> int:
        """The block size a layout with state tables is served at: one page size serves every
        table, so an attention page (block_size tokens of one layer) must hold a state page (one
        sequence's state in one layer). vLLM (HybridAttentionMambaModelConfig /
        Platform._align_hybrid_block_size, mamba_cache_mode "none") takes the alignment grain
        g = max(the attention kernel's smallest block, 16 for FlashAttention; the user's block size)
        and serves g x ceil(state page / (g x attention bytes of one token in one layer)) tokens a
        block; the state page is then padded to the attention page. Without state tables, or with
        no per-token bytes: block_size."""
        if not self.has_state or layer_bytes_per_token <= 0:
            return block_size
        grain = max(kernel_alignment, block_size)
        return grain * _cdiv(state_bytes_per_layer, grain * layer_bytes_per_token)

    def num_blocks(self, pool_bytes: int, block_size: int, layer_bytes_per_token: int) -> int:
        """Pool blocks that pool_bytes of KV memory hold."""
        return pool_bytes // self.block_bytes(block_size, layer_bytes_per_token)

    def blocks_per_sequence(self, num_tokens: int, block_size: int) -> int:
        """Blocks one sequence of num_tokens computed tokens holds over all its tables (no sharing)."""
        return sum(t.blocks_held(num_tokens, block_size) for t in self.tables)

    def blocks_by_kind(self, num_tokens: int, block_size: int) -> dict[str, int]:
        """blocks_per_sequence split by table kind ("full", "mla", "sliding:W")."""
        out: dict[str, int] = {}
        for t in self.tables:
            name = t.kind if t.sliding_window is None else f"sliding:{t.sliding_window}"
            out[name] = out.get(name, 0) + t.blocks_held(num_tokens, block_size)
        return out

    def sequences_that_fit(self, num_blocks: int, num_tokens: int, block_size: int) -> int:
        """Sequences of num_tokens tokens a pool of num_blocks blocks holds at once (no sharing)."""
        return num_blocks // max(1, self.blocks_per_sequence(num_tokens, block_size))
