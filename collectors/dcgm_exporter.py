"""dcgm-exporter as a source (`--source dcgm-exporter:URL`): on clusters that
already run NVIDIA's dcgm-exporter on every GPU node, the agent scrapes the
node's exporter instead of touching the GPUs itself.

Read: the DCGM_FI_* fields collectors/dcgm_fields.py maps, one sample per
GPU per scrape, each value through that table's scale (dcgm_exporter_series.py
says which GPU a line is, and which of several series of a GPU is its own).
A metric's kind is the catalogue's, never the exposition's TYPE:
dcgm-exporter declares some gauges `counter` (DCGM_FI_PROF_PCIE_*_BYTES, a
rate in B/s, in releases before 3.3; DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL).
The devices are the GPUs of the first answer: index (`gpu`), `UUID`, model
(`modelName`), memory and power limit where the fields are exported. The
pods labelled on a GPU's series (`pod`, `namespace`, `container`, with the
exporter's Kubernetes mapping) are kept per GPU (`attribution`). Not read:
what the table does not map, MIG instances' and NVLink links' series,
processes and XID events (the exporter has no process list, and
DCGM_FI_DEV_XID_ERRORS is the last XID, a level, not events).

Time: a sample's time is the scrape's. dcgm-exporter writes no timestamps
and refreshes its values every `-c` ms (30,000 by default), and does not say
its interval: scraped every second, it answers one reading ~30 times. The
agent sends the repeats (the analyzer's windows and its staleness need a
sample each tick) and says so once it has seen the values change at a
slower pace than it scrapes: `status()["refresh_s"]`, one count among the
agent's source errors and a `source_error` health event per GPU naming the
cure (run the exporter with -c 1000).

Faults degrade this source only, each with a status that names it (a
source error counted every tick it lasts, a `source_error` health event per
GPU when it starts and `recovered` when it ends), and sampling goes on:
unreachable, too slow (one deadline, `TIMEOUT_S`, for the whole answer), an
HTTP error, HTML (a proxy's or login page), an answer cut short or
half-written (its last line has no newline: nothing of it is used, as a cut
"45" would read 4), a line that is not Prometheus text (the whole answer is
refused, as Prometheus refuses it), a GPU missing from an answer (that GPU
only). start() refuses, with what to do, when the exporter does not answer
with at least one GPU: the agent must know its GPUs before it samples, and
a service manager (the systemd unit's Restart=always, a DaemonSet) starts it
again once the exporter is up.

Cost: the exposition of 8 GPUs with the DCP fields and pods is ~300 lines,
~80 KB. The first answer is read line by line (each new series parsed once
by prometheus_client's parser); what is remembered is the text between the
values (`_VALUE` splits it off in C) and where each value used sits. While
the next answer's text between the values is the same, only the numbers
used are read: about a hundredth of what prometheus_client's parser takes
over the whole text, and with the GET 20-35 us of the agent's CPU per
GPU-sample (docs/benchmarks.md, "dcgm-exporter source"). Anything else (a
new pod, a new series, a timestamp) reads the answer line by line again;
an answer the same as the one before is the same reading.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import re
import statistics
import time
import urllib.parse
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Callable

import structlog

from . import catalogue as cat
from . import dcgm_fields
from .dcgm_exporter_series import (HOST_LABELS, Pod, Series, cut, device_level, number_gpus, one_host, parse_head,
                                   pod, sample_line, value_and_time)
from .http_get import KeptAliveGet
from .nvml import SourceUnavailable
from .attribution import PodLookup
from .records import Attribution, DeviceInfo, GpuSample, HealthKind, HealthRecord, Scrape

log = structlog.get_logger("gpuscope.dcgm_exporter")

PREFIX = "dcgm-exporter:"
DEFAULT_PORT = 9400                  # dcgm-exporter's -a default
TIMEOUT_S = 0.5                      # the whole answer; the exporter renders from memory in milliseconds
MAX_BYTES = 16 << 20                 # 8 GPUs with every DCP field and pod labels are ~200 KB
MAX_SERIES = 100_000                 # series remembered: pods come and go, each with new series
REFRESH_RUNS = 3                     # whole runs of one reading seen before the exporter's pace is judged
SLOW_REFRESH = 2.5                   # one reading answered this many scrapes in a row or more: said
_VALUE = re.compile(r"\} ([^ \n]*)\n")   # a labelled sample's value: the last word of its line
_PROFILING = "DCGM_FI_PROF_"
_ODD_START = ("", "<", " ", "\t", "\r", "\n")     # what an exposition seldom starts with: looked at closer
WHAT_TO_DO = ("check that dcgm-exporter runs on this node and listens there (`curl URL` prints DCGM_FI_* lines; "
              "Kubernetes: `kubectl -n gpu-operator get pods -l app=nvidia-dcgm-exporter -o wide` shows the one "
              "on each node; docs/operations.md, \"dcgm-exporter\"), or run the agent with --source nvml")


class ExpositionError(ValueError):
    """The answer is not a dcgm-exporter exposition that can be read."""


def exporter_url(address: str) -> str:
    """The URL `--source dcgm-exporter:ADDRESS` scrapes: a bare HOST[:PORT]
    gets http://, port 9400 and /metrics; a URL without a path gets /metrics."""
    text = address.strip()
    bare = "://" not in text
    u = urllib.parse.urlsplit("http://" + text if bare else text)
    try:
        port = u.port
    except ValueError:
        port = -1
    if u.scheme not in ("http", "https") or not u.hostname or port == -1:
        raise ValueError(f"{PREFIX}{address}: not an exporter's address; expected e.g. "
                         f"{PREFIX}http://127.0.0.1:{DEFAULT_PORT}/metrics or {PREFIX}NODE:{DEFAULT_PORT}")
    netloc = u.netloc if port is not None or not bare else f"{u.netloc}:{DEFAULT_PORT}"
    path = u.path if u.path not in ("", "/") else "/metrics"
    return urllib.parse.urlunsplit((u.scheme, netloc, path, u.query, ""))


def open_source(address: str, timeout_s: float = TIMEOUT_S) -> DcgmExporterCollector:
    """`--source dcgm-exporter:ADDRESS`: the collector, started (its GPUs
    known). ValueError for an address that is none; SourceUnavailable when
    the exporter does not answer with a GPU."""
    collector = DcgmExporterCollector(exporter_url(address), timeout_s)
    collector.start()
    return collector


@dataclass
class _Layout:
    """What one exposition's lines are, and how to read the next one whose
    text between the values is the same."""
    skeleton: list[str] | None           # the text between the values; None: read each answer line by line
    take: Callable | None                # the values used, out of _VALUE.split's parts, in `gpus` order
    gpus: list[tuple[int, tuple[str, ...], int, int]]   # (gpu, its metrics, start, end) into the values used
    scales: list[float]
    blanks: list[float]                  # DCGM's "no value" for each value used (dcgm_fields.blank_at)
    raw: tuple                           # the values of the answer it was made from
    devices: dict[int, DeviceInfo]
    pods: dict[int, tuple[Pod, ...]]
    ignored: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.scaled = [(i, s) for i, s in enumerate(self.scales) if s != 1.0]
        self.least_blank = min(self.blanks, default=math.inf)


class DcgmExporterCollector:
    """The GPUs of one node, as its dcgm-exporter tells them."""

    def __init__(self, url: str, timeout_s: float = TIMEOUT_S, clock: Callable[[], float] = time.time) -> None:
        self.url = url
        u = urllib.parse.urlsplit(url)
        self._path = u.path + (f"?{u.query}" if u.query else "")
        self._http = KeptAliveGet(f"{u.scheme}://{u.netloc}", timeout_s, MAX_BYTES,
                                  {404: " (dcgm-exporter serves /metrics)"})
        self._clock = clock
        self._series: dict[str, Series | str] = {}     # text before a value -> the series (str: why not read)
        self._layout: _Layout | None = None
        self._devices: dict[int, DeviceInfo] = {}
        # the kubelet's pod-resources (collectors.kubelet, set by the command line): whose a GPU is when the
        # exporter runs without its Kubernetes mapping (no pod labels)
        self.pods: PodLookup | None = None
        # (kubelet generation, devices asked about, the same named): the uplink asks with every batch
        self._kubelet_named: tuple[int, list[DeviceInfo], list[DeviceInfo]] | None = None
        self._shared_said: set[int] = set()
        self._error: str | None = None                 # why the last scrape failed; None: it did not
        self._missing: set[int] = set()
        self._host: tuple[str, str] | None = None      # (label, value) of the host the answers are of
        self._text: str | None = None                  # the last answer read, and what it read
        self._readings: list[tuple[int, dict[str, float]]] = []
        self._same = 0                                 # answers in a row the same as the one before
        self._runs: collections.deque[int] = collections.deque(maxlen=REFRESH_RUNS)   # answers per reading
        self._changed_at: collections.deque[float] = collections.deque(maxlen=REFRESH_RUNS + 1)
        self.refresh_s: float | None = None            # how often the exporter's values change, once judged
        self._said_slow = False

    # -- start-up: fail fast with what to do ---------------------------------------
    def start(self) -> None:
        try:
            self._read(self._http.get(self._path))
        except (OSError, ExpositionError) as exc:
            self._http.close()
            raise SourceUnavailable(f"dcgm-exporter: {exc}; {WHAT_TO_DO.replace('URL', self.url)}") from None
        log.info("dcgm-exporter read", url=self.url, gpus=sorted(self._devices),
                 ignored=len(self._layout.ignored))

    @property
    def timeout_s(self) -> float:
        """How long a scrape may take in all before it counts as a failure."""
        return self._http.timeout_s

    @timeout_s.setter
    def timeout_s(self, seconds: float) -> None:
        self._http.timeout_s = seconds

    def devices(self) -> list[DeviceInfo]:
        """The GPUs (each with its pod: _learn_devices), and, while the
        exporter does not answer, why in its source (as DCGM's says its host
        engine is down: `gpuscope status` shows it)."""
        devices = self._named([self._devices[g] for g in sorted(self._devices)])
        if self._error is None:
            return devices
        down = f"dcgm-exporter (not answering: {self._error[:160]})"
        return [dataclasses.replace(d, source=down) for d in devices]

    def _named(self, devices: list[DeviceInfo]) -> list[DeviceInfo]:
        """GPUs the exporter names no pod of, named by the kubelet when exactly
        one pod holds each."""
        pods = self.pods
        if pods is None:
            return devices
        cached = self._kubelet_named
        if cached is not None and cached[0] == pods.generation and cached[1] == devices:
            return cached[2]
        out = []
        for d in devices:
            held = pods.holders(d.uuid, d.gpu) if d.attribution is None else ()
            if len(held) == 1:
                d = dataclasses.replace(d, attribution=Attribution(namespace=held[0].namespace, pod=held[0].pod,
                                                                   container=held[0].container))
            out.append(d)
        self._kubelet_named = (pods.generation, devices, out)
        return out

    def attribution(self, gpu: int) -> tuple[Pod, ...]:
        """The pods the exporter labels this GPU's series with (namespace,
        pod, container), for attributing the GPU to jobs; () without its
        Kubernetes mapping or when no pod uses the GPU."""
        layout = self._layout
        return layout.pods.get(gpu, ()) if layout is not None else ()

    def status(self) -> dict:
        layout = self._layout
        return dict(url=self.url, error=self._error, gpus_missing=sorted(self._missing),
                    refresh_s=self.refresh_s, values_repeat=self._said_slow,
                    ignored=list(layout.ignored) if layout is not None else [])

    # -- every tick ----------------------------------------------------------------------
    def scrape(self) -> Scrape:
        scrape = Scrape()
        t = self._clock()
        try:
            readings = self._read(self._http.get(self._path))
        except (OSError, ExpositionError) as exc:
            self._failed(str(exc), t, scrape)
            return scrape
        if self._error is not None:
            self._error = None
            log.info("dcgm-exporter read again", url=self.url)
            scrape.health.extend(HealthRecord(g, t, HealthKind.RECOVERED, f"dcgm-exporter {self.url} read again")
                                 for g in self._devices)
        self._account_missing(t, scrape)
        self._judge_refresh(t, scrape)
        scrape.samples.extend(GpuSample(g, t, values) for g, values in readings if values)
        return scrape

    def scrape_slow(self) -> Scrape:
        """Nothing: every field comes with each scrape, none costs more."""
        return Scrape()

    def close(self) -> None:
        self._http.close()

    # -- reading an answer --------------------------------------------------------------
    def _read(self, text: str) -> list[tuple[int, dict[str, float]]]:
        """(GPU, values) of each GPU in the answer; raises ExpositionError."""
        if text == self._text:          # the exporter has not refreshed since (its -c interval): the same reading
            self._same += 1
            return [(g, dict(values)) for g, values in self._readings]
        readings = self._read_new(text)
        if self._text is not None:      # a new reading (the first, begun before start-up, is not a whole run)
            if self._changed_at:
                self._runs.append(self._same + 1)
            self._changed_at.append(self._clock())
        self._same = 0
        self._text, self._readings = text, readings
        return readings

    def _read_new(self, text: str) -> list[tuple[int, dict[str, float]]]:
        if text[:1] in _ODD_START or not text.endswith("\n"):
            self._check_whole(text)
        parts = _VALUE.split(text)
        layout = self._layout
        if layout is not None and layout.skeleton is not None and parts[0::2] == layout.skeleton:
            try:
                return self._values(layout, layout.take(parts))
            except ValueError:           # a value that is not a number: the line by line read names it
                pass
        layout = self._layout = self._lay_out(text, parts)
        return self._values(layout, layout.take(parts) if layout.take is not None else layout.raw)

    def _check_whole(self, text: str) -> None:
        """Refuses an answer that is nothing, HTML, or cut mid-line."""
        body = text.lstrip()
        if not body:
            raise ExpositionError(f"{self.url} answered nothing")
        if body[:1] == "<":
            raise ExpositionError(f"{self.url} answered HTML ({cut(body, 60)!r}), not a Prometheus exposition: "
                                  "a proxy's or a login page? the URL must be dcgm-exporter's own /metrics")
        if not text.endswith("\n"):
            raise ExpositionError(f"{self.url}: the answer ends mid-line ({cut(text.rpartition(chr(10))[2], 60)!r} "
                                  "has no newline): written halfway, so none of it is used")

    def _values(self, layout: _Layout, raw: tuple) -> list[tuple[int, dict[str, float]]]:
        try:
            got = list(map(float, raw))
        except ValueError:                               # again on a value that is not a number: the caller's
            got = [float(v) if v else math.nan for v in raw]   # a blank value (older exporters) is no reading
        total = sum(got)
        if total - total == 0 and max(got) < layout.least_blank:   # no NaN, no Inf, no DCGM blank: the usual
            for i, scale in layout.scaled:
                got[i] *= scale
            return [(g, dict(zip(names, got[a:b]))) for g, names, a, b in layout.gpus]
        out = []
        for g, names, a, b in layout.gpus:
            values = {}
            for name, v, blank, scale in zip(names, got[a:b], layout.blanks[a:b], layout.scales[a:b]):
                if -blank < v < blank:                   # NaN, Inf and DCGM's blank are no reading
                    values[name] = v * scale
            out.append((g, values))
        return out

    def _lay_out(self, text: str, parts: list[str]) -> _Layout:
        """Reads the answer line by line; what each line is, for the next ones."""
        found: list[tuple[Series, str, float]] = []
        ignored: dict[str, None] = {}
        for n, line in enumerate(text.split("\n"), start=1):
            line = line.strip()
            if not line or line[0] == "#":
                continue
            where = f"{self.url} line {n}"
            _, head, tail = sample_line(line, where, _error)
            series = self._series.get(head)
            if series is None:
                if len(self._series) >= MAX_SERIES:
                    self._series.clear()
                series = self._series[head] = parse_head(head, where, _error)
            value, _ = value_and_time(tail, where, _error)    # a timestamp is not used: the scrape's time is
            if isinstance(series, str):
                ignored.setdefault(series)
            else:
                found.append((series, head, value))
        if not found:
            seen = list(ignored)
            _error(f"{self.url}: no DCGM_FI_* series of a GPU in the answer"
                   + (f" (ignored: {', '.join(seen[:4])}{', ...' if len(seen) > 4 else ''})" if seen else "")
                   + ": is this dcgm-exporter's /metrics?")
        every = [s for s, _, _ in found]
        one_host(every, "one exporter is one node's GPUs: point the agent at its own node's dcgm-exporter, not "
                        "at something that gathers several", _error)
        self._same_host(every)
        number_gpus(every, _error)
        used = _choose(found)
        layout = self._layout_of(found, used, parts, list(ignored))
        self._learn_devices(layout)
        return layout

    def _layout_of(self, found, used: list[int], parts: list[str], ignored: list[str]) -> _Layout:
        used.sort(key=lambda i: found[i][0].gpu)         # stable: each GPU's values in the answer's order
        metrics = [found[i][0].field.metric for i in used]
        gpus, start = [], 0
        for k in range(1, len(used) + 1):
            if k == len(used) or found[used[k]][0].gpu != found[used[start]][0].gpu:
                gpus.append((found[used[start]][0].gpu, tuple(metrics[start:k]), start, k))
                start = k
        where: dict[str, int] = {}                       # a line's text before its value -> its part
        for k in range(1, len(parts), 2):
            head = parts[k - 1].rpartition("\n")[2] + "}"
            where[head] = -1 if head in where else k     # a series twice: no shortcut
        at = [where.get(found[i][1], -1) for i in used]
        shortcut = all(k > 0 for k in at)
        pods: dict[int, dict[Pod, None]] = {}
        for s, _, _ in found:
            p = pod(s.labels)
            if p is not None:
                pods.setdefault(s.gpu, {})[p] = None
        devices = {g: _device(g, [(s, v) for s, _, v in found if s.gpu == g]) for g, _, _, _ in gpus}
        return _Layout(
            skeleton=parts[0::2] if shortcut else None,
            take=(itemgetter(*at) if len(at) > 1 else (lambda p, k=at[0]: (p[k],))) if shortcut else None,
            gpus=gpus, scales=[found[i][0].field.scale for i in used],
            blanks=[dcgm_fields.blank_at(found[i][0].field) for i in used],
            raw=tuple(found[i][2] for i in used), devices=devices,
            pods={g: tuple(p) for g, p in pods.items()}, ignored=ignored)

    def _same_host(self, series: list[Series]) -> None:
        """Refuses an answer of another host than the answers before: a URL
        that leads to several nodes' exporters in turn (a Service that
        balances over them) would give one host's GPUs another's numbers."""
        host = next(((k, s.labels[k]) for k in HOST_LABELS for s in series if s.labels.get(k)), None)
        if host is None or self._host is None or host == self._host:
            self._host = self._host or host
            return
        _error(f"{self.url}: this answer is {host[0]}={host[1]!r}'s GPUs, the ones before were "
               f"{self._host[1]!r}'s: the URL leads to several nodes' exporters (a Service that balances over "
               "them?); point the agent at its own node's exporter (docs/operations.md, \"dcgm-exporter\")")

    def _learn_devices(self, layout: _Layout) -> None:
        """A GPU seen once stays one of the host's (its samples name it to the
        analyzer); what a new answer says of it replaces what was known."""
        starting = not self._devices
        for g, info in layout.devices.items():
            if g not in self._devices and not starting:
                log.info("dcgm-exporter: a GPU new to the agent", url=self.url, gpu=g, uuid=info.uuid)
            pods = layout.pods.get(g, ())
            # the exporter's only way of saying whose a GPU is (it lists no processes); a GPU it puts
            # several pods on (time-slicing) stays unnamed, as it does when NVML and the kubelet cannot
            # tell its pods apart: naming the first would hide the others
            if len({(p.namespace, p.pod) for p in pods}) == 1:
                info = dataclasses.replace(info, attribution=Attribution(
                    namespace=pods[0].namespace, pod=pods[0].pod, container=pods[0].container))
            elif pods:
                info = dataclasses.replace(info, attribution=None)
                if g not in self._shared_said:
                    self._shared_said.add(g)
                    log.info("dcgm-exporter: a GPU shared by several pods is not named after any",
                             gpu=g, pods=sorted(f"{p.namespace}/{p.pod}" for p in pods)[:8])
            self._devices[g] = info

    # -- status ---------------------------------------------------------------------------
    def _failed(self, error: str, t: float, scrape: Scrape) -> None:
        scrape.count_error(f"dcgm-exporter: {error}"[:300])
        if self._error != error:                  # logged when it starts or changes, not every tick
            log.warning("dcgm-exporter not read", url=self.url, error=error[:300])
        if self._error is None:
            detail = f"dcgm-exporter not read ({cut(error, 400)}); this GPU's samples resume when it answers"
            scrape.health.extend(HealthRecord(g, t, HealthKind.SOURCE_ERROR, detail) for g in self._devices)
        self._error = error

    def _account_missing(self, t: float, scrape: Scrape) -> None:
        present = {g for g, _, _, _ in self._layout.gpus}
        missing = set(self._devices) - present
        for g in sorted(missing):
            scrape.count_error(f"dcgm-exporter: GPU {g} ({self._devices[g].uuid or 'no UUID'}) missing from its answer")
        for g in sorted(missing - self._missing):
            log.warning("dcgm-exporter: a GPU missing from its answer", url=self.url, gpu=g)
            scrape.health.append(HealthRecord(g, t, HealthKind.SOURCE_ERROR,
                                              f"GPU {g} missing from dcgm-exporter's answer ({self.url}); "
                                              "the other GPUs keep being sampled"))
        for g in sorted(self._missing - missing):
            scrape.health.append(HealthRecord(g, t, HealthKind.RECOVERED, f"GPU {g} back in dcgm-exporter's answer"))
        self._missing = missing

    def _judge_refresh(self, t: float, scrape: Scrape) -> None:
        """Says once when one reading is answered several scrapes in a row
        (the exporter's -c interval is longer than the agent's tick): the
        samples between its refreshes repeat. Judged in answers, not seconds,
        so that a slow tick or two never reads as a slow exporter."""
        if len(self._runs) < REFRESH_RUNS or self._same:
            return                                  # judged when a new reading arrives, from enough of them
        at = self._changed_at
        self.refresh_s = (at[-1] - at[0]) / (len(at) - 1)
        per_reading = statistics.median(self._runs)
        slow = per_reading >= SLOW_REFRESH
        if slow and not self._said_slow:
            note = (f"dcgm-exporter's values change every ~{self.refresh_s:.0f} s (its -c collect interval, 30000 ms "
                    f"by default), once every {per_reading:g} scrapes of the agent: the samples between repeat one "
                    "reading; run dcgm-exporter with -c 1000 (DCGM_EXPORTER_INTERVAL=1000)")
            log.warning("dcgm-exporter values repeat", url=self.url, refresh_s=round(self.refresh_s, 1),
                        scrapes_per_reading=per_reading)
            scrape.count_error(f"dcgm-exporter: values refresh every ~{self.refresh_s:.0f} s, slower than the "
                               "agent samples: run it with -c 1000")
            scrape.health.extend(HealthRecord(g, t, HealthKind.SOURCE_ERROR, note) for g in self._devices)
        elif not slow and self._said_slow:
            log.info("dcgm-exporter values change at the agent's pace", url=self.url, refresh_s=self.refresh_s)
        self._said_slow = slow


def _error(message: str) -> None:
    raise ExpositionError(message)


def _choose(found: list[tuple[Series, str, float]]) -> list[int]:
    """Which series gives each (GPU, metric): the GPU's own (no pod labels)
    where there is one, else the first (pods' copies of it)."""
    chosen: dict[tuple[int, str], int] = {}
    for i, (s, _, _) in enumerate(found):
        key = (s.gpu, s.field.metric)
        j = chosen.get(key)
        if j is None or (device_level(s.labels) and not device_level(found[j][0].labels)):
            chosen[key] = i
    return list(chosen.values())


def _device(gpu: int, series: list[tuple[Series, float]]) -> DeviceInfo:
    labels = series[0][0].labels
    value = {s.field.metric: dcgm_fields.normalise(s.field, v) for s, v in series
             if v < dcgm_fields.blank_at(s.field) and math.isfinite(v)}
    total = value.get("mem_total_bytes")
    limit = value.get("power_limit_watts")
    profiled = any(s.name.startswith(_PROFILING) for s, _ in series)
    return DeviceInfo(
        gpu=gpu, uuid=labels.get("UUID") or labels.get("uuid") or "", name=labels.get("modelName", ""),
        memory_total_bytes=int(total) if total is not None and 0 < total <= cat.PLAUSIBLE_MAX["bytes"] else None,
        power_limit_watts=limit if limit is not None and 0 < limit <= cat.PLAUSIBLE_MAX["watts"] else None,
        gpm_supported=profiled,
        source="dcgm-exporter (profiling)" if profiled else
        "dcgm-exporter (no profiling fields: add the DCP fields to its counters file)")
