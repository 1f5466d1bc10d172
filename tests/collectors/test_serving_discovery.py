"""Serving engines found from the GPU process: vLLM's worker holds the GPU,
the API server two processes up listens. Real processes, real /proc."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuscope.collectors.jobs import JobDiscovery
from tests.conftest import free_port
from tests.helpers import wait_for

TREE = Path(__file__).resolve().parents[1] / "jobs" / "serving_tree.py"


@pytest.fixture
def vllm_tree(tmp_path):
    port, pid_file = free_port(), tmp_path / "worker.pid"
    trace_dir = tmp_path / "traces"
    api = subprocess.Popen([sys.executable, str(TREE), "vllm", "serve", "tiny-llama", "--port", str(port),
                            "--profiler-config", json.dumps({"profiler": "torch", "torch_profiler_dir": str(trace_dir)}),
                            "--pid-file", str(pid_file)], start_new_session=True)
    try:
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=30)
        worker = int(pid_file.read_text())
        discovery = JobDiscovery(lambda a: False)
        wait_for(lambda: port in discovery.listening_ports(api.pid), timeout=30)
        yield api, worker, port, trace_dir
    finally:
        # the whole tree: killing the API server alone left its engine core and worker running
        os.killpg(api.pid, signal.SIGKILL)
        api.wait(10)
        time.sleep(0.1)


def test_a_vllm_worker_leads_to_its_api_server_by_command_line(vllm_tree):
    api, worker, port, trace_dir = vllm_tree
    probed = []
    job = JobDiscovery(lambda a: probed.append(a) or False).find(worker, [0])
    assert job is not None and job.kind == "torch-http"
    assert job.address == f"http://127.0.0.1:{port}" and job.trace_dir == str(trace_dir)
    assert job.pid == worker and job.gpus == [0] and f"pid {api.pid}" in job.found_by
    assert not probed                                      # no network probe of the worker's ports


def test_a_configured_serving_url_is_matched_up_the_tree(vllm_tree, tmp_path):
    api, worker, port, _ = vllm_tree
    url = f"http://127.0.0.1:{port}"
    job = JobDiscovery(lambda a: False, serving={url: str(tmp_path / "configured")}).find(worker, [1])
    assert job.address == url and job.trace_dir == str(tmp_path / "configured")


def test_a_process_with_no_engine_above_it_is_not_a_serving_job(tmp_path):
    me = JobDiscovery(lambda a: False).find(__import__("os").getpid(), [0])
    assert me is None


def test_a_configured_engine_is_a_job_even_when_no_gpu_process_shows_it(vllm_tree, tmp_path):
    """Found against a real vLLM (CPU build): `--serving URL=DIR` was neither
    listed by `gpuscope jobs` nor scraped, as no NVML process led to it (the
    same on a GPU host whose engine runs in another PID namespace)."""
    from gpuscope.daemon.cmd_serve import parse_serving
    api, worker, port, _ = vllm_tree
    url = f"http://127.0.0.1:{port}"
    serving, gpus = parse_serving([f"{url}={tmp_path / 'traces'}@1,0", "http://127.0.0.1:9=/tmp/a@b/t"])
    assert serving == {url: str(tmp_path / "traces"), "http://127.0.0.1:9": "/tmp/a@b/t"} and gpus == {url: [0, 1]}
    discovery = JobDiscovery(lambda a: False, serving=serving, serving_gpus=gpus)
    alone = [j for j in discovery.discover({}) if j.kind == "torch-http"]
    assert [(j.address, j.gpus, j.found_by) for j in alone] == [(url, [0, 1], "config"), ("http://127.0.0.1:9", [], "config")]
    # seen on a GPU, the engine is listed once, with the GPU its worker holds
    found = [j for j in discovery.discover({worker: [3]}) if j.address == url]
    assert len(found) == 1 and found[0].gpus == [3] and found[0].pid == worker


def test_bad_serving_entries_are_refused_at_start_up():
    """Found in a trial: `httpbogus=/d` was accepted and then stopped every
    engine's scrape; `@0,a` and a trailing `@` silently became directory
    names, spreading one engine's numbers over all GPUs."""
    from gpuscope.daemon.cliutil import UsageError
    from gpuscope.daemon.cmd_serve import parse_serving
    for bad in ("httpbogus=/d", "http://x=", "http://x=/d@", "http://x=/d@0,a", "http://x=/d@-1", "http://x:99999=/d"):
        with pytest.raises(UsageError, match="--serving"):
            parse_serving([bad])
    assert parse_serving(["http://x:8000=/mnt/a@b/traces"]) == ({"http://x:8000": "/mnt/a@b/traces"}, {})


def test_one_unusable_engine_address_does_not_stop_the_others():
    from gpuscope.collectors.serving_sampler import ServingSampler
    sampler = ServingSampler(lambda: [("httpbogus", [0]), ("http://127.0.0.1:9", [1])])
    scrape = sampler.scrape()
    assert list(sampler.engines) == ["http://127.0.0.1:9"]
    assert any("httpbogus" in e for e in scrape.errors)


def test_an_engine_that_names_no_gpus_is_listed_on_every_gpu_it_is_sampled_for(tmp_path):
    """Found in a trial: `gpuscope jobs` said `gpus: []` for `--serving URL=DIR`
    while the engine's numbers went to every GPU of the host."""
    from gpuscope.collectors.nvml import NvmlCollector
    from gpuscope.daemon.agent import Agent, AgentConfig
    from tests.fakes.nvml import FakeNvml, h200
    agent = Agent(AgentConfig(host="h", interval_s=0.1, slow_interval_s=1.0),
                  NvmlCollector(nvml=FakeNvml([h200(), h200(), h200()])))
    agent.collector.start()
    try:
        agent.discovery = JobDiscovery(lambda a: False, serving={"http://127.0.0.1:9": str(tmp_path),
                                                                 "http://127.0.0.1:10": str(tmp_path)},
                                       serving_gpus={"http://127.0.0.1:10": [1]})
        assert {j.address: j.gpus for j in agent.jobs()} == {"http://127.0.0.1:9": [0, 1, 2],
                                                             "http://127.0.0.1:10": [1]}
    finally:
        agent.collector.close()


def test_a_gpu_the_host_lacks_is_refused_at_start_up_and_never_sampled(tmp_path, capsys):
    """Found in a trial: --serving URL=DIR@5 on a one-GPU host was taken, and
    every batch holding GPU 5's serving numbers was refused by the analyzer,
    GPU 0's samples with it."""
    from gpuscope.daemon.cliutil import UsageError
    from gpuscope.daemon.cmd_serve import check_serving
    with pytest.raises(UsageError, match=r"@5: this host has no GPU 5 \(its GPUs: 0\)"):
        check_serving({"http://x:1": str(tmp_path)}, {"http://x:1": [5]}, [0])
    check_serving({"http://x:1": str(tmp_path / "made-by-the-engine")}, {}, [0])
    assert capsys.readouterr().err == ""                 # the engine makes it when it first writes
    check_serving({"http://x:1": str(tmp_path / "nowhere" / "traces")}, {}, [0])
    assert "neither it nor the directory above it exists" in capsys.readouterr().err
    from gpuscope.collectors.nvml import NvmlCollector
    from gpuscope.daemon.agent import Agent, AgentConfig
    from tests.fakes.nvml import FakeNvml, h200
    agent = Agent(AgentConfig(host="h", interval_s=0.1, slow_interval_s=1.0), NvmlCollector(nvml=FakeNvml([h200()])))
    agent.collector.start()
    try:
        agent.discovery = JobDiscovery(lambda a: False, serving={"http://x:1": str(tmp_path)},
                                       serving_gpus={"http://x:1": [0, 5]})
        assert [j.gpus for j in agent.jobs()] == [[0]]          # GPU 5 (lost since, or never there) gets nothing
    finally:
        agent.collector.close()
