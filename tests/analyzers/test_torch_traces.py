"""Kineto-shaped torch traces (what torch.profiler and vLLM write), with
known truth: annotations drawn on the GPU row are not GPU work, an eager
op that launches kernels is the framework's launch path while one that
computes on the CPU is host work, and a worker polling for its next batch
is idle."""
import gzip
import json

import pytest

from gpuscope.analyzers.trace_analysis import summarize
from gpuscope.collectors.chrome_trace_reader import parse_chrome_trace

GPU, HOST = 0, 4242
HEADER = [{"ph": "M", "name": "process_name", "pid": GPU, "tid": 0, "args": {"name": "GPU 0"}},
          {"ph": "M", "name": "thread_name", "pid": GPU, "tid": 7, "args": {"name": "stream 7 "}},
          {"ph": "M", "name": "process_name", "pid": HOST, "tid": 0, "args": {"name": "python3"}},
          {"ph": "M", "name": "thread_name", "pid": HOST, "tid": HOST, "args": {"name": "thread 4242 (python3)"}}]


def X(name, ts, dur, pid=HOST, tid=HOST, cat="cpu_op", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


class Steps:
    def __init__(self):
        self.events, self.corr = [], 0

    def launch(self, t, dispatch_us, kernel_at, kernel_us, op="aten::add", kernel="vectorized_elementwise_kernel"):
        """An eager op launching one kernel: op > cudaLaunchKernel, then the kernel."""
        self.corr += 1
        self.events += [X(op, t, dispatch_us), X("cudaLaunchKernel", t + dispatch_us * 0.6, dispatch_us * 0.3,
                                                 cat="cuda_runtime", correlation=self.corr),
                        X(kernel, kernel_at, kernel_us, pid=GPU, tid=7, cat="kernel", correlation=self.corr)]

    def summary(self) -> dict:
        data = gzip.compress(json.dumps({"traceEvents": HEADER + self.events}).encode())
        return summarize(parse_chrome_trace(data, "torch.pt.trace.json.gz"))


def test_gpu_annotations_are_not_gpu_work_and_cpu_ops_are_host_work():
    s, t = Steps(), 1000.0
    for step in range(30):
        start = t
        s.events.append(X("aten::index_select", t, 5000))           # on CPU tensors: host work
        t += 5000
        for _ in range(10):
            s.launch(t, 10, t + 11, 100, op="aten::mm", kernel="sm90_xmma_gemm_bf16")
            t += 111
        s.events.append(X(f"ProfilerStep#{step}", start, t - start, cat="user_annotation"))
        s.events.append(X(f"ProfilerStep#{step}", start, t - start, pid=GPU, tid=7, cat="gpu_user_annotation"))
    r = s.summary()
    assert r["verdict"] == "host-bound", r["summary"]
    assert all("ProfilerStep" not in op["kernel"] for op in r["top_ops"])


def test_tiny_eager_ops_are_launch_bound():
    s, t = Steps(), 1000.0
    for _ in range(2000):
        s.launch(t, 20, t + 21, 2)
        t += 25
    assert s.summary()["verdict"] == "launch-bound"


def test_a_worker_polling_for_its_next_batch_is_idle():
    """vLLM's worker between requests: shm_broadcast dequeue > acquire_read >
    wait > sched_yield, the frames the bundled vLLM trace has."""
    s, t = Steps(), 1000.0
    for _ in range(20):
        for k in range(5):
            s.launch(t, 10, t + 11, 50)
            t += 61
        s.events += [X("$shm_broadcast.py:500 dequeue", t, 20_000), X("$shm_broadcast.py:420 acquire_read", t + 1, 19_990),
                     X("$shm_broadcast.py:300 wait", t + 2, 19_980), X("sched_yield", t + 3, 19_970)]
        t += 20_000
    r = s.summary()
    assert r["verdict"] == "idle", r["summary"]


def test_kineto_device_properties_name_the_gpu_and_its_link():
    s = Steps()
    s.events = [{"ph": "M", "name": "process_name", "pid": GPU, "tid": 0, "args": {"name": "GPU 0"}}]
    for i in range(20):
        s.events += [X("Memcpy HtoD (Pinned -> Device)", i * 1000, 500, pid=GPU, tid=7, cat="gpu_memcpy",
                       bytes=25_000_000, correlation=i),
                     X("cudaMemcpyAsync", i * 1000, 10, cat="cuda_runtime", correlation=i)]
    data = gzip.compress(json.dumps({"traceEvents": HEADER[2:] + s.events, "deviceProperties": [
        {"id": 0, "name": "NVIDIA H100 80GB HBM3", "computeMajor": 9, "computeMinor": 0, "numSms": 132}]}).encode())
    r = summarize(parse_chrome_trace(data, "copies.pt.trace.json.gz"))
    assert r["devices"][0]["name"] == "NVIDIA H100 80GB HBM3"
    assert 0.7 < r["memcpy"]["memcpy_h2d"]["link_fraction"] < 0.9      # 50 GB/s of a Gen5 x16 link


def test_the_vllm_trace_says_when_and_where_it_ran(fixture_dir):
    """The bundled vLLM 0.32 worker trace: kineto's baseTimeNanoseconds plus
    the first event's ts is the session's wall-clock start (2026-11-29)."""
    from gpuscope.collectors.trace_files import load_trace
    path = next((fixture_dir.parent / "vllm-0.32-cpu" / "traces").glob("rank0.*.pt.trace.json.gz"))
    s = summarize(load_trace(path))
    assert s["hostnames"] == ["vm"]
    assert 1_795_990_000 < s["start_unix"] < 1_796_000_000


def test_a_threads_busy_time_is_its_work_not_its_python_frames_or_the_profilers_span():
    """The outermost Python frame and the profiler's own span cover the
    whole capture: counted, every torch thread read 100 % busy."""
    events = HEADER + [
        X("PyTorch Profiler (0)", 0, 1000, pid="Spans", tid="PyTorch Profiler", cat="Trace"),
        X("run_engine_core", 0, 1000, cat="python_function"),
        X("execute_model", 100, 200, cat="user_annotation"),
        X("aten::mm", 150, 100),
        X("aten::add", 500, 100),
        X("poll", 600, 400, tid=1, cat="python_function"),
    ]
    s = summarize(parse_chrome_trace(json.dumps({"traceEvents": events}).encode(), "t.json"))
    assert s["host"]["busiest_thread_busy_fraction"] == 0.3          # 100-300 and 500-600 of 0-1000


def _py(path, line, function):
    """A span of the Python tracer, as torch names it."""
    return f"vllm/{path}.py({line}): {function}"


def test_engine_core_steps_split_into_model_execution_scheduling_and_sampling():
    """EngineCore.step in the traced process holds the whole step; sampling
    nested in execute_model (vLLM before 0.11) counts as sampling; the time
    between steps is no step's."""
    events, t = list(HEADER), 1000.0
    for _ in range(10):
        events += [X(_py("v1/engine/core", 380, "step"), t, 1000, cat="python_function"),
                   X(_py("v1/core/sched/scheduler", 210, "schedule"), t, 100, cat="python_function"),
                   X(_py("v1/executor/abstract", 90, "execute_model"), t + 100, 600, cat="python_function"),
                   X(_py("v1/worker/gpu_model_runner", 1500, "execute_model"), t + 110, 590, cat="python_function"),
                   X(_py("v1/sample/sampler", 73, "forward"), t + 600, 100, cat="python_function"),
                   X(_py("v1/core/sched/scheduler", 800, "update_from_output"), t + 700, 100, cat="python_function"),
                   X("aten::argmax", t + 820, 50)]
        t += 1000 + 5000                                  # waiting for requests: not a step
    s = summarize(parse_chrome_trace(json.dumps({"traceEvents": events}).encode(), "core.pt.trace.json"))
    h = s["host_steps"]
    assert h["steps"] == 10 and h["duration_ms"] == dict(mean=1.0, p50=1.0, p99=1.0)
    assert (h["model_execution_fraction"], h["scheduling_fraction"], h["sampling_fraction"], h["other_fraction"]) \
        == (0.5, 0.2, 0.1, 0.2)


def test_worker_steps_run_from_execute_model_to_its_sampling_and_say_scheduling_is_not_there():
    """A multiprocess worker's trace, as vLLM 0.32 writes it: execute_model
    and sample_tokens are two RPCs, the scheduler is in another process:
    its share is unknown (None), not 0."""
    events, t = list(HEADER), 1000.0
    for k in range(20):
        events += [X(_py("v1/worker/worker_base", 365, "execute_model"), t, 600, cat="python_function"),
                   X("execute_context_0(0)_generation_4(4)", t + 10, 580, cat="user_annotation"),
                   X(_py("v1/executor/multiproc_executor", 1010, "handle_output"), t + 600, 50, cat="python_function"),
                   X(_py("v1/worker/gpu_worker", 1293, "sample_tokens"), t + 700, 100 + 100 * (k == 19),
                     cat="python_function")]
        t += 3000
    s = summarize(parse_chrome_trace(json.dumps({"traceEvents": events}).encode(), "rank0.pt.trace.json"))
    h = s["host_steps"]
    assert h["steps"] == 20 and h["scheduling_fraction"] is None
    assert h["duration_ms"]["p50"] == 0.8 and h["duration_ms"]["p99"] == pytest.approx(0.881)
    assert h["model_execution_fraction"] == pytest.approx(600 * 20 / (800 * 20 + 100))
    assert h["sampling_fraction"] == pytest.approx(2100 / 16100)
    assert h["other_fraction"] == pytest.approx(2000 / 16100)          # handle_output and the gaps


def test_a_trace_without_engine_steps_has_none():
    s = Steps()
    for i in range(30):
        s.launch(1000 + 200 * i, 10, 1000 + 200 * i + 11, 100, op="aten::mm")
    assert s.summary()["host_steps"] is None


def test_the_vllm_worker_trace_shows_its_68_steps(fixture_dir):
    """The bundled vLLM 0.32 worker trace: 68 execute_model RPCs, 64 of them
    followed by sample_tokens; the API server's trace has no steps."""
    from gpuscope.collectors.trace_files import load_trace
    traces = fixture_dir.parent / "vllm-0.32-cpu" / "traces"
    h = summarize(load_trace(next(traces.glob("rank0.*.pt.trace.json.gz"))))["host_steps"]
    assert h["steps"] == 68 and h["scheduling_fraction"] is None
    assert 0.75 < h["model_execution_fraction"] < 0.85 and 0.07 < h["sampling_fraction"] < 0.12
    assert h["model_execution_fraction"] + h["sampling_fraction"] + h["other_fraction"] == pytest.approx(1.0)
    assert 2.0 < h["duration_ms"]["mean"] < 3.0 and h["duration_ms"]["p50"] < h["duration_ms"]["p99"]
    assert summarize(load_trace(next(traces.glob("*.async_llm.*.pt.trace.json.gz"))))["host_steps"] is None
