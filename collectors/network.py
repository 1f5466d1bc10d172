"""The host's network ports and what each GPU sends through its nearest one,
from sysfs (docs/jobs.md, network counters).

Ports:
- RDMA (InfiniBand, and RoCE on Ethernet), one per device port under
  /sys/class/infiniband/DEV/ports/N: `rate` ("400 Gb/sec (4X NDR)"), `state`
  ("4: ACTIVE"), `link_layer`, counters/port_xmit_data and port_rcv_data (in
  units of 4 octets, as the InfiniBand spec counts them), and the mlx5
  hardware counters where the driver has them: congestion notifications
  (hw_counters/rp_cnp_handled: this port's sender was told to slow down;
  np_ecn_marked_roce_packets: packets that arrived ECN-marked) and
  retransmissions (out_of_sequence, packet_seq_err, local_ack_timeout_err).
- Ethernet NICs under /sys/class/net that are PCI devices (not virtual) and
  not an RDMA device's own netdev (counted once, as RDMA): `speed` (Mb/s),
  `operstate`, statistics/tx_bytes and rx_bytes.

Which port a GPU's traffic leaves by: the nearest in the PCIe tree, as
`nvidia-smi topo -m` ranks it (NVML's topology calls compare GPUs with GPUs
only, so the tree is read from sysfs: each device's path under
/sys/devices): PIX (one PCIe switch between them), PXB (several bridges,
no host bridge), PHB (the same host bridge), NODE (the same NUMA node),
SYS (across the SMP interconnect). GPUDirect RDMA needs PIX or PXB; a
GPU whose nearest port is PHB or farther stages through host memory.

Counters are read as the kernel writes them (decimal text); a counter that
goes backwards (a driver reload) gives no rate for that interval. Missing
is not zero: a port without hardware counters reports no congestion.
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Iterable

from . import catalogue as cat
from .records import GpuSample

AFFINITY = ("PIX", "PXB", "PHB", "NODE", "SYS")      # nearest first
CONGESTION = ("rp_cnp_handled", "np_ecn_marked_roce_packets")
RETRANSMITS = ("out_of_sequence", "packet_seq_err", "local_ack_timeout_err")
_RATE = re.compile(r"^\s*([\d.]+)\s*Gb/sec")


@dataclass
class Port:
    name: str                          # mlx5_0/1, eth0
    kind: str                          # infiniband, roce, ethernet
    pci: tuple[str, ...]               # its device's path under /sys/devices, split
    numa_node: int | None
    line_rate_bytes_per_s: float | None
    counters: dict[str, Path] = field(default_factory=dict)   # tx, rx (bytes), congestion, retransmits: files
    scale: dict[str, float] = field(default_factory=dict)     # a counter's unit in bytes (IB data: 4 octets)
    active: bool = True


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):       # a driver's file that is not text is as good as missing
        return None


_INT = re.compile(r"^-?[0-9]+$")


def _int(path: Path) -> int | None:
    text = _read(path)
    return int(text) if text is not None and _INT.match(text) else None


def _line_rate(text: str | None) -> float | None:
    """An RDMA port's `rate` ("400 Gb/sec (4X NDR)") in bytes per second;
    None for anything else (one port's odd file must not hide the others)."""
    m = _RATE.match(text or "")
    try:
        return float(m.group(1)) * 1e9 / 8 if m else None
    except ValueError:
        return None


def _pci_path(device_link: Path, sys_root: Path) -> tuple[str, ...]:
    """A PCI device's path below /sys/devices, as components."""
    try:
        real = Path(os.path.realpath(device_link))
        rel = real.relative_to(Path(os.path.realpath(sys_root / "devices")))
    except (OSError, ValueError):
        return ()
    return tuple(rel.parts)


def _numa(device_link: Path) -> int | None:
    n = _int(device_link / "numa_node")
    return n if n is not None and n >= 0 else None


def discover(sys_root: str | os.PathLike = "/sys") -> list[Port]:
    """The host's RDMA ports and physical Ethernet NICs."""
    root = Path(sys_root)
    ports: list[Port] = []
    rdma_netdevs: set[str] = set()
    ib = root / "class" / "infiniband"
    for dev in sorted(ib.iterdir()) if ib.is_dir() else ():
        device = dev / "device"
        for netdev in (device / "net").iterdir() if (device / "net").is_dir() else ():
            rdma_netdevs.add(netdev.name)
        for p in sorted((dev / "ports").iterdir(), key=lambda p: p.name) if (dev / "ports").is_dir() else ():
            layer = (_read(p / "link_layer") or "InfiniBand").lower()
            port = Port(f"{dev.name}/{p.name}", "roce" if layer == "ethernet" else "infiniband",
                        _pci_path(device, root), _numa(device),
                        _line_rate(_read(p / "rate")),
                        active="ACTIVE" in (_read(p / "state") or ""))
            for key, name in (("tx", "port_xmit_data"), ("rx", "port_rcv_data")):
                if (p / "counters" / name).exists():
                    port.counters[key], port.scale[key] = p / "counters" / name, 4.0
            for key, names in (("congestion", CONGESTION), ("retransmits", RETRANSMITS)):
                for name in names:
                    if (p / "hw_counters" / name).exists():
                        port.counters[f"{key}:{name}"] = p / "hw_counters" / name
            ports.append(port)
    net = root / "class" / "net"
    for dev in sorted(net.iterdir()) if net.is_dir() else ():
        device = dev / "device"
        if not device.exists() or dev.name in rdma_netdevs:
            continue
        speed = _int(dev / "speed")
        port = Port(dev.name, "ethernet", _pci_path(device, root), _numa(device),
                    speed * 1e6 / 8 if speed and speed > 0 else None,
                    active=(_read(dev / "operstate") or "") == "up")
        for key, name in (("tx", "tx_bytes"), ("rx", "rx_bytes")):
            port.counters[key], port.scale[key] = dev / "statistics" / name, 1.0
        ports.append(port)
    return ports


def affinity(gpu: tuple[str, ...], port: tuple[str, ...], gpu_numa: int | None, port_numa: int | None) -> str:
    """How far apart two PCI devices are, in `nvidia-smi topo -m`'s words."""
    if not gpu or not port:
        return "SYS"
    if gpu[0] != port[0]:                         # different host bridges (pci0000:XX)
        return "NODE" if gpu_numa is not None and gpu_numa == port_numa else "SYS"
    common = 0
    for a, b in zip(gpu, port):
        if a != b:
            break
        common += 1
    if common <= 1:                               # only the host bridge in common: through it
        return "PHB"
    # under one switch: each side one downstream port below the shared upstream port
    return "PIX" if len(gpu) - common <= 2 and len(port) - common <= 2 else "PXB"


def sysfs_bus_id(pci) -> str:
    """NVML's or DCGM's bus id ("00000000:3B:00.0", bytes in older bindings)
    as sysfs names the device ("0000:3b:00.0"); "" when the source would not say."""
    raw = getattr(pci, "busId", b"") if pci is not None else b""
    text = (raw.decode("ascii", "replace") if isinstance(raw, bytes) else str(raw)).strip().strip("\x00").lower()
    dom, _, rest = text.partition(":")
    try:
        return f"{int(dom, 16):04x}:{rest}" if rest and dom else ""
    except ValueError:
        return ""


def gpu_pci_path(bus_id: str, sys_root: str | os.PathLike = "/sys") -> tuple[tuple[str, ...], int | None]:
    """A GPU's path in the PCIe tree and its NUMA node, from its bus id (either form)."""
    name = sysfs_bus_id(SimpleNamespace(busId=bus_id))
    if not name:
        return (), None
    link = Path(sys_root) / "bus" / "pci" / "devices" / name
    return _pci_path(link, Path(sys_root)), _numa(link)


def nearest(gpu: tuple[str, ...], gpu_numa: int | None, ports: Iterable[Port]) -> tuple[Port, str] | None:
    """The active port nearest the GPU, and how near; None without one."""
    best = None
    for p in ports:
        if not p.active:
            continue
        a = affinity(gpu, p.pci, gpu_numa, p.numa_node)
        if best is None or AFFINITY.index(a) < AFFINITY.index(best[1]):
            best = (p, a)
    return best


class NetworkSampler:
    """Each GPU's nearest port's traffic as per-GPU samples: the analyzer
    sets a GPU's communication against the link its traffic takes."""

    def __init__(self, gpus: Callable[[], list[tuple[int, str]]], sys_root: str | os.PathLike = "/sys",
                 clock: Callable[[], float] = time.time, rediscover_s: float = 300.0):
        self.gpus, self.sys_root, self.clock, self.rediscover_s = gpus, Path(sys_root), clock, rediscover_s
        self.ports: list[Port] = []
        self.by_gpu: dict[int, tuple[Port, str]] = {}
        self._last: dict[str, tuple[float, dict[str, int]]] = {}
        self._found_at: float | None = None

    def _rediscover(self, now: float) -> None:
        self.ports = discover(self.sys_root)
        self.by_gpu = {}
        for index, bus_id in self.gpus():
            if not bus_id:
                continue
            path, numa = gpu_pci_path(bus_id, self.sys_root)
            hit = nearest(path, numa, self.ports)
            if hit is not None:
                self.by_gpu[index] = hit
        self._found_at = now

    def scrape(self) -> list[GpuSample]:
        now = self.clock()
        if self._found_at is None or now - self._found_at >= self.rediscover_s:
            self._rediscover(now)
        rates = {p.name: self._rates(p, now) for p in {id(p): p for p, _ in self.by_gpu.values()}.values()}
        return [GpuSample(gpu, now, rates[p.name]) for gpu, (p, _) in sorted(self.by_gpu.items()) if rates[p.name]]

    def _rates(self, p: Port, now: float) -> dict[str, float]:
        reading = {k: v for k, path in p.counters.items() if (v := _int(path)) is not None}
        last = self._last.get(p.name)
        self._last[p.name] = (now, reading)
        if last is None or now <= last[0]:
            return {}
        dt, before = now - last[0], last[1]
        out: dict[str, float] = {}

        def rate(keys: list[str], scale: float = 1.0) -> float | None:
            deltas = [reading[k] - before[k] for k in keys if k in reading and k in before]
            if not deltas or any(d < 0 for d in deltas):      # a counter reset: no rate this time
                return None
            return sum(deltas) * scale / dt
        for key in ("tx", "rx"):
            v = rate([key], p.scale.get(key, 1.0))
            if v is not None:
                out[f"nic_{key}_bytes_per_second"] = v
        if p.line_rate_bytes_per_s and "nic_tx_bytes_per_second" in out and "nic_rx_bytes_per_second" in out:
            # each direction has its own lanes: the busier one is what saturates
            out["nic_link_util_ratio"] = max(out["nic_tx_bytes_per_second"],
                                             out["nic_rx_bytes_per_second"]) / p.line_rate_bytes_per_s
        for key in ("congestion", "retransmits"):
            v = rate([k for k in p.counters if k.startswith(f"{key}:")])
            if v is not None:
                out[f"nic_{key}_per_second"] = v
        # a rate past what any port does is a misread line rate or counter: dropped, never sent (the
        # analyzer would refuse the batch)
        return {k: v for k, v in out.items() if v <= cat.ceiling(cat.BY_NAME[k])}

    def describe(self) -> str:
        """For status and the start-up log: each GPU's port and how near."""
        if not self.by_gpu:
            return "no active RDMA port or NIC near a GPU" if self._found_at is not None else "not read yet"
        by_port: dict[str, list[int]] = {}
        for gpu, (p, a) in sorted(self.by_gpu.items()):
            rate = f" {p.line_rate_bytes_per_s * 8 / 1e9:g} Gb/s" if p.line_rate_bytes_per_s else ""
            by_port.setdefault(f"{p.name} ({p.kind}{rate}, {a})", []).append(gpu)
        return "; ".join(f"{k}: GPU {','.join(map(str, v))}" for k, v in by_port.items())
