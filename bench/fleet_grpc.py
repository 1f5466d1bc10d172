"""Fleet over real gRPC: how many agents one analyzer holds, loaded from another process.

    python bench/fleet_grpc.py [--steps 100,150,...,3000] [--hold 45] [--profile] [--keep-going]
    python bench/fleet_grpc.py --tls ...            # the same ramp with mutual TLS
    python bench/fleet_grpc.py --flush 5 ...        # agents send 5 s of samples per batch
    python bench/fleet_grpc.py --slow 12 ...        # each recording row held 12 s: a steadier fleet
    python bench/fleet_grpc.py --connect-only 5000 [--send-nothing]  # memory while 5,000 agents connect

The analyzer runs as `gpuscope analyzer` in a subprocess (loopback only, its
own DuckDB file under a temporary directory). A load generator in another
process (multiprocessing, spawn) runs N simulated agents on one grpc.aio
event loop: each has its own channel (its own TCP connection), one Ingest
stream and one Commands stream, host `sim-NNNNN` and its own boot_id, and
sends one SampleBatch a second of 8 GPUs x 1 sample, at its own phase of the
second. Metric values are rows of the bundled H200 recording at 1 Hz, each
GPU at its own offset, so rules and the detector see real patterns (counters
restart every 90 s when the recording loops: a reset, which rates skip).

Per step of the ramp, after the new agents have connected and a settle time:
ack latency (sample time -> ack, and write -> ack), batches/s committed
(analyzer's own counter), analyzer RSS and CPU (per thread), on-call query
latency (GetStatus and ListFindings once a second from this process, over
their own channel), and the live-analysis lag (GetStatus
`analysis_lag_seconds` when the analyzer has it, else estimated as
now - gpus[].last_sample, which the analyzer updates in its after-commit
analysis). The ramp stops after the first step that breaks a target.
`--profile` samples the analyzer with py-spy (if installed: `pip install
py-spy`) in every step, all active threads and, separately, only the thread
holding the GIL, and sums the samples by component. With
FLEET_GRPC_ANALYZER_ENTRY=script.py the analyzer runs that script instead of
`-m gpuscope.daemon.cli` (what-if experiments: patch, then call the CLI's main).

Writes bench/out/fleet_grpc-<mode>-<time>.json and prints a table. Every run
stops by itself.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import multiprocessing as mp
import os
import platform
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OUT_DIR = ROOT / "bench" / "out"
INGEST = "/gpuscope.v1.Analyzer/Ingest"
COMMANDS = "/gpuscope.v1.Analyzer/Commands"
GPUS = 8
TARGETS = dict(ack_p99_s=5.0, rss_bytes=1 << 30, query_p95_s=0.2, lag_windows=2.0)
CONNECT_RATE = 200          # new agents per second while ramping


# ---------------------------------------------------------------------------------------------
# helpers

def pct(xs, q):
    return None if not len(xs) else round(float(np.percentile(np.asarray(xs, dtype=float), q)), 4)


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree(pid: int) -> list[int]:
    """pid and its descendants: the analyzer's analysis process counts as the analyzer."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def _cpu(path: str) -> float | None:
    try:
        with open(path) as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int, tid: int | None = None) -> float | None:
    """CPU seconds of a thread, or of a process with its descendants."""
    if tid is not None:
        return _cpu(f"/proc/{pid}/task/{tid}/stat")
    parts = [c for c in (_cpu(f"/proc/{p}/stat") for p in tree(pid)) if c is not None]
    return sum(parts) if parts else None


def proc_rss(pid: int) -> tuple[int, int] | None:
    """(VmRSS, VmHWM) in bytes, of the process and its descendants (their
    peaks summed: an upper bound of the tree's peak)."""
    total = None
    for p in tree(pid):
        try:
            with open(f"/proc/{p}/status") as f:
                txt = f.read()
        except OSError:
            continue
        get = lambda k: int(re.search(rf"^{k}:\s+(\d+) kB", txt, re.M).group(1)) * 1024  # noqa: E731
        total = (get("VmRSS"), get("VmHWM")) if total is None else (total[0] + get("VmRSS"),
                                                                      total[1] + get("VmHWM"))
    return total


def proc_pss(pid: int) -> int | None:
    """Proportional set size of the process and its descendants, bytes: the
    memory the tree costs, pages shared between its processes (the
    libraries both load) counted once. VmRSS sums count them in each."""
    total = None
    for p in tree(pid):
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                m = re.search(r"^Pss:\s+(\d+) kB", f.read(), re.M)
        except OSError:
            continue
        if m:
            total = (total or 0) + int(m.group(1)) * 1024
    return total


def threads_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of every thread of the process and its descendants, by tid."""
    out = {}
    for p in tree(pid):
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tids:
            c = proc_cpu(p, int(t))
            if c is not None:
                out[int(t)] = c
    return out


# ---------------------------------------------------------------------------------------------
# the load generator (another process)

def batch_bytes(bodies: list[bytes], flush_s: int, host: str, boot: str, seq: int, offset: int, t: float) -> bytes:
    """An agent's batch `seq`, sent at t: a header (host, boot, seq, the
    times of the last `flush_s` seconds, 8 GPUs a second) and the body of
    its place in the recording (build_bodies)."""
    from gpuscope.v1 import samples_pb2 as pb
    ts = (t - np.repeat(np.arange(flush_s - 1, -1, -1.0), GPUS)) + np.tile(np.arange(GPUS) * 1e-4, flush_s)
    head = pb.SampleBatch(host=host, boot_id=boot, seq=seq, t_f64le=ts.astype("<f8").tobytes())
    return head.SerializeToString() + bodies[(offset + seq * flush_s) % len(bodies)]


def build_bodies(flush_s: int = 1, slow: int = 1) -> list[bytes]:
    """One serialized SampleBatch body per second of the recording at 1 Hz
    (8 GPUs, GPU g at offset 11*g), holding `flush_s` seconds of samples,
    each row of the recording held `slow` seconds (its phases last `slow`
    times longer: a steadier fleet, whose verdicts change less often),
    without host, boot_id, seq and times: those go in a small header
    message; protobuf merges concatenated messages."""
    from gpuscope.collectors import catalogue as cat
    from gpuscope.collectors.recording import default_recording, read_recording
    from gpuscope.collectors.records import DeviceInfo, GpuSample, ProcessRecord
    from gpuscope.daemon.convert import encode_batch

    rec = read_recording(default_recording())
    rows = np.arange(0, len(rec), 10)                      # the recording is 10 Hz; agents sample at 1 Hz
    period = len(rows)
    names = [n for n in cat.NAMES if n in rec.metrics]
    devices = [DeviceInfo(gpu=g, uuid=f"GPU-5e1d{g:04x}-sim", name="NVIDIA H200", architecture="Hopper",
                          memory_total_bytes=150_754_820_096, power_limit_watts=700.0, pcie_generation=5,
                          pcie_width=16, gpm_supported=True) for g in range(GPUS)]
    bodies = []
    for k in range(period * slow):
        samples = []
        for s_, g in ((s_, g) for s_ in range(flush_s) for g in range(GPUS)):
            r = int(rows[((k + s_) // slow + 11 * g) % period])
            vals = {n: float(rec.metrics[n][r]) for n in names if rec.metrics[n][r] == rec.metrics[n][r]}
            cpu = vals.get("procs_cpu_cores")
            procs = tuple(ProcessRecord(pid=4000 + 10 * g + i, used_memory_bytes=p.used_memory_bytes, cpu_cores=cpu,
                                        command=f"/usr/bin/python3 train.py --rank {g}")
                          for i, p in enumerate(rec.processes[r] if rec.processes else ()))
            samples.append(GpuSample(g, 0.0, vals, procs))
        b = encode_batch("h", "b", 1, samples, devices)
        for f in ("host", "boot_id", "seq", "t_f64le"):
            b.ClearField(f)
        bodies.append(b.SerializeToString())
    return bodies


class Stats:
    def __init__(self):
        self.reset(time.time())
        self.stream_errors: collections.Counter = collections.Counter()
        self.commands = 0
        self.sent_total = self.acked_total = 0
        self.connected = 0

    def reset(self, t: float):
        self.mark = t
        self.lat: list[tuple[float, float, float]] = []   # (tick, tick->ack, write->ack)
        self.loop_lag: list[float] = []


class SimAgent:
    def __init__(self, i: int, gen: "LoadGen"):
        self.i, self.gen = i, gen
        self.host = f"sim-{i:05d}"
        self.boot = os.urandom(8).hex()
        self.seq = 0
        self.phase = random.random()
        self.offset = random.randrange(len(gen.bodies))
        self.pending: dict[int, tuple[float, float]] = {}
        self.task: asyncio.Task | None = None
        self.channel = None
        self.sent_once = False

    def channel_new(self):
        import grpc
        opts = [("grpc.use_local_subchannel_pool", 1), ("grpc.max_receive_message_length", 64 << 20)]
        if self.gen.tls_dir is None:
            return grpc.aio.insecure_channel(self.gen.target, options=opts)
        d = Path(self.gen.tls_dir)
        a = d / "agents" / self.host
        creds = grpc.ssl_channel_credentials((d / "ca.pem").read_bytes(), (a / "agent.key").read_bytes(),
                                             (a / "agent.pem").read_bytes())
        return grpc.aio.secure_channel(self.gen.target, creds, options=opts)

    def batch(self, t: float) -> bytes:
        """One batch sent at t: the last `flush_s` seconds of 1 Hz samples of 8 GPUs."""
        self.seq += 1
        return batch_bytes(self.gen.bodies, self.gen.flush_s, self.host, self.boot, self.seq, self.offset, t)

    async def commands(self):
        import grpc
        from gpuscope.v1 import analyzer_pb2 as apb
        call = self.channel.unary_stream(COMMANDS, request_serializer=apb.AgentHello.SerializeToString,
                                         response_deserializer=apb.Command.FromString)(
            apb.AgentHello(host=self.host, boot_id=self.boot))
        try:
            async for _cmd in call:
                self.gen.stats.commands += 1
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                self.gen.stats.stream_errors[f"Commands {exc.code().name}"] += 1

    async def acks(self, call):
        """Reads acks until the stream ends; its error is counted by run()."""
        import grpc
        st = self.gen.stats
        try:
            async for ack in call:
                sent = self.pending.pop(ack.seq, None)
                if sent is None:
                    continue
                now = time.time()
                st.acked_total += 1
                st.lat.append((sent[0], now - sent[0], now - sent[1]))
        except grpc.aio.AioRpcError as exc:
            return exc.code().name
        return "ended"

    async def run(self, start_at: float):
        import grpc
        from gpuscope.v1 import samples_pb2 as pb
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(0.0, start_at - loop.time()))
        st = self.gen.stats
        while not self.gen.stopping:
            self.channel = self.channel_new()
            cmd = asyncio.ensure_future(self.commands())
            reader = None
            try:
                call = self.channel.stream_stream(INGEST, request_serializer=None,
                                                  response_deserializer=pb.BatchAck.FromString)()
                reader = asyncio.ensure_future(self.acks(call))
                st.connected += 1
                try:
                    nxt = np.floor(time.time()) + self.phase + 1.0
                    while not self.gen.stopping:
                        if self.gen.send == "none" or self.gen.send == "one" and self.sent_once:
                            await asyncio.shield(reader)     # hold the streams open until the run ends
                            raise RuntimeError(f"ack stream ended: {reader.result()}")
                        await asyncio.sleep(max(0.0, nxt - time.time()))
                        tick = time.time()
                        msg = self.batch(tick)
                        self.pending[self.seq] = (tick, time.time())
                        st.sent_total += 1
                        await call.write(msg)
                        self.sent_once = True
                        nxt += self.gen.flush_s
                        if reader.done():
                            raise RuntimeError(f"ack stream ended: {reader.result()}")
                finally:
                    st.connected -= 1
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                st.stream_errors[exc.code().name] += 1
            except Exception as exc:  # noqa: BLE001 - a simulated agent reconnects on anything
                code = reader.result() if reader is not None and reader.done() and not reader.cancelled() else None
                st.stream_errors[code if code not in (None, "ended") else type(exc).__name__] += 1
            finally:
                if reader is not None:
                    reader.cancel()
                cmd.cancel()
                await self.channel.close(grace=None)
            self.pending.clear()         # a real uplink would resend these; we count them as lost
            await asyncio.sleep(1.0 + random.random())


class LoadGen:
    def __init__(self, target: str, tls_dir: str | None, send: str, flush_s: int = 1, slow: int = 1):
        self.target, self.tls_dir, self.send, self.flush_s = target, tls_dir, send, flush_s
        self.bodies = build_bodies(flush_s, slow)
        self.stats = Stats()
        self.agents: list[SimAgent] = []
        self.stopping = False

    async def set_agents(self, n: int, ramp_s: float):
        loop = asyncio.get_running_loop()
        while len(self.agents) > n:
            a = self.agents.pop()
            a.task.cancel()
        now, new = loop.time(), n - len(self.agents)
        for k in range(max(0, new)):
            a = SimAgent(len(self.agents), self)
            a.task = asyncio.ensure_future(a.run(now + ramp_s * k / max(1, new)))
            self.agents.append(a)

    def report(self, until: float) -> dict:
        """Ack latencies of batches whose sample time lies in [mark, until];
        those still unacked count at their age (a lower bound)."""
        st, now = self.stats, time.time()
        lat = [x for x in st.lat if st.mark <= x[0] <= until]
        censored = [now - tick for a in self.agents for tick, _ in a.pending.values() if st.mark <= tick <= until]
        tick_ack = [x[1] for x in lat] + censored
        write_ack = [x[2] for x in lat] + censored
        return dict(agents=len(self.agents), streams_up=st.connected, batches_measured=len(tick_ack),
                    unacked=len(censored), ack_p50_s=pct(tick_ack, 50), ack_p90_s=pct(tick_ack, 90),
                    ack_p99_s=pct(tick_ack, 99), ack_max_s=round(max(tick_ack), 3) if tick_ack else None,
                    write_to_ack_p50_s=pct(write_ack, 50), write_to_ack_p99_s=pct(write_ack, 99),
                    sent_total=st.sent_total, acked_total=st.acked_total, commands_received=st.commands,
                    stream_errors=dict(st.stream_errors), loadgen_loop_lag_p99_s=pct(st.loop_lag, 99))

    async def loop_lag(self):
        while True:
            t = time.perf_counter()
            await asyncio.sleep(0.1)
            self.stats.loop_lag.append(time.perf_counter() - t - 0.1)
            if len(self.stats.loop_lag) > 100_000:
                del self.stats.loop_lag[:50_000]


def loadgen_main(conn, target: str, tls_dir: str | None, send: str, flush_s: int = 1, slow: int = 1):
    async def run():
        import grpc  # noqa: F401
        gen = LoadGen(target, tls_dir, send, flush_s, slow)
        loop = asyncio.get_running_loop()
        lag = asyncio.ensure_future(gen.loop_lag())
        conn.send(("ready", len(gen.bodies)))
        while True:
            msg = await loop.run_in_executor(None, conn.recv)
            kind = msg[0]
            if kind == "agents":
                await gen.set_agents(msg[1], msg[2])
                conn.send(("ok",))
            elif kind == "mark":
                gen.stats.reset(time.time())
                conn.send(("ok",))
            elif kind == "report":
                conn.send(("report", gen.report(msg[1])))
            elif kind == "stop":
                gen.stopping = True
                for a in gen.agents:
                    a.task.cancel()
                await asyncio.gather(*(a.task for a in gen.agents), return_exceptions=True)
                lag.cancel()
                conn.send(("stopped",))
                return
    asyncio.run(run())


class LoadGenProcess:
    def __init__(self, target: str, tls_dir: str | None, send: str = "tick", flush_s: int = 1, slow: int = 1):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=loadgen_main, args=(child, target, tls_dir, send, flush_s, slow), daemon=True)
        self.proc.start()
        self.expect("ready", 120)

    def expect(self, kind: str, timeout: float):
        if not self.conn.poll(timeout):
            raise RuntimeError(f"load generator: no {kind!r} within {timeout} s")
        msg = self.conn.recv()
        if msg[0] != kind:
            raise RuntimeError(f"load generator: {msg!r}, expected {kind!r}")
        return msg

    def call(self, *msg, expect="ok", timeout=60.0):
        self.conn.send(msg)
        return self.expect(expect, timeout)

    def stop(self):
        try:
            self.call("stop", expect="stopped", timeout=60)
        except (RuntimeError, OSError, EOFError):
            pass
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()


# ---------------------------------------------------------------------------------------------
# the analyzer, the on-call client, the sampler

def analyzer_cli_flags() -> set[str]:
    out = subprocess.run([sys.executable, "-m", "gpuscope.daemon.cli", "analyzer", "--help"], capture_output=True,
                         text=True, cwd=ROOT, timeout=60).stdout
    return set(re.findall(r"(--[a-z-]+)", out))


class AnalyzerProcess:
    def __init__(self, workdir: Path, window: float, max_streams: int, tls_dir: str | None, extra: str = ""):
        self.port = free_port()
        self.target = f"127.0.0.1:{self.port}"
        flags = analyzer_cli_flags()
        # FLEET_GRPC_ANALYZER_ENTRY=script.py runs that script instead of the CLI module (what-if
        # experiments: a script that patches something, then calls gpuscope.daemon.cli.main()).
        entry = os.environ.get("FLEET_GRPC_ANALYZER_ENTRY")
        cmd = [sys.executable, *([entry] if entry else ["-m", "gpuscope.daemon.cli"]), "--json-logs", "analyzer", "--db",
               str(workdir / "f.duckdb"), "--listen", self.target, "--window", str(window)]
        self.notes = []
        if "--max-streams" in flags:
            cmd += ["--max-streams", str(max_streams)]
        if tls_dir is not None:
            cmd += ["--tls-dir", tls_dir]
        elif "--insecure" in flags:
            cmd += ["--insecure"]
        else:
            self.notes.append("analyzer has no --insecure flag yet: started without it")
        cmd += shlex.split(extra)
        self.cmd = cmd
        self.log_path = workdir / "analyzer.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT)

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def log_tail(self, n: int = 20) -> list[str]:
        try:
            return self.log_path.read_text(errors="replace").splitlines()[-n:]
        except OSError:
            return []


def oncall_channel(target: str, tls_dir: str | None):
    import grpc
    if tls_dir is None:
        return grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", 256 << 20)])
    d = Path(tls_dir)
    creds = grpc.ssl_channel_credentials((d / "ca.pem").read_bytes(), (d / "client.key").read_bytes(),
                                         (d / "client.pem").read_bytes())
    return grpc.secure_channel(target, creds, options=[("grpc.max_receive_message_length", 256 << 20)])


class Monitor:
    """This process: the on-call client (GetStatus + ListFindings once a
    second, its own channel) and a sampler of the analyzer's and the load
    generator's RSS and CPU."""

    def __init__(self, target: str, tls_dir: str | None, analyzer_pid: int, loadgen_pid: int, queries: bool = True):
        from gpuscope.v1 import analyzer_pb2 as apb, analyzer_pb2_grpc
        self.apb = apb
        self.stub = analyzer_pb2_grpc.AnalyzerStub(oncall_channel(target, tls_dir))
        self.apid, self.lpid = analyzer_pid, loadgen_pid
        self.has_lag_field = "analysis_lag_seconds" in apb.AnalyzerStatus.DESCRIPTOR.fields_by_name
        self.queries: list[tuple[float, str, float, bool]] = []   # (t, rpc, seconds, ok)
        self.status: list[tuple[float, dict]] = []
        self.samples: list[tuple[float, int, int, float, float | None, dict[int, float]]] = []
        self.stop_event = threading.Event()
        self.threads = [threading.Thread(target=self._sample, daemon=True)]
        if queries:
            self.threads.append(threading.Thread(target=self._query, daemon=True))
        for t in self.threads:
            t.start()

    def _sample(self):
        while not self.stop_event.is_set():
            t = time.time()
            rss = proc_rss(self.apid)
            if rss is not None:
                self.samples.append((t, rss[0], rss[1], proc_cpu(self.apid) or 0.0, proc_cpu(self.lpid),
                                     threads_cpu(self.apid), proc_pss(self.apid)))
            self.stop_event.wait(max(0.0, 1.0 - (time.time() - t)))

    def _query(self):
        apb = self.apb
        while not self.stop_event.is_set():
            t0 = time.time()
            try:
                s = self.stub.GetStatus(apb.StatusRequest(), timeout=10)
                t1 = time.time()
                self.queries.append((t0, "GetStatus", t1 - t0, True))
                last = np.array([g.last_sample for g in s.gpus if g.last_sample > 0])
                self.status.append((t1, dict(
                    batches=s.batches_committed, samples=s.samples_committed, hosts=s.hosts, gpus=len(s.gpus),
                    findings_open=s.findings_open, anomalies=s.anomalies, agents_connected=s.agents_connected,
                    decisions=dict(s.decisions), captures_in_flight=s.captures_in_flight,
                    lag_field=getattr(s, "analysis_lag_seconds", None) if self.has_lag_field else None,
                    lag_p50=float(np.median(t1 - last)) if len(last) else None,
                    lag_max=float((t1 - last).max()) if len(last) else None, bytes=s.ByteSize())))
            except Exception as exc:  # noqa: BLE001 - a failed query is a data point
                self.queries.append((t0, "GetStatus", time.time() - t0, False))
                self.status.append((time.time(), dict(error=str(exc)[:200])))
            t0 = time.time()
            try:
                r = self.stub.ListFindings(apb.FindingsRequest(start=t0 - 3600, limit=1000), timeout=10)
                self.queries.append((t0, "ListFindings", time.time() - t0, True))
                del r
            except Exception:  # noqa: BLE001
                self.queries.append((t0, "ListFindings", time.time() - t0, False))
            self.stop_event.wait(max(0.0, 1.0 - (time.time() - t0)))

    def stop(self):
        self.stop_event.set()
        for t in self.threads:
            t.join(15)

    def window(self, t0: float, t1: float, window_s: float) -> dict:
        smp = [s for s in self.samples if t0 <= s[0] <= t1]
        q = [x for x in self.queries if t0 <= x[0] <= t1]
        st = [s for s in self.status if t0 <= s[0] <= t1 and "error" not in s[1]]
        out: dict = {}
        if len(smp) >= 2:
            dt = smp[-1][0] - smp[0][0]
            pss = [s[6] for s in smp if s[6] is not None]
            out.update(rss_max_mb=round(max(s[1] for s in smp) / 2**20, 1), rss_end_mb=round(smp[-1][1] / 2**20, 1),
                       pss_max_mb=round(max(pss) / 2**20, 1) if pss else None,
                       analyzer_cpu_pct=round(100 * (smp[-1][3] - smp[0][3]) / dt, 1),
                       loadgen_cpu_pct=(round(100 * (smp[-1][4] - smp[0][4]) / dt, 1)
                                        if smp[-1][4] is not None and smp[0][4] is not None else None))
            a, b = smp[0][5], smp[-1][5]
            per = sorted(((tid, (b[tid] - a.get(tid, 0.0)) / dt * 100) for tid in b), key=lambda x: -x[1])
            out["analyzer_threads_cpu_pct"] = {str(tid): round(c, 1) for tid, c in per[:8] if c >= 1.0}
        for rpc in ("GetStatus", "ListFindings"):
            lat = [x[2] for x in q if x[1] == rpc]
            out[f"{rpc}_p50_s"], out[f"{rpc}_p95_s"] = pct(lat, 50), pct(lat, 95)
            out[f"{rpc}_failed"] = sum(1 for x in q if x[1] == rpc and not x[3])
        out["query_p95_s"] = pct([x[2] for x in q], 95)
        if len(st) >= 2:
            out["batches_per_s"] = round((st[-1][1]["batches"] - st[0][1]["batches"]) / (st[-1][0] - st[0][0]), 1)
            out["samples_per_s"] = round((st[-1][1]["samples"] - st[0][1]["samples"]) / (st[-1][0] - st[0][0]), 1)
        if st:
            last = st[-1][1]
            out.update(gpus=last["gpus"], hosts=last["hosts"], findings_open=last["findings_open"],
                       anomalies=last["anomalies"], agents_connected=last["agents_connected"],
                       decisions=last["decisions"], status_bytes=last["bytes"])
            fld = [s[1]["lag_field"] for s in st if s[1]["lag_field"] is not None]
            est = [s[1]["lag_max"] for s in st if s[1]["lag_max"] is not None]
            if est:     # end to end: newest sample the analysis has seen per GPU vs now (includes queueing)
                out.update(last_sample_age_max_s=round(max(est), 2),
                           last_sample_age_p50_s=round(float(np.median([s[1]["lag_p50"] for s in st])), 2))
            # analysis_lag_seconds counts only samples the analyzer has admitted; samples an
            # agent could not send yet (backpressure) show in the age of each GPU's newest
            # analysed sample. The lag judged is the larger of the two.
            if fld:
                out["analysis_lag_field_max_s"] = round(max(fld), 2)
            lags = ([max(fld)] if fld else []) + ([max(est)] if est else [])
            if lags:
                out.update(lag_source=("max(GetStatus.analysis_lag_seconds, " if fld else "(")
                           + "now - oldest gpus[].last_sample)", lag_max_s=round(max(lags), 2))
                out["lag_windows"] = round(out["lag_max_s"] / window_s, 2)
        return out


# ---------------------------------------------------------------------------------------------
# profiling

def pyspy() -> str | None:
    for cand in (shutil.which("py-spy"), str(Path(sys.executable).parent / "py-spy"), "/tmp/pyspy-prefix/bin/py-spy"):
        if cand and Path(cand).exists():
            return cand
    return None


def thread_names(pid: int) -> dict[int, str]:
    """Native thread id -> Python thread name, from `py-spy dump`."""
    exe = pyspy()
    if exe is None:
        return {}
    try:
        out = subprocess.run([exe, "dump", "--pid", str(pid), "--nonblocking"], capture_output=True, text=True,
                             timeout=30).stdout
    except subprocess.TimeoutExpired:
        return {}
    names = {}
    for m in re.finditer(r"^Thread (0x[0-9A-Fa-f]+|\d+) \([^)]*\)(?:: \"([^\"]*)\")?", out, re.M):
        ident = m.group(1)
        names[int(ident, 16) if ident.startswith("0x") else int(ident)] = m.group(2) or "?"
    return names


def start_profile(pid: int, seconds: int, path: Path, gil: bool = False) -> subprocess.Popen | None:
    """py-spy, without pausing the analyzer: every active thread (native work
    such as DuckDB's included), or with gil=True only the thread holding the GIL."""
    exe = pyspy()
    if exe is None:
        return None
    return subprocess.Popen([exe, "record", "--pid", str(pid), "--duration", str(seconds), "--rate", "25",
                             "--nonblocking", "--threads", "--format", "raw", "--output", str(path),
                             *(["--gil"] if gil else [])], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# component of a stack: the first rule whose pattern is in the stack (leaf first)
COMPONENTS = [
    ("duckdb: agents/devices upsert (INSERT OR REPLACE)", r"upsert_agents|upsert_devices"),
    ("duckdb: windows/findings/anomalies/decisions", r"insert_windows|upsert_findings|insert_anomalies|"
                                                     r"upsert_decisions|insert_decisions|insert_findings|insert_health"),
    ("duckdb: samples/processes append", r"Store\.append"),
    ("duckdb: commit/begin", r"Store\.commit|Store\.begin"),
    ("live windows: features+rules (classify)", r"compute_window|classify \(|LiveWindows\._close"),
    ("live windows: accumulate (LiveWindows.add)", r"live\.py"),
    ("detector/policy/findings", r"detector\.py|trigger\.py|findings\.py|_act_on|_decided"),
    ("analysis: _analyse/_record other", r"Analyzer\._analyse|Analyzer\._record|Analyzer\.sweep"),
    ("writer: group/concat/seqs", r"writer\.py"),
    ("decode (ingest.decode)", r"ingest\.py"),
    ("on-call queries (status, findings)", r"Analyzer\.status|GetStatus|ListFindings|store\.py|finding_pb"),
    ("service: Ingest/_admit/_ack/budget", r"service\.py|flow\.py"),
    ("grpc.aio / asyncio machinery", r"grpc|asyncio|_cython|aio|selectors"),
]


def summarize_profile(path: Path, names: dict[int, str], top: int = 25) -> dict:
    """py-spy raw (collapsed) stacks -> samples per thread, per component, and
    the top leaf and inclusive functions."""
    if not path.exists():
        return {}
    per_thread: collections.Counter = collections.Counter()
    comp: collections.Counter = collections.Counter()
    leaf: collections.Counter = collections.Counter()
    incl: collections.Counter = collections.Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        n = int(n)
        frames = stack.split(";")
        head = frames[0]
        m = re.search(r"\((0x[0-9a-fA-F]+|\d+)\)|tid[: ]*(\d+)|(0x[0-9a-fA-F]+)", head)
        tid = None
        if m:
            v = next(g for g in m.groups() if g)
            tid = int(v, 16) if v.startswith("0x") else int(v)
        tname = names.get(tid, head)
        per_thread[tname] += n
        total += n
        body = frames[1:] if head.startswith(("thread", "process", "Thread", "Process")) else frames
        while body and body[0].startswith(("process", "thread", "Thread")):
            body = body[1:]
        joined = ";".join(reversed(body))     # leaf first
        for cname, pat in COMPONENTS:
            if re.search(pat, joined):
                comp[cname] += n
                break
        else:
            comp["other"] += n
        if body:
            leaf[body[-1]] += n
        for f in set(body):
            incl[f] += n
    share = lambda c: {k: round(100 * v / total, 1) for k, v in c.most_common(top)}  # noqa: E731
    return dict(samples=total, per_thread_pct=share(per_thread), components_pct=share(comp),
                leaf_pct=share(leaf), inclusive_pct=share(incl))


# ---------------------------------------------------------------------------------------------
# TLS material

def make_certs(tls_dir: Path, agents: int) -> dict:
    """`gpuscope certs init` and `certs client` through the CLI, one agent's
    certificate through the CLI and the rest through the same library call
    (`security.certs.issue_agent`: one CLI start per agent would take minutes)."""
    gs = [sys.executable, "-m", "gpuscope.daemon.cli", "certs"]
    t0 = time.time()
    subprocess.run(gs + ["init", str(tls_dir)], check=True, cwd=ROOT, capture_output=True, timeout=120)
    subprocess.run(gs + ["client", str(tls_dir), "--name", "bench-oncall", "--role", "reader"], check=True,
                   cwd=ROOT, capture_output=True, timeout=120)
    subprocess.run(gs + ["agent", str(tls_dir), "--host", "sim-00000", "--out", str(tls_dir / "agents" / "sim-00000")],
                   check=True, cwd=ROOT, capture_output=True, timeout=120)
    from gpuscope.security.certs import issue_agent
    for i in range(1, agents):
        host = f"sim-{i:05d}"
        issue_agent(tls_dir, host, out=tls_dir / "agents" / host)
    return dict(agents=agents, seconds=round(time.time() - t0, 1))


def check_tls(target: str, tls_dir: str) -> dict:
    """Is the analyzer really speaking TLS (and refusing plain text)?"""
    import grpc
    from gpuscope.v1 import analyzer_pb2 as apb, analyzer_pb2_grpc
    out = {}
    for name, ch in (("tls", oncall_channel(target, tls_dir)), ("plaintext", grpc.insecure_channel(target))):
        try:
            analyzer_pb2_grpc.AnalyzerStub(ch).GetStatus(apb.StatusRequest(), timeout=5)
            out[name] = "ok"
        except grpc.RpcError as exc:
            out[name] = f"{exc.code().name}: {(exc.details() or '')[:100]}"
        ch.close()
    return out


# ---------------------------------------------------------------------------------------------
# runs

def wait_ready(target: str, tls_dir: str | None, timeout: float = 60.0) -> None:
    import grpc
    ch = oncall_channel(target, tls_dir)
    grpc.channel_ready_future(ch).result(timeout=timeout)
    ch.close()


def verdict(step: dict) -> list[str]:
    broken = []
    if step.get("ack_p99_s") is None or step["ack_p99_s"] > TARGETS["ack_p99_s"]:
        broken.append(f"ack p99 {step.get('ack_p99_s')} s > {TARGETS['ack_p99_s']} s")
    memory = step.get("pss_max_mb") or step.get("rss_max_mb", 0)      # the process tree, shared pages once
    if memory * 2**20 > TARGETS["rss_bytes"]:
        broken.append(f"memory (PSS) {memory} MB > 1 GiB")
    if step.get("query_p95_s") is None or step["query_p95_s"] > TARGETS["query_p95_s"]:
        broken.append(f"query p95 {step.get('query_p95_s')} s > {TARGETS['query_p95_s']} s")
    if step.get("lag_windows") is None or step["lag_windows"] > TARGETS["lag_windows"]:
        broken.append(f"analysis lag {step.get('lag_windows')} windows > {TARGETS['lag_windows']}")
    if step.get("stream_errors"):
        broken.append(f"stream errors {step['stream_errors']}")
    return broken


def ramp(ns, workdir: Path) -> dict:
    steps = [int(x) for x in ns.steps.split(",")]
    tls_dir = None
    res: dict = dict(mode=("tls" if ns.tls else "insecure") + (f"-flush{ns.flush}" if ns.flush != 1 else "")
                     + (f"-slow{ns.slow}" if ns.slow != 1 else ""),
                     window_s=ns.window, hold_s=ns.hold, settle_s=ns.settle, flush_s=ns.flush, slow=ns.slow, steps=[])
    if ns.tls:
        tls_dir = str(workdir / "tls")
        res["certs"] = make_certs(Path(tls_dir), max(steps))
    an = AnalyzerProcess(workdir, ns.window, ns.max_streams or 2 * max(steps) + 200, tls_dir, ns.analyzer_args)
    res["analyzer_cmd"] = " ".join(an.cmd[1:])
    res["notes"] = list(an.notes)
    gen = mon = None
    try:
        wait_ready(an.target, tls_dir)
        if tls_dir:
            res["tls_check"] = check_tls(an.target, tls_dir)
            if res["tls_check"].get("plaintext") == "ok":
                res["notes"].append("the analyzer answered plain text with --tls-dir: TLS is not wired into "
                                    "`gpuscope analyzer` yet, so this run measured no TLS")
                return res
        gen = LoadGenProcess(an.target, tls_dir, flush_s=ns.flush, slow=ns.slow)
        mon = Monitor(an.target, tls_dir, an.proc.pid, gen.proc.pid)
        prev = 0
        for n in steps:
            ramp_s = max(2.0, (n - prev) / CONNECT_RATE)
            t_start = time.time()
            gen.call("agents", n, ramp_s)
            time.sleep(ramp_s + ns.settle)
            gen.call("mark")
            t0 = time.time()
            profs = {}
            names = {}
            load0 = os.getloadavg()[0]
            if ns.profile:
                names = thread_names(an.proc.pid)
                for kind in ("threads", "gil"):
                    profs[kind] = start_profile(an.proc.pid, max(5, int(ns.hold) - 10),
                                                workdir / f"profile-{kind}-{n}.txt", gil=kind == "gil")
            time.sleep(ns.hold)
            t1 = time.time()
            rep = gen.call("report", t1 - 10, expect="report")[1]
            step = dict(agents=n, gpus_expected=n * GPUS, ramp_s=round(ramp_s, 1),
                        measured_s=round(t1 - t0, 1), started=round(t_start, 1),
                        machine_load_1m=[round(load0, 2), round(os.getloadavg()[0], 2)])
            step.update(rep)
            step.update(mon.window(t0, t1, ns.window))
            if step.get("analyzer_threads_cpu_pct") and names:
                step["analyzer_threads_cpu_pct"] = {f"{names.get(int(t), 'native')}[{t}]": c
                                                    for t, c in step["analyzer_threads_cpu_pct"].items()}
            for kind, prof in profs.items():
                if prof is None:
                    continue
                prof.wait(60)
                path = workdir / f"profile-{kind}-{n}.txt"
                step[f"profile_{kind}"] = summarize_profile(path, names)
                OUT_DIR.mkdir(parents=True, exist_ok=True)
                if path.exists():
                    shutil.copy(path, OUT_DIR / f"fleet_grpc-{res['mode']}-profile-{kind}-{n}.txt")
            step["broken"] = verdict(step)
            res["steps"].append(step)
            print_step(step, flush=True)
            prev = n
            if an.proc.poll() is not None:
                res["notes"].append(f"analyzer exited with {an.proc.returncode}")
                break
            if step["broken"] and not ns.keep_going:
                break
        held = [s["agents"] for s in res["steps"] if not s["broken"]]
        res["held_agents"] = max(held) if held else 0
        res["first_broken"] = next((dict(agents=s["agents"], why=s["broken"]) for s in res["steps"] if s["broken"]),
                                   None)
    finally:
        _teardown(res, mon, gen, an)
        res["analyzer_log_tail"] = [ln[:300] for ln in an.log_tail(8)]
    return res


def count_log(path: Path) -> dict:
    c: collections.Counter = collections.Counter()
    try:
        for line in path.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("level") in ("warning", "error", "critical"):
                c[f"{rec.get('level')}: {str(rec.get('event'))[:60]}"] += 1
    except OSError:
        pass
    return dict(c.most_common(10))


def connect_only(ns, workdir: Path) -> dict:
    n = ns.connect_only
    an = AnalyzerProcess(workdir, ns.window, ns.max_streams or 2 * n + 200, None, ns.analyzer_args)
    res: dict = dict(mode="connect-only", agents=n, send_one=not ns.send_nothing, analyzer_cmd=" ".join(an.cmd[1:]),
                     notes=list(an.notes))
    gen = mon = None
    try:
        wait_ready(an.target, None)
        gen = LoadGenProcess(an.target, None, send="none" if ns.send_nothing else "one")
        mon = Monitor(an.target, None, an.proc.pid, gen.proc.pid, queries=False)
        time.sleep(3)
        base = proc_rss(an.proc.pid)[0]
        ramp_s = n / ns.connect_rate
        t0 = time.time()
        gen.call("agents", n, ramp_s)
        time.sleep(ramp_s + ns.hold)
        t_hold = time.time()
        rep = gen.call("report", t_hold, expect="report")[1]
        gen.call("agents", 0, 0)
        time.sleep(20)
        t_end = time.time()
        series = [(round(s[0] - t0, 1), round(s[1] / 2**20, 1)) for s in mon.samples if s[0] >= t0 - 3]
        during = [s for s in mon.samples if t0 <= s[0] <= t_hold]
        peak = max(s[1] for s in during)
        res.update(rss_before_mb=round(base / 2**20, 1), rss_peak_mb=round(peak / 2**20, 1),
                   rss_at_hold_end_mb=round(during[-1][1] / 2**20, 1),
                   rss_after_disconnect_mb=round(mon.samples[-1][1] / 2**20, 1),
                   rss_hwm_mb=round(mon.samples[-1][2] / 2**20, 1),
                   kb_per_agent=round((peak - base) / 1024 / max(1, n), 1),
                   ramp_s=ramp_s, hold_s=ns.hold, seconds=round(t_end - t0, 1),
                   streams_up_at_end=rep["streams_up"], batches_acked=rep["acked_total"],
                   batches_sent=rep["sent_total"], stream_errors=rep["stream_errors"],
                   rss_series_mb=series[::2],
                   rss_last_30s_slope_mb_per_min=_slope([s for s in during if s[0] >= t_hold - 30]))
        res["analyzer"] = mon.window(t0, t_hold, ns.window)
    finally:
        _teardown(res, mon, gen, an)
    return res


def _teardown(res: dict, mon, gen, an) -> None:
    """Stops the monitor, the load and the analyzer, whatever happened."""
    if mon is not None:
        mon.stop()
    if gen is not None:
        gen.stop()
    res["analyzer_exit"] = an.stop()
    res["analyzer_log_warnings"] = count_log(an.log_path)


def _slope(smp) -> float | None:
    if len(smp) < 3:
        return None
    t = np.array([s[0] for s in smp])
    r = np.array([s[1] for s in smp]) / 2**20
    return round(float(np.polyfit(t - t[0], r, 1)[0] * 60), 2)


# ---------------------------------------------------------------------------------------------

COLS = [("agents", "agents"), ("ack p50", "ack_p50_s"), ("ack p99", "ack_p99_s"), ("batch/s", "batches_per_s"),
        ("RSS MB", "rss_max_mb"), ("PSS MB", "pss_max_mb"), ("an CPU%", "analyzer_cpu_pct"),
        ("gen CPU%", "loadgen_cpu_pct"),
        ("Status p95", "GetStatus_p95_s"), ("Findings p95", "ListFindings_p95_s"), ("lag win", "lag_windows"),
        ("errors", "stream_errors")]


def print_step(step: dict, flush: bool = False):
    print(" | ".join(f"{h} {step.get(k)}" for h, k in COLS) + ("  BROKEN: " + "; ".join(step["broken"])
                                                                 if step.get("broken") else "  ok"),
          file=sys.stderr, flush=flush)


def print_table(res: dict):
    if "steps" in res:
        print("| " + " | ".join(h for h, _ in COLS) + " |")
        print("|" + "---|" * len(COLS))
        for s in res["steps"]:
            print("| " + " | ".join(str(s.get(k)) for _, k in COLS) + " |")
    else:
        for k in ("agents", "rss_before_mb", "rss_peak_mb", "rss_at_hold_end_mb", "rss_after_disconnect_mb",
                  "kb_per_agent", "streams_up_at_end", "stream_errors"):
            print(f"{k:28s} {res.get(k)}")


def git_tree() -> str:
    """HEAD and whether the working tree differed from it (others edit it meanwhile)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=ROOT, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return head + (" + uncommitted changes" if dirty else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", default="100,150,200,250,500,1000,2000,3000", help="agents per step (comma-separated)")
    ap.add_argument("--keep-going", action="store_true", help="measure every step, even after one broke a target")
    ap.add_argument("--hold", type=float, default=45.0, help="measured seconds per step")
    ap.add_argument("--settle", type=float, default=12.0, help="seconds after the ramp before measuring")
    ap.add_argument("--window", type=float, default=5.0)
    ap.add_argument("--max-streams", type=int, default=0,
                    help="analyzer --max-streams (default: 2 per agent of the largest step + 200)")
    ap.add_argument("--flush", type=int, default=1, metavar="S",
                    help="each agent sends one batch every S seconds holding S samples per GPU (default 1)")
    ap.add_argument("--slow", type=int, default=1, metavar="N",
                    help="hold each recording row N seconds: phases (and verdicts) change N times less often")
    ap.add_argument("--tls", action="store_true", help="mutual TLS: `gpuscope certs`, one certificate per agent")
    ap.add_argument("--analyzer-args", default="", metavar="ARGS",
                    help="more `gpuscope analyzer` flags, e.g. '--memory-limit 256MB'")
    ap.add_argument("--profile", action="store_true", help="py-spy the analyzer in every step")
    ap.add_argument("--connect-only", type=int, default=0, metavar="N", help="N agents connect, send one batch, idle")
    ap.add_argument("--send-nothing", action="store_true", help="with --connect-only: open the streams only")
    ap.add_argument("--connect-rate", type=float, default=250.0, help="agents per second (connect-only)")
    ap.add_argument("--out", default=None, help="result JSON (default bench/out/fleet_grpc-<mode>-<time>.json)")
    ns = ap.parse_args()
    if ns.connect_only and ns.hold == 45.0:
        ns.hold = 60.0
    workdir = Path(tempfile.mkdtemp(prefix="fleet_grpc-"))
    t0 = time.time()
    try:
        res = connect_only(ns, workdir) if ns.connect_only else ramp(ns, workdir)
    finally:
        keep = os.environ.get("FLEET_GRPC_KEEP")
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    res = dict(date=time.strftime("%Y-%m-%d %H:%M"), machine=f"{platform.node()} {os.cpu_count()} cpu",
               python=platform.python_version(), wall_s=round(time.time() - t0, 1), tree=git_tree(), targets=dict(
                   ack_p99_s=5, rss_gib=1, query_p95_s=0.2, lag_windows=2), **res)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    out = Path(ns.out) if ns.out else OUT_DIR / f"fleet_grpc-{res['mode']}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(res, indent=1, default=str))
    print_table(res)
    print(f"result: {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
