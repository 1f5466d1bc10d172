"""Uplink: streams sample batches to the analyzer and keeps them until acked.

Sampling never waits on the network: `submit` only appends to a buffer. A
flusher thread cuts batches; a connection thread holds one Ingest stream,
resends every unacknowledged batch after a reconnect, and drops a batch for
good only when the analyzer acknowledges it (committed or duplicate) or
rejects it as invalid. The buffer is bounded: when the analyzer is away long
enough to fill it, the oldest samples go first and are counted.

Channels come from `security` (security.tls.ClientSecurity: the agent's
certificate for mutual TLS), or from an explicit `channel_factory` in tests.
"""
from __future__ import annotations

import collections
import itertools
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import grpc
import structlog

from gpuscope.collectors.records import DeviceInfo, GpuSample, HealthRecord
from gpuscope.security.redact import redact_command
from gpuscope.security.tls import INSECURE, ClientSecurity, explain_failure
from gpuscope.v1 import REJECTED_SEQ_KEY, analyzer_pb2_grpc, samples_pb2 as pb

from .convert import encode_batch


log = structlog.get_logger("gpuscope.uplink")
MAX_HEALTH_PER_BATCH = 1000
# A batch is cut before it would pass either: the analyzer refuses a batch of
# more than 131,072 processes, and takes no message over 32 MiB
# (daemon/serve.py); 8 MiB leaves room for what the estimate leaves out.
MAX_BATCH_PROCESSES = 131_072
MAX_BATCH_BYTES = 8 << 20
MAX_BATCH_COMMAND_CHARS = 1 << 20     # distinct command-line text, the analyzer's MAX_COMMAND_CHARS


@dataclass(frozen=True)
class UplinkConfig:
    target: str
    flush_interval_s: float = 1.0
    max_batch_samples: int = 4096
    buffer_samples: int = 50_000       # pending + unacknowledged, across GPUs
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 15.0


class Uplink:
    def __init__(self, config: UplinkConfig, host: str, boot_id: str,
                 devices: Callable[[], list[DeviceInfo]],
                 channel_factory: Callable[[str], grpc.Channel] | None = None,
                 security: ClientSecurity = INSECURE):
        self.config = config
        self.host, self.boot_id = host, boot_id
        self._devices = devices
        self._security = security
        self._channel_factory = channel_factory or security.channel_factory()
        self._lock = threading.Lock()
        # one flush at a time: a seq is taken and enters _unacked in order, so the
        # oldest unacked seq a batch names is never above its own (the flush loop and
        # stop() or a caller's flush() would otherwise interleave)
        self._flush_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._pending: collections.deque[GpuSample] = collections.deque()
        self._pending_health: list[HealthRecord] = []
        # seq -> (batch, its samples, its oldest sample's time: the send lag /metrics reports)
        self._unacked: collections.OrderedDict[int, tuple[pb.SampleBatch, int, float]] = collections.OrderedDict()
        self._unacked_samples = 0
        self._send_q: queue.SimpleQueue | None = None
        self._call = None
        self._seq = 0
        self.dropped = 0
        self.sent = self.acked = self.rejected = 0
        self.connected = False
        self.last_error = ""
        self._threads: list[threading.Thread] = []

    # -- producer side (sampler thread) ------------------------------------------
    def submit(self, samples: Sequence[GpuSample], health: Iterable[HealthRecord] = ()) -> None:
        with self._lock:
            self._pending.extend(samples)
            self._pending_health.extend(health)
            self._enforce_bound()
            full = len(self._pending) >= self.config.max_batch_samples
        if full:
            self._wake.set()

    def _enforce_bound(self) -> None:
        over = len(self._pending) + self._unacked_samples - self.config.buffer_samples
        while over > 0 and self._unacked:       # oldest data first
            seq, (_, n, _) = self._unacked.popitem(last=False)
            self._unacked_samples -= n
            self.dropped += n
            over -= n
        if over > 0:
            for _ in range(min(over, len(self._pending))):
                self._pending.popleft()
            self.dropped += over

    @property
    def buffered(self) -> int:
        with self._lock:
            return len(self._pending) + self._unacked_samples

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        for target, name in ((self._flush_loop, "uplink-flush"), (self._connection_loop, "uplink-conn")):
            th = threading.Thread(target=target, name=name, daemon=True)
            th.start()
            self._threads.append(th)

    def stop(self, drain_s: float = 2.0) -> None:
        """Flush what is pending and give the analyzer `drain_s` to ack it."""
        self.flush()
        deadline = time.monotonic() + drain_s
        while self.connected and self._unacked and time.monotonic() < deadline:
            time.sleep(0.02)
        self._stop.set()
        self._wake.set()
        with self._lock:
            if self._send_q is not None:
                self._send_q.put(None)
            call = self._call
        if call is not None:
            call.cancel()
        for th in self._threads:
            th.join(timeout=5)

    # -- batching ------------------------------------------------------------------
    def _flush_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.config.flush_interval_s)
            self._wake.clear()
            try:
                self.flush()
            except Exception:  # the loop must survive; a bad sample must not stop uploads
                log.exception("uplink flush failed")

    def flush(self) -> None:
        with self._flush_lock:
            self._flush()

    def _flush(self) -> None:
        while True:
            with self._lock:
                if not self._pending and not self._pending_health:
                    return
                take, redacted = _batch_take(self._pending, self.config.max_batch_samples)
                samples = [self._pending.popleft() for _ in range(take)]
                # the analyzer takes at most 10,000 health events a batch; the rest go in the next
                health, self._pending_health = self._pending_health[:MAX_HEALTH_PER_BATCH], \
                    self._pending_health[MAX_HEALTH_PER_BATCH:]
                self._seq += 1
                seq = self._seq
                self._unacked_samples += take   # still counted against the bound
                dropped = self.dropped
            batch = encode_batch(self.host, self.boot_id, seq, samples, self._devices(), health, dropped, redacted)
            with self._lock:
                # read under the lock: a batch dropped for lack of room is gone from _unacked for good
                batch.min_unacked_seq = next(iter(self._unacked), seq)   # seqs enter in order
                self._unacked[seq] = (batch, take, min((smp.t for smp in samples), default=time.time()))
                if self._send_q is not None:
                    self._send_q.put(batch)
                    self.sent += 1

    # -- the stream ------------------------------------------------------------------
    def _connection_loop(self) -> None:
        backoff = self.config.backoff_initial_s
        while not self._stop.is_set():
            try:
                channel = self._channel_factory(self.config.target)
            except ValueError as exc:       # TLS files unreadable or expired (TlsConfigError): retry, never die
                if self.last_error != str(exc):
                    log.error("uplink cannot open a channel, buffering", analyzer=self.config.target, error=str(exc))
                with self._lock:
                    self.last_error = str(exc)
                if self._stop.wait(backoff):
                    return
                backoff = min(backoff * 2, self.config.backoff_max_s)
                continue
            q: queue.SimpleQueue = queue.SimpleQueue()
            with self._lock:
                for batch, *_ in self._unacked.values():
                    q.put(batch)
                    self.sent += 1
                self._send_q = q
            try:
                call = analyzer_pb2_grpc.AnalyzerStub(channel).Ingest(iter(q.get, None))
                with self._lock:
                    self._call = call
                for ack in call:
                    if not self.connected:
                        log.info("uplink connected", analyzer=self.config.target)
                        with self._lock:
                            self.last_error = ""      # the stream delivers again: the old failure is history
                    self.connected = True
                    backoff = self.config.backoff_initial_s
                    self._on_ack(ack)
                retry = False
            except grpc.RpcError as exc:
                retry = self._on_error(exc)
            except Exception:  # never let the uplink die; the agent keeps sampling
                log.exception("uplink stream failed")
                retry = False
            finally:
                with self._lock:
                    self._send_q = None
                    self._call = None
                q.put(None)
                channel.close()
                self.connected = False
            if not retry and self._stop.wait(backoff):
                return
            backoff = min(backoff * 2, self.config.backoff_max_s)

    def _on_ack(self, ack: pb.BatchAck) -> None:
        with self._lock:
            entry = self._unacked.pop(ack.seq, None)
            if entry is not None:
                self._unacked_samples -= entry[1]
            if ack.status == pb.BatchAck.REJECTED:
                self.rejected += 1
                self.last_error = ack.error
            else:
                self.acked += 1
        if ack.status == pb.BatchAck.REJECTED:
            log.error("analyzer rejected batch", seq=ack.seq, error=ack.error)

    def _on_error(self, exc: grpc.RpcError) -> bool:
        """Returns True when the stream should be reopened at once."""
        code = exc.code() if hasattr(exc, "code") else None
        detail = exc.details() if hasattr(exc, "details") else str(exc)
        if self._stop.is_set():
            return False
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            seq = None
            for key, value in (exc.trailing_metadata() or ()):
                if key == REJECTED_SEQ_KEY:
                    seq = int(value)
            if seq is not None:  # never resend an invalid batch; resend the rest
                self._on_ack(pb.BatchAck(seq=seq, status=pb.BatchAck.REJECTED, error=detail))
                return True
        # a stream that delivered acks was accepted: its reset is the analyzer going away (kill -9), not a
        # refused certificate (found in a trial: every agent logged one at level error)
        explained = explain_failure(exc, self.config.target, self._security, established=self.connected) \
            if code is not None else None
        message = explained or f"{code}: {detail}"
        if self.connected or self.last_error != message:      # once per distinct failure, not per retry
            if explained:
                log.error("analyzer refused the uplink, buffering", analyzer=self.config.target,
                          error=explained, buffered=self.buffered)
            else:
                log.warning("analyzer unavailable, buffering", analyzer=self.config.target,
                            code=str(code), error=detail, buffered=self.buffered)
        with self._lock:
            self.last_error = message
        return False

    def stats(self) -> dict:
        with self._lock:
            oldest = next(iter(self._unacked.values()))[2] if self._unacked else \
                (self._pending[0].t if self._pending else None)
            return dict(connected=self.connected, dropped_samples=self.dropped, batches_sent=self.sent,
                        batches_acked=self.acked, batches_rejected=self.rejected,
                        unacked_samples=len(self._pending) + self._unacked_samples, last_error=self.last_error,
                        # how far the analyzer's copy is behind: the oldest sample not yet acknowledged
                        send_lag_seconds=max(time.time() - oldest, 0.0) if oldest is not None else 0.0)


def _batch_take(pending, most: int) -> tuple[int, dict[str, str]]:
    """How many of the oldest pending samples the next batch takes: at most
    `most`, and fewer when their processes would pass MAX_BATCH_PROCESSES,
    their distinct command lines MAX_BATCH_COMMAND_CHARS, or their estimated
    size MAX_BATCH_BYTES (a host with many processes on each GPU, or many
    short-lived ones, catching up). Always at least one. Also the command
    lines as sent, redacted (which may lengthen them), for encode_batch."""
    processes = size = chars = 0
    sent: dict[str, str] = {}
    for i, smp in enumerate(itertools.islice(pending, most)):
        processes += len(smp.processes)
        # a sample's time, GPU and values; each process's numbers and command line
        size += 12 + 9 * len(smp.values)
        for p in smp.processes:
            line = sent.get(p.command)
            if line is None:
                line = sent[p.command] = redact_command(p.command)
                chars += len(line)
            size += 40 + 4 * len(line)
        if i and (processes > MAX_BATCH_PROCESSES or size > MAX_BATCH_BYTES or chars > MAX_BATCH_COMMAND_CHARS):
            return i, sent
    return min(len(pending), most), sent
