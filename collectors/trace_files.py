"""Finds and opens a trace: an `.xplane.pb`, a Chrome trace JSON, or a
profile directory (then its newest run, preferring the XSpace; of a torch
profiler's directory, the newest session's largest trace).

A trace is one profiling session of one host, whatever number of files the
profiler wrote for it: JAX writes `plugins/profile/<run>/<host>.xplane.pb`,
`<host>.trace.json.gz` and `perfetto_trace.json.gz`, the same events three
times, the XSpace with the most detail (HLO, costs); torch writes one
`*.pt.trace.json[.gz]` per rank and session.

Whatever the path or the bytes, these return a Trace or raise TraceError
naming the file and what is wrong with it."""
from __future__ import annotations

import gzip
import re
from dataclasses import dataclass
from pathlib import Path

from .chrome_trace_reader import parse_chrome_trace
from .trace_model import Trace
from .xspace_reader import MAX_TRACE_BYTES, TraceError, parse_xspace

# by name, how parse_trace reads a file (a trace found by content may be named anything .json)
JSON_SUFFIXES = (".trace.json.gz", ".trace.json", "perfetto_trace.json.gz", ".pt.trace.json.gz", ".json.gz", ".json")
# the names profilers give their traces, in order of preference for one session and host
XSPACE, TRACE_JSON = ".xplane.pb", (".trace.json.gz", ".trace.json")        # .pt.trace.json[.gz] among them
PERFETTO = ("perfetto_trace.json.gz", "perfetto_trace.json")               # one per JAX run, no host in its name
JAX_RUN = re.compile(r"\d{4}(_\d\d){5}")                                   # JAX names runs YYYY_MM_DD_HH_MM_SS

SESSION_S = 120.0     # trace files written this close to the newest one are taken as its session


@dataclass(frozen=True)
class Profile:
    """One profiling session of one host: the file read, and the others
    holding the same events (in less detail), not read."""
    path: Path
    same: tuple[Path, ...] = ()


def resolve(path: str | Path) -> Path:
    """The trace to read at `path`: the file itself, or in a directory the
    newest run's XSpace, else its newest session's largest trace JSON."""
    return traces_at(path)[0]


def traces_at(path: str | Path) -> list[Path]:
    """The file read of every trace at `path`, the one `resolve` reads first."""
    return [p.path for p in profiles_at(path)]


def profiles_at(path: str | Path) -> list[Profile]:
    """Every trace at `path` (one a session and host), newest session first."""
    p = Path(path)
    try:
        if not p.exists():
            raise TraceError(f"{p}: no such file or directory")
        if p.is_file():
            _refuse_a_recording(p)
            return [Profile(p)]
        if not p.is_dir():
            raise TraceError(f"{p}: neither a file nor a directory (a pipe or a device?)")
        candidates = [f for f in p.rglob("*") if f.is_file() and _looks_like_a_trace(f)]
        stats = {f: f.stat() for f in candidates}
    except TraceError:
        raise                                              # already says what is wrong
    except (OSError, ValueError, RecursionError) as exc:   # name too long, a NUL in it, unreadable or too deep
        raise TraceError(f"{p}: cannot be searched ({type(exc).__name__}: {exc})") from None
    if not candidates:
        raise TraceError(f"{p}: no .xplane.pb or trace JSON below it")
    profiles = _by_session_and_host(candidates)
    newest = {}                                   # run directory -> its newest file's time
    for f in candidates:
        newest[f.parent] = max(newest.get(f.parent, 0.0), stats[f].st_mtime)

    def run_order(d: Path) -> tuple:
        return (d.name if JAX_RUN.fullmatch(d.name) else "", newest[d], str(d))
    runs = {d: i for i, d in enumerate(sorted(newest, key=run_order, reverse=True))}

    # A torch profiler (vLLM, SGLang) writes every session into one directory, each rank's worker trace
    # beside the API server's: the newest session's largest file is the one with the GPU's kernels.
    def order(pr: Profile) -> tuple:
        f = pr.path
        st = stats[f]
        recent = newest[f.parent] - st.st_mtime <= SESSION_S
        return (runs[f.parent], not f.name.endswith(XSPACE), not recent,
                -st.st_size if recent else -st.st_mtime, f.name)
    return sorted(profiles, key=order)


def _looks_like_a_trace(f: Path) -> bool:
    """By the names profilers write; a bare .json[.gz] by its first bytes (a
    Chrome trace's object or array), so a model's config.json is not one."""
    name = f.name
    if name.endswith((XSPACE, *TRACE_JSON, *PERFETTO)):
        return True
    if not name.endswith((".json", ".json.gz")):
        return False
    try:
        with (gzip.open(f, "rb") if name.endswith(".gz") else open(f, "rb")) as fh:
            head = fh.read(256)
    except (OSError, EOFError):
        return False
    head = head.removeprefix(b"\xef\xbb\xbf").lstrip()
    return head.startswith(b"[") or re.match(rb'\{\s*"(traceEvents|displayTimeUnit)"', head) is not None


def _by_session_and_host(files: list[Path]) -> list[Profile]:
    """One Profile per run directory and host, reading its XSpace, else its
    trace JSON, else the perfetto trace; other files are each their own."""
    groups: dict[tuple[Path, str], list[Path]] = {}
    perfetto = []
    for f in files:
        host = _host(f.name)
        if f.name in PERFETTO:
            perfetto.append(f)
        else:                                  # a bare trace JSON is its own
            groups.setdefault((f.parent, host) if host is not None else (f.parent, None, f.name), []).append(f)
    for f in perfetto:
        # the run's own copy of its host's events; with several hosts in the run, whose is not said
        hosts = [k for k in groups if k[0] == f.parent and _host(groups[k][0].name) is not None]
        groups.setdefault(hosts[0] if len(hosts) == 1 else (f.parent, f.name), []).append(f)
    out = []
    for group in groups.values():
        group.sort(key=lambda f: (_preference(f.name), f.name))
        out.append(Profile(group[0], tuple(group[1:])))
    return out


def _host(name: str) -> str | None:
    """`vm` of `vm.xplane.pb` and `vm.trace.json.gz`; None for other names."""
    for suffix in (XSPACE, *TRACE_JSON):
        if name.endswith(suffix) and name not in PERFETTO:
            return name[: -len(suffix)]
    return None


def _preference(name: str) -> int:
    return 0 if name.endswith(XSPACE) else 1 if name.endswith(TRACE_JSON) else 2


def _refuse_a_recording(p: Path) -> None:
    """A CSV is a recording, not a trace: said so (the readers would call it
    'not an XSpace protobuf'). An XSpace starts with a newline byte (its
    planes' tag), so a first line of comma-separated words never is one."""
    try:
        with (gzip.open(p, "rb") if p.name.endswith(".gz") else open(p, "rb")) as fh:
            head = fh.read(4096)
    except (OSError, EOFError):
        return                                             # the reader says what is wrong with it
    first = head.removeprefix(b"\xef\xbb\xbf").split(b"\n", 1)[0].rstrip(b"\r")
    csv_like = (b"," in first and first[:1] not in (b"{", b"[") and first.isascii()
                and all(32 <= c < 127 or c == 9 for c in first))
    if p.name.endswith((".csv", ".csv.gz")) or csv_like:
        raise TraceError(f"{p}: not a trace: a CSV, a recording of samples? (gpuscope classify reads "
                         f"recordings: docs/recordings.md; traces are .xplane.pb or trace JSON)")


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
