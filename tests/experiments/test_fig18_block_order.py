"""Fig. 18(b)'s ordering against the paper's: with decode attention charged per block
(pagesim/sim/cost/paged_blocks.py), small blocks lose to the gather, large ones to fragmentation
and empty slots, and the best block size falls in the paper's range (section 7.2: 16-128 for
ShareGPT, 16-32 for Alpaca), OPT-13B on an A100-40GB."""

from __future__ import annotations

import pytest

from pagesim.experiments.fig18_block_size import NEAR_BEST, best_blocks, block_size_sweep
from pagesim.experiments.paper import FIG18_BEST_BLOCKS

# 0.9 x the block-16 sustainable rate the full figure's search finds (reports/figures/fig18_block_size.md);
# the sweep runs at a fixed rate, as the figure does, over a shorter window
RATES = {"sharegpt": 2.9, "alpaca": 37.6}
BLOCKS = (1, 4, 16, 32, 64, 128, 256)


@pytest.mark.slow
@pytest.mark.parametrize("trace", ["sharegpt", "alpaca"])
def test_best_block_size_is_the_papers(trace):
    _, rows = block_size_sweep(trace, BLOCKS, duration=200.0, warmup=60.0, seed=0, resolution=0.08, rate=RATES[trace])
    nl = {r["block_size"]: r["mean_normalized_latency"] for r in rows}
    best, _ = best_blocks(rows)
    lo, hi = FIG18_BEST_BLOCKS[trace]
    assert lo <= best <= hi, nl
    # below the range the gather costs more than the memory saved; past it fragmentation wins
    assert nl[1] > nl[4] > nl[best] * (1 + NEAR_BEST), nl
    assert nl[256] > nl[best] * (1 + NEAR_BEST), nl
