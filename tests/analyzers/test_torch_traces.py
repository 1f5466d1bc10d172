"""Kineto-shaped torch traces (what torch.profiler and vLLM write), with
known truth: annotations drawn on the GPU row are not GPU work, an eager
op that launches kernels is the framework's launch path while one that
computes on the CPU is host work, and a worker polling for its next batch
is idle."""
import gzip
import json

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
