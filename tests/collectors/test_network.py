"""Network ports from a sysfs tree laid out as the kernel lays it out
(mlx5 RDMA ports with their counters and hardware counters, a RoCE port's
own netdev, a physical and a virtual Ethernet NIC, GPUs and NICs in a PCIe
tree), which port each GPU's traffic leaves by, and its rates."""
import os
from pathlib import Path

from gpuscope.collectors.network import NetworkSampler, affinity, discover, gpu_pci_path, nearest

GPU0 = "pci0000:3a/0000:3a:00.0/0000:3b:00.0/0000:3c:00.0/0000:3d:00.0"       # under a PCIe switch
NIC0 = "pci0000:3a/0000:3a:00.0/0000:3b:00.0/0000:3c:01.0/0000:3e:00.0"       # the same switch: PIX
GPU1 = "pci0000:ae/0000:ae:00.0/0000:af:00.0"
NIC1 = "pci0000:ae/0000:ae:02.0/0000:b0:00.0"                                 # the same host bridge: PHB
GPU2 = "pci0000:17/0000:17:00.0/0000:18:00.0"                                 # NUMA 0, no NIC of its own
ETH = "pci0000:00/0000:00:1c.0/0000:01:00.0"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _device(root: Path, rel: str, numa: int) -> Path:
    d = root / "devices" / rel
    _write(d / "numa_node", str(numa))
    link = root / "bus" / "pci" / "devices" / rel.rsplit("/", 1)[-1]
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(d, link.parent), link)
    return d


def _ib(root: Path, name: str, dev: Path, rate: str, layer: str, counters: dict, hw: dict | None = None) -> Path:
    cls = root / "class" / "infiniband" / name
    cls.mkdir(parents=True)
    os.symlink(os.path.relpath(dev, cls), cls / "device")
    port = cls / "ports" / "1"
    _write(port / "rate", rate)
    _write(port / "state", "4: ACTIVE")
    _write(port / "phys_state", "5: LinkUp")
    _write(port / "link_layer", layer)
    for k, v in counters.items():
        _write(port / "counters" / k, str(v))
    for k, v in (hw or {}).items():
        _write(port / "hw_counters" / k, str(v))
    return port


def _net(root: Path, name: str, dev: Path | None, speed: int, tx: int, rx: int, state="up") -> Path:
    d = root / "class" / "net" / name
    d.mkdir(parents=True)
    if dev is not None:
        os.symlink(os.path.relpath(dev, d), d / "device")
    _write(d / "speed", str(speed))
    _write(d / "operstate", state)
    _write(d / "statistics" / "tx_bytes", str(tx))
    _write(d / "statistics" / "rx_bytes", str(rx))
    return d


def fake_sys(root: Path) -> dict[str, Path]:
    for rel, numa in ((GPU0, 0), (GPU1, 1), (GPU2, 0)):
        _device(root, rel, numa)
    nic0, nic1, eth = _device(root, NIC0, 0), _device(root, NIC1, 1), _device(root, ETH, 0)
    p0 = _ib(root, "mlx5_0", nic0, "400 Gb/sec (4X NDR)", "InfiniBand",
             {"port_xmit_data": 1000, "port_rcv_data": 2000, "port_xmit_wait": 0})
    p1 = _ib(root, "mlx5_1", nic1, "100 Gb/sec (4X EDR)", "Ethernet", {"port_xmit_data": 0, "port_rcv_data": 0},
             {"rp_cnp_handled": 10, "np_ecn_marked_roce_packets": 5, "out_of_sequence": 0, "packet_seq_err": 0,
              "local_ack_timeout_err": 0})
    (nic1 / "net").mkdir()
    (nic1 / "net" / "ens2f0np0").mkdir()                  # the RoCE port's own netdev: counted as RDMA once
    _net(root, "ens2f0np0", nic1, 100000, 0, 0)
    e = _net(root, "eno1", eth, 25000, 500, 700)
    _net(root, "docker0", None, -1, 0, 0)                  # virtual: no PCI device
    return dict(p0=p0, p1=p1, eth=e)


def test_ports_are_found_as_the_kernel_lists_them(tmp_path):
    fake_sys(tmp_path)
    ports = {p.name: p for p in discover(tmp_path)}
    assert sorted(ports) == ["eno1", "mlx5_0/1", "mlx5_1/1"]
    assert (ports["mlx5_0/1"].kind, ports["mlx5_0/1"].line_rate_bytes_per_s) == ("infiniband", 50e9)
    assert (ports["mlx5_1/1"].kind, ports["mlx5_1/1"].line_rate_bytes_per_s) == ("roce", 12.5e9)
    assert ports["eno1"].line_rate_bytes_per_s == 25e9 / 8 and ports["eno1"].numa_node == 0
    assert sorted(k for k in ports["mlx5_1/1"].counters if ":" in k) == [
        "congestion:np_ecn_marked_roce_packets", "congestion:rp_cnp_handled", "retransmits:local_ack_timeout_err",
        "retransmits:out_of_sequence", "retransmits:packet_seq_err"]
    assert not any(":" in k for k in ports["mlx5_0/1"].counters)      # no hardware counters: none, not zero


def test_each_gpu_s_nearest_port_as_nvidia_smi_topo_ranks_it(tmp_path):
    fake_sys(tmp_path)
    ports = discover(tmp_path)
    for bus_id, want in (("00000000:3D:00.0", ("mlx5_0/1", "PIX")), ("00000000:AF:00.0", ("mlx5_1/1", "PHB")),
                         ("00000000:18:00.0", ("mlx5_0/1", "NODE"))):
        path, numa = gpu_pci_path(bus_id, tmp_path)
        p, a = nearest(path, numa, ports)
        assert (p.name, a) == want, bus_id
    g = tuple(GPU0.split("/"))
    assert affinity(g, tuple("pci0000:3a/0000:3a:00.0/0000:40:00.0/0000:41:00.0/0000:42:00.0".split("/")), 0, 0) \
        == "PXB"
    assert affinity(g, tuple(NIC1.split("/")), 0, 1) == "SYS"
    assert gpu_pci_path("garbage", tmp_path) == ((), None)


def test_rates_from_the_counters_and_a_reset_gives_none(tmp_path):
    files = fake_sys(tmp_path)
    clock = [100.0]
    s = NetworkSampler(lambda: [(0, "00000000:3D:00.0"), (1, "00000000:AF:00.0"), (2, "00000000:18:00.0")],
                       tmp_path, clock=lambda: clock[0])
    assert s.scrape() == []                                  # a first reading has nothing to rate against
    assert s.describe() == ("mlx5_0/1 (infiniband 400 Gb/s, PIX): GPU 0; mlx5_1/1 (roce 100 Gb/s, PHB): GPU 1; "
                            "mlx5_0/1 (infiniband 400 Gb/s, NODE): GPU 2")
    _write(files["p0"] / "counters" / "port_xmit_data", str(1000 + 5_000_000_000))     # 4-octet words
    _write(files["p0"] / "counters" / "port_rcv_data", str(2000 + 1_000_000_000))
    _write(files["p1"] / "hw_counters" / "rp_cnp_handled", "30")
    _write(files["p1"] / "hw_counters" / "np_ecn_marked_roce_packets", "15")
    clock[0] = 102.0
    by_gpu = {x.gpu: x.values for x in s.scrape()}
    assert by_gpu[0] == by_gpu[2]                            # one port's numbers for each GPU that uses it
    assert by_gpu[0]["nic_tx_bytes_per_second"] == 10e9 and by_gpu[0]["nic_rx_bytes_per_second"] == 2e9
    assert by_gpu[0]["nic_link_util_ratio"] == 0.2 and "nic_congestion_per_second" not in by_gpu[0]
    assert by_gpu[1] == {"nic_tx_bytes_per_second": 0.0, "nic_rx_bytes_per_second": 0.0, "nic_link_util_ratio": 0.0,
                         "nic_congestion_per_second": 15.0, "nic_retransmits_per_second": 0.0}
    _write(files["p0"] / "counters" / "port_xmit_data", "7")            # the driver reloaded
    clock[0] = 103.0
    by_gpu = {x.gpu: x.values for x in s.scrape()}
    assert "nic_tx_bytes_per_second" not in by_gpu[0] and "nic_link_util_ratio" not in by_gpu[0]


def test_one_port_s_odd_files_leave_the_other_ports_read(tmp_path):
    """Found in a trial: a `rate` of "1.2.3 Gb/sec" or ". Gb/sec", a file of
    bytes that are not UTF-8, or a numa_node of "--1" raised out of
    discover(), so no port of the host was read at any interval after."""
    files = fake_sys(tmp_path)
    _write(files["p0"] / "rate", "1.2.3 Gb/sec (4X NDR)")
    (files["p1"] / "state").write_bytes(b"\xff\xfe 4: ACTIVE")
    _write(tmp_path / "devices" / ETH / "numa_node", "--1")
    _write(files["eth"] / "statistics" / "tx_bytes", "--5")
    ports = {p.name: p for p in discover(tmp_path)}
    assert sorted(ports) == ["eno1", "mlx5_0/1", "mlx5_1/1"]
    assert ports["mlx5_0/1"].line_rate_bytes_per_s is None and ports["mlx5_0/1"].active
    assert not ports["mlx5_1/1"].active                   # a state that cannot be read: not known to be up
    assert ports["eno1"].numa_node is None
    _write(files["p0"] / "rate", ". Gb/sec")
    assert {p.name: p.line_rate_bytes_per_s for p in discover(tmp_path)}["mlx5_0/1"] is None
    clock = [100.0]
    s = NetworkSampler(lambda: [(0, "00000000:3D:00.0")], tmp_path, clock=lambda: clock[0])
    s.scrape()
    clock[0] = 101.0
    (sample,) = s.scrape()
    assert sample.values["nic_tx_bytes_per_second"] == 0.0 and "nic_link_util_ratio" not in sample.values


# -- NVLink per link (collectors/nvlink.py), through the NVML collector --------------------------
def _links(up=18, tx=0, rx=0, errors=(0, 0, 0, 0)):
    return {k: {"up": k < up, "tx_kib": tx, "rx_kib": rx, "errors": list(errors)} for k in range(18)}


def test_nvlink_per_link_state_load_and_errors(tmp_path):
    from gpuscope.collectors.nvml import NvmlCollector
    from tests.fakes.nvml import FakeNvml, h200
    clock = [100.0]
    busy, down, none = h200(nvlinks=_links()), h200(nvlinks=_links(up=16)), h200()       # none: no NVLink
    c = NvmlCollector(nvml=FakeNvml([busy, down, none]), clock=lambda: clock[0])
    c.start()
    first = {s.gpu: s.values for s in c.scrape_slow().samples}
    assert first[0]["nvlink_links_active"] == 18 and first[1]["nvlink_links_active"] == 16
    assert "nvlink_links_active" not in first[2]               # a GPU without NVLink: nothing, not zero
    assert first[0]["nvlink_errors_total"] == 0 and "nvlink_link_max_util_ratio" not in first[0]
    busy.nvlinks[3]["tx_kib"] = int(12.5e9 * 10 / 1024)          # one link at half its 25 GB/s for 10 s
    busy.nvlinks[5]["errors"] = [2, 0, 1, 0]
    clock[0] = 110.0
    second = {s.gpu: s.values for s in c.scrape_slow().samples}
    assert abs(second[0]["nvlink_link_max_util_ratio"] - 0.5) < 1e-3
    assert second[0]["nvlink_errors_total"] == 3
    assert second[1]["nvlink_link_max_util_ratio"] == 0.0
