"""Finds and opens a trace: an `.xplane.pb`, a Chrome trace JSON, or a
profile directory (then its newest run, preferring the XSpace; of a torch
profiler's directory, the newest session's largest trace).

Whatever the path or the bytes, these return a Trace or raise TraceError
naming the file and what is wrong with it."""
from __future__ import annotations

from pathlib import Path

from .chrome_trace_reader import parse_chrome_trace
from .trace_model import Trace
from .xspace_reader import MAX_TRACE_BYTES, TraceError, parse_xspace

JSON_SUFFIXES = (".trace.json.gz", ".trace.json", "perfetto_trace.json.gz", ".pt.trace.json.gz", ".json.gz", ".json")


SESSION_S = 120.0     # trace files written this close to the newest one are taken as its session


def resolve(path: str | Path) -> Path:
    """The trace to read at `path`: the file itself, or in a directory the
    newest run's XSpace, else its newest session's largest trace JSON."""
    return traces_at(path)[0]


def traces_at(path: str | Path) -> list[Path]:
    """Every trace at `path`, the one `resolve` reads first."""
    p = Path(path)
    try:
        if not p.exists():
            raise TraceError(f"{p}: no such file or directory")
        if p.is_file():
            return [p]
        if not p.is_dir():
            raise TraceError(f"{p}: neither a file nor a directory (a pipe or a device?)")
        candidates = [f for f in p.rglob("*")
                      if (f.name.endswith(".xplane.pb") or f.name.endswith(JSON_SUFFIXES)) and f.is_file()]
        stats = {f: f.stat() for f in candidates}
    except (OSError, ValueError, RecursionError) as exc:   # name too long, a NUL in it, unreadable or too deep
        raise TraceError(f"{p}: cannot be searched ({type(exc).__name__}: {exc})") from None
    if not candidates:
        raise TraceError(f"{p}: no .xplane.pb or trace JSON below it")
    newest_run = max(c.parent for c in candidates)   # JAX names runs by timestamp: YYYY_MM_DD_HH_MM_SS
    newest = max(stats[c].st_mtime for c in candidates if c.parent == newest_run)

    # A torch profiler (vLLM, SGLang) writes every session into one directory, each rank's worker trace
    # beside the API server's: the newest session's largest file is the one with the GPU's kernels.
    def order(f: Path) -> tuple:
        st = stats[f]
        recent = newest - st.st_mtime <= SESSION_S
        return (f.parent != newest_run, not f.name.endswith(".xplane.pb"), not recent,
                -st.st_size if recent else -st.st_mtime, f.name)
    return sorted(candidates, key=order)


def parse_trace(data: bytes, source: str) -> Trace:
    """XSpace or trace JSON, by name and, failing that, by content."""
    source = str(source)
    if isinstance(data, (bytearray, memoryview)):
        data = bytes(data)
    if not isinstance(data, bytes):
        raise TraceError(f"{source}: expected the file's bytes, got {type(data).__name__}")
    if len(data) > MAX_TRACE_BYTES:
        raise TraceError(f"{source}: {len(data)} bytes; traces over 2 GiB are not read whole")
    if source.endswith(".xplane.pb"):
        return parse_xspace(data, source)
    if source.endswith(JSON_SUFFIXES):
        return parse_chrome_trace(data, source)
    # No telling name: by content. An XSpace starts with 0x0a (its planes' tag), which is also
    # "\n", so white space before "{" only suggests JSON; whichever reader fails, the other tries.
    head = data[:64]
    text = head.removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\r\n")[:1] in (b"{", b"[")
    json_first = head[:1] in (b"{", b"[", b"\x1f") or head.startswith(b"\xef\xbb\xbf") or (
        text and head[:1] != b"\n")
    first, second = (parse_chrome_trace, parse_xspace) if json_first else (parse_xspace, parse_chrome_trace)
    try:
        return first(data, source)
    except TraceError as exc:
        try:
            return second(data, source)
        except TraceError:
            raise exc from None


def load_trace(path: str | Path) -> Trace:
    p = resolve(path)
    try:
        size = p.stat().st_size
        if size > MAX_TRACE_BYTES:
            raise TraceError(f"{p}: {size} bytes; traces over 2 GiB are not read whole")
        data = p.read_bytes()
    except OSError as exc:
        raise TraceError(f"{p}: {exc.strerror or exc}") from None
    return parse_trace(data, str(p))
