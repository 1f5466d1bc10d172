"""communication-bound: moving data (PCIe, NVLink) is the limit.

Bulk host<->device copies and collectives show up as interconnect traffic of
hundreds of MiB/s or more while the SMs wait (kernel launches alone move tens
of MiB/s). The host CPU that a copy burns (pinned staging) is part of the
transfer, so it does not make the window host-bound. A link near its peak is
communication-bound even when the SMs are also busy (collectives run on SMs).
"""
from __future__ import annotations

import numpy as np

from gpuscope.collectors import human

from ..features import Window
from .common import COMMUNICATION, Features, busy, known, pct, ramp, traffic

VERDICT, ALTERNATIVES = COMMUNICATION, ()

# What to try: the SMs wait on a link, so overlap, shorten or move less.
TRY = (
    "overlap collectives with compute (XLA: --xla_gpu_enable_latency_hiding_scheduler=true)",
    "check the path: `nvidia-smi topo -m` and NCCL_DEBUG=INFO show whether traffic takes PCIe or the host "
    "where NVLink was expected",
    "move less: fewer tensor-parallel ranks or larger per-GPU batches; pinned host memory for host copies",
)


def score(f: Features) -> np.ndarray:
    waiting = 1.0 - busy(f)
    # a link near its line rate: the GPU's PCIe, or the network port its traffic leaves by (collectives
    # between hosts cross PCIe too, but a 400 Gb/s port fills before a Gen5 x16 link does)
    saturated = np.maximum.reduce([ramp(f.get("pcie_link_util_ratio"), 0.5, 0.8),
                                   ramp(f.get("nic_link_util_ratio"), 0.5, 0.8),
                                   ramp(f.get("nvlink_link_max_util_ratio"), 0.5, 0.8)])
    s = np.maximum(traffic(f) * waiting, saturated)
    return np.where(known(f.get("interconnect_bytes_per_second")) | known(f.get("nic_link_util_ratio")), s, np.nan)


def describe(w: Window) -> str:
    pcie, nvl = w.get("pcie_bytes_per_second"), w.get("nvlink_bytes_per_second")
    link = w.get("pcie_link_util_ratio")
    of_link = f" = {pct(link)} of the link's peak per direction" if pcie is not None and link is not None else ""
    nic, nic_link = w.get("nic_bytes_per_second"), w.get("nic_link_util_ratio")
    busiest = w.get("nvlink_link_max_util_ratio")
    on_link = f" (busiest link {pct(busiest)} of its peak)" if busiest is not None else ""
    parts = [f"PCIe {human.value('bytes/s', pcie)}{of_link}" if pcie is not None else None,
             f"NVLink {human.value('bytes/s', nvl)}{on_link}" if nvl else None]
    said = " + ".join(p for p in parts if p) + " moving while the GPU computes little"
    if nic and nic_link is not None:
        said += (f"; its network port {human.value('bytes/s', nic)} = {pct(nic_link)} of its line rate"
                 + (f", {w.get('nic_congestion_per_second'):,.0f} congestion notifications/s"
                    if w.get("nic_congestion_per_second") else ""))
    return said
