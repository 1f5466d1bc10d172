"""On-call queries over gRPC: status, findings, query. Plain functions that
return JSON-ready dicts; the CLI prints them. Each takes `security`, what the
client presents (security.tls.ClientSecurity; the CLI builds it from its
flags in security_flags); without it a call is plain text."""
from __future__ import annotations

import json
import re
import socket
import threading
import time

import grpc
import structlog
from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor

from gpuscope.collectors import catalogue as cat
from gpuscope.collectors.records import ATTRIBUTION_FIELDS
from gpuscope.collectors.serving_profiler import expected_seconds
from gpuscope.security.tls import INSECURE, ClientSecurity, broke_mid_call, closed_in_handshake, explain_failure
from gpuscope.v1 import agent_pb2, agent_pb2_grpc, analyzer_pb2 as apb, analyzer_pb2_grpc

from .serve import MAX_MESSAGE_BYTES   # capture replies carry the XSpace

log = structlog.get_logger("gpuscope.clients")


class ClientError(RuntimeError):
    pass


class ConnectionLost(ClientError):
    """A stream that was open broke: the server stopped or restarted (not a
    refusal: it answered on this connection before)."""


_OPTIONS = (("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES))


# What runs the server a client asked for, for "is it running?"
_SERVED_BY = {"analyzer": "`gpuscope analyzer` or `gpuscope up`", "agent": "`gpuscope agent` or `gpuscope up`"}


def _client_error(exc: grpc.RpcError, server: str, security: ClientSecurity, wants: str = "analyzer",
                  timeout: float | None = None) -> ClientError:
    """One line that says what went wrong and what to do: the server is not
    there or went away, it did not answer in time, or it refused this
    client's TLS or role. `timeout`: the call's deadline, in seconds."""
    code, reason = exc.code(), _reason(exc.details() or "")
    running = f"is {_SERVED_BY[wants]} running there?"
    if broke_mid_call(exc):
        return ClientError(f"lost the connection to {server} in the middle of the call ({reason}): the {wants} "
                           f"there stopped or restarted; {running}")
    if closed_in_handshake(exc) and _refuses_connections(server):
        return ClientError(f"cannot reach {server}: it {'reset' if 'reset' in reason else 'closed'} the connection "
                           f"and now refuses new ones ({reason}); {running}")
    explained = explain_failure(exc, server, security)
    if explained:
        return ClientError(explained)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        within = f"within {timeout:g} s" if timeout else "in time"
        return ClientError(f"the {wants} at {server} did not answer {within}: it is overloaded, or its process is "
                           "stopped (kill -STOP, a debugger, a host out of memory); try again, or look at that "
                           "process")
    if code == grpc.StatusCode.UNIMPLEMENTED:
        wrong = _wrong_service(server, security, wants)
        if wrong:
            return ClientError(wrong)
    if code == grpc.StatusCode.UNAVAILABLE and ("retry shortly" in reason or "resend later" in reason):
        return ClientError(f"{server}: {reason}")      # it answered: busy or restarting, not unreachable
    if code == grpc.StatusCode.UNAVAILABLE:
        return ClientError(f"cannot reach {server}: {reason} ({running})")
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.OUT_OF_RANGE):
        return ClientError(exc.details() or code.name)    # the server's words are for people already
    return ClientError(f"{server}: {code.name}: {exc.details()}")


# gRPC's prefix to a failed connection's cause ("...; last error: UNKNOWN: ipv4:10.0.0.5:9403: "):
# the address is said already, and the cause is what a person acts on
_CONNECT_PREFIX = re.compile(r"^failed to connect to all addresses; last error: \w+: \S+: ")


def _reason(details: str) -> str:
    return _CONNECT_PREFIX.sub("", details)


def _refuses_connections(target: str, timeout_s: float = 2.0) -> bool:
    """True when a TCP connection to `target` (HOST:PORT, [V6]:PORT) is
    refused now: nothing listens there. Anything else, a connection made, a
    timeout, a name that does not resolve, a Unix socket, is False: not known
    to be gone."""
    host, _, port = target.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdecimal() or target.startswith(("unix:", "unix-abstract:")):
        return False
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    return False


def _wrong_service(server: str, security: ClientSecurity, wants: str) -> str | None:
    """When a call is not implemented there: what answers at `server`
    instead, and where to ask (an agent knows its analyzer)."""
    with security.channel(server, options=_OPTIONS) as ch:
        try:
            if wants == "analyzer":
                s = agent_pb2_grpc.AgentStub(ch).GetStatus(agent_pb2.AgentStatusRequest(), timeout=3)
                where = (f"at {s.analyzer}: pass --server {s.analyzer}" if s.analyzer else
                         "(this agent streams to none: it was started without --analyzer)")
                return (f"{server} is the agent of host {s.host or '?'}, not an analyzer: findings, queries, reports, "
                        f"anomalies and watch are answered by the analyzer {where}")
            analyzer_pb2_grpc.AnalyzerStub(ch).GetStatus(apb.StatusRequest(gpu_limit=1), timeout=3)
            return (f"{server} is an analyzer, not an agent: captures and jobs are asked of the agent on the job's "
                    f"host (--server HOST, port 9401; `gpuscope status` lists the hosts), or of `gpuscope up`")
        except grpc.RpcError:
            return None


def _call(server: str, fn, timeout: float = 10.0, security: ClientSecurity = INSECURE, wants: str = "analyzer"):
    with security.channel(server, options=_OPTIONS) as ch:
        try:
            return fn(ch, timeout)
        except grpc.RpcError as exc:
            raise _client_error(exc, server, security, wants, timeout) from None


def attribution_dict(a) -> dict:
    """An Attribution message as the labels it knows (none: {})."""
    return {k: v for k in ATTRIBUTION_FIELDS if (v := getattr(a, k))}


def finding_dict(f: apb.Finding) -> dict:
    return dict(id=f.id, host=f.host, gpu=f.gpu, job=f.job, attribution=attribution_dict(f.attribution),
                verdict=f.verdict, start=f.start,
                end=f.end if f.HasField("end") else None, confidence=round(f.confidence, 3),
                absorbed_until=f.absorbed_until if f.HasField("absorbed_until") else None,
                windows=f.windows, evidence=dict(sorted(f.evidence.numbers.items())),
                flags=list(f.evidence.flags), summary=f.evidence.summary,
                alternatives=list(f.evidence.alternatives), decided_by=f.evidence.decided_by,
                counters_verdict=f.evidence.counters_verdict or f.verdict, trace_verdict=f.evidence.trace_verdict or None,
                captures=list(f.evidence.captures), source=f.evidence.source or None, kind=f.kind or "bottleneck")


def _record_dict(r) -> dict:
    return dict(id=r.id, host=r.host, target=r.target, pid=r.pid if r.HasField("pid") else None, gpus=list(r.gpus),
                job=r.job, start=r.start, end=r.end, duration_ms=r.duration_ms, path=r.path, size_bytes=r.size_bytes,
                status=r.status, error=r.error, trigger=r.trigger, kind=r.kind)


def capture(server: str, jax: str | None, pid: int | None, duration_ms: int, *,
            security: ClientSecurity = INSECURE, timeout_s: float | None = None) -> tuple[dict, bytes]:
    req = agent_pb2.CaptureRequest(duration_ms=duration_ms, trigger="on-call")
    if jax:
        req.jax_address = jax
    else:
        req.pid = pid
    # longer than the agent may take (a serving engine's stop can take minutes): the agent
    # sizes its waits to this deadline and always answers, with the capture id, before it
    reply = _call(server, lambda ch, t: agent_pb2_grpc.AgentStub(ch).Capture(req, timeout=t),
                  timeout=timeout_s or expected_seconds(duration_ms) + 30, security=security, wants="agent")
    return _record_dict(reply.record), reply.xspace


def captures(server: str, *, security: ClientSecurity = INSECURE) -> list[dict]:
    def fn(ch, timeout):
        try:
            resp = analyzer_pb2_grpc.AnalyzerStub(ch).ListCaptures(apb.CapturesRequest(), timeout=timeout)
            return [dict(_record_dict(c.record), verdict=c.verdict or None, confidence=c.confidence,
                         finding_id=c.finding_id or None,
                         summary=(json.loads(c.summary_json).get("summary") if c.summary_json else None))
                    for c in resp.captures]
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
        resp = agent_pb2_grpc.AgentStub(ch).ListCaptures(agent_pb2.ListCapturesRequest(), timeout=timeout)
        return [_record_dict(r) for r in resp.captures]
    return _call(server, fn, security=security)


def jobs(server: str, *, security: ClientSecurity = INSECURE) -> list[dict]:
    resp = _call(server, lambda ch, t: agent_pb2_grpc.AgentStub(ch).ListJobs(agent_pb2.ListJobsRequest(), timeout=t),
                 timeout=30, security=security, wants="agent")
    return [dict(pid=j.pid or None, address=j.address, gpus=list(j.gpus), command=j.command, found_by=j.found_by,
                 kind=_JOB_KINDS.get(j.kind, j.kind or "jax"), trace_dir=j.trace_dir or None,
                 attribution=attribution_dict(j.attribution)) for j in resp.jobs]


_JOB_KINDS = {"torch-http": "serving"}



def watch(server: str, host: str = "", gpu: int | None = None, verdicts=(), kinds=(), *,
          security: ClientSecurity = INSECURE, on_open=None):
    """Yields events as the analyzer publishes them (until interrupted).
    `on_open()` runs once the stream is open, before the first event: what it
    reads of the current state misses no event that follows."""
    req = apb.WatchRequest(host=host, verdicts=list(verdicts), kinds=list(kinds))
    if gpu is not None:
        req.gpu = gpu
    answered = False         # the server has answered on this connection: a break later is not a refusal
    with security.channel(server) as ch:
        try:
            stream = analyzer_pb2_grpc.AnalyzerStub(ch).Watch(req)
            if on_open is not None:
                on_open()
                answered = True
            for e in stream:
                answered = True
                yield dict(kind=e.kind, t=e.t, host=e.host, gpu=e.gpu, verdict=e.verdict or None,
                           record=json.loads(e.json))
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.CANCELLED:
                return
            if answered and exc.code() == grpc.StatusCode.UNAVAILABLE or broke_mid_call(exc):
                raise ConnectionLost(f"lost the connection to {server} (the server stopped or restarted: "
                                     f"{exc.details()})") from None
            raise _client_error(exc, server, security) from None


def records(server: str, table: str, host: str = "", since: float = 0.0, limit: int = 200, *,
            security: ClientSecurity = INSECURE) -> list[dict]:
    req = apb.RecordsRequest(table=table, host=host, since=since, limit=limit)
    resp = _call(server, lambda ch, t: analyzer_pb2_grpc.AnalyzerStub(ch).ListRecords(req, timeout=t),
                 security=security)
    return [json.loads(j) for j in resp.json]


def report(server: str, finding_id: str, context_s: float = 0.0, *, security: ClientSecurity = INSECURE) -> dict:
    # ids are lowercase hex: `7E61AC` and a pasted `'7e61 '` mean the same finding
    req = apb.ReportRequest(finding_id=finding_id.strip().lower(), context_seconds=context_s)
    return json.loads(_call(server, lambda ch, t: analyzer_pb2_grpc.AnalyzerStub(ch).Report(req, timeout=t),
                            timeout=60, security=security).json)


def range_report(server: str, start: float | None = None, end: float | None = None, host: str = "",
                 gpu: int | None = None, max_points: int = 0, max_gpus: int = 0, *,
                 security: ClientSecurity = INSECURE) -> dict:
    """The picture of a time range (the analyzer's analyzers/report.py,
    build_range_report): unset start/end are the last hour."""
    req = _in_range(apb.RangeReportRequest(host=host, max_points=max_points, max_gpus=max_gpus), start, end)
    if gpu is not None:
        req.gpu = gpu
    return json.loads(_call(server, lambda ch, t: analyzer_pb2_grpc.AnalyzerStub(ch).RangeReport(req, timeout=t),
                            timeout=90, security=security).json)


# UploadCapture's chunks: at most 1 MiB of trace each (analyzer.proto), so that
# the analyzer never takes a large message
CAPTURE_CHUNK_BYTES = 1 << 20


# The analyzer busy with other traces, restarting, or slower than the deadline:
# worth sending again (a capture's id makes a resend of a stored one harmless)
_RESEND = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED,
                     grpc.StatusCode.DEADLINE_EXCEEDED})


def report_capture(analyzer: str, record, xspace: bytes, *, security: ClientSecurity = INSECURE,
                   attempts: int = 4, backoff_s: float = 5.0, stop: threading.Event | None = None) -> None:
    """Agent -> analyzer: the capture and its trace, to store and link
    (the agent presents its own certificate: security_flags.agent_security).
    Sent again after 5, 10 and 20 s while the analyzer answers with a
    transient error, e.g. while it receives other hosts' traces; once `stop`
    is set (the agent is shutting down) it is not sent again, and the last
    refusal is raised."""
    def send(ch, timeout):
        stub = analyzer_pb2_grpc.AnalyzerStub(ch)
        for attempt in range(attempts):
            try:
                return stub.UploadCapture(capture_chunks(record, xspace), timeout=timeout)
            except grpc.RpcError as exc:
                if attempt + 1 == attempts or exc.code() not in _RESEND or (stop is not None and stop.is_set()):
                    raise
                delay = backoff_s * 2 ** attempt
                log.info("capture report refused for now, sending it again", id=record.id,
                         code=exc.code().name, in_s=delay)
                if stop is None:
                    time.sleep(delay)
                elif stop.wait(delay):
                    raise
    _call(analyzer, send, timeout=60, security=security)


def capture_chunks(record, trace: bytes, size: int = CAPTURE_CHUNK_BYTES):
    """UploadCapture's messages: the record and the trace's size first."""
    view = memoryview(trace)
    yield apb.CaptureChunk(record=record, trace_bytes=len(trace), data=bytes(view[:size]))
    for start in range(size, len(trace), size):
        yield apb.CaptureChunk(data=bytes(view[start:start + size]))


def status(server: str, host: str = "", gpu_limit: int = 0, *, security: ClientSecurity = INSECURE) -> dict:
    def fn(ch, timeout):
        try:
            s = analyzer_pb2_grpc.AnalyzerStub(ch).GetStatus(apb.StatusRequest(host=host, gpu_limit=gpu_limit),
                                                             timeout=timeout)
            return dict(kind="analyzer", **message_dict(s))
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
        s = agent_pb2_grpc.AgentStub(ch).GetStatus(agent_pb2.AgentStatusRequest(), timeout=timeout)
        return dict(kind="agent", **message_dict(s))
    return _call(server, fn, security=security)


_INT64 = {FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
          FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64}


def message_dict(msg) -> dict:
    """A message as JSON-ready dict with proto field names; 64-bit integers
    stay numbers (protobuf's JSON mapping makes them strings, and a script
    reading `"samples_committed": "51"` beside numbers breaks)."""
    d = json_format.MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    _numbers(msg.DESCRIPTOR, d)
    return d


def _numbers(desc, d: dict) -> None:
    for f in desc.fields:
        v = d.get(f.name)
        if v is None:
            continue
        if f.type in _INT64:
            d[f.name] = [int(x) for x in v] if isinstance(v, list) else int(v)
        elif f.message_type is not None and f.message_type.GetOptions().map_entry:
            value = f.message_type.fields_by_name["value"]
            if value.type in _INT64:
                d[f.name] = {k: int(x) for k, x in v.items()}
            elif value.message_type is not None:
                for x in v.values():
                    _numbers(value.message_type, x)
        elif f.message_type is not None:
            for x in v if isinstance(v, list) else [v]:
                if isinstance(x, dict):
                    _numbers(f.message_type, x)


def _in_range(req, start: float | None, end: float | None):
    """Sets a request's optional start and end (unset: unbounded)."""
    if start is not None:
        req.start = start
    if end is not None:
        req.end = end
    return req


def accuracy(server: str, start: float | None = None, end: float | None = None, host: str = "", *,
             security: ClientSecurity = INSECURE) -> list[dict]:
    """Verdict pairs counted by (model, counters_verdict, trace_verdict)."""
    req = _in_range(apb.AccuracyRequest(host=host), start, end)
    resp = _call(server, lambda ch, t: analyzer_pb2_grpc.AnalyzerStub(ch).GetAccuracy(req, timeout=t),
                 security=security)
    return [dict(model=p.model, counters_verdict=p.counters_verdict, trace_verdict=p.trace_verdict,
                 pairs=p.pairs) for p in resp.pairs]


def degraded(server: str, start: float | None = None, end: float | None = None, *,
             security: ClientSecurity = INSECURE) -> list[dict]:
    """GPUs under their peers, one entry per (GPU, dimension), kind "degraded"
    (absent figures are None); then the groups too small to judge, one entry
    per (model, driver, dimension), kind "unjudged": model, driver,
    dimension, gpus (with a figure there), min_peers."""
    req = _in_range(apb.DegradedRequest(), start, end)
    resp = _call(server, lambda ch, t: analyzer_pb2_grpc.AnalyzerStub(ch).ListDegraded(req, timeout=t),
                 security=security)
    opt = lambda m, f: getattr(m, f) if m.HasField(f) else None  # noqa: E731
    link = ("pcie_generation", "pcie_width", "pcie_max_generation", "pcie_max_width")
    return [dict(kind="degraded", host=g.host, gpu=g.gpu, uuid=g.uuid, model=g.model, driver=g.driver,
                 dimension=g.dimension, value=opt(g, "value"), peer_median=opt(g, "peer_median"),
                 peers=opt(g, "peers"), shortfall=opt(g, "shortfall"), z=opt(g, "z"), unit=g.unit,
                 link={f: opt(g, f) for f in link} if any(g.HasField(f) for f in link) else None,
                 summary=g.summary) for g in resp.gpus] + [
        dict(kind="unjudged", model=u.model, driver=u.driver, dimension=u.dimension, gpus=u.gpus,
             min_peers=u.min_peers) for u in resp.unjudged]


def top(server: str, start: float | None = None, end: float | None = None, host: str = "", by: str = "gpu",
        limit: int = 20, *, security: ClientSecurity = INSECURE) -> dict:
    req = _in_range(apb.TopRequest(host=host, by=by, limit=limit), start, end)
    r = _call(server, lambda ch, t: analyzer_pb2_grpc.AnalyzerStub(ch).Top(req, timeout=t), security=security)
    return dict(start=r.start, end=r.end, by=r.by, rows=[dict(
        host=x.host, gpu=x.gpu, job=x.job, verdict=x.verdict, bottleneck_seconds=x.bottleneck_seconds,
        share=x.share, findings=x.findings, gpus=x.gpus, now_verdict=x.now_verdict or None,
        now_since=x.now_since or None, confidence=x.confidence, summary=x.summary, flags=list(x.flags),
        finding_id=x.finding_id, verdicts=[dict(verdict=v.verdict, seconds=v.seconds) for v in x.verdicts],
        stale=x.stale, last_seen_age_s=x.last_seen_age_seconds or None,
        attribution=attribution_dict(x.attribution), conditions=list(x.conditions)) for x in r.rows],
        conditions=[finding_dict(f) for f in r.conditions])


def findings(server: str, host: str = "", gpu: int | None = None, verdicts: list[str] | None = None,
             start: float | None = None, end: float | None = None, open_only: bool = False,
             limit: int = 1000, *, flags: list[str] | None = None, pod: str = "", namespace: str = "",
             slurm_job: str = "", kinds: list[str] | None = None,
             security: ClientSecurity = INSECURE) -> list[dict]:
    """pod: a pod's name or namespace/name; namespace, slurm_job: the job's;
    kinds: bottleneck, degraded, regression (none: all)."""
    req = apb.FindingsRequest(host=host, verdicts=verdicts or [], open_only=open_only, limit=limit,
                              flags=flags or [], pod=pod, namespace=namespace, slurm_job=slurm_job,
                              kinds=kinds or [])
    if gpu is not None:
        req.gpu = gpu
    _in_range(req, start, end)
    resp = _call(server, lambda ch, t: analyzer_pb2_grpc.AnalyzerStub(ch).ListFindings(req, timeout=t),
                 security=security)
    return [finding_dict(f) for f in resp.findings]


def query(server: str, metric: str, host: str, gpu: int | None, start: float, end: float,
          aggregate: str, step: float, *, raw: bool = False, group_by: str = "",
          security: ClientSecurity = INSECURE) -> dict:
    """group_by: "" (a series per GPU), job, pod or slurm-job (one per group, with its `group` and `gpus`)."""
    req = apb.MetricQuery(metric=metric, host=host, start=start, end=end, aggregate=aggregate, step_seconds=step,
                          raw=raw, group_by=group_by)
    if gpu is not None:
        req.gpu = gpu
    r = _call(server, lambda ch, t: analyzer_pb2_grpc.AnalyzerStub(ch).QueryMetric(req, timeout=t), timeout=60,
              security=security)
    return dict(metric=r.metric, unit=r.unit, aggregate=r.aggregate, rate=r.metric in cat.BY_NAME and r.unit != cat.BY_NAME[r.metric].unit, group_by=group_by or None, series=[
        dict(host=s.host, gpu=s.gpu, samples=s.samples, **({"group": s.group, "gpus": s.gpus} if group_by else {}),
             **({"points": [[p.t, p.value] for p in s.points]} if r.aggregate == "series"
                else {"value": s.value if s.HasField("value") else None}))
        for s in r.series])


def report_calibration(server: str, host: str, calibration: dict, *,
                       security: ClientSecurity = INSECURE) -> dict:
    """Sends one `gpuscope calibrate` result; {id, ceilings} as stored."""
    req = apb.CalibrationReport(host=host, calibration_json=json.dumps(calibration, default=str))
    ack = _call(server, lambda ch, t: analyzer_pb2_grpc.AnalyzerStub(ch).ReportCalibration(req, timeout=t),
                timeout=30, security=security)
    return dict(id=ack.id, ceilings=ack.ceilings)


def check_calibration_send(server: str, host: str, *, security: ClientSecurity = INSECURE,
                           timeout_s: float = 10.0) -> None:
    """Raises ClientError unless the analyzer at `server` answers and would
    take a calibration for `host` from this caller (a dry run: nothing stored)."""
    req = apb.CalibrationReport(host=host, dry_run=True)
    _call(server, lambda ch, t: analyzer_pb2_grpc.AnalyzerStub(ch).ReportCalibration(req, timeout=t),
          timeout=timeout_s, security=security)


def ceilings(server: str, host: str = "", model: str = "", uuid: str = "", history: bool = False, *,
             security: ClientSecurity = INSECURE) -> list[dict]:
    req = apb.CeilingsRequest(host=host, model=model, uuid=uuid, history=history)
    resp = _call(server, lambda ch, t: analyzer_pb2_grpc.AnalyzerStub(ch).ListCeilings(req, timeout=t),
                 security=security)
    return json.loads(resp.calibrations_json or "[]")


def programs(server: str, start: float | None = None, host: str = "", fingerprint: str = "", limit: int = 0, *,
             security: ClientSecurity = INSECURE) -> list[dict]:
    """Programs with their runs and baselines (analyzers/program_list.py)."""
    req = apb.ProgramsRequest(host=host, fingerprint=fingerprint, limit=limit)
    if start is not None:
        req.start = start
    resp = _call(server, lambda ch, t: analyzer_pb2_grpc.AnalyzerStub(ch).ListPrograms(req, timeout=t),
                 security=security)
    return json.loads(resp.programs_json or "[]")


def dist_jobs(server: str, start: float | None = None, job: str = "", limit: int = 0, *,
              security: ClientSecurity = INSECURE) -> list[dict]:
    """Distributed jobs with their ranks and stragglers (analyzers/job_list.py)."""
    req = apb.DistJobsRequest(job=job, limit=limit)
    if start is not None:
        req.start = start
    resp = _call(server, lambda ch, t: analyzer_pb2_grpc.AnalyzerStub(ch).ListDistJobs(req, timeout=t),
                 security=security)
    return json.loads(resp.jobs_json or "[]")


def capture_job(server: str, job: str, duration_ms: int = 0, lead_ms: int = 0, *,
                security: ClientSecurity = INSECURE) -> dict:
    """Asks every rank of `job` to trace one window: {group, start_at, ranks}."""
    req = apb.CaptureJobRequest(job=job, duration_ms=duration_ms, lead_ms=lead_ms)
    resp = _call(server, lambda ch, t: analyzer_pb2_grpc.AnalyzerStub(ch).CaptureJob(req, timeout=t),
                 security=security)
    return dict(group=resp.group, start_at=resp.start_at, ranks=json.loads(resp.ranks_json or "[]"))


def job_skew(server: str, group: str, *, security: ClientSecurity = INSECURE) -> dict:
    """A coordinated capture's ranks and collectives (analyzers/rank_skew.py)."""
    req = apb.JobSkewRequest(group=group)
    resp = _call(server, lambda ch, t: analyzer_pb2_grpc.AnalyzerStub(ch).JobSkew(req, timeout=t),
                 security=security)
    return json.loads(resp.json or "{}")
