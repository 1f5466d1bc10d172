"""Finds the JAX/XLA jobs on this host's GPUs that expose a profiler service.

Three sources, in order: configuration (addresses given to the agent), the
job's environment (`GPUSCOPE_PROFILER_PORT=9012` in /proc/PID/environ), and
the TCP ports the GPU's processes listen on (/proc/PID/fd socket inodes
matched against /proc/PID/net/tcp{,6}), each recognised as a profiler by a
probe that starts no capture. Probe answers are remembered per (pid, port).

These are also the only targets the agent will capture: an address that is
neither discovered nor configured (`--profiler HOST:PORT`, `--serving
URL=TRACE_DIR`) is refused, so whoever can call the agent cannot point it
at an arbitrary host.
"""
from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

ENV_PORT = "GPUSCOPE_PROFILER_PORT"
TCP_LISTEN = "0A"


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
                 configured: Iterable[str] = (), serving: dict[str, str] | None = None):
        """serving: base URL of a vLLM/SGLang server -> the directory it writes traces to."""
        self._probe = probe
        self._root = Path(proc_root)
        self._configured = list(configured)
        self._serving = dict(serving or {})
        self._verdicts: dict[tuple[int, int], bool] = {}

    def discover(self, gpu_pids: dict[int, list[int]]) -> list[Job]:
        """gpu_pids: pid -> GPUs it runs on (from NVML's process lists)."""
        jobs = [Job(None, a, found_by="config") for a in self._configured]
        for pid, gpus in sorted(gpu_pids.items()):
            job = self.find(pid, gpus)
            if job is not None:
                jobs.append(job)
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
                return Job(None, url, found_by="config", kind="torch-http", trace_dir=trace_dir)
        return None

    def find(self, pid: int, gpus: list[int] | None = None) -> Job | None:
        command = self._command(pid)
        port = self._env_port(pid)
        if port is not None:
            return Job(pid, f"127.0.0.1:{port}", list(gpus or []), command, "environ")
        ports = self.listening_ports(pid)
        for port in ports:
            key = (pid, port)
            if key not in self._verdicts:
                self._verdicts[key] = self._probe(f"127.0.0.1:{port}")
            if self._verdicts[key]:
                return Job(pid, f"127.0.0.1:{port}", list(gpus or []), command, "port")
        for url, trace_dir in self._serving.items():
            port = urllib.parse.urlsplit(url).port
            if port in ports:
                return Job(pid, url, list(gpus or []), command, "serving", kind="torch-http", trace_dir=trace_dir)
        return None

    def _command(self, pid: int) -> str:
        try:
            return (self._root / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").strip().decode("utf-8", "replace")
        except OSError:
            return ""

    def _env_port(self, pid: int) -> int | None:
        try:
            env = (self._root / str(pid) / "environ").read_bytes()
        except OSError:
            return None
        for item in env.split(b"\0"):
            if item.startswith(ENV_PORT.encode() + b"="):
                value = item.split(b"=", 1)[1]
                return int(value) if value.isdigit() and 0 < int(value) < 65536 else None
        return None

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
