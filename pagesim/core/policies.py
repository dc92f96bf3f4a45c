"""The named serving systems a run can choose, built from the core's pieces. Both drivers (the
simulator and the executor) build their KV manager and scheduler here."""

from __future__ import annotations

from dataclasses import dataclass, replace

from pagesim.core.hybrid_kv import HybridKVManager
from pagesim.core.kv_groups import KVGroupSpec, KVLayout
from pagesim.core.kv_manager import KVCacheManager
from pagesim.core.paged import BLOCK_KEYS, PagedKVManager
from pagesim.core.reservation import ReservationKVManager
from pagesim.core.scheduler import Scheduler, SchedulerConfig

# policy name -> (reservation estimate or None for paged, batching)
POLICIES = {
    "paged": (None, "iteration"),  # vLLM
    "orca-max": ("max", "iteration"),
    "orca-pow2": ("pow2", "iteration"),
    "orca-oracle": ("oracle", "iteration"),
    "static": ("max", "static"),  # request-level batching over max-length reservations (FasterTransformer)
    "vllm-v1": (None, "iteration"),  # vLLM v1's scheduler: paged, with the presets of POLICY_PRESETS
}
# Settings a named system implies unless a run sets them itself (pagesim.sim.engine.with_policy_presets).
# vLLM v1: chunked prefill and prefix caching on (off for a hybrid model with state layers, as v1's
# own default: pagesim.sim.presets.policy_preset), recompute preemption (v1 has no swap). v1
# preempts the request it admitted last; under FCFS that is the most recent arrival, as here
# (admission follows arrival, and a preempted request re-enters the waiting queue at its front,
# ahead of everything newer), so the victim rule needs no change.
POLICY_PRESETS = {
    "vllm-v1": {"chunked_prefill": True, "prefix_caching": True, "preemption": "recompute"},
}

@dataclass
class PoolConfig:
    num_device_blocks: int
    num_host_blocks: int = 0
    block_size: int = 16
    prefix_caching: bool = False
    allocator: str = "buddy"  # reservation baselines only
    prefix_key: str = "fast"  # prefix-cache block key: "fast" (Python hash) or "sha256" (shared servers)
    # the model's KV cache groups (pagesim.core.kv_groups); None: every layer keeps every token.
    # num_device_blocks counts blocks of the groups' layout (KVLayout.num_blocks sizes it from bytes).
    kv_groups: tuple[KVGroupSpec, ...] | None = None


def uses_paged_blocks(policy: str) -> bool:
    """Whether the named system keeps KV in paged blocks (and so can keep one table per KV cache
    group); the reservation baselines reserve contiguous ranges instead."""
    return POLICIES.get(policy, (None,))[0] is None


def make_kv_manager(policy: str, pool: PoolConfig, max_model_len: int) -> KVCacheManager:
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    estimate, _ = POLICIES[policy]
    if estimate is None:
        if pool.prefix_key not in BLOCK_KEYS:
            raise ValueError(f"unknown prefix key {pool.prefix_key!r}; choose from {', '.join(BLOCK_KEYS)}")
        plain = pool.kv_groups is None or KVLayout.of(pool.kv_groups).is_plain
        manager = PagedKVManager if plain else HybridKVManager
        return manager(pool.num_device_blocks, pool.block_size, pool.num_host_blocks,
                       enable_prefix_caching=pool.prefix_caching, block_key=BLOCK_KEYS[pool.prefix_key],
                       kv_groups=pool.kv_groups)
    if pool.kv_groups is not None and not KVLayout.of(pool.kv_groups).is_plain:
        raise ValueError(f"KV cache groups (sliding windows, mixed attention kinds) need paged blocks; policy "
                         f"{policy!r} reserves contiguous ranges for every layer")
    if pool.prefix_caching:
        raise ValueError(f"prefix caching needs paged blocks; policy {policy!r} reserves contiguous ranges")
    return ReservationKVManager(pool.num_device_blocks, pool.block_size, estimate, max_model_len, pool.allocator)


def make_scheduler(policy: str, pool: PoolConfig, config: SchedulerConfig) -> Scheduler:
    """A scheduler for the named system (the policy decides the batching)."""
    kv = make_kv_manager(policy, pool, config.max_model_len)
    return Scheduler(replace(config, batching=POLICIES[policy][1]), kv)
