"""dcgm-exporter as the agent's source: a real HTTP server on loopback
serving recorded real expositions (tests/data/dcgm_exporter/), ones made
with prometheus_client and ones in dcgm-exporter's own format, every fault
the source must outlive, and the agent and analyzer as processes judging a
memory-bound GPU from the exporter's numbers alone."""
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from gpuscope.collectors.dcgm_exporter import DcgmExporterCollector, exporter_url
from gpuscope.collectors.dcgm_exporter_series import Pod
from gpuscope.collectors.nvml import SourceUnavailable
from gpuscope.collectors.records import HealthKind
from gpuscope.daemon import clients
from gpuscope.daemon.agent import Agent, AgentConfig
from gpuscope.daemon.sources import make_source
from tests.conftest import free_port
from tests.fakes.dcgm_exporter import BUSY_H100, FakeExporter, Gpu, exposition
from tests.helpers import wait_for

DATA = Path(__file__).resolve().parents[1] / "data" / "dcgm_exporter"
GPUSCOPE = [sys.executable, "-m", "gpuscope.daemon.cli"]


@pytest.fixture
def exporter():
    srv = FakeExporter()
    yield srv
    srv.stop()


def started(url: str, **kw) -> DcgmExporterCollector:
    c = DcgmExporterCollector(url, **kw)
    c.start()
    return c


def by_gpu(scrape) -> dict:
    return {s.gpu: s.values for s in scrape.samples}


# -- real expositions -----------------------------------------------------------------------

def test_a_t4s_default_counters_recorded_by_datadog(exporter):
    exporter.body = (DATA / "datadog_t4.prom").read_text()
    c = started(exporter.url)
    (dev,) = c.devices()
    assert (dev.gpu, dev.uuid, dev.name) == (0, "GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e", "Tesla T4")
    assert not dev.gpm_supported and dev.memory_total_bytes is None
    v = by_gpu(c.scrape())[0]
    # every unit through dcgm_fields' table: MHz, W, mJ (a counter: the cumulative value, as the catalogue's kind says)
    assert v == pytest.approx({"sm_clock_hertz": 300e6, "mem_clock_hertz": 405e6, "temp_celsius": 25.0,
                               "power_watts": 8.969, "energy_joules_total": 128996.013, "pcie_replay_total": 0.0,
                               "util_gpu_ratio": 0.0, "util_mem_ratio": 0.0, "mem_used_bytes": 0.0})
    assert c.status()["ignored"] == ["DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_XID_ERRORS",
                                     "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
                                     "DCGM_FI_DEV_VGPU_LICENSE_STATUS", "DCGM_FI_DEV_COUNT"]
    assert c.attribution(0) == ()
    c.close()


def test_device_facts_labels_and_an_old_field_name(exporter):
    exporter.body = (DATA / "datadog_t4_labels.prom").read_text()
    c = started(exporter.url)
    assert c.devices()[0].memory_total_bytes == 15109 * 1048576      # DCGM_FI_DEV_FB_TOTAL, MiB
    # DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, DCGM's older name of the clock-event reasons
    assert by_gpu(c.scrape())[0] == {"mem_total_bytes": 15109 * 1048576.0, "clock_event_reasons": 1.0}
    c.close()


def test_pod_labels_are_kept_for_attribution(exporter):
    exporter.body = (DATA / "datadog_a10g_pod.prom").read_text()
    c = started(exporter.url)
    assert c.devices()[0].gpm_supported and c.devices()[0].name == "NVIDIA A10G"
    assert by_gpu(c.scrape())[0] == {"gpm_dram_bw_util_ratio": pytest.approx(3e-6)}
    assert c.attribution(0) == (Pod(namespace="ray-llm", pod="ray-1111111", container="ray-worker"),)
    assert c.attribution(0)[0]._asdict() == {"namespace": "ray-llm", "pod": "ray-1111111", "container": "ray-worker"}
    c.close()


def test_nvidias_readme_output_empty_pods_and_a_not_supported_code(exporter):
    exporter.body = (DATA / "nvidia_readme_kubernetes.prom").read_text()
    c = started(exporter.url)
    # MEMORY_TEMP 9223372036854775794 is DCGM's NOT_SUPPORTED, not 9e18 degrees; empty pod labels are no pod
    assert by_gpu(c.scrape())[0] == {"sm_clock_hertz": 139e6, "mem_clock_hertz": 405e6}
    assert c.attribution(0) == ()
    c.close()


# -- expositions made with prometheus_client and in dcgm-exporter's format --------------------------

def prometheus_client_text(values: dict[int, dict[str, float]], pods: bool = False) -> str:
    registry = CollectorRegistry()
    names = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname"] + (
        ["container", "namespace", "pod"] if pods else [])
    gauges = {}
    for g, fields in values.items():
        for name, v in fields.items():
            if name not in gauges:
                gauges[name] = Gauge(name, f"{name} help", names, registry=registry)
            labels = [str(g), f"GPU-{g:08x}-0000-0000-0000-000000000000", f"00000000:{g + 0x18:02X}:00.0",
                      f"nvidia{g}", "NVIDIA H200", "node-7"] + ([f"c{g}", "team-a", f"job-{g}"] if pods else [])
            gauges[name].labels(*labels).set(v)
    return generate_latest(registry).decode()


def test_an_exposition_made_with_prometheus_client_eight_gpus(exporter):
    values = {g: {"DCGM_FI_DEV_GPU_UTIL": 10 * g, "DCGM_FI_PROF_DRAM_ACTIVE": g / 10,
                  "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.5, "DCGM_FI_DEV_FB_USED": 1024 * g} for g in range(8)}
    exporter.body = prometheus_client_text(values, pods=True)
    c = started(exporter.url)
    assert [d.gpu for d in c.devices()] == list(range(8)) and c.devices()[3].uuid == "GPU-00000003-0000-0000-0000-000000000000"
    got = by_gpu(c.scrape())
    for g in range(8):
        assert got[g] == pytest.approx({"util_gpu_ratio": g / 10, "gpm_dram_bw_util_ratio": g / 10,
                                        "gpm_tensor_util_ratio": 0.5, "mem_used_bytes": 1024.0 * g * 1048576})
        assert c.attribution(g) == (Pod("team-a", f"job-{g}", f"c{g}"),)
    c.close()


def test_values_move_between_scrapes_and_new_series_are_read(exporter):
    gpus = [Gpu(0), Gpu(1)]
    exporter.body = lambda: exposition(gpus)
    c = started(exporter.url)
    for util in (10, 55, 90):                               # the same lines, other numbers: the shortcut
        gpus[1].values["DCGM_FI_DEV_GPU_UTIL"] = util
        gpus[0].values["DCGM_FI_PROF_DRAM_ACTIVE"] = util / 100
        got = by_gpu(c.scrape())
        assert got[1]["util_gpu_ratio"] == pytest.approx(util / 100)
        assert got[0]["gpm_dram_bw_util_ratio"] == pytest.approx(util / 100)
    assert c._layout.skeleton is not None                   # the shortcut is taken for this format
    gpus[1].pods = [("serving", "vllm-0", "engine"), ("serving", "vllm-1", "engine")]   # pods arrive: new lines
    gpus[1].values["DCGM_FI_DEV_GPU_UTIL"] = 42
    assert by_gpu(c.scrape())[1]["util_gpu_ratio"] == pytest.approx(0.42)
    assert c.attribution(1) == (Pod("serving", "vllm-0", "engine"), Pod("serving", "vllm-1", "engine"))
    assert c.attribution(0) == ()
    gpus[1].values["DCGM_FI_DEV_GPU_UTIL"] = ""                 # left blank, as older exporters do: no reading
    got = by_gpu(c.scrape())
    assert "util_gpu_ratio" not in got[1] and got[0]["util_gpu_ratio"] == 1.0 and c._layout.skeleton is not None
    gpus[1].values["DCGM_FI_DEV_GPU_UTIL"] = "garbage"          # a value that is not a number, after the shortcut
    s = c.scrape()
    assert not s.samples and any("is not a number" in k for k in s.errors)
    c.close()


def test_a_gpus_own_series_wins_over_each_pods_share(exporter):
    # dcgm-exporter's per-process mapping of a shared GPU: GPU_UTIL split among its pods, the GPU's own beside
    own = 'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",modelName="NVIDIA H100",Hostname="n"'
    exporter.body = ("# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
                     f'{own},container="a",namespace="ns",pod="p1",pod_uid="u1"}} 30\n'
                     f'{own},container="b",namespace="ns",pod="p2",pod_uid="u2"}} 50\n'
                     f"{own}}} 80\n")
    c = started(exporter.url)
    assert by_gpu(c.scrape())[0] == {"util_gpu_ratio": pytest.approx(0.8)}
    assert [p.pod for p in c.attribution(0)] == ["p1", "p2"]
    # several pods on one GPU: named after none (found in a trial: the first was, and `--pod p2` found nothing)
    assert c.devices()[0].attribution is None
    c.close()


def test_without_pod_labels_the_kubelet_names_a_gpus_pod(exporter):
    """An exporter run without its Kubernetes mapping labels no pod; the
    kubelet's pod-resources do, by GPU UUID (found in a trial: --kubelet-socket
    was ignored with this source)."""
    from gpuscope.collectors.attribution import PodRef

    class Kubelet:
        generation = 1
        held = {"gpu-a": (PodRef("ml", "trainer-1", "main"),), "gpu-b": (PodRef("ml", "x", "a"), PodRef("ml", "y", "b"))}

        def holders(self, uuid, index):
            return self.held.get(uuid.lower(), ())

    exporter.body = ("# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
                     'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",modelName="NVIDIA H100",Hostname="n"} 80\n'
                     'DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b",modelName="NVIDIA H100",Hostname="n"} 80\n')
    c = started(exporter.url)
    assert [d.attribution for d in c.devices()] == [None, None]
    c.pods = k = Kubelet()
    a0, a1 = (d.attribution for d in c.devices())
    assert (a0.namespace, a0.pod, a0.container) == ("ml", "trainer-1", "main") and a1 is None   # shared: unnamed
    assert c.devices()[0] is c.devices()[0]                         # asked again only when the kubelet's answer moved
    k.held = {}
    k.generation = 2
    assert [d.attribution for d in c.devices()] == [None, None]
    c.close()


def test_the_catalogue_decides_the_kind_not_the_exposition(exporter):
    # dcgm-exporter before 3.3 declared the PCIe byte rates `counter`; they are B/s, read as they are
    exporter.body = ("# TYPE DCGM_FI_PROF_PCIE_TX_BYTES counter\n"
                     'DCGM_FI_PROF_PCIE_TX_BYTES{gpu="0",UUID="GPU-a"} 5000000\n'
                     "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"
                     'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0",UUID="GPU-a"} 7000\n'
                     "# TYPE DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP_NS gauge\n"
                     'DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP_NS{gpu="0",UUID="GPU-a"} 2500000000\n')
    c = started(exporter.url)
    assert by_gpu(c.scrape())[0] == pytest.approx({"gpm_pcie_tx_bytes_per_second": 5e6, "energy_joules_total": 7.0,
                                                   "throttle_sw_power_cap_seconds_total": 2.5})
    c.close()


# -- faults: each degrades this source only, with a status, and the scrapes go on ---------------------

def test_unreachable_at_start_is_refused_with_what_to_do():
    url = f"http://127.0.0.1:{free_port()}/metrics"
    with pytest.raises(SourceUnavailable, match=r"dcgm-exporter: http://127.0.0.1:\d+/metrics: .*refused.*"
                                                r"curl http://127.0.0.1:\d+/metrics.*--source nvml"):
        started(url)


@pytest.mark.parametrize("body,words", [
    ("", "answered nothing"),
    ("<html><body>Sign in</body></html>\n", "answered HTML"),
    ('DCGM_FI_DEV_GPU_UTIL{gpu="0"} 4', "ends mid-line"),
    ("# HELP x\nnode_load1 0.5\n", "no DCGM_FI_* series of a GPU in the answer (ignored: node_load1)"),
])
def test_what_is_not_an_exporter_is_refused_at_start(exporter, body, words):
    exporter.body = body
    with pytest.raises(SourceUnavailable, match="dcgm-exporter: ") as e:
        started(exporter.url)
    assert words in str(e.value)


@pytest.mark.parametrize("fault,words", [
    ("500", "answered HTTP 500"),
    ("html", "answered HTML"),
    ("cut", "http://127.0.0.1"),
    ("slow", "no whole answer within 0.3 s"),
    ("trickle", "no whole answer within 0.3 s"),
    ("half", "ends mid-line"),
    ("garbage", "line 2: '{\"error\": 1}' is neither a metric sample nor a comment"),
    ("two hosts", "a second host, Hostname='node-b'"),
    ("another host", "this answer is Hostname='node-b''s GPUs, the ones before were 'gpu-node-1''s"),
])
def test_each_fault_is_a_status_and_the_next_answer_is_read(exporter, fault, words):
    gpus = [Gpu(0), Gpu(1)]
    good = exposition(gpus)
    exporter.body = good
    c = started(exporter.url, timeout_s=0.3)
    if fault == "half":
        exporter.body = good[:len(good) * 2 // 3].rsplit("} ", 1)[0] + "} 4"     # "45" cut to "4"
    elif fault == "garbage":
        exporter.body = good.replace("# TYPE DCGM_FI_DEV_SM_CLOCK gauge\n", '{"error": 1}\n', 1)
    elif fault == "two hosts":
        exporter.body = good + exposition([Gpu(2)], host="node-b")
    elif fault == "another host":                          # a Service balancing over nodes' exporters
        exporter.body = exposition(gpus, host="node-b")
    else:
        exporter.fault = fault
    t0 = time.monotonic()
    bad = c.scrape()
    assert time.monotonic() - t0 < 2.0                    # one deadline for the whole answer
    assert not bad.samples
    (key,) = bad.errors
    assert key.startswith("dcgm-exporter: ") and words in key, key
    assert [(h.gpu, h.kind) for h in bad.health] == [(0, HealthKind.SOURCE_ERROR), (1, HealthKind.SOURCE_ERROR)]
    assert words in bad.health[0].detail and "resume" in bad.health[0].detail
    again = c.scrape()                                    # still failing: counted, not said again
    assert again.errors == {key: 1} and not again.health and c.status()["error"]
    exporter.fault, exporter.body = None, good
    back = c.scrape()
    assert sorted(by_gpu(back)) == [0, 1] and not back.errors
    assert [(h.gpu, h.kind) for h in back.health] == [(0, HealthKind.RECOVERED), (1, HealthKind.RECOVERED)]
    assert c.status()["error"] is None
    c.close()


def test_connection_refused_after_start_then_the_exporter_comes_back(exporter):
    exporter.body = exposition([Gpu(0)])
    c = started(exporter.url)
    exporter.stop()
    down = c.scrape()
    assert not down.samples and "refused" in next(iter(down.errors))
    assert [h.kind for h in down.health] == [HealthKind.SOURCE_ERROR]
    exporter.start()                                      # the same port again
    back = c.scrape()
    assert by_gpu(back)[0]["util_gpu_ratio"] == 1.0 and [h.kind for h in back.health] == [HealthKind.RECOVERED]
    c.close()


def test_a_gpu_missing_from_one_answer_is_that_gpus_status_only(exporter):
    gpus = [Gpu(0), Gpu(1), Gpu(2)]
    exporter.body = lambda: exposition(gpus)
    c = started(exporter.url)
    gone = gpus.pop(1)
    s = c.scrape()
    assert sorted(by_gpu(s)) == [0, 2]
    assert s.errors == {f"dcgm-exporter: GPU 1 ({gone.uuid}) missing from its answer": 1}
    assert [(h.gpu, h.kind) for h in s.health] == [(1, HealthKind.SOURCE_ERROR)]
    assert [d.gpu for d in c.devices()] == [0, 1, 2] and c.status()["gpus_missing"] == [1]
    s = c.scrape()
    assert not s.health and len(s.errors) == 1
    gpus.insert(1, gone)
    s = c.scrape()
    assert sorted(by_gpu(s)) == [0, 1, 2] and [(h.gpu, h.kind) for h in s.health] == [(1, HealthKind.RECOVERED)]
    c.close()


def test_a_gpu_new_to_the_agent_joins_its_devices(exporter):
    gpus = [Gpu(0)]
    exporter.body = lambda: exposition(gpus)
    c = started(exporter.url)
    gpus.append(Gpu(1))
    assert sorted(by_gpu(c.scrape())) == [0, 1] and [d.gpu for d in c.devices()] == [0, 1]
    c.close()


def test_values_that_change_slower_than_the_agent_scrapes_are_said_once(exporter):
    """dcgm-exporter's -c (30 s by default) longer than the agent's tick: the
    samples between repeat one reading."""
    gpus = [Gpu(0), Gpu(1)]
    exporter.body = lambda: exposition(gpus)
    now = [1000.0]
    c = started(exporter.url, clock=lambda: now[0])
    said = []
    for i in range(1, 40):
        now[0] += 1.0
        if i % 5 == 0:                                    # the exporter refreshes every 5 s
            gpus[0].values["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] += 2500
        s = c.scrape()
        assert len(s.samples) == 2                        # the repeats are still sampled
        said += [(i, k) for k in s.errors] + [(i, h.kind, h.gpu) for h in s.health]
    assert c.status()["refresh_s"] == pytest.approx(5.0) and c.status()["values_repeat"]
    when = said[0][0]
    assert said == [(when, "dcgm-exporter: values refresh every ~5 s, slower than the agent samples: run it with "
                           "-c 1000"), (when, HealthKind.SOURCE_ERROR, 0), (when, HealthKind.SOURCE_ERROR, 1)]
    assert when == 20                                     # three whole runs of one reading seen: judged


def test_values_that_change_every_scrape_are_not_said(exporter):
    gpus = [Gpu(0)]
    exporter.body = lambda: exposition(gpus)
    now = [1000.0]
    c = started(exporter.url, clock=lambda: now[0])
    for _ in range(20):
        now[0] += 1.0
        gpus[0].values["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] += 500
        s = c.scrape()
        assert not s.errors and not s.health
    assert c.status()["refresh_s"] == pytest.approx(1.0) and not c.status()["values_repeat"]


# -- addresses and the command line -----------------------------------------------------------------

@pytest.mark.parametrize("address,url", [
    ("127.0.0.1:9500", "http://127.0.0.1:9500/metrics"),
    ("gpu-node-3", "http://gpu-node-3:9400/metrics"),
    ("http://10.0.0.7:9400", "http://10.0.0.7:9400/metrics"),
    ("https://exporter.gpu.svc/metrics", "https://exporter.gpu.svc/metrics"),
    ("http://127.0.0.1:9400/custom/path?collect[]=x", "http://127.0.0.1:9400/custom/path?collect[]=x"),
    ("[::1]:9400", "http://[::1]:9400/metrics"),
])
def test_addresses(address, url):
    assert exporter_url(address) == url


@pytest.mark.parametrize("address", ["", "ftp://x/metrics", "http://:9400", "node:notaport"])
def test_bad_addresses(address):
    with pytest.raises(ValueError, match="not an exporter's address"):
        exporter_url(address)


def test_make_source_starts_it_and_names_the_url(exporter):
    exporter.body = exposition([Gpu(0), Gpu(1)])
    collector, source = make_source(f"dcgm-exporter:127.0.0.1:{exporter.port}", 1.0, allow_fallback=False)
    try:
        assert source == f"dcgm-exporter:{exporter.url}" and [d.gpu for d in collector.devices()] == [0, 1]
        collector.start()                             # already started: the agent's start does nothing more
        assert exporter.requests == 1
    finally:
        collector.close()


def test_the_agent_keeps_ticking_through_an_exporter_outage(exporter):
    exporter.body = exposition([Gpu(0), Gpu(1)])
    agent = Agent(AgentConfig(host="h", source="dcgm-exporter", interval_s=0.1),
                  DcgmExporterCollector(exporter.url, timeout_s=0.3))
    agent.start()
    try:
        wait_for(lambda: agent.samples >= 6)
        exporter.fault = "500"
        ticks = agent.ticks
        wait_for(lambda: agent.ticks >= ticks + 5)
        assert any("answered HTTP 500" in k for k in agent.errors)
        assert [h.kind for h in agent.health] == [HealthKind.SOURCE_ERROR] * 2
        # said where people look (found in a trial: status showed "dcgm-exporter (profiling)" through it)
        assert all(d.source.startswith("dcgm-exporter (not answering: ") and "HTTP 500" in d.source
                   for d in agent.devices())
        samples = agent.samples
        exporter.fault = None
        wait_for(lambda: agent.samples >= samples + 6)
        assert [h.kind for h in agent.health][-2:] == [HealthKind.RECOVERED] * 2
        assert {d.source for d in agent.devices()} == {"dcgm-exporter (profiling)"}
    finally:
        agent.stop()


# -- end to end: agent and analyzer as processes -------------------------------------------------------

def test_agent_on_an_exporter_feeds_an_analyzer_that_finds_memory_bound(exporter, tmp_path):
    """`gpuscope agent --source dcgm-exporter:URL` and `gpuscope analyzer`, each
    its own process: an exporter whose numbers say LLM decode (HBM busy,
    tensor pipes idle, SMs occupied) becomes memory-bound findings."""
    gpus = [Gpu(0, pods=[("ml", "trainer-7", "main")]),
            Gpu(1, values={**BUSY_H100, "DCGM_FI_DEV_GPU_UTIL": 0, "DCGM_FI_PROF_SM_ACTIVE": 0.0,
                                   "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.0, "DCGM_FI_PROF_DRAM_ACTIVE": 0.0,
                                   "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.0, "DCGM_FI_DEV_MEM_COPY_UTIL": 0},
                            pods=[("llm", "decode-7f9c", "vllm")])]
    energy = [0]

    def body():
        energy[0] += 400_000                              # the energy counter moves: the values change each scrape
        for g in gpus:
            g.values["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] = 3_000_000_000 + energy[0]
        return exposition(gpus)
    exporter.body = body
    aport, gport = free_port(), free_port()
    analyzer = subprocess.Popen(GPUSCOPE + ["--log-level", "warning", "analyzer", "--insecure", "--db",
                                            str(tmp_path / "e.duckdb"), "--listen", f"127.0.0.1:{aport}",
                                            "--window", "1", "--duration", "90s"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    agent = subprocess.Popen(GPUSCOPE + ["--log-level", "warning", "agent", "--insecure", "--source",
                                         f"dcgm-exporter:127.0.0.1:{exporter.port}", "--analyzer",
                                         f"127.0.0.1:{aport}", "--listen", f"127.0.0.1:{gport}", "--interval", "0.2",
                                         "--host", "k8s-gpu-node", "--serving-interval", "0", "--duration", "90s"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)

    def judged():
        if agent.poll() is not None or analyzer.poll() is not None:
            pytest.fail(f"a process ended: {[p.communicate() for p in (agent, analyzer) if p.poll() is not None]}")
        try:
            return [f for f in clients.findings(f"127.0.0.1:{aport}", host="k8s-gpu-node", open_only=True)
                    if f["windows"] >= 3]
        except clients.ClientError:                   # the analyzer is still starting
            return []
    try:
        found = wait_for(judged, timeout=60, step=0.5)
        verdicts = {f["gpu"]: f["verdict"] for f in found}
        assert verdicts[0] == "memory-bound", found
        assert verdicts.get(1, "idle") == "idle", found
        memory = next(f for f in found if f["gpu"] == 0)
        assert memory["evidence"]["dram_bw_util_ratio"] == pytest.approx(0.88, abs=0.02)
        # whose it is: the exporter lists no processes, its pod labels say (found in a trial: no finding did)
        assert memory["job"] == "pod ml/trainer-7 container main" and memory["attribution"]["pod"] == "trainer-7"
        assert [f["id"] for f in clients.findings(f"127.0.0.1:{aport}", pod="ml/trainer-7")] == [memory["id"]]
        # ... and so do queries pooled by pod or job (found in a trial: they left out every exporter GPU)
        now = time.time()
        q = clients.query(f"127.0.0.1:{aport}", "util_gpu_ratio", "", None, now - 300, now, "mean", 0, group_by="pod")
        assert [(s["group"], s["gpus"]) for s in q["series"]] == [("llm/decode-7f9c", 1), ("ml/trainer-7", 1)]
        q = clients.query(f"127.0.0.1:{aport}", "util_gpu_ratio", "", None, now - 300, now, "mean", 0, group_by="job")
        assert "k8s-gpu-node pod ml/trainer-7 container main" in [s["group"] for s in q["series"]]
        st = clients.status(f"127.0.0.1:{gport}")
        assert st["source"] == f"dcgm-exporter:{exporter.url}" and [d["gpu"] for d in st["devices"]] == [0, 1]
        assert st["devices"][0]["name"] == "NVIDIA H100 80GB HBM3"
    finally:
        for p in (agent, analyzer):
            p.send_signal(2)
        outs = [p.communicate(timeout=30) for p in (agent, analyzer)]
    assert agent.returncode == 0 and analyzer.returncode == 0, outs
    assert json.dumps(outs)                               # the processes' words, when an assert above fails
