"""The long-running commands (`up`, `agent`, `analyzer`): the composition
root that wires collectors, agent, analyzer and servers together."""
from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import sys
import threading
import time
import urllib.parse
from pathlib import Path

from gpuscope.v1 import agent_pb2_grpc

from . import clients, config_file, logs
from .agent import Agent, AgentConfig
from .cliutil import UsageError, default_db
from .entry import interrupted
from .report_retry import ReportRetry
from .exporter import AgentCollector, AlertCollector, FleetCollector, registry, serve as serve_metrics
from .security_flags import (agent_host, agent_security, default_tls_dir, server_tls_dir, server_tls_files,
                             server_tokens)
from .serve import build_server, ensure_free, parse_hostport, shutdown
from .service import AgentServicer
from .sources import make_source
from .uplink import Uplink, UplinkConfig


def make_attribution(ns):
    """Whose each GPU process is: /proc, the kubelet's pod-resources socket
    (--kubelet-socket; its absence is a status, not an error), and the
    workload as job discovery reads it from /proc without probing."""
    from gpuscope.collectors.attribution import Attributor
    from gpuscope.collectors.jobs import JobDiscovery
    from gpuscope.collectors.kubelet import KubeletConfig, PodResources

    pods = None
    if ns.kubelet_socket:
        pods = PodResources(KubeletConfig(socket=ns.kubelet_socket, refresh_s=ns.kubelet_refresh))
    return Attributor(pods=pods, workload=JobDiscovery(lambda _address: False).workload)


def _attributed(agent: Agent, attribution, source: str) -> None:
    """The agent reports (and starts, and stops) attribution when its
    processes come from NVML (NVML itself, or beside DCGM). dcgm-exporter
    lists no processes: its GPUs are named by its pod labels, else by the
    kubelet's answer for the GPU (`--kubelet-socket`), which it is handed."""
    if source == "nvml" or source == "dcgm" or source.startswith("dcgm:"):
        agent.attribution = attribution
        note = getattr(agent.collector, "processes_note", "")
        if note:
            attribution.no_processes = f"unavailable: {note.removeprefix('no processes: ')}"
    elif source.startswith("dcgm-exporter:"):
        agent.attribution = attribution
        attribution.no_processes = ("none: dcgm-exporter lists no processes; GPUs are named by its pod labels, "
                                    "else by the kubelet's pod-resources")
        agent.collector.pods = attribution.pods


def _network(agent: Agent, source: str) -> None:
    """The network ports nearest each GPU (collectors/network.py), on a
    real host only: a replay's GPUs sit in no PCIe tree of this machine."""
    if source.startswith("replay:") or source.startswith("recording"):
        return
    from gpuscope.collectors.network import NetworkSampler
    agent.network = NetworkSampler(lambda: [(d.gpu, d.pci_bus_id) for d in agent.devices() if d.pci_bus_id])


def _setup_captures(agent: Agent, ns, analyzer_target: str | None, links, serving=None) -> None:
    """Deep captures: runner under --capture-dir, job discovery, and reports
    to the analyzer (which summarizes, stores and links them). `serving`:
    --serving parsed and checked already (`up` does it before any file)."""
    from gpuscope.collectors.jobs import JobDiscovery
    from gpuscope.collectors.serving_sampler import ServingSampler
    from gpuscope.collectors.xla_profiler import XlaProfilerClient
    from .captures import CaptureConfig, CaptureRunner
    from .convert import capture_pb

    profiling = agent.collector if hasattr(agent.collector, "pause_profiling") else None   # DCGM's, paused meanwhile
    agent.captures = CaptureRunner(CaptureConfig(capture_dir(ns), max_bytes=ns.capture_budget_mb << 20), ns.host,
                                   profiling=profiling)
    if serving is None:
        serving = parse_serving(ns.serving or [])
        check_serving(*serving, [d.gpu for d in agent.devices()])
    serving, serving_gpus = serving
    agent.discovery = JobDiscovery(lambda addr: XlaProfilerClient(addr).probe(), configured=ns.profiler or [],
                                   serving=serving, serving_gpus=serving_gpus)
    agent.serving = ServingSampler(lambda: [(j.address, j.gpus) for j in agent.jobs() if j.kind == "torch-http"])
    if analyzer_target:
        agent.capture_reporter = lambda rec, data: clients.report_capture(analyzer_target, capture_pb(rec), data,
                                                                          security=links, stop=agent.stopping)
        agent.report_retry = ReportRetry(agent.capture_reporter, agent.stopping)


def capture_dir(ns) -> Path:
    """--capture-dir, else captures/ beside the DB (`up --db` elsewhere kept
    its captures under ~/.local/state before)."""
    if ns.capture_dir:
        return Path(ns.capture_dir)
    return Path(getattr(ns, "db", None) or default_db()).parent / "captures"


def check_serving(serving: dict[str, str], serving_gpus: dict[str, list[int]], host_gpus: list[int]) -> None:
    """Refuses at start-up what would fail later: a GPU the host does not
    have (its samples would make the analyzer refuse every batch), and says
    when a trace directory cannot be (a capture then refuses before it
    starts the engine's profiler)."""
    for url, gpus in serving_gpus.items():
        missing = [g for g in gpus if g not in host_gpus]
        if missing and host_gpus:
            raise UsageError(f"--serving {url}=...@{','.join(map(str, gpus))}: this host has no GPU "
                             f"{', '.join(map(str, missing))} (its GPUs: {', '.join(map(str, sorted(host_gpus)))})")
    for url, trace_dir in serving.items():
        if not Path(trace_dir).is_dir() and not Path(trace_dir).parent.is_dir():
            logs.say(f"warning: --serving {url}={trace_dir}: neither it nor the directory above it exists "
                     f"here; captures of this engine are refused until one does (it must be where the engine "
                     f"writes its traces, e.g. vLLM's torch_profiler_dir, as this host sees it)", "warning")


_GPU_LIST = re.compile(r"\d{1,3}(,\d{1,3})*")


def parse_serving(items: list[str]) -> tuple[dict[str, str], dict[str, list[int]]]:
    """--serving URL=TRACE_DIR[@GPUS] -> ({url: trace_dir}, {url: GPUs named}).
    A trailing @ is always the GPU list: a typo there must not turn into a
    directory name and spread one engine's numbers over every GPU."""
    serving, gpus = {}, {}
    for item in items:
        url, sep, trace_dir = item.partition("=")
        u = urllib.parse.urlsplit(url)
        if not sep or u.scheme not in ("http", "https") or not u.hostname or not trace_dir:
            raise UsageError(f"--serving: {item!r} is not URL=TRACE_DIR[@GPUS] "
                             "(e.g. http://127.0.0.1:8000=/tmp/vllm_profile@0,1)")
        try:
            u.port
        except ValueError:
            raise UsageError(f"--serving: {url!r} has a bad port") from None
        head, at, tail = trace_dir.rpartition("@")
        if at and "/" not in tail:
            if not _GPU_LIST.fullmatch(tail) or not head:
                raise UsageError(f"--serving: {item!r}: after @ comes a list of GPU indexes, e.g. @0 or @0,1")
            trace_dir, gpus[url] = head, sorted({int(g) for g in tail.split(",")})
        serving[url] = trace_dir
    return serving, gpus


def _analyzer_config(ns, dry_run: bool):
    from gpuscope.analyzers.analyzer import AnalyzerConfig
    from gpuscope.analyzers.trigger import TriggerConfig

    trigger = TriggerConfig(dry_run=dry_run, host_cooldown_s=ns.host_cooldown, job_captures_per_hour=ns.job_captures,
                            fleet_fraction=ns.fleet_fraction, capture_duration_ms=ns.capture_duration_ms)
    return AnalyzerConfig(ns.db, window_s=ns.window, memory_limit=ns.memory_limit,
                          threads=getattr(ns, "threads", 2), trigger=trigger, retention_s=ns.retention,
                          rollup=not ns.no_rollup, publish=_publish_config(ns),
                          fleet_check_s=ns.fleet_check_every, snapshot_s=ns.snapshot_every)


def _publish_config(ns):
    """--publish and its flags, checked before anything starts (a wrong
    cluster name or a missing S3 library is found now, not at the first
    pass); None without --publish."""
    from gpuscope.analyzers.object_store import ObjectStore, StorageError, parse_location
    from gpuscope.analyzers.publish import PublishConfig

    if not ns.publish:
        if ns.cluster:
            raise UsageError("--cluster names what --publish writes; give --publish URL too")
        return None
    if not ns.cluster:
        raise UsageError("--publish needs --cluster NAME: every file is partitioned by cluster")
    try:
        config = PublishConfig(url=ns.publish, cluster=ns.cluster, state_dir=ns.publish_state or f"{ns.db}.publish",
                               interval_s=ns.publish_interval, delay_s=ns.publish_delay,
                               backfill_s=ns.publish_backfill)
        ObjectStore(parse_location(ns.publish)).probe()       # a target it cannot write: refused now
    except (ValueError, StorageError) as exc:
        raise UsageError(f"--publish: {exc}") from None
    try:
        os.makedirs(config.state_dir, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--publish-state {config.state_dir}: cannot create it ({exc.strerror or exc}); the "
                         f"outbox and watermarks go there") from None
    return config


def _metrics(ns, name: str, *collectors):
    """Prometheus /metrics on --metrics-listen (None without it): plain HTTP
    on loopback (only this host reaches it, and it holds no secret: a local
    Prometheus or node agent scrapes it as any exporter), else over TLS with
    this process's files, to scrapers with a certificate of the fleet's CA.
    The start-up line says which, with the URL to scrape (found in a trial:
    a plain curl on loopback met a TLS reset and no word why)."""
    from gpuscope.security.tls import is_loopback

    if not ns.metrics_listen:
        return None
    tls = None if is_loopback(ns.metrics_listen) else server_tls_files(ns, name)
    try:
        server = serve_metrics(ns.metrics_listen, registry(*collectors), tls)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    logs.say(f"Prometheus /metrics at http{'s' if tls else ''}://{ns.metrics_listen}/metrics"
             + (" (mutual TLS: the scraper needs a certificate of the fleet's CA)" if tls else
                " (plain HTTP: loopback only)"))
    return server


def _metrics_address_free(ns) -> None:
    """--metrics-listen refused before anything starts, with what holds the
    port, as --listen is (found in a trial: both came after 'agent started')."""
    if getattr(ns, "metrics_listen", None):
        parse_hostport(ns.metrics_listen, "--metrics-listen")
        ensure_free(ns.metrics_listen, "--metrics-listen")


def _db_directory(ns) -> None:
    """--db's directory, made if need be; one line naming the flag when it
    cannot be (found in a trial: a traceback)."""
    from .config_checks import writable_file

    why = writable_file(ns.db)
    try:
        if why is None:
            Path(ns.db).parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        why = f"cannot create {Path(ns.db).parent}: {exc.strerror or exc}"
    if why:
        raise UsageError(f"--db {ns.db}: {why}")
    _private(Path(ns.db))
    _private(Path(f"{ns.db}.wal"))


def _private(path: Path) -> None:
    """A DB made before the umask was the server's own, or loosened since, is
    made its owner's alone again (it holds command lines only operators may
    see), saying so once; found in a trial: a 0644 DB stayed 0644."""
    try:
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            path.chmod(mode & 0o700)
            logs.say(f"{path}: was readable by others ({oct(mode)}); now {oct(mode & 0o700)}", "warning")
    except OSError:          # not there yet, or not ours to change: it is opened as it is
        pass


def _early_checks(ns):
    """What can be refused before anything is said, started or written: plain
    text beyond loopback, and the alert receivers (returned, checked)."""
    from gpuscope.security.tls import is_loopback

    _memory_limit(ns)
    _metrics_address_free(ns)
    if ns.insecure:
        for flag in ("listen", "metrics_listen"):
            where = getattr(ns, flag, None)
            if where and not is_loopback(where):
                raise UsageError(f"--insecure: --{flag.replace('_', '-')} {where} is not a loopback address; plain "
                                 f"text is allowed on 127.0.0.1/::1 only (use --tls-dir for the fleet, see "
                                 f"docs/security.md)")
    return _alert_config(ns)


# DuckDB's cap, the least it is given. At start-up alone the analyzer's DuckDB needs more than 4 MB;
# one replayed host ran out of memory at 16 MB (an OutOfMemoryException that ended `up`), 32 MB held
# with nothing to spare for reports and larger commit groups; twice that is the floor.
MEMORY_LIMIT_FLOOR = 64 * 10**6


def _memory_limit(ns) -> None:
    """--memory-limit as DuckDB would take it, from the floor above to the
    machine's memory (more than it has is no cap at all). Said now, not by
    the analysis process at start-up, nor by its first query."""
    from gpuscope.analyzers.store import memory_size_bytes

    value = ns.memory_limit
    try:
        size = memory_size_bytes(value)
    except ValueError as exc:
        raise UsageError(f"--memory-limit {exc}", exit_status=2) from None
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if size < MEMORY_LIMIT_FLOOR:
        why = "less than DuckDB needs to hold the analyzer's tables and a commit"
    elif size > physical and _given(ns, "memory_limit", "1GB"):   # the default on a small machine: DuckDB's
        why = "more than this machine's memory"
    else:
        return
    raise UsageError(f"--memory-limit {value}: {why}; give {MEMORY_LIMIT_FLOOR // 10**6}MB to {physical >> 20}MiB "
                     f"(this machine's memory), e.g. 1GB", exit_status=2)


def _given(ns, key: str, default) -> bool:
    """Whether a setting came from a flag, the environment or a file, not its
    default (told by its value where the sources were not resolved)."""
    res = getattr(ns, "configuration", None)
    if res is None or key not in res.settings:
        return getattr(ns, key) != default
    return res.settings[key].kind != config_file.DEFAULT


def _alert_config(ns):
    """The alert hooks the flags ask for (checked before anything starts), or None."""
    from gpuscope.analyzers.alerts import ALERTMANAGER, JSON, AlertConfig, parse_receiver

    receivers = []
    for flag, urls, fmt in (("--alertmanager", ns.alertmanager, ALERTMANAGER),
                            ("--alert-webhook", ns.alert_webhook, JSON)):
        for url in urls:
            try:
                receivers.append(parse_receiver(url, fmt))
            except ValueError as exc:
                raise UsageError(f"{flag} {exc}") from None
    return AlertConfig(tuple(receivers), min_severity=ns.alert_severity, per_minute=ns.alert_rate,
                       alert_after_s=ns.alert_after) if receivers else None


def _alerter(config, analyzer):
    """Subscribed to the analyzer's events and started, each receiver said
    (a receiver mistyped is found at start, not at the first incident);
    None without receivers."""
    from gpuscope.analyzers.alerts import Alerter

    if config is None:
        return None
    alerter = Alerter(config)
    analyzer.events.subscribe(alerter.watch())
    alerter.start()
    for r in config.receivers:
        logs.say(f"alerts ({r.format}) to {r.shown}: {config.min_severity} and above, findings once they last "
                 f"{config.alert_after_s:g} s (docs/operations.md, Alerts)")
    return alerter


def _alert_metrics(alerter) -> list:
    """The alert receivers' delivery counters for /metrics, when there are receivers."""
    return [AlertCollector(alerter.counters)] if alerter is not None else []


def _start_commands(agent: Agent, target: str, host: str, links):
    from .commands import CommandListener

    listener = CommandListener(target, host, agent.boot_id, agent.run_command, security=links)
    listener.start()
    return listener


def _uplink_factory(ns, target: str, links):
    def make(boot_id, devices):
        return Uplink(UplinkConfig(target=target, buffer_samples=ns.buffer_samples,
                                   flush_interval_s=ns.flush_interval), ns.host, boot_id, devices, security=links)
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


RECORDING_WINDOW_S = 5.0     # what a window should hold of a recording: its phases last longer


def _paced_for(ns, source: str) -> None:
    """`up`'s sampling interval and window when not given: a replay at
    --speed S plays S seconds of recording a second, so both shrink S times
    (a 5 s window at 10x held 50 s of the recording, straddled its phases,
    and every window was transitional: no finding in 8 minutes)."""
    speed = ns.speed if source.startswith("replay:") else 1.0
    if ns.interval is None:
        ns.interval = max(0.1, min(1.0, 1.0 / speed))
    if ns.window is None:
        ns.window = max(1.0, RECORDING_WINDOW_S / speed)
    held = ns.window * speed
    if held > RECORDING_WINDOW_S:
        logs.say(f"at --speed {speed:g} a {ns.window:g} s window holds {held:g} s of the recording, longer than "
                 "some of its phases: more windows straddle two, are transitional and open no finding "
                 f"(--speed {RECORDING_WINDOW_S / ns.window:g} or less to see every phase)", "warning")


def _install_signals() -> threading.Event:
    """Ctrl-C and SIGTERM set the event the server waits on. Installed before
    anything starts: one that arrives during start-up lets start-up finish and
    then stops cleanly, instead of a KeyboardInterrupt leaving threads behind."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    if interrupted():                  # noted by the entry point while this command was loading
        stop.set()
    return stop


def _server_security(ns, name: str, listen: str) -> dict:
    """build_server's credentials and per-call authentication for this
    process: mutual TLS and roles, or, only with --insecure on a loopback
    address, neither (and it says so)."""
    from gpuscope.security.auth import OPERATOR_ACTIONS, audit, authorize, caller_from
    from gpuscope.security.tls import is_loopback, server_credentials

    files = server_tls_files(ns, name)
    if files is None:
        if not is_loopback(listen):
            raise UsageError(f"--insecure: {listen} is not a loopback address; plain text is allowed on "
                             "127.0.0.1/::1 only (use --tls-dir for the fleet, see docs/security.md)")
        if getattr(ns, "oncall_listen", None):
            raise UsageError("--oncall-listen is a TLS port for bearer tokens; it cannot be used with --insecure")
        logs.say(f"INSECURE: {listen} serves without TLS or authentication (--insecure, loopback only)", "warning")
        return {}
    tokens = server_tokens(ns)

    def authenticate(method: str, auth_context: dict, metadata: tuple):
        caller = caller_from(auth_context, metadata, tokens)
        denial = authorize(method, caller)
        if method not in OPERATOR_ACTIONS:
            return caller, denial, None
        if denial:
            audit(caller, method, outcome="denied")
            return caller, denial, None
        return caller, None, lambda outcome, target: audit(caller, method, {"target": target} if target else None,
                                                           outcome=outcome)     # once it has ended
    security = dict(credentials=server_credentials(files, require_client_cert=True), authenticate=authenticate)
    oncall = getattr(ns, "oncall_listen", None)
    if oncall:
        parse_hostport(oncall, "--oncall-listen")
        if _same_port(oncall, ns.listen):
            raise UsageError(f"--oncall-listen {oncall} is the port of --listen {ns.listen}: give the token "
                             f"port one of its own")
        ensure_free(oncall, "--oncall-listen")      # before the DB is opened, as --listen is
        if tokens is None:
            raise UsageError("--oncall-listen serves callers with bearer tokens: pass --tokens FILE too")
        # grpc cannot ask for a client certificate and accept its absence, so
        # token-only callers get a port of their own; the same roles apply
        security["extra_ports"] = [(oncall, server_credentials(files, require_client_cert=False), "--oncall-listen")]
    elif tokens is not None:
        logs.say("tokens are accepted from callers that also present a certificate of this CA; "
                 "for token-only callers add --oncall-listen HOST:PORT")
    return security


def _same_port(a: str, b: str) -> bool:
    """Two HOST:PORT that would contend for one port (a wildcard host takes every address's)."""
    (ha, _, pa), (hb, _, pb) = a.rpartition(":"), b.rpartition(":")
    wild = ("0.0.0.0", "[::]", "::", "")
    return pa == pb and pa != "0" and (ha == hb or ha in wild or hb in wild)


def _provision_local_pki(ns) -> None:
    """`up` is secure with no flags: a CA and certificates for this host, made
    once under tls/ beside the DB (0700), used by its servers, its in-process
    agent and by on-call commands on this host."""
    from gpuscope.security.certs import ensure_local_pki

    if ns.insecure or ns.ca or ns.cert or ns.key:
        return
    made = ensure_local_pki(server_tls_dir(ns), ns.host)
    if made.get("created"):
        logs.say(f"made a local CA and certificates in {made['dir']} ({', '.join(made['created'])})")


def _client_security_words(ns) -> str:
    """What an on-call command on this host must add to reach this `up`: the
    TLS directory, unless it is where clients look by default (found in a
    trial: with --db elsewhere the printed command was refused)."""
    if ns.insecure:
        return " --insecure"
    tls = server_tls_dir(ns)
    if tls and os.path.abspath(tls) != os.path.abspath(default_tls_dir()):
        return f" --tls-dir {shlex.quote(tls)}"
    return ""


def _loopback(listen: str, port: int) -> str:
    host = listen.rpartition(":")[0]
    if host in ("0.0.0.0", "[::]", ""):
        host = "127.0.0.1"
    return f"{host}:{port}"


def cmd_up(ns) -> int:
    from gpuscope.analyzers import accuracy
    from gpuscope.analyzers.analyzer import Analyzer
    from gpuscope.analyzers.service import AnalyzerServicer, add_to_server as add_analyzer_to_server
    from .view import LiveView

    stop = _install_signals()
    parse_hostport(ns.listen, "--listen")
    alerts = _early_checks(ns)
    _db_directory(ns)
    log_path = _logs_beside_the_view(ns)
    # the source first: a wrong --source is the user's to fix whatever holds the port
    attribution = make_attribution(ns)
    collector, source = make_source(ns.source, ns.speed, allow_fallback=True, attribution=attribution)
    _paced_for(ns, source)
    serving = parse_serving(ns.serving or [])
    check_serving(*serving, [d.gpu for d in collector.devices()])      # before any file
    ensure_free(ns.listen)
    _provision_local_pki(ns)
    security = _server_security(ns, "analyzer", ns.listen)
    links = agent_security(ns, server_name="localhost")
    # A replay has no real process to capture: decisions are recorded as dry runs.
    analyzer = Analyzer(_analyzer_config(ns, dry_run=ns.dry_run or source.startswith("replay:")))
    analyzer.start()
    alerter = _alerter(alerts, analyzer)
    agent_cfg = AgentConfig(host=ns.host, source=source, interval_s=ns.interval,
                              serving_interval_s=ns.serving_interval, network_interval_s=ns.network_interval)
    agent = Agent(agent_cfg, collector)
    _attributed(agent, attribution, source)
    _network(agent, source)
    servicer = AnalyzerServicer(analyzer)
    server, port, health = build_server(ns.listen, [
        (add_analyzer_to_server, servicer, "gpuscope.v1.Analyzer"),
        (agent_pb2_grpc.add_AgentServicer_to_server, AgentServicer(agent, "in-process"), "gpuscope.v1.Agent")],
        **security)
    server.start()
    target = _loopback(ns.listen, port)
    _setup_captures(agent, ns, target, links, serving)
    agent.start(_uplink_factory(ns, target, links))
    listener = _start_commands(agent, target, ns.host, links)
    # the verdicts are the analyzer's (FleetCollector): one gauge, with its host label
    metrics = _metrics(ns, "analyzer", AgentCollector(agent), FleetCollector(analyzer.status),
                       *_alert_metrics(alerter))
    view = LiveView()
    header = (f"gpuscope up: {source} ({ns.speed:g}x)  listening on {ns.listen.rpartition(':')[0]}:{port}  "
              f"db {ns.db}")
    logs.say(f"serving on {ns.listen.rpartition(':')[0]}:{port}; query it with "
             f"`gpuscope findings --server {target}{_client_security_words(ns)}`")
    if log_path is not None:
        header += f"  logs {log_path}"
    started = time.time()

    def tick():
        if not ns.no_view:
            known = accuracy.measured(analyzer.store.verdict_pairs())
            view.show(analyzer.status(), analyzer.list_findings(open_only=True, limit=8), header,
                      lambda verdict: accuracy.trust_words(verdict, known), activity=_activity(analyzer),
                      warmup=analyzer.detector.warmup())
    try:
        _wait(stop, ns.duration, tick)
    finally:
        view.close()
        if metrics is not None:
            metrics.shutdown()
        listener.stop()
        agent.stop()
        seen_ = analyzer.list_findings(start=started, limit=100_000)
        _stop_analyzer(server, servicer, analyzer, alerter)
    from .view import summary
    print(summary(seen_, time.time() - started))
    logs.say("stopped")
    return 0


def _logs_beside_the_view(ns) -> Path | None:
    """With the live view on a terminal, logs go to a file beside the DB
    from before anything logs (a logger keeps where it first wrote) until
    the process ends: no log line may land in the view."""
    if ns.no_view or not sys.stdout.isatty():
        return None
    path = Path(ns.db).parent / "gpuscope-up.log"
    logs.say(f"logs go to {path} while the view is on")
    logs.configure(ns.log_level, ns.json_logs, file=open(path, "a", buffering=1))
    return path


def _activity(analyzer, minutes: float = 1.0, points: int = 12) -> dict:
    """(host, gpu) -> the last minute of GPU activity, for the view's sparklines."""
    end = time.time()
    step = minutes * 60 / points
    rows = analyzer.store.metric("util_gpu_ratio", "", None, end - minutes * 60, end, "series", step)
    out: dict = {}
    for r in rows:
        out.setdefault((r["host"], r["gpu"]), {})[int((r["bucket"] - (end - minutes * 60)) // step)] = r["value"]
    return {k: [v.get(i) for i in range(points)] for k, v in out.items()}


def cmd_agent(ns) -> int:
    stop = _install_signals()
    parse_hostport(ns.listen, "--listen")
    if ns.analyzer:
        parse_hostport(ns.analyzer, "--analyzer")
    _metrics_address_free(ns)
    # only when asked for: an agent on a GPU host must not quietly replay a recording
    attribution = make_attribution(ns)
    # the default (None) picks the best GPU source; only an explicit `auto` may end with the recording
    collector, source = make_source(ns.source, ns.speed, allow_fallback=ns.source == "auto",
                                    attribution=attribution)
    links = agent_security(ns)
    ns.host, chosen = agent_host(ns.host, _given(ns, "host", socket.gethostname()), links)
    if chosen:
        logs.say(chosen)
    security = _server_security(ns, "agent", ns.listen)
    factory = _uplink_factory(ns, ns.analyzer, links) if ns.analyzer else None
    agent = Agent(AgentConfig(host=ns.host, source=source, interval_s=ns.interval,
                              serving_interval_s=ns.serving_interval, network_interval_s=ns.network_interval),
                  collector, factory)
    _attributed(agent, attribution, source)
    _network(agent, source)
    _setup_captures(agent, ns, ns.analyzer or None, links)
    server, port, health = build_server(ns.listen, [
        (agent_pb2_grpc.add_AgentServicer_to_server, AgentServicer(agent, ns.analyzer or ""), "gpuscope.v1.Agent")],
        max_workers=8, **security)
    agent.start()
    server.start()
    from gpuscope.analyzers.offline import judge_newest      # the agent says its GPUs' verdicts itself
    metrics = _metrics(ns, "agent", AgentCollector(agent, judge_newest))
    listener = _start_commands(agent, ns.analyzer, ns.host, links) if ns.analyzer else None
    schedule = _calibration_schedule(agent, ns, source)
    logs.say(f"agent: {source}, API on {ns.listen.rpartition(':')[0]}:{port}, analyzer {ns.analyzer or '(none)'}")
    try:
        _wait(stop, ns.duration)
    finally:
        if metrics is not None:
            metrics.shutdown()
        if listener is not None:
            listener.stop()
        if schedule is not None:
            schedule.stop()
        agent.stop()
        shutdown(server, health)
    return 0


def _calibration_schedule(agent: Agent, ns, source: str):
    """The weekly calibration of idle GPUs (daemon/calibration_schedule.py),
    when it can send what it measures and has real GPUs to measure."""
    import importlib.util

    from .calibration_schedule import CalibrationSchedule, ScheduleConfig

    if not ns.calibrate_every:
        return None
    if not ns.analyzer or source.startswith("replay"):
        return None
    if importlib.util.find_spec("jax") is None:
        logs.say("calibration schedule off: JAX is not installed here (pip install 'gpuscope[calibrate]' and "
                 "JAX's CUDA plugin; --calibrate-every 0 silences this)")
        return None
    base = [sys.executable, "-m", "gpuscope.daemon.cli", "calibrate", "--quick", "--json", "--send", ns.analyzer,
            "--host", ns.host]
    for flag in ("tls_dir", "ca", "cert", "key", "tls_server_name"):
        if getattr(ns, flag, None):
            base += ["--" + flag.replace("_", "-"), str(getattr(ns, flag))]
    if ns.insecure:
        base.append("--insecure")
    schedule = CalibrationSchedule(
        ScheduleConfig(state_path=str(capture_dir(ns).parent / "calibrations.json"), every_s=ns.calibrate_every,
                       idle_for_s=ns.calibrate_idle),
        agent, lambda gpu: base + ["--gpu", str(gpu)])
    schedule.start()
    return schedule


def cmd_analyzer(ns) -> int:
    from gpuscope.analyzers.analyzer import Analyzer
    from gpuscope.analyzers.engine import EngineClient, settle_heap, tune_runtime
    from gpuscope.analyzers.flow import HOST_BURST_BYTES, HostRate
    from gpuscope.analyzers.service import AnalyzerServicer, add_to_server as add_analyzer_to_server

    stop = _install_signals()
    parse_hostport(ns.listen, "--listen")
    ensure_free(ns.listen)                     # before the DB is opened: fail fast, touch nothing
    alerts = _early_checks(ns)
    security = _server_security(ns, "analyzer", ns.listen)
    tune_runtime()
    _db_directory(ns)
    config = _analyzer_config(ns, dry_run=ns.dry_run)
    if ns.engine == "process":
        analyzer = EngineClient(config, init=logs.configure, init_args=(ns.log_level, ns.json_logs))
        analyzer.start()                       # the store opens in the child; its errors end start-up here
    else:
        analyzer = Analyzer(config)
    servicer = AnalyzerServicer(analyzer, max_agent_streams=ns.max_streams,
                                host_rate=HostRate(ns.host_rate, HOST_BURST_BYTES) if ns.host_rate else None)
    try:
        server, port, health = build_server(ns.listen, [
            (add_analyzer_to_server, servicer, "gpuscope.v1.Analyzer")], **security)
    except BaseException:
        analyzer.close()
        raise
    if ns.engine == "thread":
        analyzer.start()
    alerter = _alerter(alerts, analyzer)
    try:
        metrics = _metrics(ns, "analyzer", FleetCollector(lambda: {**analyzer.status(), **servicer.flow_counts()}),
                           *_alert_metrics(alerter))
    except BaseException:
        shutdown(server, grace_s=0)
        analyzer.close()
        if alerter is not None:
            alerter.stop(timeout_s=0)
        raise
    server.start()
    settle_heap()
    oncall = f", on-call (tokens) on {ns.oncall_listen.rpartition(':')[0]}:{server.extra_ports[0]}" \
        if server.extra_ports else ""
    logs.say(f"analyzer: listening on {ns.listen.rpartition(':')[0]}:{port}{oncall}, db {ns.db}")
    try:
        _wait(stop, ns.duration)
    finally:
        logs.say("analyzer: stopping (committing what it holds, then closing the store)")
        if metrics is not None:
            metrics.shutdown()
        _stop_analyzer(server, servicer, analyzer, alerter)
    logs.say("analyzer: stopped")
    return 0


def _stop_analyzer(server, servicer, analyzer, alerter=None) -> None:
    """Within 10 s: the writer commits what it holds while the server can
    still send those acks; later batches are refused UNAVAILABLE (agents
    resend them elsewhere or later); then the server and the store close,
    and the alerts queued are sent (2 s at most)."""
    analyzer.drain(timeout_s=6.0)
    shutdown(server, grace_s=1.0)
    servicer.close()
    analyzer.close()
    if alerter is not None:
        alerter.stop(timeout_s=2.0)
