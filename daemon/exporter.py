"""Prometheus export of an agent (`--metrics-listen`): each GPU's newest
value of every catalogue metric, its verdict, and the agent's own health.

Names follow Prometheus' conventions: `gpuscope_gpu_<metric>` with the unit
in the name (`gpuscope_gpu_power_watts`), counters as `_total`. The
profiling metrics are named for what they measure, as DCGM names them
(`gpuscope_gpu_sm_active_ratio`, `gpuscope_gpu_dram_active_ratio`), whichever
source read them (NVML GPM, DCGM, dcgm-exporter): catalogue.EXPORTED.
Per-GPU labels are `gpu`, `uuid` and `model` only: the series of a GPU live
as long as the GPU, whatever runs on it. The verdict gauge adds `job`
(collectors.attribution.job_label: a Slurm job, pod, unit or program, never
a pid), `pod` and `namespace`, which live as long as the work; scrape it
with `honor_labels: true`, as dcgm-exporter is, or Prometheus renames `job`
to `exported_job`. The agent judges its own newest window with the
analyzer's rules (`judge`, wired in by the command line); the analyzer
exports the fleet's (`gpuscope analyzer --metrics-listen`), and `gpuscope
up` exports both. The process' CPU and memory are prometheus_client's
standard `process_*` metrics.

Served by prometheus_client's HTTP server: plain HTTP on a loopback
address; anywhere else only with TLS, the client presenting a certificate
of the fleet's CA (Prometheus' `tls_config` with `cert_file`/`key_file`).
"""
from __future__ import annotations

import time
from typing import Callable, Iterable

from prometheus_client import ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import CollectorRegistry

from gpuscope.collectors import catalogue as cat
from gpuscope.collectors.attribution import job_label
from gpuscope.collectors.records import GpuSample

from .cliutil import VERDICTS
from .serve import parse_hostport

PREFIX = "gpuscope_"

# A GPU's verdict, given its newest samples (analyzers.offline.judge_newest,
# wired in by the command line: the agent's own modules never import analyzers)
Judge = Callable[[list[GpuSample], float, dict], dict]


def _family(m: cat.Metric, labels: list[str]):
    name = cat.prometheus_name(m)
    if m.kind is cat.Kind.COUNTER:
        return CounterMetricFamily(name, m.help, labels=labels)
    return GaugeMetricFamily(name, f"{m.help} ({m.unit})", labels=labels)


STALE_TICKS = 3
SLOW_GRACE_S = 2.0       # a scrape that takes a while is not an outage


class AgentCollector:
    """A prometheus_client collector over a running Agent."""

    def __init__(self, agent, judge: Judge | None = None, window_s: float = 5.0):
        self.agent = agent
        self._judge, self._window_s = judge, window_s

    def collect(self) -> Iterable:
        a = self.agent
        devices = {d.gpu: d for d in a.devices()}
        now = time.time()
        with a._ring_lock:
            at = dict(a.latest_at)
            latest = {g: dict(v) for g, v in a.latest.items()}
        labels = ["gpu", "uuid", "model"]
        # A GPU whose source went quiet (exporter or host engine down, GPU lost) shows no values, not its
        # last ones: a dashboard would read a busy, healthy GPU through the outage (found in a trial)
        quiet_after = STALE_TICKS * a.config.interval_s + SLOW_GRACE_S
        up = GaugeMetricFamily(PREFIX + "gpu_up", "1 while the GPU's samples arrive (none for "
                               f"{STALE_TICKS} intervals: 0, and its values are left out)", labels=labels)
        age = GaugeMetricFamily(PREFIX + "gpu_sample_age_seconds", "since the GPU's newest sample", labels=labels)
        for gpu in sorted(set(devices) | set(at)):
            d = devices.get(gpu)
            key = [str(gpu), d.uuid if d else "", d.name if d else ""]
            fresh = gpu in at and now - at[gpu] <= quiet_after
            up.add_metric(key, 1.0 if fresh else 0.0)
            if gpu in at:
                age.add_metric(key, max(now - at[gpu], 0.0))
            if not fresh:
                latest.pop(gpu, None)
        yield from (up, age)
        for m in cat.METRICS:
            fam = None
            for gpu in sorted(latest):
                v = latest[gpu].get(m.name)
                if v is None or v != v:
                    continue                     # missing is not zero: no sample, no series
                d = devices.get(gpu)
                fam = fam or _family(m, labels)
                fam.add_metric([str(gpu), d.uuid if d else "", d.name if d else ""], v)
            if fam is not None:
                yield fam
        if self._judge is not None:
            yield self._verdicts(devices, set(latest))
        yield from _health(a)

    def _verdicts(self, devices: dict, fresh: set[int]):
        fam = GaugeMetricFamily(PREFIX + "gpu_verdict", f"1 on the GPU's verdict over its newest "
                                f"{self._window_s:g} s (the analyzer's rules, judged by the agent), 0 on the others",
                                labels=["gpu", "uuid", "verdict", "job", "pod", "namespace"])
        recent = [s for s in self.agent.recent(self._window_s) if s.gpu in fresh]
        judged = self._judge(recent, self._window_s, devices) if recent else {}
        owners = _owners(recent, devices)
        for gpu in sorted(judged):
            d, (job, pod, namespace) = devices.get(gpu), owners.get(gpu, ("", "", ""))
            for v in VERDICTS:
                fam.add_metric([str(gpu), d.uuid if d else "", v, job, pod, namespace],
                               1.0 if judged[gpu].verdict == v else 0.0)
        return fam


def _owners(recent: list[GpuSample], devices: dict) -> dict[int, tuple[str, str, str]]:
    """(job, pod, namespace) of each GPU: its newest sample's biggest
    process (by device memory), else what the source says of the GPU."""
    out: dict[int, tuple[str, str, str]] = {}
    seen: set[int] = set()
    for s in reversed(recent):
        if s.gpu in seen or not (s.processes or "procs_count" in s.values):
            continue
        seen.add(s.gpu)
        p = max(s.processes, key=lambda p: p.used_memory_bytes or 0, default=None)
        if p is not None:
            a = p.attribution
            out[s.gpu] = (job_label(a, p.command), a.pod if a else "", a.namespace if a else "")
    for gpu, d in devices.items():
        if gpu not in out and d.attribution is not None:
            out[gpu] = (job_label(d.attribution), d.attribution.pod, d.attribution.namespace)
    return out


def _health(a) -> Iterable:
    s = a.status()
    up = s["uplink"]
    for name, help_, value in (
            ("agent_samples", "GPU samples taken", s["samples"]),
            ("agent_ticks", "sampling ticks", s["ticks"]),
            ("agent_tick_overruns", "ticks that ran past the next one's time", s["tick_overruns"]),
            ("agent_dropped_samples", "samples dropped because the buffer was full while the analyzer was away",
             up.get("dropped_samples", 0)),
            ("agent_batches_sent", "batches sent to the analyzer", up.get("batches_sent", 0)),
            ("agent_batches_acked", "batches the analyzer stored and acknowledged", up.get("batches_acked", 0)),
            ("agent_source_errors", "errors reading the sources (NVML, serving engines, ...)",
             sum(s["errors"].values()))):
        c = CounterMetricFamily(PREFIX + name, help_)
        c.add_metric([], value)
        yield c
    for name, help_, value in (
            ("agent_unacked_samples", "samples sent or waiting, not yet acknowledged", up.get("unacked_samples", 0)),
            ("agent_uplink_connected", "1 while the stream to the analyzer is up", int(bool(up.get("connected")))),
            ("agent_send_lag_seconds", "age of the oldest sample the analyzer has not acknowledged (0: none)",
             up.get("send_lag_seconds", 0.0)),
            ("agent_gpus", "GPUs the agent samples", len(s["devices"]))):
        g = GaugeMetricFamily(PREFIX + name, help_)
        g.add_metric([], value)
        yield g
    captures = CounterMetricFamily(PREFIX + "agent_captures", "deep captures by outcome", labels=["status"])
    by: dict[str, int] = {}
    for rec in list(a.captures.records) if a.captures is not None else []:
        by[rec.status] = by.get(rec.status, 0) + 1
    for status, n in sorted(by.items()):
        captures.add_metric([status], n)
    yield captures


class FleetCollector:
    """The analyzer's view: each GPU's verdict (a gauge of 1 on the current
    verdict's series, 0 on the others, so a dashboard can sum by verdict),
    its confidence, staleness, and the open findings by verdict."""

    def __init__(self, status: Callable[[], dict]):
        self._status = status

    def collect(self) -> Iterable:
        s = self._status()
        # uuid, namespace and pod as dcgm-exporter labels its series, so the two join; the pod is the
        # open finding's job's (empty when none): bounded by pods, never by pids or requests
        verdict = GaugeMetricFamily(PREFIX + "gpu_verdict", "1 on the GPU's current verdict (of its last window)",
                                    labels=["host", "gpu", "uuid", "namespace", "pod", "verdict"])
        conf = GaugeMetricFamily(PREFIX + "gpu_verdict_confidence", "confidence of that verdict (0-1)",
                                 labels=["host", "gpu"])
        stale = GaugeMetricFamily(PREFIX + "gpu_stale", "1 while no sample of the GPU has arrived for 3 windows",
                                  labels=["host", "gpu"])
        open_by: dict[str, int] = {v: 0 for v in VERDICTS}
        for g in s["gpus"]:
            host, gpu = g["host"], str(g["gpu"])
            for v in VERDICTS:
                verdict.add_metric([host, gpu, g.get("uuid") or "", g.get("namespace") or "", g.get("pod") or "", v],
                                   1.0 if g["verdict"] == v else 0.0)
            conf.add_metric([host, gpu], g["confidence"])
            stale.add_metric([host, gpu], 1.0 if g.get("stale") else 0.0)
            if g.get("open_finding") and g["verdict"] in open_by:
                open_by[g["verdict"]] += 1
        yield from (verdict, conf, stale)
        findings = GaugeMetricFamily(PREFIX + "findings_open", "GPUs with an open finding, by its verdict",
                                     labels=["verdict"])
        for v, n in open_by.items():
            findings.add_metric([v], n)
        yield findings
        for name, help_, key in (("samples_committed", "samples stored since start", "samples_committed"),
                                 ("batches_committed", "batches stored since start", "batches_committed"),
                                 ("batches_rejected", "batches refused since start", "batches_rejected"),
                                 ("batches_held", "batches held back since start: their host was over its "
                                  "ingest rate (--host-rate)", "batches_held"),
                                 ("batches_over_rate", "batches refused as transient since start: their host "
                                  "was too far over its ingest rate", "batches_over_rate"),
                                 ("anomalies", "anomalies raised since start", "anomalies")):
            c = CounterMetricFamily(PREFIX + "analyzer_" + name, help_)
            c.add_metric([], s.get(key, 0))
            yield c
        g = GaugeMetricFamily(PREFIX + "analyzer_analysis_lag_seconds", "how far live analysis is behind the newest "
                              "samples")
        g.add_metric([], s.get("analysis_lag_seconds") or 0.0)
        yield g
        since = s.get("store_failing_since")
        g = GaugeMetricFamily(PREFIX + "analyzer_store_failing_seconds", "how long the store has failed to commit "
                              "agents' batches (a full disk, most often); 0 while it commits")
        g.add_metric([], max(0.0, time.time() - since) if since is not None else 0.0)
        yield g
        yield from _publishing(s.get("publish"))


def _publishing(p: dict | None) -> Iterable:
    """The fleet tier (--publish), when on: how far behind it is and how its
    uploads fare, labelled by cluster (one series per analyzer)."""
    if not p:
        return
    for name, help_, key, family in (
            ("publish_lag_seconds", "age of the oldest row not yet in object storage", "lag_seconds", GaugeMetricFamily),
            ("publish_pending_files", "Parquet files staged, waiting for upload", "files_pending", GaugeMetricFamily),
            ("publish_uploads", "Parquet files uploaded since start", "files_uploaded", CounterMetricFamily),
            ("publish_failures", "publish passes that failed since start (storage down, refused)", "failures",
             CounterMetricFamily)):
        m = family(PREFIX + "analyzer_" + name, help_, labels=["cluster"])
        m.add_metric([p.get("cluster") or ""], p.get(key) or 0)
        yield m


class AlertCollector:
    """The alert hooks' delivery, per receiver (its URL without credentials):
    alerts sent, failed posts tried again, alerts dropped by reason, alerts
    waiting. `counters`: the Alerter's, a list of one dict per receiver."""

    def __init__(self, counters: Callable[[], list[dict]]):
        self._counters = counters

    def collect(self) -> Iterable:
        sent = CounterMetricFamily(PREFIX + "alerts_sent", "alerts delivered to the receiver", labels=["receiver"])
        retried = CounterMetricFamily(PREFIX + "alerts_retried", "posts to the receiver that failed and are tried "
                                      "again", labels=["receiver"])
        dropped = CounterMetricFamily(PREFIX + "alerts_dropped", "alerts never delivered, by reason (rate-limit, "
                                      "queue-full, expired, refused, shutdown)", labels=["receiver", "reason"])
        pending = GaugeMetricFamily(PREFIX + "alerts_pending", "alerts waiting to be delivered (kept while the "
                                    "receiver does not answer)", labels=["receiver"])
        for c in self._counters():
            sent.add_metric([c["receiver"]], c["sent"])
            retried.add_metric([c["receiver"]], c["retried"])
            for reason, n in sorted(c["dropped"].items()):
                dropped.add_metric([c["receiver"], reason], n)
            pending.add_metric([c["receiver"]], c["pending"])
        yield from (sent, retried, dropped, pending)


def registry(*collectors) -> CollectorRegistry:
    """The collectors, and the process' own CPU seconds, resident memory
    and open files (`process_*`, prometheus_client's standard names)."""
    r = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=r)
    for c in collectors:
        r.register(c)
    return r


def serve(listen: str, reg: CollectorRegistry, tls=None):
    """Starts the /metrics HTTP server; `tls`: the process's TlsFiles (TLS,
    client certificates of its CA required), None for plain HTTP, which is
    refused beyond loopback. Raises ValueError naming what is wrong."""
    from prometheus_client import start_http_server

    from gpuscope.security.tls import is_loopback

    host, _, port = parse_hostport(listen, "--metrics-listen").rpartition(":")
    if tls is None and not is_loopback(listen):
        raise ValueError(f"--metrics-listen {listen}: beyond loopback, /metrics is served over TLS only, to "
                         f"scrapers with a certificate of the fleet's CA: drop --insecure and give --tls-dir")
    kw = dict(certfile=str(tls.cert), keyfile=str(tls.key), client_cafile=str(tls.ca),
              client_auth_required=True) if tls is not None else {}
    try:
        server, _ = start_http_server(int(port), host.strip("[]"), reg, **kw)
    except OSError as exc:
        raise ValueError(f"--metrics-listen {listen}: {exc.strerror or exc}") from None
    return server
