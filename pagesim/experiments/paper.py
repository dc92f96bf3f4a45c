"""The paper's numbers, in one place, and the tolerances our verdicts on them use.

Paper: Kwon et al., "Efficient Memory Management for Large Language Model Serving with
PagedAttention", SOSP 2023, arXiv 2309.06180. Each constant names the figure it is read from
(see also /work/shared/DESIGN.md section 9). Figure scripts import these; they never retype a
paper number. What the scripts share besides (verdict rows, reports, plots) is in
pagesim/experiments/figures.py.
"""

from __future__ import annotations

from dataclasses import dataclass

ARXIV = "arXiv 2309.06180"

# Policies in the order the paper draws them, with the paper's labels.
POLICIES = ("orca-max", "orca-pow2", "orca-oracle", "paged")
POLICY_LABELS = {"orca-max": "Orca (Max)", "orca-pow2": "Orca (Pow2)", "orca-oracle": "Orca (Oracle)", "paged": "vLLM",
                 "static": "FasterTransformer"}

# Setup shared by Fig. 2 and Fig. 13 (paper section 6.1 / Fig. 2 caption): OPT-13B on one A100-40GB.
# The paper ran an eager engine of 2023: its figures run the engine profile the calibrated terms describe.
PAPER_ENGINE = "paper"
SETUP_OPT13B = {"model": "opt-13b", "gpu": "a100-40gb", "tp": 1, "engine": PAPER_ENGINE}


@dataclass(frozen=True)
class LengthMeans:
    """Fig. 11: mean input (prompt) and output lengths of a dataset, in OPT tokens."""
    prompt_len: float
    output_len: float
    source: str


FIG11_MEANS = {
    "sharegpt": LengthMeans(161.31, 337.99, "Fig. 11a, ShareGPT (pairs with input + output <= 2048); " + ARXIV),
    "alpaca": LengthMeans(19.31, 58.45, "Fig. 11b, Alpaca; " + ARXIV),
}


@dataclass(frozen=True)
class BatchedRequests:
    """Fig. 13: mean number of batched requests per policy at one request rate."""
    trace: str
    rate: float  # req/s, Poisson
    values: dict  # policy -> mean batched requests
    source: str


FIG13_BATCHED = {
    "sharegpt": BatchedRequests("sharegpt", 2.0, {"orca-max": 7.00, "orca-pow2": 9.81, "orca-oracle": 13.62, "paged": 30.42},
                                "Fig. 13a, OPT-13B ShareGPT at 2 req/s; " + ARXIV),
    "alpaca": BatchedRequests("alpaca", 30.0, {"orca-max": 7.00, "orca-pow2": 43.24, "orca-oracle": 72.75, "paged": 132.44},
                              "Fig. 13b, OPT-13B Alpaca at 30 req/s; " + ARXIV),
}

# Fig. 2: share of KV cache slots (percent), OPT-13B ShareGPT at 4 req/s. None: the paper draws
# no such segment (Oracle has no internal fragmentation; for vLLM it states only token states).
FIG02_CATEGORIES = ("token_states", "reserved", "internal_fragmentation", "external_and_other")
FIG02_CATEGORY_LABELS = {"token_states": "Token states", "reserved": "Reservation",
                         "internal_fragmentation": "Internal fragmentation",
                         "external_and_other": "External fragmentation & others"}
FIG02_TRACE = "sharegpt"
FIG02_RATE = 4.0
FIG02_WINDOW_S = (300.0, 900.0)
FIG02_SHARES = {
    "orca-max": {"token_states": 20.4, "reserved": 13.3, "internal_fragmentation": 57.3, "external_and_other": 8.9},
    "orca-pow2": {"token_states": 26.8, "reserved": 17.9, "internal_fragmentation": 13.6, "external_and_other": 41.6},
    "orca-oracle": {"token_states": 38.2, "reserved": 25.2, "internal_fragmentation": None, "external_and_other": 36.6},
    "paged": {"token_states": 96.3, "reserved": None, "internal_fragmentation": None, "external_and_other": None},
}
FIG02_SOURCE = "Fig. 2, OPT-13B ShareGPT at 4 req/s, average KV slot shares; " + ARXIV


# Fig. 12: normalized latency against request rate. (model, gpu, tensor-parallel GPUs, panel label)
@dataclass(frozen=True)
class Setup:
    model: str
    gpu: str
    tp: int
    label: str

    @property
    def key(self) -> str:
        return f"{self.model}/{self.tp}x{self.gpu}"


# Figs. 18 and 19's rate search over SETUP_OPT13B (Fig. 12's probe sets the engine itself)
SEARCH_OPT13B = Setup(SETUP_OPT13B["model"], SETUP_OPT13B["gpu"], SETUP_OPT13B["tp"], "OPT-13B")
FIG12_SETUPS = (Setup("opt-13b", "a100-40gb", 1, "OPT-13B, 1 x A100-40GB"),
                Setup("opt-66b", "a100-40gb", 4, "OPT-66B, 4 x A100-40GB"),
                Setup("opt-175b", "a100-80gb", 8, "OPT-175B, 8 x A100-80GB"))
FIG12_SYSTEMS = ("paged", "orca-oracle", "orca-pow2", "orca-max", "static")  # static = FasterTransformer
FIG12_TRACES = ("sharegpt", "alpaca")
FIG12_SOURCE = "Fig. 12 and section 6.2 text; " + ARXIV
# vLLM's sustainable rate over each baseline's, ShareGPT, over the three models (section 6.2).
FIG12_SHAREGPT_RATIO_BANDS = {"orca-oracle": (1.7, 2.7), "orca-max": (2.7, 8.0)}
FIG12_FT_MAX_RATIO = 22.0  # "up to 22x higher request rates than FasterTransformer"
# Section 6.2 on Alpaca: the advantage over Orca (Oracle) and (Pow2) is "less pronounced" for
# OPT-175B (large KV space, short sequences: compute-bound), i.e. its ratio is below OPT-13B's.
FIG12_ALPACA_175B_LESS_PRONOUNCED = ("orca-oracle", "orca-pow2")
# The x-axis ranges the paper sweeps, OPT-13B (req/s): where each system's curve bends up.
FIG12_SWEPT_RATES = {
    "sharegpt": {"paged": (1.0, 2.0), "orca-oracle": (0.5, 1.5), "orca-pow2": (0.25, 0.9), "orca-max": (0.2, 0.75)},
    "alpaca": {"paged": (20.0, 31.5), "orca-oracle": (15.0, 24.0), "orca-pow2": (7.5, 18.0), "orca-max": (2.0, 5.0)},
}

# Fig. 18b: block sizes swept and the best range per trace (OPT-13B, normalized latency).
FIG18_BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
FIG18_BEST_BLOCKS = {"sharegpt": (16, 128), "alpaca": (16, 32)}
FIG18_SOURCE = "Fig. 18b and section 7.2 text; " + ARXIV
# Fig. 18a: the paged-attention kernel is 20-26% slower than FasterTransformer's contiguous one.
FIG18A_OVERHEAD_BAND = (0.20, 0.26)
FIG18A_SOURCE = "Fig. 18a and section 7.1 text; " + ARXIV
# Fig. 19: swap vs recompute. (a) swapping is slow at small blocks; recompute does not depend on
# the block size; (b) end to end the two are comparable for blocks 16-64.
FIG19_BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
FIG19_COMPARABLE_BLOCKS = (16, 64)
# "recomputation overhead is never higher than 20% of swapping's latency": recompute <= 1.2 x swap
FIG19_RECOMPUTE_MAX_OVER_SWAP = 1.20
FIG19_SOURCE = "Fig. 19 and section 7.3 text; " + ARXIV


# -- Figs. 14-17: sharing (parallel sampling, beam search, shared prefix, chatbot) ----------------
# Sections 6.3-6.5 of the paper. The ratios are vLLM's sustainable rate over the baseline's (the
# paper reads them off the latency-vs-rate curves); the paper states single numbers, so the band
# is SHARING_RATIO_REL_TOL around each (figures.sharing_ratio_band), for Figs. 14, 16 and 17.
SHARING_RATIO_REL_TOL = 0.25


# Fig. 14: OPT-13B on 1 x A100-40GB, Alpaca; "the improvement of vLLM over Orca (Oracle) grows from
# 1.3x in basic sampling to 2.3x in beam search with a width of 6" (section 6.3).
FIG14_SETUP = {"model": "opt-13b", "gpu": "a100-40gb", "tp": 1}
FIG14_TRACE = "alpaca"
FIG14_WIDTHS = (2, 4, 6)
FIG14_RATIO_OVER_ORACLE = {("basic", 1): 1.3, ("beam", 6): 2.3}
FIG14_SOURCE = "Fig. 14 and section 6.3 text; " + ARXIV

# Fig. 15: average memory saving (percent) from sharing KV blocks, OPT-13B; Alpaca per n / width
# 2, 4, 6 (figure labels), ShareGPT only as the range the text gives over 2-6 (section 6.3).
FIG15_ALPACA_SAVING = {"parallel": {2: 6.09, 4: 8.53, 6: 9.79}, "beam": {2: 37.56, 4: 53.13, 6: 55.16}}
FIG15_SHAREGPT_SAVING_RANGE = {"parallel": (16.2, 30.5), "beam": (44.3, 66.3)}
FIG15_WIDTHS = (2, 4, 6)
FIG15_TOLERANCE_POINTS = 5.0  # Alpaca: |ours - paper| in percentage points
FIG15_SOURCE = "Fig. 15 and section 6.3 text; " + ARXIV

# Fig. 16: shared prefix, LLaMA-13B, WMT16 En-De translation with a 1-shot (80-token) or 5-shot
# (341-token) prefix: vLLM with prefix sharing vs Orca (Oracle), throughput (section 6.4). 13B
# models run on 1 x A100-40GB (the paper's Table 1 assigns GPUs by model size).
FIG16_SETUP = {"model": "llama-13b", "gpu": "a100-40gb", "tp": 1}
FIG16_CASES = {"translation_1shot": (80, 1.67), "translation_5shot": (341, 3.58)}  # trace -> (prefix tokens, ratio)
FIG16_SOURCE = "Fig. 16 and section 6.4 text; " + ARXIV

# Fig. 17: chatbot, OPT-13B, ShareGPT conversations, prompt = the last 1024 tokens of the
# conversation, output <= 1024; "vLLM can sustain 2x higher request rates compared to the three
# Orca baselines"; the KV cache is NOT kept between rounds (section 6.5), so no prefix caching.
FIG17_SETUP = {"model": "opt-13b", "gpu": "a100-40gb", "tp": 1}
FIG17_TRACE = "sharegpt_chat"
FIG17_RATIO_OVER_ORCA = 2.0
FIG17_SOURCE = "Fig. 17 and section 6.5 text; " + ARXIV
