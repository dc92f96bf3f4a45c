"""The core's exceptions, in one place.

Two kinds, and callers must keep them apart:

- `CannotServe`: a documented outcome, not a bug. This configuration cannot serve at all (the
  model leaves no room for a KV pool, its KV heads do not split over the tensor-parallel
  degree). A capacity planner records it as "infeasible". Requests that a working
  configuration can never fit are not exceptions: the scheduler rejects them with a reason and
  the run goes on.
- `CoreError` and its subclasses: an invariant of the engine core broke. That is a bug in the
  core or in a driver, and nobody may swallow it as "infeasible" or "not sustainable".
"""

from __future__ import annotations


class CannotServe(ValueError):
    """This configuration cannot serve any request (a ValueError, so configuration checks that
    catch ValueError keep working)."""


class CoreError(Exception):
    """An invariant of the engine core broke: a bug, never an expected outcome."""


class OutOfBlocks(CoreError):
    """A pool or allocator was asked for a block it does not have. The scheduler checks free
    space before every allocation, so this reaching a driver is a bug."""


class DoubleFree(CoreError):
    """A block or range was freed that is not allocated."""


class NegativeRefcount(CoreError):
    """A block's reference count would drop below zero."""


class SchedulerStalled(CoreError):
    """Requests are queued but the scheduler produced an empty step: none can ever run."""
