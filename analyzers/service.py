"""gRPC servicer of the analyzer (grpc.aio): translates protos to Analyzer
calls. No thread per stream: ingest streams wait on the writer's byte
budget (backpressure), command and watch streams on their own queues, and
on-call queries run on a pool of their own so agents can never crowd them out."""
from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import functools
import importlib.metadata
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import duckdb
import grpc
import structlog
from google.protobuf.message import DecodeError

from gpuscope.collectors import catalogue as cat
from gpuscope.collectors.records import ATTRIBUTION_FIELDS, MAX_ATTRIBUTION_BYTES
from gpuscope.v1 import ACCEPTED_KEY, NOT_STORED, analyzer_pb2 as apb, analyzer_pb2_grpc, samples_pb2 as pb

from gpuscope.security.context import current_caller
from gpuscope.security.redact import command_label

from .analyzer import Analyzer
from .calibrations import CalibrationInvalid
from .degraded import find_degraded, unjudged_groups
from . import coordinated
from .report import LIMITS, MIN_PREFIX, AmbiguousId
from .events import Watch
from .batch_size import SCREEN_ABOVE_BYTES, check_size, screen
from .capture_upload import (MAX_OPEN_UPLOADS, MAX_OPEN_UPLOADS_PER_HOST, MAX_UPLOADS, UPLOAD_RECEIVE_S, UPLOAD_WAIT_S, TraceAssembly,
                             UploadError)
from .flow import HostRate, ReadGate
from .ingest import BatchError, validate_capture_record
from .throttle import Throttle
from .store import AGGREGATES, FINDING_GROUPS, FINDING_KINDS, PROCESS_GROUPS
from .writer import COMMITTED, BatchRejected, StoreUnavailable


try:
    VERSION = importlib.metadata.version("gpuscope")
except importlib.metadata.PackageNotFoundError:   # running from a source tree
    VERSION = "unknown"
DEFAULT_GPU_LIMIT = 1000      # GetStatus lists at most this many GPUs unless asked for more
_ACK = {COMMITTED: pb.BatchAck.COMMITTED}
# What a queued batch holds once decoded beyond its wire bytes (a NaN-marked
# matrix of its metrics, the processes' Arrow table, device protos): measured
# 10 KiB for an 8-GPU 1 s batch and 19 KiB for a 5 s one (tracemalloc plus
# Arrow's pool); the byte budget charges this with margin, so that 64 MiB of
# budget bounds what the queue really holds.
DECODED_BATCH_BYTES = 32 << 10
HELD_NOTE_S = 2.0           # a batch held by its host's rate tells the analyzer its host is alive this often
# Large messages read from agents' streams and waiting for the writer's budget, at most (flow.ReadGate);
# a stream whose last message was at most READ_FREE_BYTES reads its next without waiting. An agent's
# batch of a few seconds is ~40 KB at 8 GPUs; one catching up after an outage sends up to 8 MiB.
READ_GATE_BYTES = 64 << 20
READ_FREE_BYTES = 256 << 10
# Agents' batches reach the servicer as bytes (add_to_server), so that their
# size is known without ByteSize(), which serializes the message again (100 ms
# for 50 MB, on the event loop).
RAW_REQUESTS = frozenset({"Ingest", "Push"})
# Unary methods registered as client streams, so that the servicer decides
# whether to take the message before gRPC receives it (ReportCapture).
STREAMED_IN = frozenset({"ReportCapture"})
STREAM_QUEUE = 100          # commands or events waiting for one slow stream; more are dropped
log = structlog.get_logger("gpuscope.service")


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


def attribution_pb(labels: dict | None) -> pb.Attribution | None:
    """A finding's attribution (its known labels) on the wire; None: none known."""
    if not labels:
        return None
    return pb.Attribution(**{k: v for k, v in labels.items() if k in ATTRIBUTION_FIELDS and v})


def finding_pb(f: dict) -> apb.Finding:
    ev = f["evidence"] or {}
    m = apb.Finding(id=f["id"], host=f["host"], gpu=f["gpu"], job=f["job"] or "", verdict=f["verdict"],
                    start=f["start"], confidence=f["confidence"], windows=f["windows"],
                    kind=f.get("kind") or "bottleneck",
                    attribution=attribution_pb(f.get("attribution")),
                    evidence=apb.Evidence(numbers={k: float(v) for k, v in ev.items()},
                                          flags=f["flags"] or [], summary=f["summary"] or "",
                                          alternatives=f["alternatives"] or [],
                                          decided_by=f["decided_by"] or "",
                                          counters_verdict=f.get("counters_verdict") or f["verdict"],
                                          trace_verdict=f.get("trace_verdict") or "",
                                          captures=f.get("captures") or [], source=f.get("source") or ""))
    if f["end"] is not None:
        m.end = f["end"]
    if f.get("absorbed_until") is not None:
        m.absorbed_until = f["absorbed_until"]
    return m


def _findings_entry(f: apb.Finding) -> bytes:
    """One finding as an entry of FindingsResponse.findings (field 1) on the
    wire: a list's reply is then its entries joined and parsed once, 2 ms for
    1,000 findings against 19 ms to copy 1,000 messages into a reply."""
    body = f.SerializeToString()
    n, head = len(body), bytearray(b"\x0a")
    while n >= 0x80:
        head.append(n & 0x7F | 0x80)
        n >>= 7
    head.append(n)
    return bytes(head) + body


def _unavailable_as_status(handler):
    """An on-call query the store cannot answer now (the analysis process
    restarting, the store failing) ends UNAVAILABLE with the reason, which
    clients retry, instead of grpc's UNKNOWN."""
    @functools.wraps(handler)
    async def wrapped(self, request, context):
        try:
            return await handler(self, request, context)
        except StoreUnavailable as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"{exc}; retry shortly")
    return wrapped


class AnalyzerServicer(analyzer_pb2_grpc.AnalyzerServicer):
    def __init__(self, analyzer: Analyzer, commit_timeout_s: float = 60.0, oncall_threads: int = 4,
                 max_agent_streams: int = 10_000, host_rate: HostRate | None = None):
        self.analyzer = analyzer
        self.host_rate = host_rate
        self._rate_log = Throttle(10.0)
        self.max_agent_streams = max_agent_streams
        self.agent_streams = 0
        self._reading = ReadGate(READ_GATE_BYTES, READ_FREE_BYTES)
        self._timeout = commit_timeout_s
        self._oncall = ThreadPoolExecutor(max_workers=oncall_threads, thread_name_prefix="oncall")
        self._captures = ThreadPoolExecutor(max_workers=2, thread_name_prefix="capture-report")
        # Batches are validated and decoded here, not on the event loop: when
        # a commit group's acks free the byte budget, hundreds of waiting
        # streams are admitted at once, and decoding them in the loop's turn
        # (~0.4 ms each) kept it from on-call requests for up to 1.9 s.
        self._decoding = ThreadPoolExecutor(max_workers=1, thread_name_prefix="decode")
        # large batches' strings are measured on a thread of their own, so that the
        # other agents' batches are not decoded behind one client's padded batches
        self._screening = ThreadPoolExecutor(max_workers=1, thread_name_prefix="screen")
        self._uploads = asyncio.Semaphore(MAX_UPLOADS)
        self._uploads_open = 0
        self._host_uploads: collections.Counter[str] = collections.Counter()

    async def _query(self, fn, *args, pool=None):
        return await asyncio.get_running_loop().run_in_executor(pool or self._oncall, _in_context(fn), *args)

    # -- agents -----------------------------------------------------------------------
    async def _admit(self, data: bytes, context, method: str):
        """Parses and sizes one batch, waits for room in the writer's budget,
        validates and queues it. Returns (batch, future, error): error is a
        permanent refusal of the batch. Raises _Refused when the call itself
        is to end (garbage, another host's batch, a host too far over its rate)."""
        try:
            req = pb.SampleBatch.FromString(data)
        except DecodeError as exc:
            self.analyzer.count_rejected(None, str(exc))
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT,
                           f"/gpuscope.v1.Analyzer/{method}: the request is not a valid message ({exc})") from None
        denied = _other_host(req.host, "host")      # another host's batch is refused, not counted as ours
        if denied is not None:
            raise _Refused(*denied)
        error = await self._sized(req, len(data))
        if error is not None:
            return req, None, error
        charged = await self._host_share(req, len(data))
        n = len(data) + DECODED_BATCH_BYTES
        budget = self.analyzer.writer.budget
        acquired = False
        try:
            await budget.acquire(n)
            acquired = True
            decoded = await asyncio.get_running_loop().run_in_executor(
                self._decoding, _in_context(self.analyzer.check), req)    # counts and logs a refusal itself
            fut = asyncio.wrap_future(self.analyzer.submit_decoded(decoded))
        except BaseException as exc:   # refused, or the stream cancelled while it waited: nothing queued
            if acquired:
                budget.release(n)
            self._refund(req.host, charged)
            if isinstance(exc, BatchError):
                return req, None, str(exc)
            raise
        host = req.host

        def done(f) -> None:
            budget.release(n)
            # a batch of its host's share that was not written (a resend found stored, a failed commit) is given back
            if f.cancelled() or f.exception() is not None or f.result() != COMMITTED:
                self._refund(host, charged)
        # a batch whose stream ended before its ack never has its failure awaited: retrieved here
        fut.add_done_callback(done)
        return req, fut, None

    async def _sized(self, req: pb.SampleBatch, wire_bytes: int) -> str | None:
        """A refusal if the batch is larger than it may be (batch_size.py),
        before it takes byte budget, which the other agents would wait for:
        on the loop from its counts, then, for a large batch, from its
        strings on a thread of their own."""
        try:
            check_size(req, wire_bytes)
            if wire_bytes > SCREEN_ABOVE_BYTES:
                await asyncio.get_running_loop().run_in_executor(self._screening, screen, req, wire_bytes)
        except BatchError as exc:
            self.analyzer.count_rejected(req, str(exc))
            return str(exc)
        return None

    def flow_counts(self) -> dict[str, int]:
        """What the per-host rate did since start (for status and /metrics)."""
        rate = self.host_rate
        return dict(batches_held=rate.held if rate else 0, batches_over_rate=rate.refused if rate else 0)

    async def _host_share(self, req: pb.SampleBatch, wire_bytes: int) -> int:
        """Holds a batch back while its host is over its rate (flow.HostRate),
        before it takes byte budget; a host too deep in debt (sending on many
        streams at once) is refused as transient. Returns the bytes charged,
        which are given back if the batch is not stored after all (its
        caller gave up while held, or it was a resend already stored)."""
        if self.host_rate is None:
            return 0
        wait = self.host_rate.charge(req.host, wire_bytes)
        if wait == 0:
            return wire_bytes
        said = self._rate_log.hit(held=int(wait is not None), refused=int(wait is None))
        if said is not None:
            log.warning("hosts over their ingest rate: batches held back", latest_host=req.host[:80],
                        latest_wait_s=None if wait is None else round(wait, 1),
                        rate_bytes_per_s=int(self.host_rate.rate),
                        held_since_last_line=said["held"], refused_since_last_line=said["refused"])
        if wait is None:
            raise _Refused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                           f"batch seq={req.seq}: host {req.host[:80]!r} is over its ingest rate "
                           f"({self.host_rate.rate / 1024:.0f} KiB/s, --host-rate): it owes more than "
                           f"{self.host_rate.max_debt / (1 << 20):.0f} MiB; resend later")
        try:
            # said while it waits, so that a host held longer than the staleness horizon is not taken for silent
            until = time.monotonic() + wait
            while (left := until - time.monotonic()) > 0:
                self.analyzer.note_held(req.host)
                await asyncio.sleep(min(left, HELD_NOTE_S))
        except BaseException:
            self._refund(req.host, wire_bytes)
            raise
        return wire_bytes

    def _refund(self, host: str, charged: int) -> None:
        if charged and self.host_rate is not None:
            self.host_rate.refund(host, charged)

    async def _ack(self, seq: int, fut) -> pb.BatchAck:
        try:
            result = await asyncio.wait_for(asyncio.shield(fut), self._timeout)
        except BatchRejected as exc:
            self.analyzer.count_rejected(None, str(exc))
            return pb.BatchAck(seq=seq, status=pb.BatchAck.REJECTED, error=f"batch seq={seq}: {exc}")
        return pb.BatchAck(seq=seq, status=_ACK.get(result, pb.BatchAck.DUPLICATE))

    def _not_stored(self, exc: Exception) -> str:
        """UNAVAILABLE's details for a batch not stored: what happened, in the
        store's words (a timeout has none), and what to do, said once here."""
        return f"{NOT_STORED}: {str(exc) or f'no commit within {self._timeout:.0f} s'}"

    async def Push(self, request: bytes, context):
        try:
            req, fut, error = await self._admit(request, context, "Push")
        except _Refused as exc:
            await context.abort(exc.code, exc.details)
        if error is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"batch seq={req.seq}: {error}")
        try:
            ack = await self._ack(req.seq, fut)
        except (StoreUnavailable, asyncio.TimeoutError) as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, self._not_stored(exc))
        if ack.status == pb.BatchAck.REJECTED:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, ack.error)
        return ack

    async def Ingest(self, request_iterator, context):
        """Every batch taken gets an ack (COMMITTED, DUPLICATE, or REJECTED
        naming the field), or the stream ends with UNAVAILABLE and the agent
        resends what was not acked. Acks go back in the order batches came;
        a message that ends the stream (garbage, another host's batch, a host
        too far over its rate) ends it after the acks of the batches before it."""
        await self._stream_slot(context)
        pending: asyncio.Queue = asyncio.Queue()

        async def read() -> None:
            # An agent sends every few seconds, and whatever references its last batch keeps
            # it until the next: grpc.aio's request iterator holds the wire bytes in its own
            # frame, and this frame held them and the parsed message (~130 KiB at 8 GPUs x 5 s
            # in all), which at 2,000 agents was a third of the gRPC process. So each message
            # is read from the context, and let go of once queued.
            # A stream sending large batches waits at the read gate (flow.ReadGate).
            slot = self._reading.stream()
            try:
                while True:
                    await slot.reserve()
                    try:
                        if (data := await context.read()) is grpc.aio.EOF:
                            return
                        await slot.read(len(data))
                        try:
                            req, fut, error = await self._admit(data, context, "Ingest")
                        except _Refused as exc:
                            await pending.put(exc.with_traceback(None))     # its frames hold the message
                            return
                    finally:
                        slot.release()      # queued (the writer's budget holds it now), refused, or cancelled
                    del data
                    seq, req = req.seq, None
                    await pending.put((seq, fut, error))
            finally:
                await pending.put(None)

        reader = asyncio.ensure_future(read())
        self.agent_streams += 1
        try:
            while True:
                item = await pending.get()
                if item is None:
                    break
                if isinstance(item, _Refused):
                    await context.abort(item.code, item.details)
                seq, fut, error = item
                if error is not None:
                    yield pb.BatchAck(seq=seq, status=pb.BatchAck.REJECTED,
                                      error=f"INVALID_ARGUMENT: batch seq={seq}: {error}")
                    continue
                try:
                    yield await self._ack(seq, fut)
                except (StoreUnavailable, asyncio.TimeoutError) as exc:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, self._not_stored(exc))
            await reader      # surfaces what reading raised
        finally:
            self.agent_streams -= 1
            reader.cancel()

    async def ReportCapture(self, requests, context):
        """An older agent's report, its trace in one message. Registered as
        a stream (STREAMED_IN) though its callers send one message, so that
        its place among the uploads is taken before the message is received:
        a caller waiting or refused holds gRPC's flow-control window, not its
        trace (found in a trial: 100 reports of 29 MiB at once took 5.3 GB;
        30 waiting took 1.4 GB as unary calls, 0.28 GB as streams). Under
        mutual TLS the per-host count is the certificate's host, known before
        the message is; without, all such reports count as one host's."""
        caller = current_caller()
        host = caller.host if caller is not None and caller.role == "agent" else ""
        async with self._upload_slot(context, "ReportCapture", host) as slot:
            try:
                request = await asyncio.wait_for(_only(requests), UPLOAD_RECEIVE_S)
            except UploadError as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"ReportCapture: {exc}")
            except asyncio.TimeoutError:
                await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"ReportCapture: the report did not "
                                    f"arrive within {UPLOAD_RECEIVE_S:.0f} s; resend it")
            if request is None:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "ReportCapture: no message came")
            await _own_host(context, request.record.host, "record.host")
            try:
                validate_capture_record(request.record)
            except BatchError as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"record: {exc}")
            return await self._store_capture(request.record, request.xspace, context, slot)

    async def UploadCapture(self, request_iterator, context):
        """ReportCapture with the trace in chunks (capture_upload.py): the
        caller's right to its host and the record are checked on the first
        chunk, before any trace is taken, and at most MAX_UPLOADS traces are
        held at once."""
        chunks = request_iterator.__aiter__()
        try:
            first = await chunks.__anext__()
        except StopAsyncIteration:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "UploadCapture: no chunk came")
        await _own_host(context, first.record.host, "record.host")
        try:
            trace = TraceAssembly(first)
            validate_capture_record(first.record)
        except UploadError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"UploadCapture: {exc}")
        except BatchError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"record: {exc}")
        async with self._upload_slot(context, "UploadCapture", first.record.host) as slot:
            try:
                # a slot held by a stalled client would hold every agent's captures up
                data = await asyncio.wait_for(self._receive(chunks, trace), UPLOAD_RECEIVE_S)
            except UploadError as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"UploadCapture: {exc}")
            except asyncio.TimeoutError:
                await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"UploadCapture: the trace did not arrive "
                                    f"within {UPLOAD_RECEIVE_S:.0f} s; resend it")
            return await self._store_capture(trace.record, data, context, slot)

    @contextlib.asynccontextmanager
    async def _upload_slot(self, context, method: str, host: str):
        """One of MAX_UPLOADS slots for a trace being received and stored,
        waited for at most UPLOAD_WAIT_S. Beyond MAX_OPEN_UPLOADS uploads open
        at once (receiving or waiting), or MAX_OPEN_UPLOADS_PER_HOST of one
        host, the next is refused at once: gRPC buffers what waiting streams
        send (200 of them took 9.8 GB), and one client held all of them
        (found in trials). The slot is given back when the trace is stored,
        even if its caller gave up before (`slot.storing`)."""
        if self._uploads_open >= MAX_OPEN_UPLOADS or self._host_uploads[host] >= MAX_OPEN_UPLOADS_PER_HOST:
            mine = self._host_uploads[host]
            of_host = f" ({mine} of host {host[:80]!r})" if host else ""
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{method}: {self._uploads_open} capture "
                                f"uploads are open{of_host}, at most {MAX_OPEN_UPLOADS} "
                                f"({MAX_OPEN_UPLOADS_PER_HOST} a host); resend later")
        slot = _Slot()
        self._uploads_open += 1
        self._host_uploads[host] += 1

        def close(stored: asyncio.Future | None = None) -> None:
            if stored is not None and not stored.cancelled():
                stored.exception()                         # its caller is gone: nobody else retrieves it
            if slot.granted:
                self._uploads.release()
            self._uploads_open -= 1
            self._host_uploads[host] -= 1
            if not self._host_uploads[host]:
                del self._host_uploads[host]
        try:
            try:
                await asyncio.wait_for(self._uploads.acquire(), UPLOAD_WAIT_S)
                slot.granted = True
            except asyncio.TimeoutError:
                await context.abort(grpc.StatusCode.UNAVAILABLE, f"{method}: {MAX_UPLOADS} traces are being "
                                    f"received; resend later")
            yield slot
        finally:
            if slot.storing is not None and not slot.storing.done():
                slot.storing.add_done_callback(close)      # the trace is still held until it is stored
            else:
                close()

    @staticmethod
    async def _receive(chunks, trace: TraceAssembly) -> bytes:
        async for chunk in chunks:
            trace.add(chunk)
        return trace.trace()

    async def _store_capture(self, record, xspace: bytes, context, slot: "_Slot") -> apb.CaptureSummary:
        slot.storing = asyncio.get_running_loop().run_in_executor(
            self._captures, _in_context(self.analyzer.report_capture), record, xspace)
        try:
            row = await asyncio.shield(slot.storing)
        except (StoreUnavailable, TimeoutError) as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"the capture was {NOT_STORED}: "
                                f"{exc or 'no answer within 30 s'}")
        return capture_summary_pb(row)

    async def ReportCalibration(self, request, context):
        await _own_host(context, request.host, "host")
        if request.dry_run:        # this caller may send for this host: that is all a dry run asks
            return apb.CalibrationAck()
        try:
            record = json.loads(request.calibration_json)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"calibration_json: not JSON ({exc})")
        try:
            ack = await self._query(self.analyzer.report_calibration, request.host, record, pool=self._captures)
        except CalibrationInvalid as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"calibration: {exc}")
        except (StoreUnavailable, TimeoutError) as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"could not store the calibration, resend later: {exc}")
        return apb.CalibrationAck(**ack)

    async def ListCeilings(self, request, context):
        rows = await self._query(self.analyzer.store.ceilings, request.host or None, request.model or None,
                                 request.uuid or None, request.history)
        return apb.CeilingsResponse(calibrations_json=json.dumps(rows, default=str))

    async def ListPrograms(self, request, context):
        try:
            start = _finite(request.start, "start") if request.HasField("start") else time.time() - PROGRAMS_SINCE_S
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        rows = await self._query(self.analyzer.list_programs, start, request.host, request.fingerprint,
                                 _limit(request.limit, 200))
        return apb.ProgramsResponse(programs_json=json.dumps(_for_caller(rows), default=str))

    async def ListDistJobs(self, request, context):
        try:
            start = _finite(request.start, "start") if request.HasField("start") else time.time() - JOBS_SINCE_S
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        rows = await self._query(self.analyzer.list_jobs, start, request.job, _limit(request.limit, 200))
        return apb.DistJobsResponse(jobs_json=json.dumps(_for_caller(rows), default=str))

    async def CaptureJob(self, request, context):
        """Every rank of a job traced over one window: a command to each rank's
        agent with the start on the analyzer's clock (agents correct for
        theirs) and the time it was sent."""
        duration = request.duration_ms or 2000
        lead = request.lead_ms or 2000
        if not 0 < duration <= coordinated.MAX_DURATION_MS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"duration_ms: {duration}, expected 1 to {coordinated.MAX_DURATION_MS}")
        if not 200 <= lead <= 60_000:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"lead_ms: {lead}, expected 200 to 60000 (the agents must hear of it before it starts)")
        if not request.job:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "job: empty (`gpuscope jobs --fleet` lists them)")
        ranks = await self._query(self.analyzer.job_ranks, request.job)
        if not ranks:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"job {request.job[:200]!r}: no rank seen in the last 10 minutes "
                                "(`gpuscope jobs --fleet` lists the jobs seen)")
        group, start_at, out = coordinated.send(self.analyzer.commands, request.job, ranks, duration, lead / 1e3)
        log.info("coordinated capture", group=group, job=request.job[:200], ranks=len(out),
                 sent=sum(o["sent"] for o in out), start_at=start_at, duration_ms=duration)
        return apb.CaptureJobResponse(group=group, start_at=start_at, ranks_json=json.dumps(out))

    async def JobSkew(self, request, context):
        if not request.group.isalnum() or len(request.group) > 32:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"group: {request.group[:40]!r} is not a coordinated capture's id")
        return apb.JobSkewResponse(json=json.dumps(await self._query(self.analyzer.job_skew, request.group),
                                                   default=str))

    async def Commands(self, request, context):
        if not request.host:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "host: empty")
        await _own_host(context, request.host, "host")
        await self._stream_slot(context)
        q, deliver = _stream_queue()
        hub = self.analyzer.commands
        hub.subscribe(request.host, deliver)
        self.agent_streams += 1
        try:
            # headers now, not with the first command (which may come hours later): the agent then knows
            # the stream was accepted, and reads a later reset as the analyzer going away, not a refusal
            await context.send_initial_metadata(((ACCEPTED_KEY, "1"),))
            while True:
                yield await q.get()
        finally:
            self.agent_streams -= 1
            hub.unsubscribe(request.host, deliver)

    async def _stream_slot(self, context) -> None:
        """Agents' streams have their own limit, so a fleet at its limit
        never makes the server refuse an on-call query."""
        if self.agent_streams >= self.max_agent_streams:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"{self.agent_streams} agent streams open, the limit (--max-streams); retry later")

    # -- on-call ----------------------------------------------------------------------
    @_unavailable_as_status
    async def GetStatus(self, request, context):
        # built on the on-call pool: a fleet's status is thousands of GPUs,
        # and the event loop must keep serving agents meanwhile
        return await self._query(self._status_pb, request.host, request.gpu_limit or DEFAULT_GPU_LIMIT)

    def _status_pb(self, host: str, gpu_limit: int) -> apb.AnalyzerStatus:
        s = self.analyzer.status(host, gpu_limit)
        out = apb.AnalyzerStatus(version=VERSION, started=s["started"], batches_committed=s["batches_committed"],
                                 batches_duplicate=s["batches_duplicate"], batches_rejected=s["batches_rejected"],
                                 samples_committed=s["samples_committed"], hosts=s["hosts"],
                                 findings_open=s["findings_open"], db_path=s["db_path"],
                                 window_seconds=s["window_seconds"], anomalies=s["anomalies"],
                                 decisions=s["decisions"], captures_in_flight=s["captures_in_flight"],
                                 agents_connected=s["agents_connected"], samples_stored=s["samples_stored"],
                                 gpus_stale=s["gpus_stale"], hosts_stale=s["hosts_stale"],
                                 analysis_lag_seconds=s["analysis_lag_seconds"], gpus_total=s["gpus_total"],
                                 gpus_matching=s["gpus_matching"])
        out.MergeFrom(apb.AnalyzerStatus(**self.flow_counts()))
        if s.get("store_failing_since") is not None:
            out.store_error = s.get("store_error", "")[:1000]
            out.store_failing_seconds = max(0.0, time.time() - s["store_failing_since"])
        if s.get("publish"):
            out.publish.CopyFrom(apb.PublishStatus(**s["publish"]))
        for g in s["gpus"]:
            m = out.gpus.add(host=g["host"], gpu=g["gpu"], name=g["name"] or "", verdict=g["verdict"],
                             confidence=g["confidence"], last_sample=g["last_sample"], flags=g["flags"],
                             lost=g["lost"], stale=g["stale"], last_seen_age_seconds=g["last_seen_age_s"] or 0.0,
                             source=g.get("source") or "")
            if g["open_finding"]:
                m.open_finding = g["open_finding"]
        return out

    @_unavailable_as_status
    async def ListFindings(self, request, context):
        start, end = await _optional_range(request, context)

        bad = [f for f in request.flags if not re.fullmatch(r"[a-z][a-z0-9-]{0,40}", f)]
        if bad:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"flags: {bad[0]!r} is not a flag (power-capped, thermal-throttled, ...)")
        for name in ("pod", "namespace", "slurm_job"):
            value = getattr(request, name)
            if len(value.encode()) > 2 * MAX_ATTRIBUTION_BYTES:       # namespace/pod: two labels
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"{name}: longer than {2 * MAX_ATTRIBUTION_BYTES} bytes; no job's is")
        unknown = [k for k in request.kinds if k not in FINDING_KINDS]
        if unknown:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"kinds: {unknown[0][:40]!r} is not a kind of finding ({', '.join(FINDING_KINDS)})")

        def build() -> apb.FindingsResponse:
            made = self.analyzer.findings_messages(
                lambda r: _findings_entry(finding_pb(_for_caller(r))), "full" if _sees_commands() else "hidden",
                host=request.host, gpu=request.gpu if request.HasField("gpu") else None,
                verdicts=list(request.verdicts), start=start, end=end, open_only=request.open_only,
                limit=_limit(request.limit, 1000), flags=list(request.flags), pod=request.pod,
                namespace=request.namespace, slurm_job=request.slurm_job, kinds=list(request.kinds))
            return apb.FindingsResponse.FromString(b"".join(made))
        return await self._query(build)

    @_unavailable_as_status
    async def QueryMetric(self, request, context):
        metric = cat.find(request.metric)
        if metric is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"metric: unknown {request.metric!r}; `gpuscope metrics` lists them")
        agg = request.aggregate or "series"
        if agg != "series" and agg not in AGGREGATES:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"aggregate: {agg!r}, expected series or one of {', '.join(AGGREGATES)}")
        if metric.unit == "bitmask" and agg not in ("series", "last"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"aggregate: {agg!r} of a bitmask ({metric.name}) means nothing; use series (the "
                                f"bits set in each bucket) or last")
        try:
            end = _finite(request.end, "end") or time.time()
            start = _finite(request.start, "start") or end - 3600
            step = _finite(request.step_seconds, "step_seconds") or max(1.0, (end - start) / 300)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if start > end:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "start: after end")
        if step <= 0 or (agg == "series" and (end - start) / step > MAX_POINTS):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"step_seconds: {step:g} gives more than {MAX_POINTS} points per GPU; use a larger step")
        if request.group_by and request.group_by not in PROCESS_GROUPS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"group_by: {request.group_by!r}, expected {', '.join(PROCESS_GROUPS)} (or empty: "
                                f"per GPU)")
        rate = metric.kind is cat.Kind.COUNTER and not request.raw
        rows = await self._query(self.analyzer.store.metric, metric.name, request.host,
                                 request.gpu if request.HasField("gpu") else None, start, end, agg, step, rate,
                                 request.group_by)
        out = apb.MetricResult(metric=metric.name, unit=RATE_UNITS.get(metric.unit, f"{metric.unit}/s") if rate
                               else metric.unit, aggregate=agg)
        series: dict[tuple, apb.MetricSeries] = {}
        for r in rows:
            if request.group_by == "job":        # "host pid:N command": a reader sees the executable only
                host_, _, job = r["group"].partition(" ")
                r["group"] = f"{host_} {_for_caller({'job': job})['job']}"
            key = (r["host"], r["gpu"], r.get("group"))
            s = series.get(key)
            if s is None:
                s = series[key] = out.series.add(host=r["host"], gpu=r["gpu"], group=r.get("group") or "",
                                                 gpus=r.get("gpus") or 0)
            s.samples += int(r["n"])
            if agg == "series":
                s.points.add(t=r["bucket"], value=r["value"])
            elif r["value"] is not None:
                s.value = float(r["value"])
        return out

    @_unavailable_as_status
    async def ListCaptures(self, request, context):
        rows = await self._query(self.analyzer.store.captures, request.host, _limit(request.limit, 100))
        return apb.CapturesResponse(captures=[capture_summary_pb(_for_caller(r)) for r in rows])

    async def Watch(self, request, context):
        q, deliver = _stream_queue(maxsize=10_000)
        w = Watch(host=request.host, gpu=request.gpu if request.HasField("gpu") else None,
                  verdicts=frozenset(request.verdicts), kinds=frozenset(request.kinds), deliver=deliver)
        wid = self.analyzer.events.subscribe(w)
        try:
            while True:
                e = await q.get()
                yield apb.Event(kind=e["kind"], t=e["t"] or 0.0, host=e["host"], gpu=e["gpu"] or 0,
                                verdict=e.get("verdict") or "", json=json.dumps(_for_caller(e["record"]), default=str))
        finally:
            self.analyzer.events.unsubscribe(wid)

    @_unavailable_as_status
    async def ListRecords(self, request, context):
        try:
            since = _finite(request.since, "since")
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            rows = await self._query(self.analyzer.store.records, request.table, request.host, since,
                                     _limit(request.limit, 200))
        except KeyError:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"table: {request.table!r}, expected anomalies or decisions")
        return apb.RecordsResponse(json=[json.dumps(_for_caller(r), default=str) for r in rows])

    @_unavailable_as_status
    async def Report(self, request, context):
        try:
            ctx_s = _finite(request.context_seconds, "context_seconds")
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            report = await self._query(self.analyzer.report, request.finding_id, ctx_s)
        except AmbiguousId as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if report is None:
            if 0 < len(request.finding_id) < MIN_PREFIX:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"finding_id {request.finding_id!r} is too short to name a finding: give its "
                                    f"first {MIN_PREFIX} characters or more (`gpuscope findings` lists them)")
            await context.abort(grpc.StatusCode.NOT_FOUND, f"finding_id: no finding {request.finding_id!r} "
                                                           "(`gpuscope findings` lists them; give an id whole, or "
                                                           "its first 4 characters or more)")
        return apb.ReportResponse(json=json.dumps(_for_caller(report), default=str))

    @_unavailable_as_status
    async def RangeReport(self, request, context):
        start, end = await _optional_range(request, context)
        end = time.time() if end is None else end
        start = end - 3600 if start is None else start
        if start >= end:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "start: not before end")
        points, gpus = request.max_points, request.max_gpus
        for name, value, (lo, hi) in (("max_points", points, LIMITS["points"]), ("max_gpus", gpus, LIMITS["gpus"])):
            if value and not lo <= value <= hi:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: {value}, expected {lo} to {hi}")
        rep = await self._query(self.analyzer.range_report, start, end, request.host,
                                request.gpu if request.HasField("gpu") else None, points, gpus)
        return apb.ReportResponse(json=json.dumps(_for_caller(rep), default=str))

    @_unavailable_as_status
    async def Top(self, request, context):
        by = request.by or "gpu"
        if by != "gpu" and by not in FINDING_GROUPS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"by: {by!r}, expected gpu, {', '.join(FINDING_GROUPS)}")
        start, end = await _optional_range(request, context)
        end = time.time() if end is None else end
        start = end - 3600 if start is None else start
        if start >= end:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "start: not before end")
        limit = _limit(request.limit, 20)
        rows = await self._query(self.analyzer.top, start, end, request.host, by, limit)
        conditions = await self._query(functools.partial(
            self.analyzer.list_findings, host=request.host, open_only=True,
            kinds=[k for k in FINDING_KINDS if k != "bottleneck"], limit=limit))
        conditions.sort(key=lambda f: (-(f["confidence"] or 0.0), f["host"], f["gpu"]))
        out = apb.TopResponse(start=start, end=end, by=by, conditions=[finding_pb(_for_caller(f)) for f in conditions])
        for r in map(_for_caller, rows):
            now = r["now"] or {}
            # the row's id, summary and flags are its main verdict's longest finding's; `now_*` the open one's
            shown = {"id": r["finding_id"], "confidence": r["confidence"], "summary": r["summary"],
                     "flags": r["flags"]}
            out.rows.add(host=r["host"], gpu=r["gpu"], job=r["job"] or "", verdict=r["main_verdict"],
                         bottleneck_seconds=r["bottleneck_seconds"], findings=r["findings"], gpus=r["gpus"],
                         # a job, pod or Slurm job over several GPUs: GPU-seconds of the range's GPU-seconds
                         # (found in a trial: a pod on 2 GPUs read 187 %)
                         share=r["bottleneck_seconds"] / ((end - start) * max(r["gpus"] if by != "gpu" else 1, 1)),
                         now_verdict=now.get("verdict", ""), now_since=now.get("start") or 0.0,
                         confidence=shown["confidence"] or 0.0, summary=shown["summary"] or "",
                         flags=shown["flags"] or [], finding_id=shown["id"] or "",
                         verdicts=[apb.VerdictSeconds(**v) for v in r.get("verdicts") or ()],
                         stale=bool(r.get("stale")), last_seen_age_seconds=r.get("last_seen_age_s") or 0.0,
                         attribution=attribution_pb(r.get("attribution")), conditions=r.get("conditions") or [])
        return out

    @_unavailable_as_status
    async def GetAccuracy(self, request, context):
        start, end = await _optional_range(request, context)

        def build() -> apb.AccuracyResponse:
            rows = self.analyzer.store.verdict_pairs(start, end, request.host)
            return apb.AccuracyResponse(pairs=[apb.VerdictPairs(**r) for r in rows])
        return await self._query(build)

    @_unavailable_as_status
    async def ListDegraded(self, request, context):
        start, end = await _optional_range(request, context)
        end = time.time() if end is None else end
        start = end - DEGRADED_SPAN_S if start is None else start

        def build() -> apb.DegradedResponse:
            # the peer statistics run here, on the inputs' Arrow table: an in-memory DuckDB
            # of the gRPC process's own, not the analysis process's GIL
            con, inputs = duckdb.connect(), self.analyzer.store.degraded_inputs(start, end)
            found = find_degraded(con, inputs)
            keep = ("host", "gpu", "uuid", "model", "driver", "dimension", "value", "peer_median", "peers",
                    "shortfall", "z", "unit", "summary")
            return apb.DegradedResponse(gpus=[apb.DegradedGpu(**{k: f[k] for k in keep if f[k] is not None},
                                                              **{k: v for k, v in (f["link"] or {}).items()
                                                                 if v is not None})
                                              for f in found],
                                        unjudged=[apb.UnjudgedGroup(**g) for g in unjudged_groups(con, inputs)])
        return await self._query(build)

    def close(self) -> None:
        self._oncall.shutdown(wait=False, cancel_futures=True)
        self._captures.shutdown(wait=False, cancel_futures=True)
        self._decoding.shutdown(wait=False, cancel_futures=True)
        self._screening.shutdown(wait=False, cancel_futures=True)


MAX_POINTS = 100_000
DEGRADED_SPAN_S = 3600.0     # live figures of the last hour unless asked
PROGRAMS_SINCE_S = 7 * 86400  # programs with runs in the last week unless asked
JOBS_SINCE_S = 3600.0         # distributed jobs seen in the last hour unless asked


def _in_context(fn):
    """fn to run on a pool thread with this call's context (its caller)."""
    ctx = contextvars.copy_context()
    return lambda *args: ctx.run(fn, *args)


def _stream_queue(maxsize: int = STREAM_QUEUE):
    """An asyncio queue for one stream, and a thread-safe way to fill it
    from the writer thread (False when the stream is too slow to keep up)."""
    loop = asyncio.get_running_loop()
    q: asyncio.Queue = asyncio.Queue(maxsize)

    def deliver(item) -> bool:
        if q.qsize() >= maxsize:
            return False
        loop.call_soon_threadsafe(_put, q, item)
        return True
    return q, deliver


def _put(q: asyncio.Queue, item) -> None:
    try:
        q.put_nowait(item)
    except asyncio.QueueFull:
        pass


class _Refused(Exception):
    """A call to end with this status (raised where the context is not to be aborted yet)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


def _other_host(host: str, field: str) -> tuple[grpc.StatusCode, str] | None:
    """An agent's certificate names its host: it may act for that host only."""
    caller = current_caller()
    if caller is not None and caller.role == "agent" and host != caller.host:
        return (grpc.StatusCode.PERMISSION_DENIED,
                f"{field}: {host[:80]!r}, but this agent's certificate is for {caller.host!r}")
    return None


async def _own_host(context, host: str, field: str) -> None:
    denied = _other_host(host, field)
    if denied is not None:
        await context.abort(*denied)


async def _optional_range(request, context) -> tuple[float | None, float | None]:
    """A request's optional start and end; INVALID_ARGUMENT naming a bad one."""
    try:
        return (_finite(request.start, "start") if request.HasField("start") else None,
                _finite(request.end, "end") if request.HasField("end") else None)
    except ValueError as exc:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))


def _finite(value: float, field: str) -> float:
    if value != value or value in (float("inf"), float("-inf")) or abs(value) > 1e12:
        raise ValueError(f"{field}: {value!r} is not a time or duration in seconds")
    return value


# a counter's unit -> its rate's: seconds of throttling per second is the share of time throttled
RATE_UNITS = {"bytes": "bytes/s", "seconds": "ratio", "joules": "watts", "count": "1/s"}


def _limit(value: int, default: int) -> int:
    return min(value or default, 10_000)


def _for_caller(obj):
    """Job command lines (already stored with secrets redacted) are shown in
    full to operators only; others see the process and its executable."""
    return obj if _sees_commands() else _hide_commands(obj)


def _sees_commands() -> bool:
    caller = current_caller()
    return caller is None or caller.role == "operator"


def _hide_commands(obj):
    if isinstance(obj, dict):
        return {k: (command_label(v) if k in ("job", "command") and isinstance(v, str) else _hide_commands(v))
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [_hide_commands(v) for v in obj]
    return obj


class _Slot:
    """An upload's place: whether it got one of the slots, and its trace's
    store job once started (what still holds the trace after its caller
    gives up)."""
    __slots__ = ("granted", "storing")

    def __init__(self) -> None:
        self.granted = False
        self.storing: asyncio.Future | None = None


def add_to_server(servicer: AnalyzerServicer, server) -> None:
    """The generated registration, except that agents' batches (RAW_REQUESTS)
    reach the servicer as bytes, sized as they came, and STREAMED_IN methods
    as a stream of their one message."""
    analyzer_pb2_grpc.add_AnalyzerServicer_to_server(servicer, _RawBatches(server))


def _raw(handler):
    return handler._replace(request_deserializer=None)


def _streamed_in(handler):
    """A unary handler as a client-streaming one: the same bytes on the wire."""
    return handler._replace(request_streaming=True, stream_unary=handler.unary_unary, unary_unary=None)


def _ours(name: str, handler):
    if name in RAW_REQUESTS:
        return _raw(handler)
    if name in STREAMED_IN:
        return _streamed_in(handler)
    return handler


async def _only(requests):
    """A stream's one message (None when none came), read to the stream's
    end, so that no receiver is left waiting with the message inside it (a
    trial of a like change, since taken back, found such receivers kept
    109 messages of 30 MiB, 5 GB, until a full collection)."""
    got = None
    async for request in requests:
        if got is not None:
            raise UploadError("more than one message came; the method takes one")
        got = request
    return got


class _RawBatches:
    """The server as add_AnalyzerServicer_to_server sees it: the handlers it
    registers for RAW_REQUESTS lose their deserializer, those for STREAMED_IN
    take a stream."""

    def __init__(self, server):
        self._server = server

    def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
        self._server.add_registered_method_handlers(
            service, {name: _ours(name, h) for name, h in handlers.items()})

    def add_generic_rpc_handlers(self, handlers) -> None:
        self._server.add_generic_rpc_handlers(tuple(_RawGeneric(h) for h in handlers))


class _RawGeneric(grpc.GenericRpcHandler):
    def __init__(self, inner):
        self._inner = inner

    def service(self, details):
        handler = self._inner.service(details)
        return None if handler is None else _ours(details.method.rpartition("/")[2], handler)
