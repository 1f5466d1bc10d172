"""`gpuscope`: the command line. Parses, dispatches, and turns errors into
one line and an exit status. Only `main` exits."""
from __future__ import annotations

import argparse
import logging
import os
import socket
import sys

# grpc's C core logs each failed TLS handshake at INFO on stderr, before our
# one-line message (clients) and once per refused peer (servers). Set before
# grpc loads; GRPC_VERBOSITY in the environment still wins.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from gpuscope.analyzers.fleet_layout import check_cluster
from gpuscope.analyzers.object_store import parse_location
from gpuscope.collectors.kubelet import DEFAULT_SOCKET as KUBELET_SOCKET
from gpuscope.collectors.nvml import SourceUnavailable
from gpuscope.collectors.recording import RecordingError
from gpuscope.collectors.xspace_reader import TraceError

from . import client_config, clients, config_checks, config_file, logs
from .cliutil import (FINDING_KINDS, VERDICTS, UsageError, byte_rate, default_db, duration, number, positive_duration,
                      positive_float, positive_int)
from .cmd_accuracy import cmd_accuracy
from .cmd_degraded import cmd_degraded
from .cmd_calibrate import add_calibrate_parser
from .cmd_ceilings import add_ceilings_parser
from .cmd_dist_jobs import add_job_parser, cmd_fleet_jobs
from .cmd_programs import add_programs_parser
from .cmd_certs import add_certs_parser
from .cmd_config import add_config_flag, add_config_parser
from .cmd_fleet import add_fleet_parser
from .cmd_offline import cmd_classify, cmd_metrics, cmd_trace_summarize
from .cmd_oncall import (cmd_capture, cmd_captures, cmd_findings, cmd_jobs, cmd_query, cmd_records, cmd_status,
                         cmd_top, cmd_watch, render_report)
from .cmd_report import cmd_report
from .cmd_serve import cmd_agent, cmd_analyzer, cmd_up
from .entry import interrupted, resume_ctrl_c
from .security_flags import add_client_flags, add_server_flags
from .serve import ListenError

config_checks.parse_location = parse_location      # `config check` and start-up judge --publish as the analyzer does


def _cluster_name(text: str) -> str:
    """--cluster as the fleet tier's partitions take it, refused by the flag
    (and by `config check` for the file's key), not later as --publish's."""
    try:
        return check_cluster(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("cluster name ")) from None

__all__ = ["main", "build_parser", "render_report"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpuscope", description="GPU fleet profiler: names each GPU's bottleneck.")
    p.add_argument("--version", action="version", version=f"gpuscope {_version()}")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="the least level logged (default info)")
    p.add_argument("--json-logs", action="store_true", default=None, help="JSON log lines (default off a terminal)")
    sub = p.add_subparsers(dest="command", required=True)

    def source_args(sp, default):
        sp.add_argument("--source", default=default,
                        help="nvml, dcgm[:HOST[:PORT]] (DCGM: embedded, or the nv-hostengine at HOST or "
                             "$DCGM_HOSTENGINE), dcgm-exporter:URL (the node's exporter, e.g. "
                             "dcgm-exporter:127.0.0.1:9400), replay:FILE, or auto: the best this host has "
                             "(a running DCGM host engine, else the node's dcgm-exporter, else NVML; then, for "
                             "`up` or an explicit auto, the bundled H200 recording). Default: "
                             + ("auto" if default == "auto" else "the best GPU source, as auto without the recording"))
        sp.add_argument("--speed", type=number(0, 1000, above=True), default=1.0,
                        help="replay speed (default 1); `up` then samples and judges windows that much faster, "
                             "so a window still holds 5 s of the recording (down to 1 s windows: above 5x findings "
                             "get rare)")
        sp.add_argument("--interval", type=number(0.1, 60, unit=" s"), default=1.0, help="sampling interval in seconds, 0.1 to 60 (default 1)")
        sp.add_argument("--host", default=socket.gethostname(), help="host name reported (default: this host's)")
        sp.add_argument("--flush-interval", type=number(0.1, 60, unit=" s"), default=1.0,
                        help="seconds between batches to the analyzer, 0.1-60 (default 1; 5 lets one "
                             "analyzer hold ~3x the agents, see docs/operations.md)")
        sp.add_argument("--buffer-samples", type=number(100, 100_000_000, int), default=50_000,
                        help="samples kept while the analyzer is away (default 50000; oldest dropped first)")
        sp.add_argument("--duration", type=positive_duration, default=None, help="stop after this long (default: run until Ctrl-C)")
        sp.add_argument("--capture-dir", default=None,
                        help="where deep captures are written (default: captures/ beside the DB: --db for up, "
                             "the default DB's directory for agent)")
        sp.add_argument("--capture-budget-mb", type=number(1, 10_000_000, int), default=2048, help="capture directory budget (default 2048)")
        sp.add_argument("--profiler", action="append", metavar="HOST:PORT",
                        help="a JAX profiler server to know about (repeat); others are discovered")
        sp.add_argument("--serving", action="append", metavar="URL=TRACE_DIR[@GPUS]",
                        help="a vLLM/SGLang server with /start_profile, the directory it writes traces to, and "
                             "the GPUs it uses (e.g. http://127.0.0.1:8000=/tmp/vllm@0,1; without @GPUS: the ones "
                             "its processes are seen on, else all) (repeat)")
        sp.add_argument("--metrics-listen", default=None, metavar="HOST:PORT",
                        help="serve Prometheus /metrics here: each GPU's metrics and the agent's health (beyond "
                             "loopback over TLS only, to scrapers with a certificate of the fleet's CA)")
        sp.add_argument("--serving-interval", type=number(1, 300, unit=" s", zero=True), default=5.0, metavar="S",
                        help="seconds between scrapes of each serving engine's /metrics, 1-300, 0 for never "
                             "(default 5: one analysis window)")
        sp.add_argument("--network-interval", type=number(1, 300, unit=" s", zero=True), default=5.0, metavar="S",
                        help="seconds between readings of the network port nearest each GPU (RDMA port counters, "
                             "NIC bytes, from /sys), 1-300, 0 for never (default 5)")
        sp.add_argument("--kubelet-socket", default=KUBELET_SOCKET, metavar="PATH",
                        help=f"the kubelet's pod-resources socket, which names the pod holding each GPU (default "
                             f"{KUBELET_SOCKET}; absent is fine off Kubernetes; '' turns it off)")
        sp.add_argument("--kubelet-refresh", type=number(1, 3600, unit=" s"), default=30.0, metavar="S",
                        help="seconds between asks of the kubelet, 1-3600 (default 30)")

    def analyzer_args(sp):
        sp.add_argument("--db", default=default_db(), help=f"DuckDB file (default {default_db()})")
        sp.add_argument("--window", type=number(1, 60, unit=" s"), default=5.0,
                        help="classification window in seconds, 1-60 (default 5)")
        sp.add_argument("--memory-limit", default="1GB",
                        help="DuckDB memory cap, from 64MB to this machine's memory (default 1GB)")
        sp.add_argument("--dry-run", action="store_true", help="record capture decisions, start none")
        sp.add_argument("--host-cooldown", type=duration, default=600.0, help="between captures on a host (default 10m)")
        sp.add_argument("--job-captures", type=number(0, 10_000, int), default=3, help="captures per job per hour (default 3)")
        sp.add_argument("--fleet-fraction", type=number(0, 1, above=True), default=0.05,
                        help="share of hosts that may capture at once, at least one (default 0.05)")
        sp.add_argument("--capture-duration-ms", type=number(1, 600_000, int), default=2000, help="triggered capture length (default 2000)")
        sp.add_argument("--retention", type=_retention, default=_retention("14d"),
                        help="raw samples older than this are rolled up to per-minute means and deleted "
                             "(e.g. 14d, 36h; default 14d)")
        sp.add_argument("--no-rollup", action="store_true", help="delete old samples without keeping per-minute means")
        sp.add_argument("--fleet-check-every", type=duration, default=300.0, metavar="DURATION",
                        help="between fleet checks, which open `degraded` findings for GPUs under their peers "
                             "(docs/degraded.md), `regression` findings for runs slower than their program's "
                             "earlier runs (docs/programs.md) and `straggler` findings for the rank a distributed "
                             "job waits for (docs/jobs.md); 0 for never (default 5m)")
        sp.add_argument("--snapshot-every", type=_snapshot_period, default=30.0, metavar="DURATION",
                        help="how stale the store's copy of each GPU's state and of open findings' running numbers "
                             "(windows, confidence, evidence) may get, 5s-5m; opening, closing and verdict changes "
                             "are written at once, and live queries read memory. Longer costs less on a large "
                             "fleet (2,000 agents on 2 cores: 60s, docs/capacity.md); a kill -9 loses at most this "
                             "much of those numbers (default 30s)")
        g = sp.add_argument_group("fleet tier", "per-minute rollups, closed findings and capture summaries as "
                                                "hive-partitioned Parquet for `gpuscope fleet` (docs/fleet.md)")
        g.add_argument("--publish", default=None, metavar="URL",
                       help="publish to a directory, s3://BUCKET/PREFIX or gs://BUCKET/PREFIX (default: off)")
        g.add_argument("--cluster", type=_cluster_name, default=None, metavar="NAME",
                       help="this analyzer's cluster, a partition of every file (required with --publish)")
        g.add_argument("--publish-interval", type=positive_duration, default=300.0, metavar="DURATION",
                       help="between publish passes (default 5m)")
        g.add_argument("--publish-delay", type=duration, default=300.0, metavar="DURATION",
                       help="minutes this recent wait for late samples and closing findings (default 5m)")
        g.add_argument("--publish-backfill", type=duration, default=0.0, metavar="DURATION",
                       help="on the first start, publish this much of what the DB already holds (default 0)")
        g.add_argument("--publish-state", default=None, metavar="DIR",
                       help="the outbox and watermarks (default: DB.publish/ beside --db)")
        g = sp.add_argument_group("alerts", "findings and anomalies posted as they happen (docs/operations.md, Alerts)")
        g.add_argument("--alertmanager", action="append", metavar="URL", default=[],
                       help="an Alertmanager to post to: its base URL (http://alertmanager:9093) or its "
                            "endpoint (.../api/v2/alerts), either works (repeat)")
        g.add_argument("--alert-webhook", action="append", metavar="URL", default=[],
                       help="a URL that gets one JSON object per alert by POST (repeat)")
        g.add_argument("--alert-severity", choices=("info", "warning", "critical"), default="warning",
                       help="the least severity sent (default warning: memory-, launch-, host- and "
                            "communication-bound findings that last --alert-after, and anomalies; info adds "
                            "compute-bound and idle findings and bottleneck changes; critical: lost GPUs, XID "
                            "and ECC errors)")
        g.add_argument("--alert-after", type=positive_duration, default=120.0, metavar="DURATION",
                       help="a finding alerts once it has lasted this long; shorter episodes are never sent "
                            "(default 2m)")
        g.add_argument("--alert-rate", type=positive_int, default=60, metavar="N",
                       help="new alerts per receiver per minute; more are dropped and counted (default 60)")

    sp = sub.add_parser("up", help="agent + analyzer in one process, with a live view")
    sp.add_argument("--listen", default="127.0.0.1:9403", help="gRPC address (default 127.0.0.1:9403)")
    sp.add_argument("--no-view", action="store_true", help="no live view (logs only)")
    add_config_flag(sp)
    source_args(sp, "auto")
    analyzer_args(sp)
    add_server_flags(sp, "default: tls/ beside --db, made on first start")
    # None: chosen for the source (a replay at --speed S samples and judges S times faster)
    sp.set_defaults(fn=cmd_up, window=None, interval=None)

    sp = sub.add_parser("agent", help="the per-host sampling daemon")
    sp.add_argument("--analyzer", default="", help="analyzer HOST:PORT to stream to")
    sp.add_argument("--listen", default="127.0.0.1:9401", help="agent API address (default 127.0.0.1:9401)")
    sp.add_argument("--calibrate-every", type=duration, default=7 * 86400.0, metavar="DURATION",
                    help="measure each GPU's ceilings again this often (`gpuscope calibrate --quick --send`), only "
                         "while it is idle and never beside a job; needs --analyzer and JAX with its CUDA plugin; "
                         "0 for never (default 7d)")
    sp.add_argument("--calibrate-idle", type=positive_duration, default=900.0, metavar="DURATION",
                    help="how long a GPU must have been idle before a scheduled calibration (default 15m)")
    add_config_flag(sp)
    source_args(sp, None)
    add_server_flags(sp, "NAME is agent", agent_links=True)
    sp.set_defaults(fn=cmd_agent)

    sp = sub.add_parser("analyzer", help="the central analyzer: ingest, store, findings, queries")
    sp.add_argument("--listen", default="127.0.0.1:9403",
                    help="gRPC address (default 127.0.0.1:9403: this host only; for the fleet use 0.0.0.0:9403 "
                         "with --tls-dir)")
    add_config_flag(sp)
    sp.add_argument("--threads", type=number(1, 1024, int), default=2, help="DuckDB threads (default 2)")
    sp.add_argument("--metrics-listen", default=None, metavar="HOST:PORT",
                    help="serve Prometheus /metrics here: each GPU's verdict, open findings, ingest counters "
                         "(beyond loopback over TLS only, to scrapers with a certificate of the fleet's CA)")
    sp.add_argument("--oncall-listen", default=None, metavar="HOST:PORT",
                    help="a second TLS port where on-call callers authenticate with a bearer token alone "
                         "(--tokens); the main port requires client certificates")
    sp.add_argument("--max-streams", type=number(2, 10_000_000, int), default=10_000,
                    help="agents' streams at once, two per agent (ingest, commands); on-call calls are not "
                         "counted (default 10000)")
    sp.add_argument("--host-rate", type=byte_rate, default="256KiB", metavar="BYTES",
                    help="each host's batches, in bytes a second over time after its first 64MiB: a host over it "
                         "has its batches held back (its agent buffers them), so one client cannot fill the disk; "
                         "e.g. 1MiB; 0: off (default 256KiB, about 90x an 8-GPU host's samples)")
    sp.add_argument("--duration", type=positive_duration, default=None, help="stop after this long")
    sp.add_argument("--engine", choices=("process", "thread"), default="process",
                    help="process (default): store and live analysis in a process of their own, so a fleet's "
                         "analysis and its gRPC traffic use two cores; thread: all in this process")
    analyzer_args(sp)
    add_server_flags(sp, "NAME is analyzer")
    sp.set_defaults(fn=cmd_analyzer)

    def server_args(sp):
        port = 9401 if sp.prog.split()[-1] in client_config.AGENT_COMMANDS else 9403
        sp.add_argument("--server", default=None, metavar="HOST[:PORT]",
                        help=f"{_asks(sp.prog.split()[-1])} to ask (default: "
                             f"${client_config.ENV_SERVER}, else `server` in {client_config.config_path()}, else "
                             f"{client_config.DEFAULT_SERVER}); a bare HOST means port {port}")
        sp.add_argument("--json", action="store_true", help="JSON output")
        add_client_flags(sp)

    def range_args(sp):
        sp.add_argument("--since", type=positive_duration, default=None, help="from this long ago, e.g. 1h")
        sp.add_argument("--start", type=float, default=None, help="Unix seconds")
        sp.add_argument("--end", type=float, default=None, help="Unix seconds (default now)")
        sp.add_argument("--host", default="")
        sp.add_argument("--gpu", type=number(0, 65535, int), default=None, help="GPU index")

    sp = sub.add_parser("status", help="analyzer or agent status")
    server_args(sp)
    sp.add_argument("--host", default="", help="list only this host's GPUs (the totals stay fleet-wide)")
    sp.add_argument("--limit", type=positive_int, default=1000, metavar="N",
                    help="list at most N GPUs, by host and index (default 1000)")
    sp.set_defaults(fn=cmd_status)

    sp = sub.add_parser("findings", help="bottleneck episodes, degraded GPUs, program regressions and the "
                                         "stragglers of distributed jobs")
    server_args(sp)
    range_args(sp)
    sp.add_argument("--verdict", action="append", choices=VERDICTS, help="repeat for several")
    sp.add_argument("--kind", action="append", choices=FINDING_KINDS,
                    help="bottleneck episodes, degraded GPUs (under their peers: docs/degraded.md), program "
                         "regressions (docs/programs.md) or the stragglers of distributed jobs (docs/jobs.md); "
                         "repeat for several (default: all)")
    sp.add_argument("--flag", action="append", metavar="FLAG",
                    help="findings carrying this flag, e.g. power-capped, thermal-throttled, or a degraded GPU's "
                         "weak dimension: hbm, tensor, pcie, nvlink, clocks (repeat: all of them)")
    sp.add_argument("--pod", default="", metavar="POD", help="findings of jobs in this Kubernetes pod (NAME or "
                                                              "NAMESPACE/NAME)")
    sp.add_argument("--namespace", default="", metavar="NS", help="findings of jobs in this Kubernetes namespace")
    sp.add_argument("--slurm-job", default="", metavar="JOBID", help="findings of this Slurm job's processes")
    sp.add_argument("--open", action="store_true", help="open findings only")
    sp.add_argument("--limit", type=positive_int, default=1000, metavar="N")
    sp.set_defaults(fn=cmd_findings)

    sp = sub.add_parser("top", help="what is wrong on the fleet: GPUs (or jobs) bottlenecked longest over a "
                                    "range, and what holds them now")
    server_args(sp)
    sp.add_argument("--since", type=positive_duration, default=None, help="from this long ago (default 1h)")
    sp.add_argument("--start", type=float, default=None, help="Unix seconds")
    sp.add_argument("--end", type=float, default=None, help="Unix seconds (default now)")
    sp.add_argument("--host", default="", help="one host (default: the fleet)")
    sp.add_argument("--by", choices=("gpu", "job", "pod", "slurm-job"), default="gpu",
                    help="rank GPUs (default), jobs, Kubernetes pods or Slurm jobs")
    sp.add_argument("--limit", type=positive_int, default=20, metavar="N", help="at most N rows (default 20)")
    sp.add_argument("--watch", type=positive_float, nargs="?", const=5.0, default=None, metavar="S",
                    help="redraw every S seconds (default 5), like top")
    sp.set_defaults(fn=cmd_top)

    sp = sub.add_parser("query", help="a metric's series or aggregate over a time range")
    server_args(sp)
    range_args(sp)
    sp.add_argument("--metric", required=True, help="catalogue name, e.g. util_gpu_ratio")
    sp.add_argument("--aggregate", default="series", choices=["series", "mean", "min", "max", "p50", "p95", "p99", "last"])
    sp.add_argument("--step", type=positive_duration, default=None, help="bucket width for series (default: range/300)")
    sp.add_argument("--raw", action="store_true",
                    help="a counter (_total) as its running total (default: its rate per second, as rate() in "
                         "Prometheus)")
    sp.add_argument("--group-by", choices=("job", "pod", "slurm-job"), default=None,
                    help="pool the samples of the GPUs each job, pod or Slurm job held (default: per GPU); raw "
                         "samples only, not minutes rolled up by retention")
    sp.set_defaults(fn=cmd_query)

    sp = sub.add_parser("classify", help="classify a recording offline, window by window")
    sp.add_argument("file")
    sp.add_argument("--window", type=number(1, 60, unit=" s"), default=5.0, help="seconds, 1-60 (default 5)")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(fn=cmd_classify)

    sp = sub.add_parser("trace", help="read profiler traces")
    trace_sub = sp.add_subparsers(dest="trace_command", required=True)
    tp = trace_sub.add_parser("summarize", help="the bottleneck of one trace: .xplane.pb, trace JSON, or a profile dir")
    tp.add_argument("path")
    tp.add_argument("--all", action="store_true", help="every trace under a directory, newest session first "
                                                         "(default: the newest session's main trace)")
    tp.add_argument("--json", action="store_true")
    tp.set_defaults(fn=cmd_trace_summarize)

    sp = sub.add_parser("capture", help="deep-capture a job now (JAX/XLA, or a vLLM/SGLang server), through its "
                                        "host's agent")
    server_args(sp)
    target = sp.add_mutually_exclusive_group(required=True)
    target.add_argument("--jax", metavar="HOST:PORT", help="the job's profiler server, as the agent reaches it")
    target.add_argument("--serving", metavar="URL", help="a serving engine's base URL (http://HOST:PORT), one the "
                                                         "agent found on its GPUs or was started with --serving")
    target.add_argument("--pid", type=positive_int, help="a process on the agent's GPUs; its profiler port is discovered")
    target.add_argument("--job", metavar="JOB", help="every rank of a distributed job (`gpuscope jobs --fleet`) over "
                                                     "the same window, through the analyzer (--server): who arrives "
                                                     "last at each collective (operator role)")
    sp.add_argument("--duration-ms", type=int, default=2000, help="trace length (default 2000)")
    sp.add_argument("--timeout", type=positive_float, default=None, metavar="S",
                    help="how long to wait for the agent's answer (default: long enough for a serving engine's "
                         "stop, 60 s + 100 s per second of capture + margins); the agent answers before it, "
                         "'slow' with the capture id if the engine has not finished")
    sp.set_defaults(fn=cmd_capture)

    sp = sub.add_parser("watch", help="findings, anomalies, capture decisions and captures as they happen",
                        description="Starts with the last 5 minutes' anomalies and the open findings (last, "
                                    "just above the live events), then "
                                    "prints each event as it happens. --json: one JSON object per line, "
                                    '{"kind": finding|anomaly|decision|capture, "t": Unix seconds, "host", "gpu", '
                                    '"verdict", "record": the finding, anomaly, decision or capture}; the lines of '
                                    'the state at start carry "backlog": true.')
    server_args(sp)
    sp.add_argument("--host", default="")
    sp.add_argument("--gpu", type=number(0, 65535, int), default=None, help="GPU index")
    sp.add_argument("--verdict", action="append", choices=VERDICTS + FINDING_KINDS[1:],
                    help="events of this verdict; a degraded, regression or straggler finding's verdict is its kind")
    sp.add_argument("--kind", action="append", choices=["finding", "anomaly", "decision", "capture"])
    sp.set_defaults(fn=cmd_watch)

    for name, what in (("anomalies", "anomalies the detector raised"), ("decisions", "capture decisions and why")):
        sp = sub.add_parser(name, help=what)
        server_args(sp)
        sp.add_argument("--host", default="")
        sp.add_argument("--since", type=positive_duration, default=None)
        sp.add_argument("--limit", type=positive_int, default=200, metavar="N")
        sp.set_defaults(fn=cmd_records)

    sp = sub.add_parser("report", help="the story of one finding: counters, verdicts, captures, anomalies; "
                                       "--html/--png: pictures of a time range or of a finding's context",
                        description="gpuscope report FINDING_ID prints the story of one finding. With --html FILE "
                                    "(one self-contained page: a timeline of each GPU's verdict, the counters "
                                    "behind it, findings and captures on it, a roofline of the captured ops, the "
                                    "findings with what to try) or --png FILE (the timeline alone), it draws a "
                                    "time range (--since 2h, or --start/--end) or the finding's context. "
                                    "docs/operations.md, Reports with pictures.")
    sp.add_argument("finding_id", nargs="?", default=None, help="a finding's id (its first 4 characters do)")
    server_args(sp)
    sp.add_argument("--context", type=duration, default=None, help="seconds shown before and after the episode (default or 0: the episode's length, "
                         "at least 60 s and at most 30 min)")
    sp.add_argument("--since", type=positive_duration, default=None, help="a range from this long ago, e.g. 2h")
    sp.add_argument("--start", type=float, default=None, help="a range from this Unix time")
    sp.add_argument("--end", type=float, default=None, help="...to this Unix time (default now)")
    sp.add_argument("--host", default="", help="the range's host (default: the fleet)")
    sp.add_argument("--gpu", type=number(0, 65535, int), default=None, help="the range's GPU index")
    sp.add_argument("--html", metavar="FILE", default=None, help="write the report as one HTML page that opens offline")
    sp.add_argument("--png", metavar="FILE", default=None, help="write the timeline as a PNG (for a ticket)")
    sp.add_argument("--max-gpus", type=number(1, 64, int), default=None, metavar="N",
                    help="GPUs drawn, those bottlenecked longest first (default 16)")
    sp.add_argument("--points", type=number(50, 10_000, int), default=None, metavar="N",
                    help="points per GPU and counter, and windows per lane before they are merged (default 1000)")
    sp.set_defaults(fn=cmd_report)

    sp = sub.add_parser("accuracy", help="how often counters verdicts agreed with the traces taken at the time")
    server_args(sp)
    sp.add_argument("--host", default="", help="one host (default: the fleet)")
    sp.add_argument("--since", type=positive_duration, default=None, help="pairs from this long ago (default: all kept)")
    sp.set_defaults(fn=cmd_accuracy)

    sp = sub.add_parser("degraded", help="GPUs well under their peers of the same model: HBM, tensor, PCIe link, "
                                         "NVLink, clocks at the power limit")
    server_args(sp)
    sp.add_argument("--since", type=positive_duration, default=3600.0, metavar="DURATION",
                    help="live figures from samples this recent (default 1h)")
    sp.set_defaults(fn=cmd_degraded)

    sp = sub.add_parser("jobs", help="the jobs on an agent's GPUs it can trace: JAX profiler servers and "
                                     "serving engines (vLLM, SGLang, TensorRT-LLM); --fleet: distributed jobs "
                                     "across hosts, as the analyzer groups their ranks")
    server_args(sp)
    sp.add_argument("--fleet", action="store_true",
                    help="ask the analyzer (--server) for distributed jobs: ranks, hosts, what their GPUs do now "
                         "and stragglers (docs/jobs.md)")
    sp.add_argument("--since", type=positive_duration, default=3600.0, metavar="DURATION",
                    help="with --fleet: jobs with ranks seen this recently (default 1h)")
    sp.set_defaults(fn=lambda ns: cmd_fleet_jobs(ns) if ns.fleet else cmd_jobs(ns))
    add_job_parser(sub, server_args)

    sp = sub.add_parser("captures", help="list captures with status and verdict")
    server_args(sp)
    sp.set_defaults(fn=cmd_captures)

    add_ceilings_parser(sub, server_args)
    add_programs_parser(sub, server_args)

    sp = sub.add_parser("metrics", help="the metric catalogue: names, units, kinds")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(fn=cmd_metrics)

    add_certs_parser(sub)
    add_calibrate_parser(sub)
    add_config_parser(sub, build_parser)
    add_fleet_parser(sub)
    return p


def _retention(value: str) -> float:
    from gpuscope.analyzers.retention import parse_age
    try:
        return parse_age(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _snapshot_period(value: str) -> float:
    from gpuscope.analyzers.analyzer import MAX_SNAPSHOT_EVERY_S
    s = duration(value)
    if not 5 <= s <= MAX_SNAPSHOT_EVERY_S:
        raise argparse.ArgumentTypeError(f"{value!r}: the snapshot period is 5s to {MAX_SNAPSHOT_EVERY_S / 60:g}m")
    return s


def _asks(command: str) -> str:
    if command in client_config.AGENT_COMMANDS:
        return "agent (or `gpuscope up`)"
    return "analyzer or agent" if command in ("status", "captures") else "analyzer"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("gpuscope")
    except PackageNotFoundError:          # run from a checkout that was never installed
        return "unknown (not installed)"


SERVERS = ("analyzer", "agent", "up")
_served = False          # main() ran a server: run() skips the interpreter's teardown


def run() -> None:
    """The `gpuscope` command. A server that has stopped cleanly (batches
    committed, streams answered, logs written) leaves without the
    interpreter's teardown: there, gRPC's asyncio threads are killed inside
    native code and can abort the process ("terminate called after throwing
    an instance of ''", grpc/grpc#38679), which would make a clean stop look
    like a crash to systemd."""
    rc = main()
    if _served:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    sys.exit(rc)


def main(argv: list[str] | None = None) -> int:
    global _served
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.command not in SERVERS:
        resume_ctrl_c()
    try:
        configured = _configure(ns, parser, sys.argv[1:] if argv is None else argv)
    except config_file.ConfigError as exc:
        _said(ns, exc)
        return 2
    logs.configure(ns.log_level, ns.json_logs)
    if configured is not None:
        for warning in configured.warnings:
            logs.say(f"warning: {warning}", "warning")
        if config_file.summary(configured):
            logs.say(config_file.summary(configured))
    _served = ns.command in SERVERS
    if _served and interrupted():       # Ctrl-C while loading: nothing has started yet
        return 130
    if _served:
        # what a server writes (the DB and its WAL, snapshots, captures, spools) holds job command lines
        # that only operators may read: readable by its own user only, as the systemd units' UMask=0077,
        # whatever the shell's umask (found in a trial: a 0644 DB beside a 0700 tls/)
        os.umask(os.umask(0o077) | 0o077)
    try:
        if hasattr(ns, "server"):
            client_config.apply(ns)
        return ns.fn(ns)
    except (UsageError, ValueError, RecordingError, TraceError, SourceUnavailable, ListenError,
            clients.ClientError, RuntimeError) as exc:
        origin = getattr(ns, "origin", {}).get("server")
        where = f" (the address came from {origin})" if isinstance(exc, clients.ClientError) and origin and \
            origin != "--server" and ns.server in str(exc) else ""
        print(f"gpuscope {ns.command}: error: {exc}{where}", file=sys.stderr)
        return getattr(exc, "exit_status", 1)
    except config_file.ConfigError as exc:
        _said(ns, exc)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:   # `gpuscope classify ... | head`
        sys.stderr.close()
        return 0


def _configure(ns, parser, argv: list[str]):
    """A server's settings from its configuration file and the environment,
    under its flags (daemon/config_file.py); None for other commands."""
    if ns.command not in SERVERS:
        return None
    return config_file.apply(ns, parser, config_file.flags_given(build_parser, argv))


def _said(ns, exc: config_file.ConfigError) -> None:
    """Each problem on a line of its own, as argparse says a bad flag."""
    for problem in exc.problems:
        print(f"gpuscope {ns.command}: error: {problem}", file=sys.stderr)


if __name__ == "__main__":
    run()
