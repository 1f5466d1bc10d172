"""Finds and opens a trace: an `.xplane.pb`, a Chrome trace JSON, or a
profile directory (then its newest run, preferring the XSpace)."""
from __future__ import annotations

from pathlib import Path

from .chrome_trace_reader import parse_chrome_trace
from .trace_model import Trace
from .xspace_reader import TraceError, parse_xspace

JSON_SUFFIXES = (".trace.json.gz", ".trace.json", "perfetto_trace.json.gz", ".pt.trace.json.gz", ".json.gz", ".json")


def resolve(path: str | Path) -> Path:
    p = Path(path)
    if not p.exists():
        raise TraceError(f"{p}: no such file or directory")
    if p.is_file():
        return p
    candidates = [f for f in p.rglob("*") if f.is_file() and (f.name.endswith(".xplane.pb") or f.name.endswith(JSON_SUFFIXES))]
    if not candidates:
        raise TraceError(f"{p}: no .xplane.pb or trace JSON below it")
    newest_run = max(c.parent for c in candidates)   # runs are named by timestamp: YYYY_MM_DD_HH_MM_SS
    runs = [c for c in candidates if c.parent == newest_run] or candidates
    runs.sort(key=lambda f: (not f.name.endswith(".xplane.pb"), f.name))
    return runs[0]


def parse_trace(data: bytes, source: str) -> Trace:
    """XSpace or trace JSON, by name and, failing that, by content."""
    if source.endswith(".xplane.pb") or (not source.endswith(JSON_SUFFIXES) and data[:1] not in (b"{", b"[", b"\x1f")):
        return parse_xspace(data, source)
    return parse_chrome_trace(data, source)


def load_trace(path: str | Path) -> Trace:
    p = resolve(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise TraceError(f"{p}: {exc.strerror}") from None
    return parse_trace(data, str(p))
