"""The host link of a GPU and its peak, so a copy's bandwidth can be said as
a fraction of what the link can do ("2.5 GB/s = 4 % of a Gen5 ×16 link").

The link comes from the agent's device info (NVML's current PCIe generation
and width) when the analyzer has it; a trace alone does not say, so for a
trace read offline the device's name stands in (the form factor's usual
link), and the summary says which."""
from __future__ import annotations

# PCIe payload bandwidth per lane per direction, bytes/s, by generation
# (after 8b/10b or 128b/130b encoding).
PCIE_LANE_BYTES_PER_S = {1: 0.25e9, 2: 0.5e9, 3: 0.985e9, 4: 1.969e9, 5: 3.938e9, 6: 7.563e9}

# The host link each GPU ships with (SXM and PCIe cards alike), by name.
# GH200/GB200 reach their host over NVLink-C2C, not PCIe: no PCIe link to judge by.
_NOT_PCIE = ("GH200", "GB200", "GB300")
_BY_NAME = (("H200", 5, 16), ("H100", 5, 16), ("H800", 5, 16), ("A100", 4, 16),
            ("A800", 4, 16), ("L40", 4, 16), ("L4", 4, 16), ("A10", 4, 16), ("V100", 3, 16), ("T4", 3, 16))


def pcie_link(generation: int | None = None, width: int | None = None, device_name: str | None = None) -> dict | None:
    """{generation, width, peak_bytes_per_s (per direction), source} or None."""
    if generation in PCIE_LANE_BYTES_PER_S and width and 0 < width <= 64:
        return dict(generation=generation, width=width, peak_bytes_per_s=PCIE_LANE_BYTES_PER_S[generation] * width,
                    source="device info")
    if device_name and any(m in device_name for m in _NOT_PCIE):
        return None
    for marker, gen, lanes in _BY_NAME:
        if device_name and marker in device_name:
            return dict(generation=gen, width=lanes, peak_bytes_per_s=PCIE_LANE_BYTES_PER_S[gen] * lanes,
                        source=f"link assumed from the device name, {device_name[:64]}")
    return None


def describe(link: dict) -> str:
    return f"a Gen{link['generation']} ×{link['width']} link"
