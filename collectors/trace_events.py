"""Trace-event JSON decoded into the few fields the reader uses, fast and in
bounded memory.

A torch (Kineto) trace of a 2 s vLLM capture is ~40 MB of gzip and ~650 MB
of JSON with over two million events; `json.loads` of it builds ~4 GB of
Python dicts. Here msgspec decodes each event into a small typed struct,
skipping every field the analysis does not read (5x faster than json.loads,
a sixth of the memory), and a Kineto file, whose writer puts every event
of `traceEvents` on a line of its own that starts with two spaces and `{`,
is decompressed and decoded a slice of events at a time, so its JSON text
is never whole in memory.

What does not fit the types (an `args` that is not an object, a file
laid out otherwise) is decoded the tolerant way (`json.loads`), and the
reader skips and counts what it cannot use, as before.
"""
from __future__ import annotations

import json
import queue
import threading
import zlib
from typing import Any, Callable

import msgspec

PIECE_BYTES = 16 << 20          # decompressed per step of a Kineto file
_EVENT_LINE = b"\n  {"           # Kineto: each event of traceEvents starts a line with two spaces
_ARRAY_END = b"\n  ]"


class Args(msgspec.Struct, gc=False):
    name: Any = None                 # process_name / thread_name metadata
    labels: Any = None               # process_labels metadata (Kineto >= torch 2.x: "GPU 0")
    hlo_op: Any = None
    program_id: Any = None
    hlo_module: Any = None
    memcpy_details: Any = None
    Memset_details: Any = None
    bytes: Any = None
    correlation_id: Any = None
    correlation: Any = None


class Event(msgspec.Struct, gc=False):
    ph: Any = None
    name: Any = ""
    cat: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = 0
    args: Any = None                 # Args, None, or BAD_ARGS (an args that is not an object)


class Meta(msgspec.Struct):
    deviceProperties: Any = None
    baseTimeNanoseconds: Any = None
    host_name: Any = None


class TypedEvent(msgspec.Struct, gc=False):
    """An event as the usual writers give it: what does not fit these types
    sends the file to the tolerant path. The reader checks nothing more of a
    slice of these than ts and dur (null, out of range)."""
    ph: str = ""
    name: str = ""
    cat: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | None = None
    dur: float | None = 0.0
    args: Args | None = None


class _Doc(Meta):
    traceEvents: list[TypedEvent] | None = None


BAD_ARGS = Args()                    # the marker of an event whose args is not an object
_EVENTS = msgspec.json.Decoder(list[TypedEvent])
_DOC = msgspec.json.Decoder(_Doc)
_META = msgspec.json.Decoder(Meta)
_ARG_KEYS = tuple(Args.__struct_fields__)


def decode_typed(raw: bytes | bytearray) -> tuple[list, Meta] | None:
    """(events, meta) of a whole document, or None when it does not fit the
    types (then decode_tolerant)."""
    try:
        if raw.lstrip()[:1] == b"[":
            return _EVENTS.decode(raw), Meta()
        doc = _DOC.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return None
    if doc.traceEvents is None:
        return None
    return doc.traceEvents, doc


def decode_tolerant(doc: Any) -> tuple[list, Meta] | None:
    """(events, meta) of a document json.loads read: events that are not
    objects become None, an args that is not an object BAD_ARGS. None when
    there is no traceEvents array."""
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc if isinstance(doc, list) else None
    if not isinstance(events, list):
        return None
    meta = Meta(*(doc.get(k) for k in Meta.__struct_fields__)) if isinstance(doc, dict) else Meta()
    return tolerant_events(events), meta


def tolerant_events(events: list) -> list:
    """Events json.loads read, as Events (None for one that is not an object)."""
    out: list[Event | None] = []
    for e in events:
        if not isinstance(e, dict):
            out.append(None)
            continue
        a = e.get("args")
        args = (None if a is None else Args(*(a.get(k) for k in _ARG_KEYS)) if isinstance(a, dict) else BAD_ARGS)
        out.append(Event(e.get("ph"), e.get("name", ""), e.get("cat"), e.get("pid"), e.get("tid"), e.get("ts"),
                         e.get("dur", 0), args))
    return out


def decode_kineto_gzip(data: bytes, max_bytes: int, too_big: Callable[[], Exception],
                       consume: Callable[[list, bool], None]) -> Meta | None:
    """The meta of a gzip'd Kineto trace, its events handed to
    consume(events, typed) a slice at a time: TypedEvents, or for a slice
    that does not fit the types, Events json.loads read (typed False). None
    when the file is not laid out as Kineto writes it (then the caller
    starts again with the whole file: what consume() took is to be dropped).
    Raises too_big() past max_bytes of JSON, zlib.error on a corrupt
    stream. A thread decompresses the next piece while this one decodes
    the last (zlib lets go of the GIL; the machines are small)."""
    pieces: queue.Queue = queue.Queue(maxsize=2)
    stop = threading.Event()
    threading.Thread(target=_inflate, args=(data, max_bytes, too_big, pieces, stop), daemon=True,
                     name="trace-inflate").start()
    try:
        return _split(pieces, consume)
    finally:
        stop.set()
        while not pieces.empty():          # let the thread see `stop` rather than block on a full queue
            pieces.get_nowait()


def _inflate(data: bytes, max_bytes: int, too_big: Callable[[], Exception], pieces: queue.Queue,
             stop: threading.Event) -> None:
    """Decompressed pieces, then None at the end (or the exception that ended it)."""
    try:
        d = zlib.decompressobj(wbits=31)
        rest, total = data, 0
        while not d.eof and not stop.is_set():
            if not rest:
                raise zlib.error("ends before the end of its stream")
            piece = d.decompress(rest, PIECE_BYTES)
            rest = d.unconsumed_tail
            total += len(piece)
            if total > max_bytes:
                raise too_big()
            pieces.put((piece, d.eof and bool(d.unused_data.strip(b"\0"))))
        pieces.put(None)
    except BaseException as exc:  # handed to the reading thread, which raises it
        pieces.put(exc)


def _split(pieces: queue.Queue, consume: Callable[[list, bool], None]) -> Meta | None:
    pending = bytearray()
    header: bytes | None = None
    while True:
        item = pieces.get()
        if isinstance(item, BaseException):
            raise item
        if item is None:
            break
        piece, more_members = item
        if more_members:
            return None                    # more gzip members: the whole-file path reads them
        pending += piece
        if header is None:
            i = pending.find(b'"traceEvents"')
            j = pending.find(b"[", i) if i >= 0 else -1
            if j < 0:
                if len(pending) > PIECE_BYTES:
                    return None            # not where Kineto puts it
                continue
            header = bytes(pending[:i])
            del pending[:j + 1]
        cut = pending.rfind(_EVENT_LINE)
        if cut > 0:
            if not _decode_into(consume, pending, cut):
                return None
            del pending[:cut]
        elif len(pending) > 2 * PIECE_BYTES:
            return None                    # no event lines: another writer's layout (compact JSON)
    if header is None:
        return None
    end = pending.rfind(_ARRAY_END)
    if end < 0 or not _decode_into(consume, pending, end):
        return None
    try:
        return _META.decode(header + b'"traceEvents": []' + bytes(pending[end + len(_ARRAY_END):]))
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None


def _decode_into(consume: Callable[[list, bool], None], buf: bytearray, end: int) -> bool:
    """The events in buf[:end] (whole events, a comma after the last), as one
    array: copied once, into the array's brackets. A slice that does not fit
    the types is read by json.loads, that slice only; False when it is not
    JSON at all."""
    while end and buf[end - 1] in b" \t\r\n":
        end -= 1
    if end and buf[end - 1] == 0x2C:       # ","
        end -= 1
    while end and buf[end - 1] in b" \t\r\n":
        end -= 1
    if not end:
        return True
    body = bytearray(b"[")
    with memoryview(buf) as view:
        body += view[:end]
    body += b"]"
    try:
        events = _EVENTS.decode(body)
    except msgspec.ValidationError:
        try:
            loose = json.loads(body)
        except (ValueError, RecursionError):
            return False
        consume(tolerant_events(loose), False)
        return True
    except (msgspec.DecodeError, RecursionError):
        return False
    consume(events, True)
    return True
