"""Serving engines found from the GPU process: vLLM's worker holds the GPU,
the API server two processes up listens. Real processes, real /proc."""
import json
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
                            "--pid-file", str(pid_file)])
    try:
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=30)
        worker = int(pid_file.read_text())
        discovery = JobDiscovery(lambda a: False)
        wait_for(lambda: port in discovery.listening_ports(api.pid), timeout=30)
        yield api, worker, port, trace_dir
    finally:
        api.kill()
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
