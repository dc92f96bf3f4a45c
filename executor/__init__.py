"""The real engine: torch models on a paged KV cache, driven by the same `pagesim.core` objects
as the simulator."""
