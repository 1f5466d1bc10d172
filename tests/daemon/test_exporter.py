"""Prometheus /metrics of an agent and of the analyzer, scraped over real
HTTP(S) and parsed with prometheus_client's parser: names and units by the
conventions, missing values absent (not 0), bounded series, TLS beyond
loopback."""
import ssl
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuscope.collectors.nvml import NvmlCollector
from gpuscope.collectors.records import GpuSample, ProcessRecord, Scrape
from gpuscope.daemon.agent import Agent, AgentConfig
from gpuscope.daemon.exporter import AgentCollector, FleetCollector, registry, serve
from gpuscope.security import certs
from gpuscope.security.tls import tls_files
from tests.conftest import free_port
from tests.fakes.nvml import FakeNvml, h200
from tests.helpers import wait_for


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


@pytest.fixture
def agent():
    a = Agent(AgentConfig(host="h", interval_s=0.1, slow_interval_s=1.0),
              NvmlCollector(nvml=FakeNvml([h200(util_gpu=95, power_mw=650_000), h200(util_gpu=3)])))
    a.start()
    wait_for(lambda: len(a.latest) == 2 and "energy_joules_total" in a.latest[0])     # the slow path read too
    yield a
    a.stop()


def test_an_agent_exports_each_gpu_and_its_own_health(agent):
    server = serve(f"127.0.0.1:{free_port()}", registry(AgentCollector(agent)))
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10).read().decode()
    finally:
        server.shutdown()
    fams = _families(text)
    power = fams["gpuscope_gpu_power_watts"]
    assert power.type == "gauge" and {s.labels["gpu"] for s in power.samples} == {"0", "1"}
    assert set(power.samples[0].labels) == {"gpu", "uuid", "model"}
    by_gpu = {s.labels["gpu"]: round(s.value, 6) for s in fams["gpuscope_gpu_util_gpu_ratio"].samples}
    assert by_gpu == {"0": 0.95, "1": 0.03}
    assert fams["gpuscope_gpu_energy_joules"].type == "counter"           # `_total` in the exposition
    assert "gpuscope_gpu_energy_joules_total" in text
    assert fams["gpuscope_agent_samples"].samples[0].value > 0
    assert fams["process_cpu_seconds"].type == "counter" and fams["process_resident_memory_bytes"].samples[0].value > 0
    assert fams["gpuscope_agent_send_lag_seconds"].samples[0].value == 0      # no analyzer: nothing sent
    assert not any("pid" in s.labels for f in fams.values() for s in f.samples)
    # profiling metrics by what they measure (DCGM's names), whatever source read them
    assert "gpuscope_gpu_sm_active_ratio" in fams and "gpuscope_gpu_dram_active_ratio" in fams
    assert not any(name.startswith("gpuscope_gpu_gpm_") for name in fams)
    # each name a dashboard shows is one `gpuscope query --metric` takes (found in a trial: none was)
    from gpuscope.collectors import catalogue as cat
    shown = [n for n in fams if n.startswith("gpuscope_gpu_") and n not in ("gpuscope_gpu_up",
                                                                            "gpuscope_gpu_sample_age_seconds")]
    assert shown and all(cat.find(n) is not None and cat.prometheus_name(cat.find(n)) == n for n in shown)
    assert "gpuscope_gpu_verdict" not in fams                          # no judge wired in: no verdict


def test_an_agent_says_each_gpus_verdict_by_the_analyzers_rules():
    from gpuscope.analyzers.offline import judge_newest
    busy = h200(util_gpu=97, util_mem=80, power_mw=600_000,
                gpm_values={1: 97.0, 2: 60.0, 3: 40.0, 4: 1.0, 5: 2.0, 7: 2.0, 10: 88.0, 12: 5.0, 13: 1.0,
                            20: 10.0, 21: 10.0, 60: 0.0, 61: 0.0})
    a = Agent(AgentConfig(host="h", interval_s=0.1, slow_interval_s=1.0), NvmlCollector(nvml=FakeNvml([busy, h200()])))
    a.start()
    try:
        wait_for(lambda: len(a.recent(2.0, gpu=1)) >= 15)
        from prometheus_client import generate_latest
        fams = _families(generate_latest(registry(AgentCollector(a, judge_newest, window_s=2.0))).decode())
    finally:
        a.stop()
    verdict = fams["gpuscope_gpu_verdict"]
    assert set(verdict.samples[0].labels) == {"gpu", "uuid", "verdict", "job", "pod", "namespace"}
    on = {s.labels["gpu"]: s.labels["verdict"] for s in verdict.samples if s.value == 1}
    assert on == {"0": "memory-bound", "1": "idle"}
    assert len(verdict.samples) == 2 * len({s.labels["verdict"] for s in verdict.samples})


def test_the_verdicts_job_label_is_never_a_pid():
    from gpuscope.collectors.attribution import job_label
    from gpuscope.collectors.records import Attribution
    assert job_label(Attribution(slurm_job="4242", pod="p", namespace="n")) == "slurm:4242"
    assert job_label(Attribution(pod="trainer-0", namespace="ml", unit="x.scope")) == "pod:ml/trainer-0"
    assert job_label(Attribution(unit="train.service", workload="vllm")) == "unit:train.service"
    assert job_label(Attribution(workload="vllm", container_id="ab" * 32)) == "vllm"
    assert job_label(Attribution(container_id="ab" * 32)) == "container:abababababab"
    assert job_label(None, "/usr/bin/python3 train.py --lr 3e-4") == "python3"
    assert job_label(Attribution(), "") == ""


def test_missing_is_absent_and_short_lived_processes_add_no_series(agent):
    agent.stop()                                                        # nothing but what follows is sampled
    from gpuscope.analyzers.offline import judge_newest
    reg = registry(AgentCollector(agent, judge_newest))
    from prometheus_client import generate_latest
    assert b"gpuscope_gpu_serving_requests_running" not in generate_latest(reg)    # never sampled: no series

    def short_lived(first_pid: int) -> bytes:
        t = time.time()
        agent._handle(Scrape(samples=[GpuSample(g, t + i * 1e-3, {"util_gpu_ratio": 0.5},
                                                processes=(ProcessRecord(pid=first_pid + i, used_memory_bytes=1,
                                                                         command=f"/usr/bin/python3 step{i}.py"),))
                                      for i in range(5_000) for g in (0, 1)]))
        return generate_latest(reg)

    before, after = short_lived(100_000), short_lived(200_000)          # 10,000 processes each time
    assert len(after.splitlines()) == len(before.splitlines())
    assert after.count(b"gpuscope_gpu_verdict{") == 2 * 6               # a series per GPU and verdict, no more
    ours = b"\n".join(line for line in after.splitlines() if line.startswith(b"gpuscope_"))
    # the pids and commands never become labels (process_* series hold this process's own numbers)
    assert b'job="python3"' in ours and b"200000" not in ours and b"step" not in ours


def test_the_fleet_view_is_a_verdict_per_gpu():
    status = dict(gpus=[dict(host="h", gpu=0, verdict="memory-bound", confidence=0.8, stale=False, open_finding="f1",
                             uuid="GPU-0a", namespace="ml", pod="trainer-0"),
                        dict(host="h", gpu=1, verdict="", confidence=0.0, stale=True, open_finding=None)],
                  samples_committed=10, batches_committed=2, batches_rejected=0, anomalies=1, analysis_lag_seconds=0.5)
    from prometheus_client import generate_latest
    fams = _families(generate_latest(registry(FleetCollector(lambda: status))).decode())
    on = {(s.labels["gpu"], s.labels["verdict"]) for s in fams["gpuscope_gpu_verdict"].samples if s.value == 1}
    assert on == {("0", "memory-bound")}                                 # warming up: no verdict on
    first = next(s for s in fams["gpuscope_gpu_verdict"].samples if s.value == 1)
    assert {k: first.labels[k] for k in ("uuid", "namespace", "pod")} == dict(uuid="GPU-0a", namespace="ml",
                                                                              pod="trainer-0")
    assert {s.labels["verdict"]: s.value for s in fams["gpuscope_findings_open"].samples}["memory-bound"] == 1
    assert [s.value for s in fams["gpuscope_gpu_stale"].samples] == [0.0, 1.0]
    assert not any(n.startswith("gpuscope_analyzer_publish") for n in fams)     # no fleet tier: no series
    status["publish"] = dict(cluster="c1", lag_seconds=42.0, files_pending=3, files_uploaded=17, failures=2)
    fams = _families(generate_latest(registry(FleetCollector(lambda: status))).decode())
    assert {n: (f.samples[0].labels, f.samples[0].value) for n, f in fams.items() if "publish" in n} == {
        "gpuscope_analyzer_publish_lag_seconds": ({"cluster": "c1"}, 42.0),
        "gpuscope_analyzer_publish_pending_files": ({"cluster": "c1"}, 3.0),
        "gpuscope_analyzer_publish_uploads": ({"cluster": "c1"}, 17.0),
        "gpuscope_analyzer_publish_failures": ({"cluster": "c1"}, 2.0)}


def test_beyond_loopback_only_tls_with_a_client_certificate(tmp_path, agent):
    with pytest.raises(ValueError, match="over TLS only"):
        serve(f"0.0.0.0:{free_port()}", registry(AgentCollector(agent)))
    ca = tmp_path / "ca"
    certs.create_ca(ca)
    certs.issue_agent(ca, "h", out=ca)
    certs.issue_client(ca, "prometheus", "reader", out=tmp_path / "scraper")
    port = free_port()
    server = serve(f"0.0.0.0:{port}", registry(AgentCollector(agent)), tls_files(ca, "agent"))
    try:
        ctx = ssl.create_default_context(cafile=str(ca / "ca.pem"))
        ctx.check_hostname = False
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=ctx, timeout=10).read()
        ctx.load_cert_chain(str(tmp_path / "scraper" / "client.pem"), str(tmp_path / "scraper" / "client.key"))
        text = urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=ctx, timeout=10).read().decode()
        assert "gpuscope_gpu_power_watts" in text
    finally:
        server.shutdown()
    busy = serve(f"127.0.0.1:{free_port()}", registry(AgentCollector(agent)))
    try:
        with pytest.raises(ValueError, match="--metrics-listen"):
            serve(f"127.0.0.1:{busy.server_port}", registry(AgentCollector(agent)))
    finally:
        busy.shutdown()


def test_an_analyzer_says_its_alert_receivers_and_counts_their_deliveries(tmp_path):
    """Found in a trial: nothing at start-up said which receivers were
    configured, and nothing counted what reached them."""
    import os
    import signal
    import subprocess
    import sys
    from tests.analyzers.test_alerts import Receiver_
    am = Receiver_()
    port, metrics = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gpuscope.daemon.cli", "analyzer", "--insecure",
                             "--db", str(tmp_path / "a.duckdb"), "--listen", f"127.0.0.1:{port}",
                             "--metrics-listen", f"127.0.0.1:{metrics}",
                             "--alertmanager", am.url.replace("//", "//admin:hunter2@") + "/api/v2/alerts",
                             "--alert-webhook", f"http://127.0.0.1:{free_port()}/hook?token=abc"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        def scrape():
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5).read().decode()
            except OSError:
                return None
        text = wait_for(scrape, timeout=60)
        fams = _families(text)
        where = am.url.replace("//", "//<redacted>@") + "/api/v2/alerts"
        sent = {s.labels["receiver"]: s.value for s in fams["gpuscope_alerts_sent"].samples}
        assert len(sent) == 2 and sent[where] == 0
        assert [r for r in sent if r != where][0].endswith("/hook?token=<redacted>")
        assert {s.name for s in fams["gpuscope_alerts_retried"].samples} == {"gpuscope_alerts_retried_total"}
        assert {s.labels["reason"] for s in fams["gpuscope_alerts_dropped"].samples} >= {"expired", "rate-limit"}
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        am.close()
    assert proc.returncode == 0, err[-2000:]
    assert f"alerts (alertmanager) to {where}: warning and above" in err
    assert "alerts (json) to http://127.0.0.1:" in err and "hook?token=<redacted>" in err
    assert "hunter2" not in err and "token=abc" not in err


def test_a_gpu_whose_source_went_quiet_shows_down_not_its_last_values(agent):
    """Found in a trial: with dcgm-exporter (or DCGM's host engine) stopped,
    /metrics kept exporting util 1.0 and SM activity 0.86: a busy, healthy
    GPU on every dashboard through the outage."""
    from prometheus_client import generate_latest
    reg = registry(AgentCollector(agent))
    fams = _families(generate_latest(reg).decode())
    assert {s.labels["gpu"]: s.value for s in fams["gpuscope_gpu_up"].samples} == {"0": 1.0, "1": 1.0}
    agent.stop()
    with agent._ring_lock:
        agent.latest_at[1] -= 60.0                                    # GPU 1's source silent for a minute
    fams = _families(generate_latest(reg).decode())
    assert {s.labels["gpu"]: s.value for s in fams["gpuscope_gpu_up"].samples} == {"0": 1.0, "1": 0.0}
    assert {s.labels["gpu"] for s in fams["gpuscope_gpu_util_gpu_ratio"].samples} == {"0"}
    assert max(s.value for s in fams["gpuscope_gpu_sample_age_seconds"].samples) >= 60
