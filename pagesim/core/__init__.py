"""The engine core: requests, KV cache managers and the scheduler. Pure Python, shared by the
simulator and the executor; it imports nothing heavy."""

from pagesim.core.allocators import BuddyAllocator, FirstFitAllocator
from pagesim.core.hashed_prompt import HashedPrompt
from pagesim.core.errors import CannotServe, CoreError, DoubleFree, NegativeRefcount, OutOfBlocks, SchedulerStalled
from pagesim.core.kv_manager import KVCacheManager, WasteBreakdown
from pagesim.core.paged import BlockPool, PagedKVManager
from pagesim.core.hybrid_kv import HybridKVManager
from pagesim.core.kv_groups import NULL_BLOCK, KVGroupSpec, KVLayout
from pagesim.core.request import Request, SamplingParams, Sequence, SequenceGroup, SequenceStatus
from pagesim.core.reservation import ReservationKVManager
from pagesim.core.policies import POLICIES, PoolConfig, make_kv_manager, make_scheduler
from pagesim.core.scheduler import Scheduler, SchedulerConfig
from pagesim.core.config import DEFAULT_MAX_NUM_BATCHED_TOKENS, ServingConfig
from pagesim.core.step import BatchShape, Sample, SchedulerOutput, StepResult

__all__ = [
    "BatchShape", "DEFAULT_MAX_NUM_BATCHED_TOKENS", "POLICIES", "PoolConfig", "make_kv_manager", "make_scheduler",
    "CannotServe", "CoreError", "DoubleFree", "NegativeRefcount", "OutOfBlocks", "SchedulerStalled",
    "BlockPool", "BuddyAllocator", "FirstFitAllocator", "HashedPrompt", "HybridKVManager", "KVCacheManager", "KVGroupSpec", "KVLayout",
    "NULL_BLOCK", "PagedKVManager",
    "Request", "ReservationKVManager", "Sample", "SamplingParams", "Scheduler", "SchedulerConfig",
    "SchedulerOutput", "Sequence", "ServingConfig", "SequenceGroup", "SequenceStatus", "StepResult", "WasteBreakdown",
]
