"""What named systems and engines set unless a run sets it: vLLM v1's server defaults, and the
engine-profile options the calibrated cost model takes."""

from __future__ import annotations

# vLLM v1's defaults for its OpenAI server (vllm/engine/arg_utils.py, _set_default_args): GPUs of
# at least 70 GiB other than the A100 get larger limits; gpu_memory_utilization 0.9.
VLLM_V1_LARGE_GPU = {"max_num_seqs": 1024, "max_num_batched_tokens": 8192}
VLLM_V1_SMALL_GPU = {"max_num_seqs": 256, "max_num_batched_tokens": 2048}
VLLM_V1_GPU_MEMORY_UTILIZATION = 0.9


def vllm_v1_limits(gpu: str) -> dict:
    """vLLM v1's max_num_seqs and max_num_batched_tokens for its server on this GPU (the budget is
    also what a chunked-prefill replay that gives none takes: pagesim.sim.engine)."""
    from pagesim.sim.specs import get_gpu

    spec = get_gpu(gpu)
    large = spec.memory_bytes >= 70 * 2**30 and not spec.name.startswith("a100")
    return dict(VLLM_V1_LARGE_GPU if large else VLLM_V1_SMALL_GPU)


def policy_preset(policy: str, gpu: str, model: str | None = None) -> dict:
    """The ReplayConfig fields a named system sets unless a run sets them itself
    (pagesim.core.policies.POLICY_PRESETS; for vllm-v1 also v1's limits for the GPU and its
    memory utilization, and prefix caching off for a hybrid `model`: hybrid_prefix_caching_off).
    Empty for a system without presets."""
    from pagesim.core.policies import POLICY_PRESETS

    preset = dict(POLICY_PRESETS.get(policy, {}))
    if policy == "vllm-v1":
        preset.update(vllm_v1_limits(gpu))
        preset["gpu_memory_utilization"] = VLLM_V1_GPU_MEMORY_UTILIZATION
        if model is not None and hybrid_prefix_caching_off(model):
            preset["prefix_caching"] = False
    return preset


def step_budget(config, max_model_len: int, gpu: str) -> int:
    """A run's tokens a step (config: a ServingConfig): the one it gives, vLLM v1's chunk budget
    for the GPU where it chunks prefills, else max(2560, max_model_len) (ServingConfig.batched_tokens)."""
    return config.batched_tokens(max_model_len, vllm_v1_limits(gpu)["max_num_batched_tokens"])


LONG_CONTEXT_TOKENS = 32 * 1024  # vLLM's "long context": chunked prefill by default above it


def default_chunked_prefill(policy: str, model, max_model_len: int, prefix_caching: bool) -> bool:
    """Chunked prefill where a run leaves it unset, as vLLM decides it: v1 always chunks (its
    preset says so); v0's scheduler (`paged`) chunks a model longer than 32K tokens, unless it has
    a sliding window, layers with a per-sequence state, or prefix caching on (EngineArgs of vLLM
    0.5-0.6: "Chunked prefill is enabled by default for models with max_model_len > 32K", to keep
    the memory profiling step from sizing activations for a whole-length prompt); the reservation
    baselines never. model: its ModelSpec; max_model_len: the run's."""
    if policy == "vllm-v1":
        return True
    return (policy == "paged" and max_model_len > LONG_CONTEXT_TOKENS and not model.num_sliding_layers
            and model.linear_attn is None and not prefix_caching)


def hybrid_prefix_caching_off(model: str) -> bool:
    """Whether vLLM v1 leaves prefix caching off by default for `model`: a hybrid (layers with a
    per-sequence state: Mamba, gated DeltaNet) has it off unless --enable-prefix-caching is given
    (EngineArgs: "Disable prefix caching default for hybrid models since the feature is still
    experimental"; older versions disable it outright for Mamba models). False for a model that
    does not load: its own error is said where the run builds it."""
    from pagesim.sim.specs import get_model

    try:
        return get_model(model).linear_attn is not None
    except (KeyError, ValueError, OSError):
        return False


def engine_options(cost_model: str, engine: str, max_num_seqs: int) -> dict:
    """What the calibrated cost model needs of the engine profile (the other models describe
    their engine themselves)."""
    return {"engine": engine, "max_num_seqs": max_num_seqs} if cost_model.lower() == "calibrated" else {}
