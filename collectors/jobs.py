"""Finds the JAX/XLA jobs on this host's GPUs that expose a profiler service.

Three sources, in order: configuration (addresses given to the agent), the
job's environment (`GPUSCOPE_PROFILER_PORT=9012` in /proc/PID/environ), and
the TCP ports the GPU's processes listen on (/proc/PID/fd socket inodes
matched against /proc/PID/net/tcp{,6}), each recognised as a profiler by a
probe that starts no capture. Probe answers are remembered per (pid, port).

Serving engines (vLLM, SGLang, TensorRT-LLM) are several processes: the
API server listens on the HTTP port, an engine core and workers hold the
GPUs. From a GPU process the walk goes up its parents (at most
`MAX_ANCESTORS`) to the one that listens: a configured `--serving` URL's
port, or an engine recognised by its command line (`vllm serve`,
`vllm.entrypoints.openai.api_server`, `sglang.launch_server`,
`trtllm-serve`), whose trace directory comes from its `--profiler-config`
(`torch_profiler_dir`) or its environment (`VLLM_TORCH_PROFILER_DIR`,
`SGLANG_TORCH_PROFILER_DIR`). No network probe is needed for that, so it
comes before the JAX probes of the process's own ports.

These are also the only targets the agent will capture: an address that is
neither discovered nor configured (`--profiler HOST:PORT`, `--serving
URL=TRACE_DIR`) is refused, so whoever can call the agent cannot point it
at an arbitrary host.
"""
from __future__ import annotations

import json
import os
import re
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

ENV_PORT = "GPUSCOPE_PROFILER_PORT"
TCP_LISTEN = "0A"
MAX_ANCESTORS = 4          # worker -> engine core -> API server, with a launcher or two above
ENGINES = (("vllm", re.compile(r"(^|\s|/)vllm\s+serve\b|vllm\.entrypoints\.")),
           ("sglang", re.compile(r"sglang\.launch_server|sglang\.srt\.")),
           ("tensorrt-llm", re.compile(r"(^|\s|/)trtllm-serve\b")))
TRACE_DIR_ENV = ("VLLM_TORCH_PROFILER_DIR", "SGLANG_TORCH_PROFILER_DIR")


@dataclass
class Job:
    pid: int | None
    address: str                       # HOST:PORT of a JAX profiler, or the base URL of a serving engine
    gpus: list[int] = field(default_factory=list)
    command: str = ""
    found_by: str = ""
    kind: str = "jax"                  # jax, torch-http
    trace_dir: str = ""                # torch-http: where the engine writes its traces


class JobDiscovery:
    def __init__(self, probe: Callable[[str], bool], proc_root: str | os.PathLike = "/proc",
                 configured: Iterable[str] = (), serving: dict[str, str] | None = None,
                 serving_gpus: dict[str, list[int]] | None = None):
        """serving: base URL of a vLLM/SGLang server -> the directory it writes
        traces to; serving_gpus: the GPUs a configured engine was said to use."""
        self._probe = probe
        self._root = Path(proc_root)
        self._configured = list(configured)
        self._serving = dict(serving or {})
        self._serving_gpus = dict(serving_gpus or {})
        self._verdicts: dict[tuple[int, int], bool] = {}

    def discover(self, gpu_pids: dict[int, list[int]]) -> list[Job]:
        """gpu_pids: pid -> GPUs it runs on (from NVML's process lists)."""
        jobs = [Job(None, a, found_by="config") for a in self._configured]
        for pid, gpus in sorted(gpu_pids.items()):
            job = self.find(pid, gpus)
            if job is not None:
                jobs.append(job)
        # A configured engine is a job even when none of its processes is seen on a
        # GPU (a container's PID namespace, a CPU build): listed, scraped, capturable.
        seen = {j.address.rstrip("/") for j in jobs if j.kind == "torch-http"}
        for url, trace_dir in self._serving.items():
            if url.rstrip("/") not in seen:
                jobs.append(Job(None, url, list(self._serving_gpus.get(url, [])), found_by="config",
                                kind="torch-http", trace_dir=trace_dir))
        return jobs

    def configured(self, address: str) -> Job | None:
        """The job for an address the agent was configured with, if it was:
        a JAX profiler (`--profiler`) or a serving engine (`--serving`).
        Addresses compare as written (a URL's trailing slash aside)."""
        address = address.strip()
        if address in self._configured:
            return Job(None, address, found_by="config")
        for url, trace_dir in self._serving.items():
            if address.rstrip("/") == url.rstrip("/"):
                return Job(None, url, list(self._serving_gpus.get(url, [])), found_by="config", kind="torch-http",
                           trace_dir=trace_dir)
        return None

    def find(self, pid: int, gpus: list[int] | None = None) -> Job | None:
        command = self._command(pid)
        port = self._env_port(pid)
        if port is not None:
            return Job(pid, f"127.0.0.1:{port}", list(gpus or []), command, "environ")
        serving = self._serving_engine(pid, gpus)
        if serving is not None:
            return serving
        for port in self.listening_ports(pid):
            key = (pid, port)
            if key not in self._verdicts:
                self._verdicts[key] = self._probe(f"127.0.0.1:{port}")
            if self._verdicts[key]:
                return Job(pid, f"127.0.0.1:{port}", list(gpus or []), command, "port")
        return None

    def workload(self, pid: int) -> str:
        """What the process runs, as far as /proc tells without a probe: a JAX
        job that names its profiler port in its environment (`jax
        127.0.0.1:9012`), a serving engine known by its own or a parent's
        command line (`vllm`, `sglang`, `tensorrt-llm`), a JAX profiler a
        probe already found on one of its ports; else "". Attribution asks
        once per process, on the sampling thread: nothing here waits on a
        network."""
        port = self._env_port(pid)
        if port is not None:
            return f"jax 127.0.0.1:{port}"
        for proc in self._lineage(pid):
            command = self._command(proc)
            engine = next((name for name, pattern in ENGINES if pattern.search(command)), None)
            if engine is not None:
                return engine
        probed = sorted(port for (p, port), ok in list(self._verdicts.items()) if p == pid and ok)
        return f"jax 127.0.0.1:{probed[0]}" if probed else ""

    def _serving_engine(self, pid: int, gpus: list[int] | None) -> Job | None:
        """The serving engine `pid` belongs to: itself or the nearest parent
        that listens on a configured --serving port or is a known engine."""
        for depth, proc in enumerate(self._lineage(pid)):
            ports = self.listening_ports(proc)
            if not ports:
                continue
            where = "serving" if depth == 0 else f"serving (pid {proc}, above GPU process {pid})"
            for url, trace_dir in self._serving.items():
                if urllib.parse.urlsplit(url).port in ports:
                    return Job(pid, url, list(gpus or []), self._command(proc), where, kind="torch-http",
                               trace_dir=trace_dir)
            command = self._command(proc)
            engine = next((name for name, pattern in ENGINES if pattern.search(command)), None)
            if engine is not None:
                port = _flag_port(command, ports)
                return Job(pid, f"http://127.0.0.1:{port}", list(gpus or []), command,
                           f"{engine} command line (pid {proc})", kind="torch-http",
                           trace_dir=self._engine_trace_dir(proc))
        return None

    def _lineage(self, pid: int) -> list[int]:
        """pid and its parents, nearest first, at most MAX_ANCESTORS above it."""
        out = [pid]
        while len(out) <= MAX_ANCESTORS:
            try:
                stat = (self._root / str(out[-1]) / "stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])      # the name in () may hold spaces
            except (OSError, ValueError, IndexError):
                break
            if ppid <= 1 or ppid in out:
                break
            out.append(ppid)
        return out

    def _argv(self, pid: int) -> list[str]:
        """The arguments as the process got them (a JSON flag value keeps its spaces)."""
        try:
            raw = (self._root / str(pid) / "cmdline").read_bytes()
        except OSError:
            return []
        return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]

    def _engine_trace_dir(self, pid: int) -> str:
        """Where the engine writes its torch traces: its --profiler-config's
        torch_profiler_dir, or its environment; "" when it does not say."""
        args = self._argv(pid)
        for i, a in enumerate(args):
            value = a.split("=", 1)[1] if a.startswith("--profiler-config=") else \
                args[i + 1] if a == "--profiler-config" and i + 1 < len(args) else None
            if value is None:
                continue
            try:
                cfg = json.loads(value)
            except ValueError:
                continue
            if isinstance(cfg, dict) and isinstance(cfg.get("torch_profiler_dir"), str):
                return cfg["torch_profiler_dir"]
        env = self._environ(pid)
        return next((env[k] for k in TRACE_DIR_ENV if env.get(k)), "")

    def _command(self, pid: int) -> str:
        try:
            return (self._root / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").strip().decode("utf-8", "replace")
        except OSError:
            return ""

    def _environ(self, pid: int) -> dict[str, str]:
        try:
            raw = (self._root / str(pid) / "environ").read_bytes()
        except OSError:
            return {}
        return dict(item.decode("utf-8", "replace").split("=", 1) for item in raw.split(b"\0") if b"=" in item)

    def _env_port(self, pid: int) -> int | None:
        value = self._environ(pid).get(ENV_PORT)
        if value is None:
            return None
        return int(value) if value.isdigit() and 0 < int(value) < 65536 else None

    def listening_ports(self, pid: int) -> list[int]:
        inodes = set()
        fd_dir = self._root / str(pid) / "fd"
        try:
            for fd in fd_dir.iterdir():
                try:
                    target = os.readlink(fd)
                except OSError:
                    continue
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            return []
        ports = []
        for table in ("tcp", "tcp6"):
            try:
                lines = (self._root / str(pid) / "net" / table).read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                cols = line.split()
                if len(cols) > 9 and cols[3] == TCP_LISTEN and cols[9] in inodes:
                    ports.append(int(cols[1].rsplit(":", 1)[1], 16))
        return sorted(set(ports))


def _flag_port(command: str, listening: list[int]) -> int:
    """The engine's --port when it listens there, else its lowest listening port."""
    m = re.search(r"--port[= ](\d{1,5})\b", command)
    if m and int(m.group(1)) in listening:
        return int(m.group(1))
    return listening[0]
