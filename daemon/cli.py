"""`gpuscope`: the command line, and the composition root that wires
collectors, agent, analyzer and servers together. Only `main` exits."""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from gpuscope.collectors import catalogue as cat
from gpuscope.collectors.nvml import NvmlCollector, NvmlConfig, SourceUnavailable
from gpuscope.collectors.recording import RecordingError, default_recording, read_recording
from gpuscope.collectors.replay import ReplayCollector
from gpuscope.collectors.xspace_reader import TraceError
from gpuscope.v1 import agent_pb2_grpc, analyzer_pb2_grpc

from . import clients, logs
from .agent import Agent, AgentConfig
from .serve import ListenError, build_server, parse_hostport, shutdown
from .service import AgentServicer
from .uplink import Uplink, UplinkConfig

VERDICTS = ("compute-bound", "memory-bound", "launch-bound", "host-bound", "communication-bound", "idle")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")


class UsageError(Exception):
    pass


def duration(value: str) -> float:
    m = _DURATION.match(value.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"{value!r} is not a duration like 90s, 15m, 1h, 2d")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def default_db() -> str:
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "gpuscope", "gpuscope.duckdb")


def _print_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=1, default=str)
    sys.stdout.write("\n")


# -- sources ------------------------------------------------------------------------------
def make_source(spec: str, speed: float, allow_fallback: bool):
    """Returns (collector, description). nvml|replay:FILE|auto."""
    if spec.startswith("replay:"):
        return _replay(spec.removeprefix("replay:"), speed)
    if spec not in ("nvml", "auto"):
        raise UsageError(f"--source: {spec!r}, expected nvml, replay:FILE or auto")
    collector = NvmlCollector(NvmlConfig())
    try:
        collector.start()
    except SourceUnavailable as exc:
        if spec == "nvml" or not allow_fallback:
            raise
        print(f"gpuscope: no GPU here ({exc}).\ngpuscope: replaying the bundled NVIDIA H200 recording "
              f"at {speed:g}x instead.", file=sys.stderr)
        return _replay(str(default_recording()), speed)
    return _Started(collector), "nvml"


def _replay(path: str, speed: float):
    if speed <= 0:
        raise UsageError(f"--speed: must be > 0, got {speed}")
    rec = read_recording(path)
    return ReplayCollector(rec, speed=speed, loop=True), f"replay:{path}"


class _Started:
    """Wraps a collector already started (NVML probing happens before the agent)."""
    def __init__(self, inner):
        self._inner = inner

    def start(self):
        pass

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _setup_captures(agent: Agent, ns, analyzer_target: str | None) -> None:
    """Deep captures: runner under --capture-dir, job discovery, and reports
    to the analyzer (which summarizes, stores and links them)."""
    from gpuscope.collectors.jobs import JobDiscovery
    from gpuscope.collectors.xla_profiler import XlaProfilerClient
    from .captures import CaptureConfig, CaptureRunner
    from .convert import capture_pb

    agent.captures = CaptureRunner(CaptureConfig(Path(ns.capture_dir), max_bytes=ns.capture_budget_mb << 20), ns.host)
    serving = {}
    for item in ns.serving or []:
        url, sep, trace_dir = item.partition("=")
        if not sep or not url.startswith("http"):
            raise UsageError(f"--serving: {item!r} is not URL=TRACE_DIR (e.g. http://127.0.0.1:8000=/tmp/vllm_profile)")
        serving[url] = trace_dir
    agent.discovery = JobDiscovery(lambda addr: XlaProfilerClient(addr).probe(), configured=ns.profiler or [],
                                   serving=serving)
    if analyzer_target:
        agent.capture_reporter = lambda rec, data: clients.report_capture(analyzer_target, capture_pb(rec), data)


def _analyzer_config(ns, dry_run: bool):
    from gpuscope.analyzers.analyzer import AnalyzerConfig
    from gpuscope.analyzers.trigger import TriggerConfig

    trigger = TriggerConfig(dry_run=dry_run, host_cooldown_s=ns.host_cooldown, job_captures_per_hour=ns.job_captures,
                            fleet_fraction=ns.fleet_fraction, capture_duration_ms=ns.capture_duration_ms)
    return AnalyzerConfig(ns.db, window_s=ns.window, memory_limit=ns.memory_limit,
                          threads=getattr(ns, "threads", 2), trigger=trigger)


def _start_commands(agent: Agent, target: str, host: str):
    from .commands import CommandListener

    listener = CommandListener(target, host, agent.boot_id, agent.run_command)
    listener.start()
    return listener


def _uplink_factory(host: str, target: str, buffer_samples: int):
    def make(boot_id, devices):
        return Uplink(UplinkConfig(target=target, buffer_samples=buffer_samples), host, boot_id, devices)
    return make


def _wait(stop: threading.Event, seconds: float | None, tick=None) -> None:
    deadline = None if seconds is None else time.monotonic() + seconds
    while not stop.is_set():
        if tick is not None:
            tick()
        left = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
        if left <= 0:
            return
        stop.wait(left)


def _install_signals(stop: threading.Event) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())


def _loopback(listen: str, port: int) -> str:
    host = listen.rpartition(":")[0]
    if host in ("0.0.0.0", "[::]", ""):
        host = "127.0.0.1"
    return f"{host}:{port}"


# -- commands ---------------------------------------------------------------------------
def cmd_up(ns) -> int:
    from gpuscope.analyzers.analyzer import Analyzer
    from gpuscope.analyzers.service import AnalyzerServicer
    from .view import LiveView

    parse_hostport(ns.listen, "--listen")
    Path(ns.db).parent.mkdir(parents=True, exist_ok=True)
    collector, source = make_source(ns.source, ns.speed, allow_fallback=True)
    # A replay has no real process to capture: decisions are recorded as dry runs.
    analyzer = Analyzer(_analyzer_config(ns, dry_run=ns.dry_run or source.startswith("replay:")))
    analyzer.start()
    agent_cfg = AgentConfig(host=ns.host, source=source, interval_s=ns.interval)
    agent = Agent(agent_cfg, collector)
    server, port, health = build_server(ns.listen, [
        (analyzer_pb2_grpc.add_AnalyzerServicer_to_server, AnalyzerServicer(analyzer), "gpuscope.v1.Analyzer"),
        (agent_pb2_grpc.add_AgentServicer_to_server, AgentServicer(agent, "in-process"), "gpuscope.v1.Agent")])
    server.start()
    target = _loopback(ns.listen, port)
    _setup_captures(agent, ns, target)
    agent.start(_uplink_factory(ns.host, target, ns.buffer_samples))
    listener = _start_commands(agent, target, ns.host)
    stop = threading.Event()
    _install_signals(stop)
    view = LiveView()
    header = (f"gpuscope up: {source} ({ns.speed:g}x)  listening on {ns.listen.rpartition(':')[0]}:{port}  "
              f"db {ns.db}")
    print(f"gpuscope: serving on {ns.listen.rpartition(':')[0]}:{port}; query it with "
          f"`gpuscope findings --server {target}`", file=sys.stderr)

    def tick():
        if not ns.no_view:
            view.show(analyzer.status(), analyzer.store.findings(open_only=True, limit=8), header)
    try:
        _wait(stop, ns.duration, tick)
    finally:
        listener.stop()
        agent.stop()
        shutdown(server, health)
        analyzer.close()
    print("gpuscope: stopped", file=sys.stderr)
    return 0


def cmd_agent(ns) -> int:
    parse_hostport(ns.listen, "--listen")
    if ns.analyzer:
        parse_hostport(ns.analyzer, "--analyzer")
    collector, source = make_source(ns.source, ns.speed, allow_fallback=False)
    factory = _uplink_factory(ns.host, ns.analyzer, ns.buffer_samples) if ns.analyzer else None
    agent = Agent(AgentConfig(host=ns.host, source=source, interval_s=ns.interval), collector, factory)
    _setup_captures(agent, ns, ns.analyzer or None)
    server, port, health = build_server(ns.listen, [
        (agent_pb2_grpc.add_AgentServicer_to_server, AgentServicer(agent, ns.analyzer or ""), "gpuscope.v1.Agent")],
        max_workers=8)
    agent.start()
    server.start()
    listener = _start_commands(agent, ns.analyzer, ns.host) if ns.analyzer else None
    print(f"gpuscope agent: {source}, API on {ns.listen.rpartition(':')[0]}:{port}, "
          f"analyzer {ns.analyzer or '(none)'}", file=sys.stderr)
    stop = threading.Event()
    _install_signals(stop)
    try:
        _wait(stop, ns.duration)
    finally:
        if listener is not None:
            listener.stop()
        agent.stop()
        shutdown(server, health)
    return 0


def cmd_analyzer(ns) -> int:
    from gpuscope.analyzers.analyzer import Analyzer
    from gpuscope.analyzers.service import AnalyzerServicer

    parse_hostport(ns.listen, "--listen")
    Path(ns.db).parent.mkdir(parents=True, exist_ok=True)
    analyzer = Analyzer(_analyzer_config(ns, dry_run=ns.dry_run))
    server, port, health = build_server(ns.listen, [
        (analyzer_pb2_grpc.add_AnalyzerServicer_to_server, AnalyzerServicer(analyzer), "gpuscope.v1.Analyzer")],
        max_workers=ns.max_streams)
    analyzer.start()
    server.start()
    print(f"gpuscope analyzer: listening on {ns.listen.rpartition(':')[0]}:{port}, db {ns.db}", file=sys.stderr)
    stop = threading.Event()
    _install_signals(stop)
    try:
        _wait(stop, ns.duration)
    finally:
        shutdown(server, health)
        analyzer.close()
    return 0


def _time_range(ns) -> tuple[float | None, float | None]:
    end = ns.end
    start = ns.start
    if ns.since is not None:
        start = (end or time.time()) - ns.since
    return start, end


def cmd_status(ns) -> int:
    s = clients.status(ns.server)
    if ns.json:
        _print_json(s)
        return 0
    if s["kind"] == "agent":
        print(f"agent {s['host']} ({s['source']}): {s['samples']} samples, uplink "
              f"{'connected' if s['uplink_connected'] else 'DISCONNECTED'} to {s['analyzer']}, "
              f"dropped {s['dropped_samples']}, unacked {s['unacked_samples']}")
        for d in s.get("devices", []):
            print(f"  gpu{d.get('gpu', 0)} {d.get('name', '')} {'LOST' if d.get('lost') else ''}")
        return 0
    print(f"analyzer {s['version']}: {s['hosts']} hosts, {s['samples_committed']} samples, "
          f"{s['findings_open']} open findings, {s['anomalies']} anomalies, {s['captures_in_flight']} captures "
          f"in flight, {s['agents_connected']} agents on the command stream, db {s['db_path']}")
    for g in s.get("gpus", []):
        print(f"  {g['host']}/gpu{g.get('gpu', 0)} {g.get('verdict') or '-':<20} {g.get('confidence', 0):.2f} "
              f"{','.join(g.get('flags', []))}{' LOST' if g.get('lost') else ''}")
    return 0


def cmd_findings(ns) -> int:
    start, end = _time_range(ns)
    rows = clients.findings(ns.server, ns.host or "", ns.gpu, ns.verdict, start, end, ns.open, ns.limit)
    if ns.json:
        _print_json({"findings": rows})
        return 0
    if not rows:
        print("no findings")
    for f in rows:
        end_s = "open" if f["end"] is None else time.strftime("%H:%M:%S", time.localtime(f["end"]))
        print(f"{f['id']} {f['host']}/gpu{f['gpu']} {f['verdict']:<20} "
              f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(f['start']))} -> {end_s} "
              f"conf {f['confidence']:.2f} {','.join(f['flags'])}\n    {f['summary']}")
    return 0


def cmd_query(ns) -> int:
    if ns.metric not in cat.BY_NAME:
        raise UsageError(f"--metric: unknown {ns.metric!r}; `gpuscope metrics` lists them")
    start, end = _time_range(ns)
    end = end or time.time()
    start = start if start is not None else end - 3600
    r = clients.query(ns.server, ns.metric, ns.host or "", ns.gpu, start, end, ns.aggregate, ns.step or 0)
    if ns.json:
        _print_json(r)
        return 0
    for s in r["series"]:
        if r["aggregate"] == "series":
            print(f"{s['host']}/gpu{s['gpu']} {r['metric']} ({r['unit']}), {len(s['points'])} points:")
            for t, v in s["points"]:
                print(f"  {time.strftime('%H:%M:%S', time.localtime(t))} {v:.6g}")
        else:
            print(f"{s['host']}/gpu{s['gpu']} {r['aggregate']}({r['metric']}) = {s['value']} {r['unit']} "
                  f"over {s['samples']} samples")
    return 0


def cmd_classify(ns) -> int:
    from gpuscope.analyzers.offline import classify_recording

    rec = read_recording(ns.file)
    try:
        results = classify_recording(rec, ns.window)
    except ValueError as exc:
        raise UsageError(f"--window: {exc}") from None
    windows = [dict(gpu=c.gpu, start=c.start, end=c.end, verdict=c.verdict, confidence=c.confidence,
                    evidence=c.evidence, flags=c.flags, summary=c.summary,
                    alternatives=list(c.alternatives)) for c in results]
    if ns.json:
        _print_json({"windows": windows, "window_seconds": ns.window})
        return 0
    for w in windows:
        print(f"gpu{w['gpu']} {time.strftime('%H:%M:%S', time.localtime(w['start']))} {w['verdict']:<20} "
              f"{w['confidence']:.2f} {','.join(w['flags'])}  {w['summary']}")
    return 0


def cmd_trace_summarize(ns) -> int:
    from gpuscope.analyzers.trace_analysis import summarize
    from gpuscope.collectors.trace_files import load_trace

    summary = summarize(load_trace(ns.path))
    if ns.json:
        _print_json(summary)
        return 0
    print(f"{summary['source']} ({summary['format']}, {summary['span_seconds'] * 1e3:.0f} ms)")
    print(f"verdict: {summary['verdict'] or 'none'} (confidence {summary['confidence']:.2f}, decided by the trace)")
    print(f"  {summary['summary']}")
    for op in summary.get("top_ops", [])[:5]:
        bound = op.get("bound") or "?"
        print(f"  {op['time_fraction']:6.1%}  {op['count']:6d}x  {(op['op'] or '-')[:32]:<32} {op['kernel'][:40]:<40} {bound}")
    for w in summary["warnings"]:
        print(f"  note: {w}")
    return 0


def cmd_capture(ns) -> int:
    from gpuscope.analyzers.trace_analysis import summarize
    from gpuscope.collectors.trace_files import parse_trace

    if ns.duration_ms <= 0:
        raise UsageError(f"--duration-ms: must be > 0, got {ns.duration_ms}")
    record, xspace = clients.capture(ns.server, ns.jax, ns.pid, ns.duration_ms)
    summary = summarize(parse_trace(xspace, record["path"])) if xspace else None
    if ns.json:
        out = dict(summary) if summary else dict(verdict=None, summary=f"capture {record['status']}: {record['error']}")
        out["capture"] = record
        _print_json(out)
    else:
        print(f"capture {record['id']}: {record['status']} ({record['target']}, {record['duration_ms']} ms) "
              f"-> {record['path'] or '-'} on {record['host']}")
        if record["error"]:
            print(f"  error: {record['error']}")
        if summary:
            print(f"  verdict: {summary['verdict'] or 'none'} (confidence {summary['confidence']:.2f})")
            print(f"  {summary['summary']}")
    return 0 if record["status"].startswith("ok") else 1


def cmd_captures(ns) -> int:
    rows = clients.captures(ns.server)
    if ns.json:
        _print_json({"captures": rows})
        return 0
    if not rows:
        print("no captures")
    for r in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["start"]))
        print(f"{r['id']} {when} {r['host']} {r['target']} {r['status']:<10} {r.get('verdict') or '-':<20} "
              f"{r['size_bytes'] >> 10} KiB {r['job'][:40]}")
        if r.get("error"):
            print(f"    {r['error']}")
    return 0


def cmd_jobs(ns) -> int:
    rows = clients.jobs(ns.server)
    if ns.json:
        _print_json({"jobs": rows})
        return 0
    if not rows:
        print("no JAX/XLA jobs with a profiler server on this host's GPUs")
    for j in rows:
        print(f"pid {j['pid'] or '-':>7}  {j['address']:<21} gpus {','.join(map(str, j['gpus'])) or '-':<8} "
              f"({j['found_by']})  {j['command'][:60]}")
    return 0


def _event_line(e: dict) -> str:
    r = e["record"]
    when = time.strftime("%H:%M:%S", time.localtime(e["t"])) if e["t"] else "--:--:--"
    where = f"{e['host']}/gpu{e['gpu']}"
    if e["kind"] == "finding":
        state = "closed" if r.get("end") else "opened"
        return f"{when} finding  {where} {state} {r['verdict']} (conf {r['confidence']:.2f}): {r['summary']}"
    if e["kind"] == "anomaly":
        return f"{when} anomaly  {where} {','.join(r['kinds'])}: {r['reason']}"
    if e["kind"] == "decision":
        return f"{when} decision {where} {r['action']} [{r['status']}] {r['reason']}"
    return (f"{when} capture  {where} {r.get('kind')} {r['status']} verdict {r.get('verdict') or '-'} "
            f"{r.get('path') or ''} {r.get('error') or ''}")


def cmd_watch(ns) -> int:
    try:
        for e in clients.watch(ns.server, ns.host or "", ns.gpu, ns.verdict or (), ns.kind or ()):
            if ns.json:
                print(json.dumps(e, default=str), flush=True)
            else:
                print(_event_line(e), flush=True)
    except KeyboardInterrupt:
        pass
    return 0


def cmd_records(ns) -> int:
    since = time.time() - ns.since if ns.since else 0.0
    rows = clients.records(ns.server, ns.command, ns.host or "", since, ns.limit)
    if ns.json:
        _print_json({ns.command: rows})
        return 0
    if not rows:
        print(f"no {ns.command}")
    kind = "anomaly" if ns.command == "anomalies" else "decision"
    for r in rows:
        print(_event_line(dict(kind=kind, t=r["t"], host=r["host"], gpu=r["gpu"], record=r)))
    return 0


def cmd_report(ns) -> int:
    rep = clients.report(ns.server, ns.finding_id, ns.context or 0.0)
    if ns.json:
        _print_json(rep)
        return 0
    print(render_report(rep))
    return 0


def render_report(rep: dict) -> str:
    f, c, v = rep["finding"], rep["counters"], rep["verdict"]
    fmt = lambda t: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "open"  # noqa: E731
    lines = [f"finding {f['id']}: {f['host']}/gpu{f['gpu']} {v['decided']} (decided by {v['by']}; counters said "
             f"{v['counters']}, trace said {v['trace'] or '-'})",
             f"  {fmt(f['start'])} -> {fmt(f['end'])}, {f['windows']} windows, confidence {f['confidence']:.2f}, "
             f"job {f['job'] or '-'}", f"  {f['summary']}", "",
             f"counters (means; before/after = {c['context_seconds']:.0f} s around the episode):",
             f"  {'metric':<32} {'before':>12} {'during':>12} {'after':>12}"]
    for m in [k for k in c["during"] if k != "samples"]:
        vals = [c[w].get(m) if c[w] else None for w in ("before", "during", "after")]
        if any(x is not None for x in vals):
            lines.append(f"  {m:<32} " + " ".join(f"{x:>12.4g}" if x is not None else f"{'-':>12}" for x in vals))
    lines += ["", "what changed against the job's baseline (before):"]
    lines += [f"  {ch['metric']}: {ch['before']:.4g} -> {ch['during']:.4g} ({ch['relative']:+.0%})"
              for ch in rep["changes"]] or ["  nothing moved by 10 % or more"]
    lines += ["", f"captures: {len(rep['captures'])}"]
    for cap in rep["captures"]:
        t = cap.get("trace_summary") or {}
        lines.append(f"  {cap['id']} {cap.get('kind')} {cap['status']} {cap['path'] or ''}")
        if t:
            lines.append(f"    trace: {t.get('verdict')} — {t.get('summary')}")
    lines += ["", f"anomalies: {len(rep['anomalies'])}"]
    lines += [f"  {fmt(a['t'])} {','.join(a['kinds'])}: {a['reason']}" for a in rep["anomalies"]]
    lines += [f"decisions: {len(rep['decisions'])}"]
    lines += [f"  {fmt(d['t'])} {d['action']} [{d['status']}] {d['reason']}" for d in rep["decisions"]]
    return "\n".join(lines)


def cmd_metrics(ns) -> int:
    rows = [dict(name=m.name, unit=m.unit, kind=m.kind.value, help=m.help, raw_unit=m.raw_unit,
                 slow=m.slow) for m in cat.METRICS]
    if ns.json:
        _print_json({"metrics": rows})
    else:
        for r in rows:
            print(f"{r['name']:<40} {r['unit']:<8} {r['kind']:<8} {r['help']}")
    return 0


# -- parser --------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpuscope", description="GPU fleet profiler: names each GPU's bottleneck.")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--json-logs", action="store_true", default=None, help="JSON log lines (default off a terminal)")
    sub = p.add_subparsers(dest="command", required=True)

    def source_args(sp, default):
        sp.add_argument("--source", default=default, help="nvml, replay:FILE, or auto (NVML, else the bundled H200 recording)")
        sp.add_argument("--speed", type=float, default=1.0, help="replay speed (default 1)")
        sp.add_argument("--interval", type=float, default=1.0, help="sampling interval in seconds, 0.1 to 60 (default 1)")
        sp.add_argument("--host", default=socket.gethostname(), help="host name reported (default: this host's)")
        sp.add_argument("--buffer-samples", type=int, default=50_000,
                        help="samples kept while the analyzer is away (default 50000; oldest dropped first)")
        sp.add_argument("--duration", type=duration, default=None, help="stop after this long (default: run until Ctrl-C)")
        sp.add_argument("--capture-dir", default=os.path.join(os.path.dirname(default_db()), "captures"),
                        help="where deep captures are written (default: beside the default DB)")
        sp.add_argument("--capture-budget-mb", type=int, default=2048, help="capture directory budget (default 2048)")
        sp.add_argument("--profiler", action="append", metavar="HOST:PORT",
                        help="a JAX profiler server to know about (repeat); others are discovered")
        sp.add_argument("--serving", action="append", metavar="URL=TRACE_DIR",
                        help="a vLLM/SGLang server with /start_profile and the directory it writes traces to (repeat)")

    def analyzer_args(sp):
        sp.add_argument("--db", default=default_db(), help=f"DuckDB file (default {default_db()})")
        sp.add_argument("--window", type=float, default=5.0, help="classification window in seconds, 1-60 (default 5)")
        sp.add_argument("--memory-limit", default="1GB", help="DuckDB memory cap (default 1GB)")
        sp.add_argument("--dry-run", action="store_true", help="record capture decisions, start none")
        sp.add_argument("--host-cooldown", type=duration, default=600.0, help="between captures on a host (default 10m)")
        sp.add_argument("--job-captures", type=int, default=3, help="captures per job per hour (default 3)")
        sp.add_argument("--fleet-fraction", type=float, default=0.05,
                        help="share of hosts that may capture at once, at least one (default 0.05)")
        sp.add_argument("--capture-duration-ms", type=int, default=2000, help="triggered capture length (default 2000)")

    sp = sub.add_parser("up", help="agent + analyzer in one process, with a live view")
    sp.add_argument("--listen", default="127.0.0.1:9400", help="gRPC address (default 127.0.0.1:9400)")
    sp.add_argument("--no-view", action="store_true", help="no live view (logs only)")
    source_args(sp, "auto")
    analyzer_args(sp)
    sp.set_defaults(fn=cmd_up)

    sp = sub.add_parser("agent", help="the per-host sampling daemon")
    sp.add_argument("--analyzer", default="", help="analyzer HOST:PORT to stream to")
    sp.add_argument("--listen", default="127.0.0.1:9401", help="agent API address (default 127.0.0.1:9401)")
    source_args(sp, "nvml")
    sp.set_defaults(fn=cmd_agent)

    sp = sub.add_parser("analyzer", help="the central analyzer: ingest, store, findings, queries")
    sp.add_argument("--listen", default="0.0.0.0:9400", help="gRPC address (default 0.0.0.0:9400)")
    sp.add_argument("--threads", type=int, default=2, help="DuckDB threads (default 2)")
    sp.add_argument("--max-streams", type=int, default=256, help="concurrent gRPC calls, agents included (default 256)")
    sp.add_argument("--duration", type=duration, default=None, help="stop after this long")
    analyzer_args(sp)
    sp.set_defaults(fn=cmd_analyzer)

    def server_args(sp):
        sp.add_argument("--server", required=True, help="analyzer (or agent) HOST:PORT")
        sp.add_argument("--json", action="store_true", help="JSON output")

    def range_args(sp):
        sp.add_argument("--since", type=duration, default=None, help="from this long ago, e.g. 1h")
        sp.add_argument("--start", type=float, default=None, help="Unix seconds")
        sp.add_argument("--end", type=float, default=None, help="Unix seconds (default now)")
        sp.add_argument("--host", default="")
        sp.add_argument("--gpu", type=int, default=None)

    sp = sub.add_parser("status", help="analyzer or agent status")
    server_args(sp)
    sp.set_defaults(fn=cmd_status)

    sp = sub.add_parser("findings", help="bottleneck episodes")
    server_args(sp)
    range_args(sp)
    sp.add_argument("--verdict", action="append", choices=VERDICTS, help="repeat for several")
    sp.add_argument("--open", action="store_true", help="open findings only")
    sp.add_argument("--limit", type=int, default=1000)
    sp.set_defaults(fn=cmd_findings)

    sp = sub.add_parser("query", help="a metric's series or aggregate over a time range")
    server_args(sp)
    range_args(sp)
    sp.add_argument("--metric", required=True, help="catalogue name, e.g. util_gpu_ratio")
    sp.add_argument("--aggregate", default="series", choices=["series", "mean", "min", "max", "p50", "p95", "p99", "last"])
    sp.add_argument("--step", type=duration, default=None, help="bucket width for series (default: range/300)")
    sp.set_defaults(fn=cmd_query)

    sp = sub.add_parser("classify", help="classify a recording offline, window by window")
    sp.add_argument("file")
    sp.add_argument("--window", type=float, default=5.0, help="seconds, 1-60 (default 5)")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(fn=cmd_classify)

    sp = sub.add_parser("trace", help="read profiler traces")
    trace_sub = sp.add_subparsers(dest="trace_command", required=True)
    tp = trace_sub.add_parser("summarize", help="the bottleneck of one trace: .xplane.pb, trace JSON, or a profile dir")
    tp.add_argument("path")
    tp.add_argument("--json", action="store_true")
    tp.set_defaults(fn=cmd_trace_summarize)

    sp = sub.add_parser("capture", help="deep-capture a JAX/XLA job now, through its host's agent")
    server_args(sp)
    target = sp.add_mutually_exclusive_group(required=True)
    target.add_argument("--jax", metavar="HOST:PORT", help="the job's profiler server, as the agent reaches it")
    target.add_argument("--pid", type=int, help="a process on the agent's GPUs; its profiler port is discovered")
    sp.add_argument("--duration-ms", type=int, default=2000, help="trace length (default 2000)")
    sp.set_defaults(fn=cmd_capture)

    sp = sub.add_parser("watch", help="findings, anomalies, capture decisions and captures as they happen")
    server_args(sp)
    sp.add_argument("--host", default="")
    sp.add_argument("--gpu", type=int, default=None)
    sp.add_argument("--verdict", action="append", choices=VERDICTS)
    sp.add_argument("--kind", action="append", choices=["finding", "anomaly", "decision", "capture"])
    sp.set_defaults(fn=cmd_watch)

    for name, what in (("anomalies", "anomalies the detector raised"), ("decisions", "capture decisions and why")):
        sp = sub.add_parser(name, help=what)
        server_args(sp)
        sp.add_argument("--host", default="")
        sp.add_argument("--since", type=duration, default=None)
        sp.add_argument("--limit", type=int, default=200)
        sp.set_defaults(fn=cmd_records)

    sp = sub.add_parser("report", help="the story of one finding: counters, verdicts, captures, anomalies")
    sp.add_argument("finding_id")
    server_args(sp)
    sp.add_argument("--context", type=duration, default=None, help="before/after window (default: the episode's length)")
    sp.set_defaults(fn=cmd_report)

    sp = sub.add_parser("jobs", help="JAX/XLA jobs on an agent's GPUs that expose a profiler server")
    server_args(sp)
    sp.set_defaults(fn=cmd_jobs)

    sp = sub.add_parser("captures", help="list captures with status and verdict")
    server_args(sp)
    sp.set_defaults(fn=cmd_captures)

    sp = sub.add_parser("metrics", help="the metric catalogue: names, units, kinds")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(fn=cmd_metrics)
    return p


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    logs.configure(ns.log_level, ns.json_logs)
    try:
        return ns.fn(ns)
    except (UsageError, ValueError, RecordingError, TraceError, SourceUnavailable, ListenError,
            clients.ClientError, RuntimeError) as exc:
        print(f"gpuscope {ns.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:   # `gpuscope classify ... | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
