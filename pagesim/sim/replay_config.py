"""What a replay is configured with: the serving system, the workload and the hardware
(ReplayConfig, every field checked by its flag's rule), the named systems' presets, and the
workload built once for replicas that share it. pagesim.sim.engine re-exports them."""

from __future__ import annotations

from dataclasses import dataclass

from pagesim import inputs
from pagesim.core import ServingConfig
from pagesim.inputs import check_fields
from pagesim.models.max_len import check_max_model_len
from pagesim.sim.cost import DEFAULT_COST_MODEL
from pagesim.sim.cost.engine import DEFAULT_ENGINE
from pagesim.sim.presets import policy_preset
from pagesim.sim.specs import DEFAULT_SWAP_GIB, get_model
from pagesim.workload.requests import WorkloadConfig
from pagesim.workload.trace import Trace


@dataclass
class ReplayConfig(ServingConfig, WorkloadConfig):
    """The serving system (ServingConfig: policy, block size, limits, preemption, ...), the
    workload it replays (WorkloadConfig: arrivals, overrides, warm-up) and the hardware whose
    costs the simulator models."""

    model: str = "opt-13b"
    gpu: str = "a100-40gb"
    # None: the system's default (pagesim.sim.presets.default_chunked_prefill: vLLM chunks a prompt
    # of a model longer than 32K tokens), settled when the run is built
    chunked_prefill: bool | None = None
    tp: int = 1
    ep: int = 1  # expert parallelism: a MoE's experts split over this many GPUs (ep / tp data-parallel ranks)
    kv_cache_dtype: str = "auto"  # vLLM's --kv-cache-dtype: "auto" (the model's dtype) or "fp8" (1 byte)
    swap_space_gib: float = DEFAULT_SWAP_GIB  # host memory per GPU for swapped blocks
    gpu_memory_utilization: float | None = None  # default: the paper's (see specs)
    num_gpu_blocks: int | None = None  # override the pool size
    beam_ancestry: str | None = None  # measured beam ancestry (default: beam_model.DEFAULT_PATH)
    cost_model: str = DEFAULT_COST_MODEL
    engine: str = DEFAULT_ENGINE  # how the engine runs the kernels (calibrated cost model): pagesim.sim.cost.engine
    profile: str | None = None
    force_profile: bool = False  # use a profile measured on another model or GPU anyway (--force)
    waste_interval_s: float | None = None  # sample the KV waste breakdown this often
    # A client that gives up: a request not finished this long after its arrival is aborted
    # (its KV freed, as a server does when the client disconnects) and counted as failed.
    client_timeout_s: float | None = None

    def __post_init__(self) -> None:
        # the CLI's flags obey the same rules (pagesim.inputs), so an API caller and a cluster file's
        # group meet the same limits; checked first, so a "16" for block_size is said as such
        flag = lambda f: "--" + _FLAG_NAMES.get(f, f).replace("_", "-")  # noqa: E731
        check_fields(self, _FIELD_RULES, name=flag)
        for name, kinds in _FIELD_TYPES.items():
            value = getattr(self, name)
            if not isinstance(value, kinds):
                what = "true or false" if bool in kinds else "a name" if len(kinds) == 1 else "a path"
                raise ValueError(f"{flag(name)} must be {what}, got {value!r}")
        super().__post_init__()
        if self.max_model_len is not None:  # vLLM refuses it too (its "derived max_model_len")
            check_max_model_len(self.max_model_len, get_model(self.model).max_model_len, self.model)


_FIELD_RULES = {"tp": inputs.TP, "swap_space_gib": inputs.SWAP_GIB, "num_gpu_blocks": inputs.BLOCKS,
                "rate": inputs.RATE, "burstiness": inputs.BURSTINESS, "num_requests": inputs.NUM_REQUESTS,
                "duration": inputs.POSITIVE_SECONDS, "warmup_s": inputs.SECONDS, "n": inputs.SAMPLES,
                "beam_width": inputs.SAMPLES, "seed": inputs.SEED, "block_size": inputs.BLOCK_SIZE,
                "max_num_seqs": inputs.SEQS, "max_num_batched_tokens": inputs.TOKENS,
                "waste_interval_s": inputs.POSITIVE_SECONDS, "ep": inputs.TP, "max_model_len": inputs.TOKENS,
                "gpu_memory_utilization": inputs.NumberRule(lo=0, lo_open=True, hi=1),
                "client_timeout_s": inputs.POSITIVE_SECONDS, "concurrency": inputs.NUM_REQUESTS}
_FIELD_TYPES = {"model": (str,), "gpu": (str,), "kv_cache_dtype": (str,), "cost_model": (str,), "engine": (str,),
                "profile": (str, type(None)), "beam_ancestry": (str, type(None)),
                "chunked_prefill": (bool, type(None)),
                "prefix_caching": (bool,), "force_profile": (bool,)}
_FLAG_NAMES = {"swap_space_gib": "swap_space", "warmup_s": "warmup", "waste_interval_s": "waste_interval",
               "force_profile": "force"}


def shared_workload(cfg: ReplayConfig, trace: Trace, built: bool = True) -> tuple[list, list[str], set[int]]:
    """The run's requests, the notes on building them, and the beam widths among them. built=False:
    the requests as a Workload, each built when asked for (pagesim.workload.requests)."""
    requests, notes = cfg.requests(trace, built)
    samplings = (r.sampling for r in requests) if built else requests.samplings()
    return requests, notes, {s.beam_width for s in samplings if s.use_beam_search}


def with_policy_presets(options: dict) -> dict:
    """ReplayConfig fields with the named system's presets filled in where `options` does not set
    them (policy_preset)."""
    preset = policy_preset(options.get("policy", ServingConfig.policy), options.get("gpu", ReplayConfig.gpu),
                           options.get("model", ReplayConfig.model))
    return {**preset, **{k: v for k, v in options.items() if v is not None or k not in preset}}
