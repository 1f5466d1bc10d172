"""A capture's trace as UploadCapture sends it: in chunks, after a first
one that carries the record and the trace's size. Assembled here within
limits, then summarized and stored as ReportCapture's would be.

Chunks keep every message an agent sends small, so the analyzer takes no
message over daemon/serve.py's MAX_RECEIVE_BYTES: receiving one is a copy
on the event loop that every agent's stream waits behind (a 100 MB message
took two thirds of the loop's time, docs/benchmarks.md).
"""
from __future__ import annotations

from gpuscope.v1 import analyzer_pb2 as apb

MAX_TRACE_BYTES = 256 << 20     # the agent's own cap on a trace (daemon/captures.py, max_trace_bytes)
MAX_CHUNK_BYTES = 1 << 20
MAX_UPLOADS = 2                 # traces being received at once: each holds up to MAX_TRACE_BYTES
MAX_OPEN_UPLOADS = 8            # receiving or waiting for a slot; more are refused at once
MAX_OPEN_UPLOADS_PER_HOST = 4   # of one host (its certificate's, under mTLS): one client cannot hold them all
# A slot is waited for this long (then UNAVAILABLE: resend later), and then
# the whole trace must arrive within the next limit (256 MiB at 4 MB/s), so
# that stalled clients cannot hold the slots and every agent's captures up.
UPLOAD_WAIT_S = 20.0
UPLOAD_RECEIVE_S = 60.0


class UploadError(ValueError):
    """The upload breaks its own rules; the message names how."""


class TraceAssembly:
    """The trace's bytes as chunks arrive, refused as soon as they break the
    size the first chunk announced."""

    def __init__(self, first: apb.CaptureChunk) -> None:
        if not first.HasField("record"):
            raise UploadError("the first chunk must carry the capture's record")
        if first.trace_bytes > MAX_TRACE_BYTES:
            raise UploadError(f"trace_bytes: {first.trace_bytes}, at most {MAX_TRACE_BYTES} "
                              f"(the agent's max_trace_bytes)")
        self.record = first.record
        self.expected = first.trace_bytes
        self._data = bytearray()
        self._chunks = 0
        self.add(first)

    def add(self, chunk: apb.CaptureChunk) -> None:
        if self._chunks and (chunk.HasField("record") or chunk.trace_bytes):
            raise UploadError(f"chunk {self._chunks}: only the first chunk carries the record and trace_bytes")
        if len(chunk.data) > MAX_CHUNK_BYTES:
            raise UploadError(f"chunk {self._chunks}: {len(chunk.data)} bytes of data, at most {MAX_CHUNK_BYTES}")
        if len(self._data) + len(chunk.data) > self.expected:
            raise UploadError(f"chunk {self._chunks}: the trace runs past the {self.expected} bytes "
                              f"its first chunk announced")
        self._data += chunk.data
        self._chunks += 1

    def trace(self) -> bytes:
        """The whole trace, once every announced byte came."""
        if len(self._data) != self.expected:
            raise UploadError(f"the upload ended after {len(self._data)} of the {self.expected} bytes "
                              f"its first chunk announced")
        return bytes(self._data)
