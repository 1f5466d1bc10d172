"""Real servers on loopback for tests: an analyzer (gRPC + DuckDB file) and
agents sampling a fake NVML."""
from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import termios
import time

from gpuscope.analyzers.analyzer import Analyzer, AnalyzerConfig
from gpuscope.analyzers.engine import EngineClient
from gpuscope.analyzers.service import AnalyzerServicer, add_to_server
from gpuscope.collectors.nvml import NvmlCollector
from gpuscope.daemon.agent import Agent, AgentConfig
from gpuscope.daemon.serve import build_server, shutdown
from gpuscope.daemon.uplink import Uplink, UplinkConfig


class AnalyzerServer:
    """An analyzer on loopback; engine=True runs its store and analysis in a
    child process, as `gpuscope analyzer` does by default."""

    def __init__(self, db: str, port: int = 0, window_s: float = 1.0, engine: bool = False, **config):
        cfg = AnalyzerConfig(str(db), window_s=window_s, memory_limit="256MB", **config)
        self.analyzer = EngineClient(cfg) if engine else Analyzer(cfg)
        if engine:
            self.analyzer.start()
        self.servicer = AnalyzerServicer(self.analyzer)
        self.server, self.port, self.health = build_server(f"127.0.0.1:{port}", [
            (add_to_server, self.servicer, "gpuscope.v1.Analyzer")], max_workers=64)
        if not engine:
            self.analyzer.start()
        self.server.start()
        self.target = f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        shutdown(self.server, self.health, grace_s=0.5)
        self.analyzer.close()


def fake_agent(fake_nvml, target: str, host: str = "host-a", interval_s: float = 0.1,
               buffer_samples: int = 50_000, proc_root=None, kubelet_socket: str | None = None) -> Agent:
    """proc_root: a fake /proc for the GPU processes' CPU, command and
    attribution; kubelet_socket: a pod-resources server to ask (every 0.2 s)."""
    def uplink(boot_id, devices):
        return Uplink(UplinkConfig(target=target, flush_interval_s=0.1, buffer_samples=buffer_samples,
                                   backoff_initial_s=0.1, backoff_max_s=0.5), host, boot_id, devices)
    attribution = procstat = None
    if proc_root is not None:
        from gpuscope.collectors.attribution import Attributor
        from gpuscope.collectors.jobs import JobDiscovery
        from gpuscope.collectors.kubelet import KubeletConfig, PodResources
        from gpuscope.collectors.procstat import ProcStat
        procstat = ProcStat(proc_root)
        pods = PodResources(KubeletConfig(socket=kubelet_socket, refresh_s=0.2)) if kubelet_socket else None
        attribution = Attributor(proc_root, pods=pods,
                                 workload=JobDiscovery(lambda _address: False, proc_root=proc_root).workload)
    agent = Agent(AgentConfig(host=host, source="nvml", interval_s=interval_s, slow_interval_s=1.0),
                  NvmlCollector(nvml=fake_nvml, procstat=procstat, attribution=attribution), uplink)
    agent.attribution = attribution
    agent.start()
    return agent


def wait_for(predicate, timeout: float = 15.0, step: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout}s waiting for {predicate}")


ANSI = re.compile(r"\x1b\[[0-9;?]*[a-zA-Z]|\x1b[()][A-Z0-9]|\x1b[=>]")


def in_terminal(argv: list[str], cols: int, rows: int, seconds: float) -> tuple[str, int]:
    """Runs argv on a pty of cols x rows for `seconds`, then Ctrl-C: what the
    terminal received and the exit status."""
    pid, fd = pty.fork()
    if pid == 0:
        # os.environ, not the C environment: readline (loaded with pytest) exports COLUMNS=80 there
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        env["TERM"] = "xterm-256color"
        os.execve(argv[0], argv, env)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    out = b""

    def read_for(s: float) -> bytes:
        got, end = b"", time.monotonic() + s
        while time.monotonic() < end:
            if select.select([fd], [], [], 0.2)[0]:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                got += chunk
        return got
    try:
        out += read_for(seconds)
        os.kill(pid, signal.SIGINT)
        out += read_for(20)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _, status = os.waitpid(pid, 0)
    return out.decode("utf-8", "replace"), status


def last_frame(text: str) -> str:
    """The last screen drawn in the alternate screen, without escapes."""
    return ANSI.sub("", text[text.rindex("\x1b[H"):text.rindex("\x1b[?1049l")]).replace("\r", "")


def calibration_record(uuid: str = "GPU-aaaa", name: str = "NVIDIA H200", started_at: float = 1_700_000_000.0,
                       hbm: float = 4.1e12, bf16: float = 7.0e14, platform: str = "gpu", index: int = 0) -> dict:
    """What `gpuscope calibrate --json` prints (Calibration.to_dict() and the
    NVML `gpu` block), trimmed to the measurements the analyzer uses."""
    def m(name, unit, value, **kw):
        return dict(name=name, unit=unit, value=value, best=value * 1.02 if value else None, spread=0.01,
                    repeats=10, params={}, conditions={"sm_clock_hertz": {"min": 1.9e9, "median": 1.98e9,
                                                                            "max": 1.98e9}}, error=None, **kw)
    return dict(device=dict(platform=platform, device_kind=name, id=index, platform_version="cuda 12080",
                            jax="0.6.2", jaxlib="0.6.2"),
                gpu=dict(index=index, uuid=uuid, name=name, driver="570.124.06") if platform != "cpu" else {},
                started_at=started_at, duration_s=42.0, quick=False, forced=False,
                measurements=[m("hbm_copy", "bytes_per_second", hbm * 0.97), m("hbm_triad", "bytes_per_second", hbm),
                              m("matmul_bf16", "flop_per_second", bf16),
                              m("launch_roundtrip", "seconds", 8e-6), m("h2d", "bytes_per_second", 5.2e10),
                              m("d2h", "bytes_per_second", 5.0e10),
                              dict(name="d2d", unit="bytes_per_second", value=None, best=None, spread=None,
                                   repeats=0, params={}, conditions={}, error="one device: nothing to copy between")])


def generic_servers(handler, credentials: dict, workers: int = 2):
    """Plain gRPC servers on loopback answering with one generic handler:
    {name: address} for each {name: server credentials, or None for plain
    text}, and a function that stops them (TLS and refusal tests)."""
    from concurrent import futures

    import grpc

    out, started = {}, []
    for name, creds in credentials.items():
        s = grpc.server(futures.ThreadPoolExecutor(workers))
        s.add_generic_rpc_handlers([handler])
        port = s.add_secure_port("127.0.0.1:0", creds) if creds else s.add_insecure_port("127.0.0.1:0")
        s.start()
        started.append(s)
        out[name] = f"127.0.0.1:{port}"
    return out, lambda: [s.stop(0) for s in started]


def capturing_agent(pids: list[int], target: str, host: str, capture_dir):
    """A real agent of `host` whose fake GPUs each hold one of `pids` (real
    processes, read through /proc), that takes the analyzer's capture
    commands and reports its captures: (agent, listener), both started."""
    from gpuscope.collectors.jobs import JobDiscovery
    from gpuscope.collectors.xla_profiler import XlaProfilerClient
    from gpuscope.daemon import clients
    from gpuscope.daemon.captures import CaptureConfig, CaptureRunner
    from gpuscope.daemon.commands import CommandListener
    from gpuscope.daemon.convert import capture_pb
    from tests.fakes.nvml import FakeNvml, h200
    fake = FakeNvml([h200(processes=[(pid, 1 << 30)], util_gpu=50) for pid in pids])
    agent = fake_agent(fake, target, host=host, proc_root="/proc")
    agent.captures = CaptureRunner(CaptureConfig(capture_dir), host)
    agent.discovery = JobDiscovery(lambda a: XlaProfilerClient(a).probe())
    agent.capture_reporter = lambda rec, data: clients.report_capture(target, capture_pb(rec), data)
    listener = CommandListener(target, host, agent.boot_id, agent.run_command)
    listener.start()
    return agent, listener
