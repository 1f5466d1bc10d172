"""Alert hooks: findings and anomalies at or above a severity, posted to
webhooks as they happen — Alertmanager's API (`POST /api/v2/alerts`) and a
generic JSON POST — with retries and a rate limit per target.

A sink of the analyzer's event bus (analyzers/events.py), with a thread and
a queue per receiver: a slow or dead receiver delays and loses only its own
alerts, never another receiver's, ingest or analysis.

Severity, in Alertmanager's words:
- critical: a GPU lost, an XID error, uncorrected ECC errors;
- warning: a bottleneck finding opened (any verdict but idle), an activity
  drop, a rise of host starvation, throttling, a serving engine's latency,
  queue, KV-cache or preemption anomaly;
- info: a change of bottleneck (the finding that follows says what it is).

Alertmanager keeps a firing alert only while it is sent again (its
resolve_timeout); as Prometheus does, an open finding is resent every
`resend_s` with `endsAt` four resends ahead, and its close sends `endsAt` =
the finding's end. An anomaly is a point in time: it fires once and ends
`ANOMALY_TTL_S` later.

What leaves the host: host, GPU, verdict, the job as its process and
executable (never its command line: arguments hold secrets), whose the job
is as far as routing needs (its Kubernetes namespace and pod, its Slurm
job: labels a team's route can match), the summary, ids and times. A receiver's URL is logged as scheme://host only (Slack-style
URLs carry a token in their path).
"""
from __future__ import annotations

import http.client
import json
import queue
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable

import structlog

from gpuscope.security.redact import command_label

from .events import Watch

log = structlog.get_logger("gpuscope.alerts")

SEVERITIES = ("info", "warning", "critical")
CRITICAL_KINDS = frozenset({"gpu_lost", "xid", "ecc_uncorrected"})
INFO_KINDS = frozenset({"bottleneck-changed"})
ANOMALY_TTL_S = 300.0
ALERTMANAGER, JSON = "alertmanager", "json"


@dataclass(frozen=True)
class Receiver:
    url: str
    format: str = JSON                     # alertmanager: `url` is Alertmanager's base URL

    @property
    def where(self) -> str:
        u = urllib.parse.urlsplit(self.url)
        return f"{u.scheme}://{u.netloc.rpartition('@')[2]}"


@dataclass(frozen=True)
class AlertConfig:
    receivers: tuple[Receiver, ...] = ()
    min_severity: str = "warning"
    per_minute: int = 60                   # posts per receiver per minute; more are dropped and counted
    retries: int = 4                       # after the first try: 1, 2, 4, 8 s apart
    timeout_s: float = 5.0
    resend_s: float = 60.0                 # firing findings again, for Alertmanager
    queue_size: int = 10_000


def parse_receiver(text: str, fmt: str) -> Receiver:
    """A receiver from the command line; ValueError naming what is wrong."""
    u = urllib.parse.urlsplit(text.strip())
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"{text!r}: expected an http:// or https:// URL")
    try:
        u.port
    except ValueError:
        raise ValueError(f"{text!r}: the port is not a number from 1 to 65535") from None
    return Receiver(text.strip().rstrip("/") if fmt == ALERTMANAGER else text.strip(), fmt)


def severity(e: dict) -> str | None:
    """An event's severity, or None when it never alerts (idle findings,
    decisions, captures)."""
    if e["kind"] == "finding":
        return "warning" if e["record"].get("verdict") != "idle" else None
    if e["kind"] == "anomaly":
        kinds = set(e["record"].get("kinds") or [e["record"].get("kind")])
        if kinds & CRITICAL_KINDS:
            return "critical"
        return "info" if kinds <= INFO_KINDS else "warning"
    return None


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# a finding's attribution labels an alert carries (empty ones are left out)
ROUTING_LABELS = ("namespace", "pod", "slurm_job")


@dataclass
class _Alert:
    """One alert as the receivers get it; `firing` until it ends."""
    key: str
    severity: str
    labels: dict
    summary: str
    starts: float
    ends: float | None
    body: dict = field(default_factory=dict)      # the generic JSON


def alert_of(e: dict, sev: str) -> _Alert:
    r = e["record"]
    job = command_label(r.get("job") or "") if r.get("job") else ""
    if e["kind"] == "finding":
        owner = {k: (r.get("attribution") or {}).get(k, "") for k in ROUTING_LABELS}
        labels = dict(alertname="GPUBottleneck", severity=sev, host=e["host"], gpu=str(e["gpu"]),
                      verdict=r["verdict"], job=job, finding_id=r["id"], **owner)
        ends = r.get("end")
        summary = f"{e['host']}/gpu{e['gpu']} {r['verdict']}: {r.get('summary') or ''}"
        body = dict(kind="finding", state="resolved" if ends else "firing", severity=sev, host=e["host"],
                    gpu=e["gpu"], verdict=r["verdict"], job=job, finding_id=r["id"], start=r["start"], end=ends,
                    confidence=r.get("confidence"), flags=r.get("flags") or [], summary=summary,
                    **{k: v for k, v in owner.items() if v})
        return _Alert(f"finding/{r['id']}", sev, labels, summary, r["start"], ends, body)
    kinds = r.get("kinds") or [r.get("kind")]
    labels = dict(alertname="GPUAnomaly", severity=sev, host=e["host"], gpu=str(e["gpu"]), anomaly=kinds[0],
                  job=job, anomaly_id=r["id"])
    summary = f"{e['host']}/gpu{e['gpu']} {', '.join(kinds)}: {r.get('reason') or ''}"
    body = dict(kind="anomaly", state="firing", severity=sev, host=e["host"], gpu=e["gpu"], anomalies=kinds, job=job,
                anomaly_id=r["id"], finding_id=r.get("finding_id"), t=r["t"], summary=summary)
    return _Alert(f"anomaly/{r['id']}", sev, labels, summary, r["t"], r["t"] + ANOMALY_TTL_S, body)


class Alerter:
    """Posts alerts to each receiver from a thread and a queue of its own: a
    slow or dead receiver delays and loses only its own alerts. `watch()`
    is what the analyzer's event bus delivers to."""

    def __init__(self, config: AlertConfig, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] | None = None):
        if config.min_severity not in SEVERITIES:
            raise ValueError(f"severity {config.min_severity!r}, expected one of {', '.join(SEVERITIES)}")
        self.config = config
        self._stop = threading.Event()
        self.receivers = [_Worker(r, i, config, clock, sleep or self._stop.wait, self._stop)
                          for i, r in enumerate(config.receivers)]

    @property
    def posted(self) -> int:
        return sum(w.posted for w in self.receivers)

    @property
    def failed(self) -> int:
        return sum(w.failed for w in self.receivers)

    @property
    def dropped(self) -> int:
        return sum(w.dropped for w in self.receivers)

    def watch(self) -> Watch:
        return Watch(kinds=frozenset({"finding", "anomaly"}), deliver=self._offer)

    def _offer(self, e: dict) -> bool:
        sev = severity(e)
        if sev is None or SEVERITIES.index(sev) < SEVERITIES.index(self.config.min_severity):
            return True
        alert = alert_of(e, sev)
        return all([w.offer(alert) for w in self.receivers])

    def start(self) -> None:
        for w in self.receivers:
            w.thread.start()

    def stop(self, timeout_s: float = 3.0) -> None:
        """Sends what is queued, within `timeout_s` in all, and stops; what is
        still queued then is counted and said, per receiver."""
        for w in self.receivers:
            w.offer(None)
        deadline = time.monotonic() + timeout_s
        for w in self.receivers:
            w.thread.join(max(0.0, deadline - time.monotonic()))
        self._stop.set()
        for w in self.receivers:
            w.thread.join(1.0)
            left = w.q.qsize()
            if left:
                log.warning("alerts not delivered at shutdown", receiver=w.name, alerts=left)


class _Worker:
    """One receiver: its queue, its thread, its open findings to resend, its rate limit."""

    def __init__(self, receiver: Receiver, index: int, config: AlertConfig, clock, sleep, stop: threading.Event):
        self.receiver, self.config, self._clock, self._sleep, self._stop = receiver, config, clock, sleep, stop
        self.name = f"{receiver.where} (receiver {index + 1}, {receiver.format})"
        self.q: queue.Queue = queue.Queue(config.queue_size)
        self._firing: dict[str, _Alert] = {}          # open findings, resent to Alertmanager
        self._sent: list[float] = []
        self.posted = self.failed = self.dropped = 0
        self.thread = threading.Thread(target=self._run, name="alerts", daemon=True)

    def offer(self, alert) -> bool:
        try:
            self.q.put_nowait(alert)
            return True
        except queue.Full:
            self.dropped += 1
            return False

    def _run(self) -> None:
        next_resend = self._clock() + self.config.resend_s
        while True:
            try:
                a = self.q.get(timeout=max(0.05, next_resend - self._clock()))
            except queue.Empty:
                a = False
            if a is None:
                return
            try:
                if a:
                    if a.key.startswith("finding/"):
                        if a.ends is None:
                            self._firing[a.key] = a
                        else:
                            self._firing.pop(a.key, None)
                    self._send([a], resend=False)
                if self._clock() >= next_resend:
                    next_resend = self._clock() + self.config.resend_s
                    if self._firing:
                        self._send(list(self._firing.values()), resend=True)
            except Exception:  # the thread must survive any receiver and any alert
                log.exception("alert not sent", receiver=self.name)

    def _send(self, alerts: list[_Alert], resend: bool) -> None:
        r = self.receiver
        if r.format == ALERTMANAGER:
            self._post(r.url + "/api/v2/alerts", [self._alertmanager(a) for a in alerts])
        elif not resend:
            for a in alerts:
                self._post(r.url, a.body)

    def _alertmanager(self, a: _Alert) -> dict:
        ends = a.ends if a.ends is not None else self._clock() + 4 * self.config.resend_s
        return dict(labels={k: v for k, v in a.labels.items() if v != ""},
                    annotations=dict(summary=a.summary[:1000]), startsAt=_rfc3339(a.starts), endsAt=_rfc3339(ends))

    def _allowed(self) -> bool:
        now = self._clock()
        self._sent = [t for t in self._sent if now - t < 60]
        if len(self._sent) >= self.config.per_minute:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 100 == 0:
                log.warning("alerts over the rate limit dropped", receiver=self.name, dropped=self.dropped,
                            per_minute=self.config.per_minute)
            return False
        self._sent.append(now)
        return True

    def _post(self, url: str, payload) -> None:
        if not self._allowed():
            return
        data = json.dumps(payload, default=str).encode()
        delay = 1.0
        for attempt in range(self.config.retries + 1):
            status, detail = self._once(url, data)
            if 200 <= status < 300:
                self.posted += 1
                return
            permanent = 400 <= status < 500 and status not in (408, 429)
            if permanent or attempt == self.config.retries or self._stop.is_set():
                self.failed += 1
                log.warning("alert not delivered", receiver=self.name, status=status or None, error=detail,
                            attempts=attempt + 1)
                return
            self._sleep(delay)
            delay *= 2

    def _once(self, url: str, data: bytes) -> tuple[int, str]:
        u = urllib.parse.urlsplit(url)
        cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
        conn = cls(u.hostname, u.port, timeout=self.config.timeout_s)
        try:
            conn.request("POST", (u.path or "/") + (f"?{u.query}" if u.query else ""), body=data,
                         headers={"Content-Type": "application/json", "User-Agent": "gpuscope-alerts"})
            resp = conn.getresponse()
            text = resp.read(500).decode("utf-8", "replace")
            return resp.status, f"HTTP {resp.status}: {text[:200]}"
        except (OSError, http.client.HTTPException) as exc:
            return 0, f"{type(exc).__name__}: {exc}"
        finally:
            conn.close()
