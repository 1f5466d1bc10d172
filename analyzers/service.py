"""gRPC servicer of the analyzer: translates protos to Analyzer calls, no logic."""
from __future__ import annotations

import importlib.metadata
import json
import queue
import threading
import time

import grpc

from gpuscope.collectors import catalogue as cat
from gpuscope.v1 import REJECTED_SEQ_KEY, analyzer_pb2 as apb, analyzer_pb2_grpc, samples_pb2 as pb

from .analyzer import Analyzer
from .events import Watch
from .report import build_report
from .ingest import BatchError
from .store import AGGREGATES
from .writer import COMMITTED


try:
    VERSION = importlib.metadata.version("gpuscope")
except importlib.metadata.PackageNotFoundError:   # running from a source tree
    VERSION = "unknown"
_ACK = {COMMITTED: pb.BatchAck.COMMITTED}


def capture_summary_pb(row: dict) -> apb.CaptureSummary:
    rec = pb.CaptureRecord(id=row["id"], host=row["host"] or "", target=row["target"] or "",
                           gpus=json.loads(row["gpus"] or "[]"), job=row["job"] or "", start=row["start"] or 0,
                           end=row["end"] or 0, duration_ms=row["duration_ms"] or 0, path=row["path"] or "",
                           size_bytes=row["size_bytes"] or 0, status=row["status"] or "", error=row["error"] or "",
                           trigger=row["trigger"] or "", kind=row.get("kind") or "")
    if row.get("pid") is not None:
        rec.pid = row["pid"]
    return apb.CaptureSummary(record=rec, verdict=row["verdict"] or "", confidence=row["confidence"] or 0.0,
                              summary_json=row["summary"] or "", finding_id=row["finding_id"] or "")


def finding_pb(f: dict) -> apb.Finding:
    ev = f["evidence"] or {}
    m = apb.Finding(id=f["id"], host=f["host"], gpu=f["gpu"], job=f["job"] or "", verdict=f["verdict"],
                    start=f["start"], confidence=f["confidence"], windows=f["windows"],
                    evidence=apb.Evidence(numbers={k: float(v) for k, v in ev.items()},
                                          flags=f["flags"] or [], summary=f["summary"] or "",
                                          alternatives=f["alternatives"] or [],
                                          decided_by=f["decided_by"] or "",
                                          counters_verdict=f.get("counters_verdict") or f["verdict"],
                                          trace_verdict=f.get("trace_verdict") or "",
                                          captures=f.get("captures") or []))
    if f["end"] is not None:
        m.end = f["end"]
    return m


class AnalyzerServicer(analyzer_pb2_grpc.AnalyzerServicer):
    def __init__(self, analyzer: Analyzer, commit_timeout_s: float = 60.0):
        self.analyzer = analyzer
        self._timeout = commit_timeout_s

    def _ack(self, seq: int, fut) -> pb.BatchAck:
        return pb.BatchAck(seq=seq, status=_ACK.get(fut.result(timeout=self._timeout), pb.BatchAck.DUPLICATE))

    def Push(self, request, context):
        try:
            fut = self.analyzer.submit(request)
        except BatchError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"batch seq={request.seq}: {exc}")
        try:
            return self._ack(request.seq, fut)
        except Exception as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"commit failed, resend later: {exc}")

    def Ingest(self, request_iterator, context):
        # Decode on a reader thread so a stream keeps several batches in flight;
        # acks go back in order as each group commits.
        pending: queue.SimpleQueue = queue.SimpleQueue()

        def read() -> None:
            try:
                for req in request_iterator:
                    try:
                        pending.put((req.seq, self.analyzer.submit(req), None))
                    except BatchError as exc:
                        pending.put((req.seq, None, str(exc)))
                        return
            except Exception:  # the client went away; the response side ends the call
                pass
            finally:
                pending.put(None)

        threading.Thread(target=read, name="ingest-reader", daemon=True).start()
        while True:
            item = pending.get()
            if item is None:
                return
            seq, fut, error = item
            if error is not None:
                context.set_trailing_metadata(((REJECTED_SEQ_KEY, str(seq)),))
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"batch seq={seq}: {error}")
            try:
                yield self._ack(seq, fut)
            except Exception as exc:
                context.abort(grpc.StatusCode.UNAVAILABLE, f"commit failed, resend later: {exc}")

    def GetStatus(self, request, context):
        s = self.analyzer.status()
        out = apb.AnalyzerStatus(version=VERSION, started=s["started"], batches_committed=s["batches_committed"],
                                 batches_duplicate=s["batches_duplicate"], batches_rejected=s["batches_rejected"],
                                 samples_committed=s["samples_committed"], hosts=s["hosts"],
                                 findings_open=s["findings_open"], db_path=s["db_path"],
                                 window_seconds=s["window_seconds"], anomalies=s["anomalies"],
                                 decisions=s["decisions"], captures_in_flight=s["captures_in_flight"],
                                 agents_connected=s["agents_connected"])
        for g in s["gpus"]:
            m = out.gpus.add(host=g["host"], gpu=g["gpu"], name=g["name"] or "", verdict=g["verdict"],
                             confidence=g["confidence"], last_sample=g["last_sample"], flags=g["flags"],
                             lost=g["lost"])
            if g["open_finding"]:
                m.open_finding = g["open_finding"]
        return out

    def ListFindings(self, request, context):
        rows = self.analyzer.store.findings(
            host=request.host, gpu=request.gpu if request.HasField("gpu") else None,
            verdicts=list(request.verdicts),
            start=request.start if request.HasField("start") else None,
            end=request.end if request.HasField("end") else None,
            open_only=request.open_only, limit=request.limit or 1000)
        return apb.FindingsResponse(findings=[finding_pb(r) for r in rows])

    def QueryMetric(self, request, context):
        metric = cat.BY_NAME.get(request.metric)
        if metric is None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"metric: unknown {request.metric!r}; `gpuscope metrics` lists them")
        agg = request.aggregate or "series"
        if agg != "series" and agg not in AGGREGATES:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"aggregate: {agg!r}, expected series or one of {', '.join(AGGREGATES)}")
        end = request.end or time.time()
        start = request.start or end - 3600
        if start > end:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "start: after end")
        step = request.step_seconds or max(1.0, (end - start) / 300)
        rows = self.analyzer.store.metric(metric.name, request.host,
                                          request.gpu if request.HasField("gpu") else None,
                                          start, end, agg, step)
        out = apb.MetricResult(metric=metric.name, unit=metric.unit, aggregate=agg)
        series: dict[tuple[str, int], apb.MetricSeries] = {}
        for r in rows:
            key = (r["host"], r["gpu"])
            s = series.get(key)
            if s is None:
                s = series[key] = out.series.add(host=r["host"], gpu=r["gpu"])
            s.samples += int(r["n"])
            if agg == "series":
                s.points.add(t=r["bucket"], value=r["value"])
            elif r["value"] is not None:
                s.value = float(r["value"])
        return out


    def ReportCapture(self, request, context):
        if not request.record.id or not request.record.host:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "record.id and record.host: required")
        return capture_summary_pb(self.analyzer.report_capture(request.record, request.xspace))

    def ListCaptures(self, request, context):
        rows = self.analyzer.store.captures(request.host, request.limit or 100)
        return apb.CapturesResponse(captures=[capture_summary_pb(r) for r in rows])

    def Commands(self, request, context):
        if not request.host:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "host: empty")
        q = self.analyzer.commands.subscribe(request.host)
        try:
            while context.is_active():
                try:
                    yield q.get(timeout=0.5)
                except queue.Empty:
                    continue
        finally:
            self.analyzer.commands.unsubscribe(request.host, q)

    def Watch(self, request, context):
        w = Watch(host=request.host, gpu=request.gpu if request.HasField("gpu") else None,
                  verdicts=frozenset(request.verdicts), kinds=frozenset(request.kinds))
        wid = self.analyzer.events.subscribe(w)
        try:
            while context.is_active():
                try:
                    e = w.q.get(timeout=0.5)
                except queue.Empty:
                    continue
                yield apb.Event(kind=e["kind"], t=e["t"] or 0.0, host=e["host"], gpu=e["gpu"] or 0,
                                verdict=e.get("verdict") or "", json=json.dumps(e["record"], default=str))
        finally:
            self.analyzer.events.unsubscribe(wid)

    def ListRecords(self, request, context):
        try:
            rows = self.analyzer.store.records(request.table, request.host, request.since, request.limit or 200)
        except KeyError:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"table: {request.table!r}, expected anomalies or decisions")
        return apb.RecordsResponse(json=[json.dumps(r, default=str) for r in rows])

    def Report(self, request, context):
        report = build_report(self.analyzer.store, request.finding_id, request.context_seconds)
        if report is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"finding_id: no finding {request.finding_id!r}")
        return apb.ReportResponse(json=json.dumps(report, default=str))
