"""The engine core: requests, KV cache managers and the scheduler. Pure Python, shared by the
simulator and the executor; it imports nothing heavy. The names below are imported from their
modules when first read, so a module that needs one part of the core (a command's help reads
pagesim.core.config alone) does not load all of it."""

from pagesim.lazy_names import lazy_getattr

_HOMES = {
    "BuddyAllocator": "allocators", "FirstFitAllocator": "allocators",
    "HashedPrompt": "hashed_prompt",
    "CannotServe": "errors", "CoreError": "errors", "DoubleFree": "errors", "NegativeRefcount": "errors",
    "OutOfBlocks": "errors", "SchedulerStalled": "errors",
    "KVCacheManager": "kv_manager", "WasteBreakdown": "kv_manager",
    "BlockPool": "paged", "PagedKVManager": "paged",
    "HybridKVManager": "hybrid_kv",
    "NULL_BLOCK": "kv_groups", "KVGroupSpec": "kv_groups", "KVLayout": "kv_groups",
    "Request": "request", "SamplingParams": "request", "Sequence": "request", "SequenceGroup": "request",
    "SequenceStatus": "request",
    "ReservationKVManager": "reservation",
    "POLICIES": "policies", "PoolConfig": "policies", "make_kv_manager": "policies", "make_scheduler": "policies",
    "Scheduler": "scheduler", "SchedulerConfig": "scheduler",
    "DEFAULT_MAX_NUM_BATCHED_TOKENS": "config", "ServingConfig": "config",
    "BatchShape": "step", "Sample": "step", "SchedulerOutput": "step", "StepResult": "step",
}

__all__ = list(_HOMES)


__getattr__ = lazy_getattr(__name__, _HOMES, globals())
