"""Alert hooks: findings and anomalies at or above a severity, posted to
webhooks as they happen — Alertmanager's API (`POST /api/v2/alerts`) and a
generic JSON POST — held and retried while a receiver is away, with a rate
limit per receiver.

A sink of the analyzer's event bus (analyzers/events.py), with a thread and
a queue per receiver: a slow or dead receiver delays and loses only its own
alerts, never another receiver's, ingest or analysis.

Severity, in Alertmanager's words:
- critical: a GPU lost, an XID error, uncorrected ECC errors;
- warning: a finding that holds the GPU back (memory-, launch-, host- or
  communication-bound), an activity drop, a rise of host starvation,
  throttling, a serving engine's latency, queue, KV-cache or preemption
  anomaly;
- info: compute-bound (the GPU doing its job) and idle findings, a change
  of bottleneck (the finding that follows says what it is).

A finding alerts only once it has lasted `alert_after_s` (2 minutes): the
verdicts follow windows of seconds, and an on-call wants the bottleneck
that stays, not every 5-20 s episode. One that ends sooner is never sent.

Alertmanager tells alerts apart by their labels and keeps the newest
annotations, so the labels are the identity (alertname, severity, host, GPU,
verdict or anomaly) and the rest (finding id, job, confidence, summary) are
annotations: the episodes of one bottleneck on one GPU are one alert that
fires and resolves, not an alert each. Alertmanager keeps a firing alert
only while it is sent again; as Prometheus does, an open finding is resent
every `resend_s` with `endsAt` four resends ahead, and its close sends
`endsAt` = the finding's end. An anomaly is a point in time: it fires once
and ends `ANOMALY_TTL_S` later.

A receiver that does not answer (no connection, HTTP 5xx, 408, 429) keeps
its alerts: they are tried again 1, 2, 4 ... 60 s apart for `retry_for_s`
(10 minutes), the queue bounded (the oldest dropped and counted), and
delivered when it answers again — to Alertmanager with every alert still
firing. Counters per receiver (sent, retried, dropped by reason) are in
`Alerter.counters()`.

What leaves the host: host, GPU, verdict, the job as its process and
executable (never its command line: arguments hold secrets), whose the job
is as far as routing needs (its Kubernetes namespace and pod, its Slurm
job: labels a team's route can match), the summary, ids and times. A
receiver's URL is logged without its credentials (security/redact.py).
"""
from __future__ import annotations

import http.client
import json
import queue
import threading
import time
import urllib.parse
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable

import structlog

from gpuscope.security.redact import command_label, redact_url

from .events import Watch

log = structlog.get_logger("gpuscope.alerts")

SEVERITIES = ("info", "warning", "critical")
CRITICAL_KINDS = frozenset({"gpu_lost", "xid", "ecc_uncorrected"})
INFO_KINDS = frozenset({"bottleneck-changed"})
# The GPU doing its job (compute-bound) or nothing at all (idle) is worth a record, never a page.
INFO_VERDICTS = frozenset({"compute-bound", "idle"})
ANOMALY_TTL_S = 300.0
ALERTMANAGER, JSON = "alertmanager", "json"
ALERTMANAGER_PATH = "/api/v2/alerts"
DROP_REASONS = ("rate-limit", "queue-full", "expired", "refused", "shutdown")


@dataclass(frozen=True)
class Receiver:
    url: str
    format: str = JSON                     # alertmanager: `url` is Alertmanager's base URL

    @property
    def endpoint(self) -> str:
        """Where alerts are posted."""
        return self.url + ALERTMANAGER_PATH if self.format == ALERTMANAGER else self.url

    @property
    def shown(self) -> str:
        """The endpoint as logs and metrics show it: no credentials."""
        return redact_url(self.endpoint)


@dataclass(frozen=True)
class AlertConfig:
    receivers: tuple[Receiver, ...] = ()
    min_severity: str = "warning"
    per_minute: int = 60                   # new alerts per receiver per minute; more are dropped and counted
    alert_after_s: float = 120.0           # a finding alerts once it has lasted this long
    timeout_s: float = 5.0
    resend_s: float = 60.0                 # firing findings again, for Alertmanager
    retry_for_s: float = 600.0             # an alert not delivered by then is dropped and counted
    backoff_s: float = 1.0                 # the first retry's wait, doubled each failure ...
    backoff_max_s: float = 60.0            # ... up to this
    queue_size: int = 10_000               # alerts waiting per receiver


def parse_receiver(text: str, fmt: str) -> Receiver:
    """A receiver from the command line; ValueError naming what is wrong.
    Alertmanager's may be its base URL or its alerts endpoint."""
    text = text.strip()
    u = urllib.parse.urlsplit(text)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"{text!r}: expected an http:// or https:// URL")
    try:
        u.port
    except ValueError:
        raise ValueError(f"{text!r}: the port is not a number from 1 to 65535") from None
    if fmt != ALERTMANAGER:
        return Receiver(text, fmt)
    path = u.path.rstrip("/")
    if path.endswith(("/api/v1/alerts", "/api/v1")):
        raise ValueError(f"{text!r}: Alertmanager's API v1 was removed in 0.27; give its base URL "
                         f"(http://alertmanager:9093) or its v2 endpoint ({ALERTMANAGER_PATH})")
    path = path.removesuffix(ALERTMANAGER_PATH)
    return Receiver(urllib.parse.urlunsplit((u.scheme, u.netloc, path, u.query, "")), fmt)


def severity(e: dict) -> str | None:
    """An event's severity, or None when it never alerts (decisions,
    captures)."""
    if e["kind"] == "finding":
        return "info" if e["record"].get("verdict") in INFO_VERDICTS else "warning"
    if e["kind"] == "anomaly":
        kinds = set(e["record"].get("kinds") or [e["record"].get("kind")])
        if kinds & CRITICAL_KINDS:
            return "critical"
        return "info" if kinds <= INFO_KINDS else "warning"
    return None


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# a finding's alert by its kind: a route for hardware (degraded) is not one for jobs' bottlenecks
ALERT_NAMES = {"bottleneck": "GPUBottleneck", "degraded": "GPUDegraded", "regression": "GPURegression",
               "straggler": "GPUStraggler"}
# a finding's attribution labels an alert carries (empty ones are left out)
ROUTING_LABELS = ("namespace", "pod", "slurm_job")


@dataclass
class _Alert:
    """One alert as the receivers get it; `firing` until it ends."""
    key: str                                      # finding/<id> or anomaly/<id>
    severity: str
    labels: dict                                  # Alertmanager's identity of the alert
    annotations: dict                             # its details
    starts: float
    ends: float | None
    lasted: float                                 # seconds, as of the event
    body: dict = field(default_factory=dict)      # the generic JSON

    @property
    def is_finding(self) -> bool:
        return self.key.startswith("finding/")


def alert_of(e: dict, sev: str) -> _Alert:
    r = e["record"]
    job = command_label(r.get("job") or "") if r.get("job") else ""
    where = dict(host=e["host"], gpu=str(e["gpu"]))
    if e["kind"] == "finding":
        # whose the job is, as far as routing needs: labels a team's route can match
        owner = {k: v for k, v in ((k, (r.get("attribution") or {}).get(k, "")) for k in ROUTING_LABELS) if v}
        ends = r.get("end")
        summary = f"{e['host']}/gpu{e['gpu']} {r['verdict']}: {r.get('summary') or ''}"
        annotations = dict(summary=summary, finding_id=r["id"], job=job, report=f"gpuscope report {r['id']}",
                           confidence="" if r.get("confidence") is None else f"{r['confidence']:.2f}",
                           flags=",".join(r.get("flags") or []))
        body = dict(kind="finding", state="resolved" if ends else "firing", severity=sev, host=e["host"],
                    gpu=e["gpu"], verdict=r["verdict"], job=job, finding_id=r["id"], start=r["start"], end=ends,
                    confidence=r.get("confidence"), flags=r.get("flags") or [], summary=summary, **owner)
        lasted = (ends if ends is not None else e.get("t", r["start"])) - r["start"]
        name = ALERT_NAMES.get(r.get("kind") or "bottleneck", "GPUBottleneck")
        return _Alert(f"finding/{r['id']}", sev, dict(alertname=name, severity=sev, **where,
                                                      verdict=r["verdict"], **owner),
                      annotations, r["start"], ends, lasted, body)
    kinds = r.get("kinds") or [r.get("kind")]
    summary = f"{e['host']}/gpu{e['gpu']} {', '.join(kinds)}: {r.get('reason') or ''}"
    annotations = dict(summary=summary, anomaly_id=r["id"], anomalies=",".join(kinds), job=job,
                       finding_id=r.get("finding_id") or "")
    body = dict(kind="anomaly", state="firing", severity=sev, host=e["host"], gpu=e["gpu"], anomalies=kinds, job=job,
                anomaly_id=r["id"], finding_id=r.get("finding_id"), t=r["t"], summary=summary)
    return _Alert(f"anomaly/{r['id']}", sev, dict(alertname="GPUAnomaly", severity=sev, **where, anomaly=kinds[0]),
                  annotations, r["t"], r["t"] + ANOMALY_TTL_S, 0.0, body)


class Alerter:
    """Posts alerts to each receiver from a thread and a queue of its own: a
    slow or dead receiver delays and loses only its own alerts. `watch()`
    is what the analyzer's event bus delivers to."""

    def __init__(self, config: AlertConfig, clock: Callable[[], float] = time.time):
        if config.min_severity not in SEVERITIES:
            raise ValueError(f"severity {config.min_severity!r}, expected one of {', '.join(SEVERITIES)}")
        self.config = config
        self.receivers = [_Worker(r, i, config, clock) for i, r in enumerate(config.receivers)]

    @property
    def sent(self) -> int:
        return sum(w.sent for w in self.receivers)

    @property
    def retried(self) -> int:
        return sum(w.retried for w in self.receivers)

    @property
    def dropped(self) -> int:
        return sum(sum(w.dropped.values()) for w in self.receivers)

    def counters(self) -> list[dict]:
        """Per receiver: where (no credentials), sent, retried, dropped by
        reason, waiting to be sent, firing."""
        return [dict(receiver=w.receiver.shown, format=w.receiver.format, sent=w.sent, retried=w.retried,
                     dropped=dict(w.dropped), pending=w.pending, firing=len(w.firing)) for w in self.receivers]

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
        """Tries once more what is waiting, within `timeout_s` in all, and
        stops; what is left then is counted and said, per receiver."""
        for w in self.receivers:
            w.stopping.set()
            w.offer(None)
        deadline = time.monotonic() + timeout_s
        for w in self.receivers:
            if w.thread.ident is not None:         # started
                w.thread.join(max(0.0, deadline - time.monotonic()))


class _Worker:
    """One receiver: its queue, its thread, the findings it holds until they
    last and those firing (resent to Alertmanager), what waits to be
    delivered, its backoff and its rate limit."""

    def __init__(self, receiver: Receiver, index: int, config: AlertConfig, clock):
        self.receiver, self.config, self._clock = receiver, config, clock
        self.name = f"{receiver.shown} (receiver {index + 1}, {receiver.format})"
        self.q: queue.Queue = queue.Queue(config.queue_size)        # from the event bus, never blocking it
        self.held: dict[str, tuple[_Alert, float]] = {}              # open findings not yet lasted, when due
        self.firing: dict[str, _Alert] = {}                          # open findings sent
        # waiting to be delivered, oldest first, with the time each was queued. Alertmanager wants each
        # alert's newest state only; a generic receiver gets firing and resolved both.
        self.outbox: OrderedDict[tuple, tuple[_Alert, float]] = OrderedDict()
        self._accepted: list[float] = []                             # times of new alerts, for the rate limit
        self.sent = self.retried = 0
        self.dropped = {reason: 0 for reason in DROP_REASONS}
        self._count_lock = threading.Lock()
        self.failures = 0                                            # consecutive failed posts
        self._next_try = 0.0
        self._down_since: float | None = None
        self._resend_due = False
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="alerts", daemon=True)

    @property
    def pending(self) -> int:
        return len(self.outbox) + self.q.qsize()

    def offer(self, alert) -> bool:
        try:
            self.q.put_nowait(alert)
            return True
        except queue.Full:
            if alert is not None:
                self._drop("queue-full", 1)
            return False

    # -- the thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        next_resend = self._clock() + self.config.resend_s
        while not self.stopping.is_set():
            now = self._clock()
            wake = min([next_resend, *(due for _, due in self.held.values())]
                       + ([self._next_try] if self.outbox or self._resend_due else []))
            try:
                first = self.q.get(timeout=min(1.0, max(0.05, wake - now)))
            except queue.Empty:
                first = False
            try:
                for a in self._with_the_rest(first):
                    self._take(a)
                now = self._clock()
                self._fire_what_lasted(now)
                if now >= next_resend:
                    next_resend = now + self.config.resend_s
                    self._resend_due = bool(self.firing) and self.receiver.format == ALERTMANAGER
                self._deliver(now)
            except Exception:  # the thread must survive any receiver and any alert
                log.exception("alert not sent", receiver=self.name)
        self._last_try()

    def _with_the_rest(self, first) -> list[_Alert]:
        """The alert just taken and whatever else waits (one post to Alertmanager carries them all)."""
        out = [first] if first else []
        while len(out) < 1000:
            try:
                a = self.q.get_nowait()
            except queue.Empty:
                break
            if a is None:
                break
            out.append(a)
        return out

    def _take(self, a: _Alert) -> None:
        now = self._clock()
        if not a.is_finding:
            self._queue(a, now, new=True)
        elif a.ends is None:
            if a.lasted >= self.config.alert_after_s:
                self.firing[a.key] = a
                self._queue(a, now, new=True)
            else:
                self.held[a.key] = (a, now + self.config.alert_after_s - a.lasted)
        else:
            was_firing = self.firing.pop(a.key, None) is not None
            self.held.pop(a.key, None)
            # A finding that lasted long enough but ended before its wait was over in this process's
            # time (a replay faster than real time) is still told, once, resolved.
            if was_firing or a.lasted >= self.config.alert_after_s:
                self._queue(a, now, new=not was_firing)

    def _fire_what_lasted(self, now: float) -> None:
        for key, (a, due) in list(self.held.items()):
            if due <= now:
                del self.held[key]
                self.firing[key] = a
                self._queue(a, now, new=True)

    def _queue(self, a: _Alert, now: float, new: bool) -> None:
        """Into the outbox; a new alert (not a resolve of one sent) counts against the rate limit."""
        if new and not self._within_rate(now):
            return
        key = (a.key,) if self.receiver.format == ALERTMANAGER else (a.key, a.ends is None)
        self.outbox.pop(key, None)
        self.outbox[key] = (a, now)
        while len(self.outbox) > self.config.queue_size:
            self.outbox.popitem(last=False)
            self._drop("queue-full", 1)

    def _within_rate(self, now: float) -> bool:
        self._accepted = [t for t in self._accepted if now - t < 60]
        if len(self._accepted) >= self.config.per_minute:
            self._drop("rate-limit", 1)
            return False
        self._accepted.append(now)
        return True

    def _drop(self, reason: str, n: int) -> None:
        with self._count_lock:                     # the event bus's thread counts a full queue, this one the rest
            before = self.dropped[reason]
            self.dropped[reason] += n
        if before == 0 or before // 100 != self.dropped[reason] // 100:     # the first, then each hundredth
            log.warning("alerts dropped", receiver=self.name, reason=reason, dropped=self.dropped[reason],
                        per_minute=self.config.per_minute if reason == "rate-limit" else None)

    # -- delivery -----------------------------------------------------------------------------
    def _deliver(self, now: float) -> None:
        if now < self._next_try or not (self.outbox or self._resend_due):
            return
        self._expire(now)
        if self.receiver.format == ALERTMANAGER:
            self._to_alertmanager(now)
        else:
            while self.outbox:                     # in order, one a post, until one fails
                key, (a, _) = next(iter(self.outbox.items()))
                if not self._post([key], a.body, now):
                    return

    def _to_alertmanager(self, now: float) -> None:
        keys = list(self.outbox)[:1000]
        alerts = [self.outbox[k][0] for k in keys]
        # a resend, or the receiver back after failures: every alert still firing (Alertmanager drops what
        # it is not told again; after an outage it may have lost them all)
        if self._resend_due or self.failures:
            queued = {a.key for a in alerts}
            alerts += [a for k, a in self.firing.items() if k not in queued]
        if not alerts or self._post(keys, [self._alertmanager(a, now) for a in alerts], now):
            self._resend_due = False

    def _alertmanager(self, a: _Alert, now: float) -> dict:
        ends = a.ends if a.ends is not None else now + 4 * self.config.resend_s
        return dict(labels=a.labels, annotations={k: str(v)[:1000] for k, v in a.annotations.items() if v != ""},
                    startsAt=_rfc3339(a.starts), endsAt=_rfc3339(ends))

    def _post(self, keys: list, payload, now: float) -> bool:
        """One try; True when delivered. A refusal (HTTP 4xx but 408 and 429)
        drops what it carried; any other failure keeps it for a retry."""
        status, detail = self._once(self.receiver.endpoint, json.dumps(payload, default=str).encode())
        if 200 <= status < 300:
            for k in keys:
                self.outbox.pop(k, None)
            self.sent += len(keys)
            if self.failures:
                log.info("alert receiver answers again", receiver=self.name, failed_tries=self.failures,
                         down_s=round(now - (self._down_since or now)), delivered=len(keys))
            self.failures, self._next_try, self._down_since = 0, 0.0, None
            return True
        if 400 <= status < 500 and status not in (408, 429):
            for k in keys:
                self.outbox.pop(k, None)
            self._drop("refused", len(keys))
            log.warning("alert refused by its receiver", receiver=self.name, error=detail, alerts=len(keys))
            return False
        self.failures += 1
        self.retried += 1
        wait = min(self.config.backoff_max_s, self.config.backoff_s * 2 ** (self.failures - 1))
        self._next_try = now + wait
        if self._down_since is None:
            self._down_since = now
            log.warning("alert receiver not answering; its alerts are kept and tried again", receiver=self.name,
                        error=detail, waiting=len(self.outbox), retry_for_s=self.config.retry_for_s)
        return False

    def _expire(self, now: float) -> None:
        old = [k for k, (_, queued) in self.outbox.items() if now - queued > self.config.retry_for_s]
        for k in old:
            del self.outbox[k]
        if old:
            self._drop("expired", len(old))

    def _last_try(self) -> None:
        """At shutdown: what waits gets one more try, backoff or not; what is left is said."""
        for a in self._with_the_rest(False):
            self._take(a)
        now = self._clock()
        self._next_try = 0.0
        try:
            self._deliver(now)
        except Exception:  # shutting down: say it, never raise from the thread
            log.exception("alerts not sent at shutdown", receiver=self.name)
        if self.outbox:
            self._drop("shutdown", len(self.outbox))
            self.outbox.clear()

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
