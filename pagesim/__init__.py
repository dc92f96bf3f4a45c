"""pagesim: paged KV-cache serving, simulated and real.

`pagesim.core` holds the engine core (requests, KV managers, scheduler), `pagesim.sim` the SimPy
simulator, `pagesim.workload` traces and arrivals. Importing pagesim never imports torch.
"""

__version__ = "0.1.0"
