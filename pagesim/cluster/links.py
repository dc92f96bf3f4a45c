"""The network between replica groups: how long moving a request's prompt KV takes (P/D).

A transfer sends the prompt's KV from the prefill replica's GPUs to the decode replica's. Each
GPU of a TP group holds its share of every token's KV (pagesim.sim.specs.kv_bytes_per_token_per_gpu)
and sends it over its own link, all GPUs at once, so a transfer takes

    latency + prompt_len * (KV bytes per token per GPU) / (link bandwidth per GPU)

with the larger of the two sides' per-GPU shares when their TP degrees differ (resharding: the
side holding more per GPU sets the pace).

Sharing rule: each prefill replica sends one transfer at a time, first come first served (its
links carry one request's KV at full bandwidth; the next one waits for them). `LinkQueue` keeps
that order.

Bandwidths (per GPU, per direction):
- nvlink: the GPU's own NVLink bandwidth from the catalog (pagesim.sim.specs GPUSpec
  .interconnect_bandwidth: e.g. H100 SXM 450 GB/s a direction, NVIDIA's H100 datasheet "900 GB/s"
  bidirectional); for replicas in one NVLink domain.
- infiniband (NDR): 400 Gb/s = 50 GB/s per port, one ConnectX-7 port per GPU as in a DGX H100
  (NVIDIA DGX H100 user guide: 8 x 400 Gb/s compute fabric ports); infiniband-hdr: 200 Gb/s = 25 GB/s.
- pcie: the GPU's PCIe bandwidth from the catalog (GPUSpec.pcie_bandwidth: Gen4 x16 about
  32 GB/s, Gen5 x16 about 64 GB/s a direction, PCI-SIG), through host memory.
Latencies are orders of magnitude, not measurements (a link's one-way start-up including the
transfer engine's software: NVLink a few microseconds, an RDMA read over InfiniBand about ten,
a copy through host memory tens): set `latency_s` in a cluster file where you know better.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagesim.sim.specs import get_gpu, get_model, kv_bytes_per_token_per_gpu, with_kv_cache_dtype

GB = 1e9
# name -> (bandwidth per GPU in bytes/s or None: the GPU catalog's, latency in seconds)
LINK_KINDS = {
    "nvlink": (None, 3e-6),
    "infiniband": (50 * GB, 10e-6),
    "infiniband-hdr": (25 * GB, 10e-6),
    "pcie": (None, 30e-6),
}
DEFAULT_LINK = "infiniband"


@dataclass(frozen=True)
class Link:
    """A link kind, with its bandwidth per GPU (bytes/s, per direction) and one-way latency."""

    kind: str
    bandwidth: float
    latency_s: float

    def transfer_time(self, prompt_len: int, bytes_per_token_per_gpu: int) -> float:
        return self.latency_s + prompt_len * bytes_per_token_per_gpu / self.bandwidth


def make_link(kind: str = DEFAULT_LINK, gpu: str = "a100-40gb", bandwidth: float | None = None,
              latency_s: float | None = None) -> Link:
    """A link of a known kind between replicas on `gpu`; bandwidth / latency_s override the kind's."""
    if kind not in LINK_KINDS:
        raise ValueError(f"unknown link kind {kind!r}; one of: {', '.join(LINK_KINDS)}")
    kind_bandwidth, kind_latency = LINK_KINDS[kind]
    if bandwidth is None:
        spec = get_gpu(gpu)
        bandwidth = kind_bandwidth or (spec.interconnect_bandwidth if kind == "nvlink" else spec.pcie_bandwidth)
    return Link(kind, float(bandwidth), float(kind_latency if latency_s is None else latency_s))


def moved_bytes_per_token(prefill_cfg, decode_cfg) -> int:
    """KV bytes per prompt token that one link carries: the larger per-GPU share of the two sides."""
    return max(kv_bytes_per_token_per_gpu(with_kv_cache_dtype(get_model(cfg.model), cfg.kv_cache_dtype), cfg.tp)
               for cfg in (prefill_cfg, decode_cfg))


class LinkQueue:
    """One prefill replica's outgoing transfers, one at a time in the order they were asked for."""

    def __init__(self) -> None:
        self.free_at = 0.0  # when the transfer in progress (if any) ends

    def schedule(self, now: float, duration: float) -> tuple[float, float]:
        """(start, end) of a transfer asked for at now that takes duration."""
        start = max(now, self.free_at)
        self.free_at = start + duration
        return start, self.free_at
