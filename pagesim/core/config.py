"""The serving system under study, as one set of knobs: the configuration both drivers embed.

The simulator's ReplayConfig and the executor's EngineConfig extend ServingConfig with what only
they need (a model and GPU to cost; a pool size in blocks), and the CLI's options take their
names, choices and defaults from here, so `pagesim replay` and `pagesim run` cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from pagesim.core.kv_groups import KVGroupSpec
from pagesim.core.paged import BLOCK_KEYS
from pagesim.core.policies import POLICIES, PoolConfig, make_scheduler
from pagesim.core.reservation import ALLOCATORS
from pagesim.core.scheduler import PREEMPTION_MODES, Scheduler, SchedulerConfig

# The paper's max batched tokens per step (its artifact's setting).
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2560

# Each name-valued knob and the names it accepts (the CLI's choices).
CHOICES = {"policy": tuple(POLICIES), "preemption": PREEMPTION_MODES, "allocator": tuple(ALLOCATORS),
           "prefix_key": tuple(BLOCK_KEYS)}


@dataclass
class ServingConfig:
    policy: str = "paged"  # see POLICIES: paged (vLLM), orca-max / orca-pow2 / orca-oracle, static
    block_size: int = 16  # tokens per KV block
    max_num_seqs: int = 256  # sequences running at once, at most (vLLM's default)
    max_num_batched_tokens: int | None = None  # tokens computed in one step; None: batched_tokens()
    max_model_len: int | None = None  # longest sequence; None: the model's
    preemption: str = "auto"  # recompute | swap | auto (recompute single sequences, swap groups)
    chunked_prefill: bool = False
    prefix_caching: bool = False
    allocator: str = "buddy"  # the reservation baselines' contiguous allocator
    prefix_key: str = "fast"  # prefix-cache block key: "sha256" where users share a server (pagesim.core.paged)

    def __post_init__(self) -> None:
        for name, valid in CHOICES.items():
            value = getattr(self, name)
            if value not in valid:
                raise ValueError(f"{_flag(name)}: unknown {name} {value!r}; choose from {', '.join(valid)}")
        for name in ("block_size", "max_num_batched_tokens", "max_model_len"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{_flag(name)} must be >= 1, got {value}")
        # 0 is a system that admits nothing: every request is rejected with a reason (docs/cli.md)
        if self.max_num_seqs < 0:
            raise ValueError(f"--max-num-seqs must be >= 0, got {self.max_num_seqs}")

    def batched_tokens(self, max_model_len: int, chunked_default: int | None = None) -> int:
        """The step's token budget: without chunked prefill a step must hold the longest prompt
        (vLLM's rule as well), so the default grows with the model's length; with it, a driver
        that knows the GPU gives vLLM's default as chunked_default (pagesim.sim.presets.vllm_v1_limits)."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        if self.chunked_prefill and chunked_default is not None:
            return chunked_default
        return max(DEFAULT_MAX_NUM_BATCHED_TOKENS, max_model_len)

    def scheduler_config(self, max_model_len: int, eos_token_id: int | None = None) -> SchedulerConfig:
        return SchedulerConfig(max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.batched_tokens(max_model_len),
                               max_model_len=max_model_len, preemption_mode=self.preemption,
                               chunked_prefill=self.chunked_prefill, eos_token_id=eos_token_id)

    def pool(self, num_device_blocks: int, num_host_blocks: int, kv_groups: tuple[KVGroupSpec, ...] | None = None
             ) -> PoolConfig:
        """kv_groups: the model's KV cache groups (None: every layer keeps every token)."""
        return PoolConfig(num_device_blocks, num_host_blocks, self.block_size, self.prefix_caching, self.allocator,
                          self.prefix_key, None if kv_groups is None else tuple(kv_groups))

    def make_scheduler(self, num_device_blocks: int, num_host_blocks: int, max_model_len: int,
                       eos_token_id: int | None = None, kv_groups: tuple[KVGroupSpec, ...] | None = None
                       ) -> Scheduler:
        """The named system's KV manager and scheduler over a pool of this many blocks."""
        return make_scheduler(self.policy, self.pool(num_device_blocks, num_host_blocks, kv_groups),
                              self.scheduler_config(max_model_len, eos_token_id))


SERVING_DEFAULTS = ServingConfig()
SERVING_FIELDS = tuple(f.name for f in fields(ServingConfig))


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")
