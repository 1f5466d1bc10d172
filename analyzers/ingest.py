"""Validation and decoding of SampleBatch messages into Arrow tables.

Every check names the field at fault, so an agent operator can find the bug
from the INVALID_ARGUMENT message alone. Decoding is zero-copy where the wire
allows: the f64le columns and LSB-first validity bitmaps are Arrow's own
buffer layout.

Every integer and string is checked here against the store's column types
and the limits below, because a value that passes here and then fails inside
DuckDB fails the whole commit group, other agents' batches with it; and a
string is copied per sample, per reply and per log line, so its length is
what decides memory. Error messages echo at most a short prefix of a bad
string, for the same reason.

Strings are measured in UTF-8 bytes (what memory and the wire pay). The
agent's own strings (host, ids, device facts, health details) are refused
when too long or when they hold control or invisible characters: that is a
bug of the agent, and truncating would hide it. A process's command line is
the exception: it is whatever a user on the GPU host typed (/proc cmdline
can be megabytes), so refusing it would let any user drop the host's
batches. The agent cuts it at 256 characters where it reads it, and it is
cleaned here (see `clean_command`); only one longer than cleaning reads
(MAX_WIRE_COMMAND_CHARS), which no agent of ours sends, is refused. Attribution labels
(pod, Slurm job, user, ...) come from users' text too (environ, cgroup
names), but the agent cuts and cleans them where it reads them
(collectors/attribution.py): one that is too long or unprintable here is
the agent's bug, and refused like its other strings.

How many bytes a batch may take on the wire is checked before any of this,
before it takes byte budget (analyzers/batch_size.py).
"""
from __future__ import annotations

import hashlib
import math
import re
import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import numpy as np
import pyarrow as pa

from gpuscope.collectors import catalogue as cat
from gpuscope.collectors.records import ATTRIBUTION_FIELDS, MAX_ATTRIBUTION_BYTES, pod_job
from gpuscope.security.redact import redact_command
from gpuscope.v1 import samples_pb2 as pb

# -- sizes of one batch ----------------------------------------------------------------
MAX_BATCH_SAMPLES = 200_000
MAX_DEVICES = 256                # the largest hosts hold 16 GPUs; 8 GPUs x 7 MIG instances is 56
MAX_PROCESSES = 131_072          # 32 processes per sample at the agent's 4,096-sample batches
MAX_HEALTH_EVENTS = 10_000       # ten XID storms as the agent drains them (1,000 per slow tick)

# -- times ---------------------------------------------------------------------------
MAX_FUTURE_SKEW_S = 120.0        # agent clocks ahead of ours by more than this: reject
# An agent catching up after a day's outage is accepted; a recording of 2009,
# a clock that never synced, or `t = 1.0` is not a live sample.
MAX_AGE_S = 7 * 86_400.0

# -- numbers (the store's INTEGER and BIGINT columns, and physics) -------------------
BIGINT_MAX = 2**63 - 1           # seq, dropped_samples, codes and byte counts: keeps any SQL arithmetic safe
MAX_GPU_INDEX = 1023             # NVML indices are small; fits the INTEGER gpu columns with room to spare
MAX_PID = 4_194_304              # Linux's PID_MAX_LIMIT: no kernel hands out a larger pid
MAX_PCIE_GENERATION = 16         # PCIe 7 is current; absent (never 0) when the driver does not say
MAX_PCIE_WIDTH = 64              # lanes; x16 is usual, x32 the widest defined
MAX_POWER_LIMIT_WATTS = 10_000.0  # a whole board; B200 is 1,200 W
MAX_CAPTURE_DURATION_MS = 3_600_000  # an hour; the agent caps traces at 60 s. Fits INTEGER.

# -- strings (UTF-8 bytes) -----------------------------------------------------------
MAX_HOST_BYTES = 253             # a DNS name; printable, no blanks
MAX_TOKEN_LEN = 64               # boot_id, capture id: [A-Za-z0-9_-] (the agent sends 16 or 12 hex digits)
MAX_LABEL_BYTES = 256            # device uuid/name/architecture/source; capture target, status, trigger, kind
MAX_DETAIL_BYTES = 4096          # health detail, capture error: longer is refused, not cut (see module doc)
MAX_PATH_BYTES = 4096            # Linux PATH_MAX
MAX_COMMAND_BYTES = 4096         # a stored command line; longer ones are cut, ending in TRUNCATED
MAX_JOB_BYTES = MAX_COMMAND_BYTES + 32   # "pid:N " and a command line
# MAX_ATTRIBUTION_BYTES (256, collectors/records.py): each label of an attribution (a pod
# name is at most 253, a namespace or container name 63, a container id 64 hex digits);
# a batch holds at most MAX_PROCESSES attributions, one per distinct process and GPU
TRUNCATED = " <truncated>"
# Cleaning reads 1 KiB past the cut, so that a secret the cut would split is
# still recognised whole (a URL password needs its '@').
_CLEANED_CHARS = MAX_COMMAND_BYTES + 1024
# Distinct command-line text one batch may make us clean (characters, each
# command at most MAX_WIRE_COMMAND_CHARS): redaction costs up to ~0.25 us a
# character, so this bounds one batch to ~0.25 s of CPU. The agent cuts
# commands at 256 characters: 4,096 different processes fit.
MAX_COMMAND_CHARS = 1 << 20
# The most characters of one command line a batch may carry: what cleaning
# reads. The agent cuts at 256 (collectors/procstat.py), so a longer one is
# the sender's bug, refused like its other strings (analyzers/batch_size.py).
MAX_WIRE_COMMAND_CHARS = _CLEANED_CHARS

METRIC_NAMES = cat.NAMES
_HEALTH_NAMES = {v: k.removeprefix("HEALTH_KIND_").lower() for k, v in pb.HealthKind.items()}
_TOKEN = re.compile(r"[A-Za-z0-9_-]+")


class BatchError(ValueError):
    """An invalid batch; str() names the field."""


@dataclass
class ProcessRows:
    """A batch's process samples as columns. Plain lists and arrays, not an
    Arrow table: a decoded batch crosses a pipe to the analysis process, and
    pickling a table cost more than the rest of the batch together
    (docs/benchmarks.md); the writer makes one table per commit group."""
    host: str
    gpu: np.ndarray                      # int32
    t: np.ndarray                        # float64
    pid: list[int]
    used_memory_bytes: list[int | None]
    cpu_cores: list[float | None]
    command: list[str]                   # cleaned and redacted
    attribution: list[int | None] = field(default_factory=list)   # per row: index into attributions
    attributions: list[tuple[str | None, ...]] = field(default_factory=list)   # ATTRIBUTION_FIELDS, None: unknown

    @staticmethod
    def table(rows: list["ProcessRows"]) -> pa.Table:
        """The `processes` rows of several batches, in one table."""
        def joined(name: str) -> list:
            return [v for r in rows for v in getattr(r, name)]

        def labels(k: int) -> list:
            return [r.attributions[i][k] if i is not None else None for r in rows
                    for i in (r.attribution or [None] * len(r.pid))]
        return pa.table({
            # typed: an untyped pa.array tries (and fails) to import dateutil, per call
            "host": pa.array([r.host for r in rows for _ in r.pid], pa.string()),
            "gpu": pa.array(np.concatenate([r.gpu for r in rows]), pa.int32()),
            "t": pa.array(np.concatenate([r.t for r in rows]), pa.float64()),
            "pid": pa.array(joined("pid"), pa.int64()),
            "used_memory_bytes": pa.array(joined("used_memory_bytes"), pa.int64()),
            "cpu_cores": pa.array(joined("cpu_cores"), pa.float64()),
            "command": pa.array(joined("command"), pa.string()),
            **{name: pa.array(labels(k), pa.string()) for k, name in enumerate(ATTRIBUTION_FIELDS)},
        })


class DeviceFacts(NamedTuple):
    """A batch's device entry (pb.Device) as plain values: a decoded batch
    crosses the pipe to the analysis process, and protobuf messages pickle
    by serializing and parse again on the other side (3,200 a second at
    2,000 agents)."""
    gpu: int
    uuid: str
    name: str
    architecture: str
    memory_total_bytes: int | None
    power_limit_watts: float | None
    pcie_generation: int | None
    pcie_width: int | None
    gpm_supported: bool
    lost: bool
    source: str = ""                 # where its samples come from (an older agent sends none)
    pcie_max_generation: int | None = None
    pcie_max_width: int | None = None
    driver_version: str = ""
    pcie_busy_generation: int | None = None
    pcie_busy_width: int | None = None


@dataclass
class DecodedBatch:
    host: str
    boot_id: str
    seq: int
    count: int
    t: np.ndarray
    gpu: np.ndarray
    names: tuple[str, ...]                # the catalogue metrics the batch carries, in catalogue order
    values: np.ndarray                    # samples x names, float64, NaN = missing (valid values are finite)
    processes: ProcessRows | None
    devices: list[DeviceFacts]
    health: list[tuple]                   # rows for the health table
    dropped_samples: int = 0
    job: dict[int, str] = field(default_factory=dict)   # gpu -> job of its last sample
    min_unacked_seq: int = 0              # the writer closes the seq gaps below it (0: not said)
    owner: dict[int, dict[str, str]] = field(default_factory=dict)   # gpu -> that job's attribution (known labels)
    # the GPUs of `owner` whose source named it (dcgm-exporter's pod labels), not a process: stored per
    # batch (gpu_owners), so queries group their samples by pod as findings do
    device_owned: frozenset[int] = frozenset()


# -- checks of one value -------------------------------------------------------------
def _show(s: str) -> str:
    """A bad string as an error message may quote it: never all of it."""
    return repr(s[:40]) + ("..." if len(s) > 40 else "")


def _int(where: str, value: int, lo: int, hi: int, why: str) -> None:
    if not lo <= value <= hi:
        raise BatchError(f"{where}: {value} is outside [{lo}, {hi}] ({why})")


def _bigint(where: str, value: int) -> None:
    _int(where, value, 0, BIGINT_MAX, "the store's BIGINT range")


def _time(where: str, v: float, now: float) -> None:
    """A sample or event time: within the window around the analyzer's clock."""
    # :g, never :f: a time of 1e300 must not print as 300 digits
    if not math.isfinite(v):
        raise BatchError(f"{where}: {v!r} is not a Unix time")
    if v > now + MAX_FUTURE_SKEW_S:
        raise BatchError(f"{where}: {v!r} is {v - now:.6g} s in the future, more than MAX_FUTURE_SKEW_S = "
                         f"{MAX_FUTURE_SKEW_S:g} s (check the agent host's clock)")
    if v < now - MAX_AGE_S:
        raise BatchError(f"{where}: {v!r} is {(now - v) / 86_400:.6g} days old, more than MAX_AGE_S = "
                         f"{MAX_AGE_S / 86_400:g} days (not a live sample: a recording, or a clock that never synced)")


def _times(where: str, t: np.ndarray, now: float) -> None:
    bad = ~((t >= now - MAX_AGE_S) & (t <= now + MAX_FUTURE_SKEW_S))   # NaN fails both
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        _time(f"{where}[{i}]", float(t[i]), now)


def _token_problem(s: str) -> str | None:
    return None if _TOKEN.fullmatch(s) else "may hold only A-Z, a-z, 0-9, '_' and '-'"


def _label_problem(s: str) -> str | None:
    return None if s.isprintable() else "holds a control or invisible character"


def _host_problem(s: str) -> str | None:
    if not s.isprintable() or any(c.isspace() for c in s):
        return "holds a blank, control or invisible character (a host name is one printable word)"
    return None


def _text_problem(s: str) -> str | None:
    """Free text: printable, and lines and tabs are allowed."""
    return _label_problem(s.replace("\n", " ").replace("\t", " "))


def _string(where: str, s: str, max_bytes: int, problem: Callable[[str], str | None],
            required: bool = False) -> None:
    if not s:
        if required:
            raise BatchError(f"{where}: empty")
        return
    # characters <= UTF-8 bytes <= 4 x characters: encode only when it can matter
    if len(s) > max_bytes or (4 * len(s) > max_bytes and len(s.encode()) > max_bytes):
        raise BatchError(f"{where}: longer than {max_bytes} bytes of UTF-8 ({len(s)} characters)")
    bad = problem(s)
    if bad:
        raise BatchError(f"{where}: {_show(s)} {bad}")


def _count(where: str, n: int, most: int) -> None:
    if n > most:
        raise BatchError(f"{where}: {n} entries, at most {most}")


# -- the batch ---------------------------------------------------------------------
def check_length(name: str, data: bytes, itemsize: int, n: int) -> None:
    """An array's bytes against `count` (batch_size.py checks them before decoding)."""
    if len(data) != n * itemsize:
        raise BatchError(f"{name}: {len(data)} bytes, expected {n * itemsize} for count={n}")


def _array(name: str, data: bytes, itemsize: int, n: int, dtype: str) -> np.ndarray:
    check_length(name, data, itemsize, n)
    return np.frombuffer(data, dtype=dtype)


def decode_counted(batch: pb.SampleBatch, count_rejected: Callable[[pb.SampleBatch, str], None]) -> DecodedBatch:
    """`decode`, with a refusal handed to `count_rejected` (which counts and
    logs it) before BatchError goes on to the caller. Any thread."""
    try:
        return decode(batch)
    except ValueError as exc:
        count_rejected(batch, str(exc))
        raise


def decode(batch: pb.SampleBatch, now: float | None = None) -> DecodedBatch:
    """Validates every field of the batch and decodes it. `now`, the
    analyzer's clock, anchors the window sample times must lie in."""
    now = time.time() if now is None else now
    _check_header(batch)
    n = batch.count
    t = _array("t_f64le", batch.t_f64le, 8, n, "<f8")
    gpu = _array("gpu_u32le", batch.gpu_u32le, 4, n, "<u4")
    _times("t_f64le", t, now)
    known, facts = _devices(batch)
    if n:
        unknown = set(np.unique(gpu).tolist()) - known
        if unknown:
            raise BatchError(f"gpu_u32le: GPU {sorted(unknown)[0]} has samples but no entry in devices")
    names, values = _columns(batch, n)
    attributions = _attributions(batch)
    procs = _process_columns(batch, n)
    _check_health(batch, known, now)
    processes, job, owner = _processes(batch.host, procs, t, gpu, attributions)
    device_owned = _gpu_owners(batch, attributions, job, owner)
    # a kind this analyzer does not know (a newer agent's) is kept by its number, not refused: refusing
    # would drop the batch's samples with it, and calling it "unspecified" would hide what it was
    health = [(batch.host, h.gpu, h.t, _HEALTH_NAMES.get(h.kind) or f"kind_{h.kind}", h.detail,
               h.code if h.HasField("code") else None) for h in batch.health]
    return DecodedBatch(batch.host, batch.boot_id, batch.seq, n, t, gpu, names, values, processes,
                        facts, health, batch.dropped_samples, job,
                        batch.min_unacked_seq, owner, device_owned)


def _gpu_owners(batch: pb.SampleBatch, attributions: list[tuple[str | None, ...]], job: dict[int, str],
                owner: dict[int, dict[str, str]]) -> frozenset[int]:
    """A GPU with no process seen whose source names its owner (dcgm-exporter's
    pod labels: it lists no processes) takes that owner as its job's: the
    pod, as `findings --pod` and `top --by pod` ask for it."""
    named = set()
    for d in batch.devices:
        if d.HasField("attribution") and d.gpu not in job:
            labels = {k: v for k, v in zip(ATTRIBUTION_FIELDS, attributions[d.attribution]) if v is not None}
            if labels.get("pod"):
                job[d.gpu] = pod_job(labels.get("namespace", ""), labels["pod"], labels.get("container", ""))
                owner[d.gpu] = labels
                named.add(d.gpu)
    return frozenset(named)


def _facts(d: pb.Device) -> "DeviceFacts":
    opt = lambda f: getattr(d, f) if d.HasField(f) else None  # noqa: E731
    return DeviceFacts(d.gpu, d.uuid, d.name, d.architecture, opt("memory_total_bytes"), opt("power_limit_watts"),
                       opt("pcie_generation"), opt("pcie_width"), d.gpm_supported, d.lost, d.source,
                       opt("pcie_max_generation"), opt("pcie_max_width"), d.driver_version,
                       opt("pcie_busy_generation"), opt("pcie_busy_width"))


def _check_header(batch: pb.SampleBatch) -> None:
    _string("host", batch.host, MAX_HOST_BYTES, _host_problem, required=True)
    _string("boot_id", batch.boot_id, MAX_TOKEN_LEN, _token_problem, required=True)
    _int("seq", batch.seq, 1, BIGINT_MAX, "starts at 1; the store's BIGINT range")
    _bigint("dropped_samples", batch.dropped_samples)
    # above seq it would close gaps that batches still to come will fill
    _int("min_unacked_seq", batch.min_unacked_seq, 0, batch.seq, "0, or at most this batch's seq")
    if batch.count > MAX_BATCH_SAMPLES:
        raise BatchError(f"count: {batch.count} samples, at most {MAX_BATCH_SAMPLES} per batch")
    _count("devices", len(batch.devices), MAX_DEVICES)
    _count("processes", len(batch.processes), MAX_PROCESSES)
    _count("health", len(batch.health), MAX_HEALTH_EVENTS)
    _count("attributions", len(batch.attributions), MAX_PROCESSES)


def _attributions(batch: pb.SampleBatch) -> list[tuple[str | None, ...]]:
    """The batch's attributions as tuples in ATTRIBUTION_FIELDS order (None:
    not known), each label checked: a few per batch, one per process and GPU."""
    out = []
    for i, a in enumerate(batch.attributions):
        labels = tuple(getattr(a, name) or None for name in ATTRIBUTION_FIELDS)
        known = [v for v in labels if v is not None]
        # one check of them all (a label of 64 characters or fewer is within 256 bytes); a
        # failure goes label by label, which names the field
        if known and not (4 * max(map(len, known)) <= MAX_ATTRIBUTION_BYTES and "".join(known).isprintable()):
            for name, v in zip(ATTRIBUTION_FIELDS, labels):
                if v is not None:
                    _string(f"attributions[{i}].{name}", v, MAX_ATTRIBUTION_BYTES, _label_problem)
        out.append(labels)
    return out


# Every batch repeats its host's devices, which seldom change: each distinct
# list is checked and decoded once (a quarter of decode's time before).
_DEVICE_LISTS: dict[tuple[bytes, ...], tuple[frozenset[int], tuple["DeviceFacts", ...]]] = {}
MAX_DEVICE_LISTS = 4096     # distinct lists remembered (one per host; ~3 KB each), then all forgotten at once


def _devices(batch: pb.SampleBatch) -> tuple[frozenset[int], list["DeviceFacts"]]:
    """The GPUs the batch declares, and their facts."""
    key = tuple(d.SerializeToString() for d in batch.devices)    # one per message: no two lists share a key
    hit = _DEVICE_LISTS.get(key)
    if hit is None:
        hit = frozenset(_check_devices(batch)), tuple(_facts(d) for d in batch.devices)
        if len(_DEVICE_LISTS) >= MAX_DEVICE_LISTS:
            _DEVICE_LISTS.clear()
        _DEVICE_LISTS[key] = hit
    for i, d in enumerate(batch.devices):      # refers into this batch's attributions, so never remembered
        if d.HasField("attribution") and d.attribution >= len(batch.attributions):
            raise BatchError(f"devices[{i}].attribution: {d.attribution} is not one of the batch's "
                             f"{len(batch.attributions)} attributions")
    return hit[0], list(hit[1])


def _check_devices(batch: pb.SampleBatch) -> set[int]:
    """The GPUs the batch declares, each field checked."""
    known: set[int] = set()
    for i, d in enumerate(batch.devices):
        where = f"devices[{i}]"
        _int(f"{where}.gpu", d.gpu, 0, MAX_GPU_INDEX, "a GPU index")
        if d.gpu in known:
            raise BatchError(f"{where}.gpu: GPU {d.gpu} is listed twice")
        known.add(d.gpu)
        for name in ("uuid", "name", "architecture", "source", "driver_version"):
            _string(f"{where}.{name}", getattr(d, name), MAX_LABEL_BYTES, _label_problem)
        if d.HasField("memory_total_bytes"):
            _bigint(f"{where}.memory_total_bytes", d.memory_total_bytes)
        if d.HasField("power_limit_watts") and not 0 < d.power_limit_watts <= MAX_POWER_LIMIT_WATTS:
            raise BatchError(f"{where}.power_limit_watts: {d.power_limit_watts!r} is outside "
                             f"(0, {MAX_POWER_LIMIT_WATTS:.0f}] W")
        for name in ("pcie_generation", "pcie_max_generation", "pcie_busy_generation"):
            if d.HasField(name):
                _int(f"{where}.{name}", getattr(d, name), 1, MAX_PCIE_GENERATION, "a PCIe generation")
        for name in ("pcie_width", "pcie_max_width", "pcie_busy_width"):
            if d.HasField(name):
                _int(f"{where}.{name}", getattr(d, name), 1, MAX_PCIE_WIDTH, "PCIe lanes")
    return known


def _columns(batch: pb.SampleBatch, n: int) -> tuple[tuple[str, ...], np.ndarray]:
    """The metric columns as (names in catalogue order, samples x names
    matrix, NaN = missing), every column checked in one pass: the
    per-column path costs ~10 us a column, 33 columns a batch, and batches
    arrive thousands a second. Each field is read once (a protobuf string
    or bytes field is a new object per read) and the validity bitmaps are
    unpacked together. Only a batch with a fault takes the per-column
    path, which names the field."""
    cols = batch.columns
    metrics = tuple([c.metric for c in cols])
    data = [c.f64le for c in cols]
    valid = [c.valid for c in cols]
    ceilings = _ceilings(metrics)
    size, bitmap = 8 * n, (n + 7) // 8
    if (ceilings is None or any(len(d) != size for d in data)
            or any(v and len(v) != bitmap for v in valid)):
        return _columns_one_by_one(batch, n)
    values = np.frombuffer(bytearray(b"".join(data)), "<f8").reshape(len(cols), n)    # writable, as a copy would be
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(values) | (values < 0) | (values > ceilings[:, None])
    masked = [i for i, v in enumerate(valid) if v]
    if masked:
        mask = np.ones(values.shape, bool)
        mask[masked] = np.unpackbits(np.frombuffer(b"".join(valid[i] for i in masked), np.uint8).reshape(
            len(masked), bitmap), axis=1, count=n, bitorder="little").astype(bool)
        bad &= mask
        values = np.where(mask, values, np.nan)
    if bad.any():
        return _columns_one_by_one(batch, n)
    return _in_catalogue_order(metrics, values.T)


def _ceilings(metrics: tuple[str, ...]) -> np.ndarray | None:
    """Each metric's ceiling, or None when a metric is unknown or repeated."""
    c = _CEILINGS.get(metrics)
    if c is None:
        if len(set(metrics)) != len(metrics) or not all(m in cat.BY_NAME for m in metrics):
            return None
        c = np.array([cat.ceiling(cat.BY_NAME[m]) for m in metrics], float)
        if len(_CEILINGS) < 64:          # agents send a handful of distinct column sets
            _CEILINGS[metrics] = c
    return c


_CEILINGS: dict[tuple[str, ...], np.ndarray] = {}
_ORDER = {m: i for i, m in enumerate(METRIC_NAMES)}


def _in_catalogue_order(metrics: tuple[str, ...], values: np.ndarray) -> tuple[tuple[str, ...], np.ndarray]:
    if all(_ORDER[a] < _ORDER[b] for a, b in zip(metrics, metrics[1:])):
        return metrics, values
    o = sorted(range(len(metrics)), key=lambda i: _ORDER[metrics[i]])
    return tuple(metrics[i] for i in o), values[:, o]


def _columns_one_by_one(batch: pb.SampleBatch, n: int) -> tuple[tuple[str, ...], np.ndarray]:
    seen: dict[str, np.ndarray] = {}
    for ci, col in enumerate(batch.columns):
        seen[col.metric] = _column(f"columns[{ci}]", col, n, seen)
    metrics = tuple(seen)
    return _in_catalogue_order(metrics, np.column_stack([seen[m] for m in metrics]) if metrics
                               else np.empty((n, 0)))


def _column(base: str, col: pb.Column, n: int, seen: dict) -> np.ndarray:
    """One metric column checked: its values, NaN where missing."""
    m = cat.BY_NAME.get(col.metric)
    if m is None:
        raise BatchError(f"{base}.metric: unknown metric {_show(col.metric)} (see `gpuscope metrics`)")
    if col.metric in seen:
        raise BatchError(f"{base}.metric: {col.metric!r} appears twice")
    where = f"{base}.f64le ({col.metric})"
    values = _array(where, col.f64le, 8, n, "<f8")
    mask, full = np.ones(n, bool), values
    if col.valid:
        if len(col.valid) != (n + 7) // 8:
            raise BatchError(f"{base}.valid ({col.metric}): {len(col.valid)} bytes, expected {(n + 7) // 8}")
        mask = np.unpackbits(np.frombuffer(col.valid, np.uint8), count=n, bitorder="little").astype(bool)
        full = np.where(mask, values, np.nan)
    checks = [(~np.isfinite(values), "{v!r} is not a number (mark missing values in `valid`, never as NaN)"),
              (values < 0, "negative value {v!r}")]
    if m.kind is cat.Kind.RATIO:
        checks.append((values > cat.RATIO_CEILING, "{v!r} is not a ratio (0-1)"))
    else:
        checks.append((values > cat.ceiling(m), f"{{v!r}} {m.unit} is past any GPU's ({cat.ceiling(m):g}); "
                                             "a unit or encoding bug"))
    for bad, problem in checks:
        bad &= mask                       # what `valid` marks missing may hold anything
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise BatchError(f"{where}[{i}]: " + problem.format(v=float(values[i])))
    return full


def _check_processes(batch: pb.SampleBatch, n: int) -> None:
    """Raises BatchError naming the first process field out of range."""
    distinct = {p.command for p in batch.processes}
    longest = max(distinct, key=len, default="")
    if len(longest) > MAX_WIRE_COMMAND_CHARS:
        i = next(i for i, p in enumerate(batch.processes) if p.command == longest)
        raise BatchError(f"processes[{i}].command: {len(longest)} characters, at most {MAX_WIRE_COMMAND_CHARS} "
                         f"(the agent cuts command lines at 256)")
    chars = sum(map(len, distinct))
    if chars > MAX_COMMAND_CHARS:
        raise BatchError(f"processes[].command: {chars} characters of distinct command lines, "
                         f"at most {MAX_COMMAND_CHARS} per batch")
    for pi, p in enumerate(batch.processes):
        where = f"processes[{pi}]"
        if p.sample >= n:
            raise BatchError(f"{where}.sample: {p.sample} >= count {n}")
        _int(f"{where}.pid", p.pid, 1, MAX_PID, "a Linux pid")
        if p.HasField("used_memory_bytes"):
            _bigint(f"{where}.used_memory_bytes", p.used_memory_bytes)
        if p.HasField("cpu_cores") and not (math.isfinite(p.cpu_cores) and p.cpu_cores >= 0):
            raise BatchError(f"{where}.cpu_cores: {p.cpu_cores!r} is not a CPU share (finite, >= 0)")
        if p.HasField("attribution") and p.attribution >= len(batch.attributions):
            raise BatchError(f"{where}.attribution: {p.attribution} >= {len(batch.attributions)} attributions "
                             f"in the batch")


def _check_health(batch: pb.SampleBatch, known: set[int], now: float) -> None:
    for hi, h in enumerate(batch.health):
        where = f"health[{hi}]"
        if h.gpu not in known:
            raise BatchError(f"{where}.gpu: GPU {h.gpu} has no entry in devices")
        _time(f"{where}.t", h.t, now)
        _string(f"{where}.detail", h.detail, MAX_DETAIL_BYTES, _text_problem)
        if h.HasField("code"):
            _bigint(f"{where}.code", h.code)


def clean_command(raw: str) -> str:
    """A process's command line as the analyzer stores and shows it: secrets
    redacted (security.redact), control and invisible characters shown as
    U+FFFD, at most MAX_COMMAND_BYTES of UTF-8, ending in TRUNCATED when cut.
    Cleaned, never refused (see the module doc). Redaction runs before the
    cleaning, which would otherwise hide a tab between a flag and its value."""
    head = raw[:_CLEANED_CHARS]
    text = redact_command(head)
    if not text.isprintable():
        text = "".join(c if c.isprintable() else "\ufffd" for c in text)
    data = text.encode()
    if len(data) <= MAX_COMMAND_BYTES and len(head) == len(raw):
        return text
    keep = MAX_COMMAND_BYTES - len(TRUNCATED)
    return data[:keep].decode("utf-8", "ignore") + TRUNCATED


# A host's processes repeat batch after batch: each command line is cleaned
# once (redaction's patterns were a tenth of decode's time). Kept by a digest
# of the raw line, so no unredacted secret stays in memory; only lines of the
# agent's length (it cuts at 256 characters), at most ~1 KB cleaned each, and
# all forgotten at once past the limit (2,000 agents of 8 processes: 16,000).
_CLEANED: dict[bytes, str] = {}
MAX_CLEANED = 32_768
_CLEANED_KEY_CHARS = 256


def _cleaned(raw: str) -> str:
    if len(raw) > _CLEANED_KEY_CHARS:
        return clean_command(raw)
    key = hashlib.blake2b(raw.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    text = _CLEANED.get(key)
    if text is None:
        text = clean_command(raw)
        if len(_CLEANED) >= MAX_CLEANED:
            _CLEANED.clear()
        _CLEANED[key] = text
    return text


def _process_columns(batch: pb.SampleBatch, n: int) -> tuple[list, ...] | None:
    """The processes as columns (sample, pid, used_memory_bytes, cpu_cores,
    command, attribution; None = not reported), read in one pass and checked
    as arrays: a batch of 5 s of 8 GPUs carries 40 of them. A batch that
    fails the check goes through _check_processes, which names the field."""
    rows = batch.processes
    if not rows:
        return None
    cols: tuple[list, ...] = ([], [], [], [], [], [])
    sample, pid, mem, cpu, command, owner = (c.append for c in cols)
    for p in rows:       # presence is asked only of a zero: HasField was a third of this loop
        sample(p.sample)
        pid(p.pid)
        m, c, a = p.used_memory_bytes, p.cpu_cores, p.attribution
        mem(m if m or p.HasField("used_memory_bytes") else None)
        cpu(c if c or p.HasField("cpu_cores") else None)
        command(p.command)
        owner(a if a or p.HasField("attribution") else None)
    mems = [m for m in cols[2] if m is not None]
    cpus = np.array([c for c in cols[3] if c is not None], float)
    owners = [a for a in cols[5] if a is not None]
    if (max(cols[0]) >= n or min(cols[1]) < 1 or max(cols[1]) > MAX_PID or (mems and max(mems) > BIGINT_MAX)
            or not np.all(np.isfinite(cpus) & (cpus >= 0))
            or (owners and max(owners) >= len(batch.attributions))
            or max(map(len, distinct := set(cols[4]))) > MAX_WIRE_COMMAND_CHARS
            or sum(map(len, distinct)) > MAX_COMMAND_CHARS):
        _check_processes(batch, n)
    return cols


def _processes(host: str, cols: tuple[list, ...] | None, t: np.ndarray, gpu: np.ndarray,
               attributions: list[tuple[str | None, ...]]
               ) -> tuple[ProcessRows | None, dict[int, str], dict[int, dict[str, str]]]:
    """The process rows, and for each GPU its job (the process holding the
    most memory at the latest sample) and that job's attribution."""
    if cols is None:
        return None, {}, {}
    sample, pid, mem, cpu, raw, owner = cols
    cleaned = {c: _cleaned(c) for c in set(raw)}     # a process repeats in every sample
    commands = [cleaned[c] for c in raw]
    idx = np.array(sample, np.int64)
    g_rows, t_rows = gpu[idx].astype(np.int32), t[idx]
    job: dict[int, tuple[float, int, str, int | None]] = {}
    for g, ts, m, p, command, a in zip(g_rows.tolist(), t_rows.tolist(), mem, pid, commands, owner):
        m = m or 0
        cur = job.get(g)
        if cur is None or ts > cur[0] or (ts == cur[0] and m > cur[1]):
            job[g] = (ts, m, f"pid:{p}" + (f" {command}" if command else ""), a)
    labels: dict[int, dict[str, str]] = {}               # one dict per attribution, shared by its GPUs
    for _, _, _, a in job.values():
        if a is not None and a not in labels:
            labels[a] = {k: v for k, v in zip(ATTRIBUTION_FIELDS, attributions[a]) if v is not None}
    rows = ProcessRows(host, g_rows, t_rows, pid, mem, cpu, commands,
                       owner if attributions else [], attributions)
    return (rows, {g: v[2] for g, v in job.items()},
            {g: labels[v[3]] for g, v in job.items() if v[3] is not None})


# -- captures ------------------------------------------------------------------------
def validate_capture_record(record: pb.CaptureRecord, now: float | None = None) -> None:
    """Checks a CaptureRecord of ReportCapture as decode checks a batch;
    raises BatchError naming the field. The job is checked for length only:
    it is a command line, and whoever stores it cleans it (clean_command)."""
    now = time.time() if now is None else now
    _string("record.id", record.id, MAX_TOKEN_LEN, _token_problem, required=True)
    _string("record.host", record.host, MAX_HOST_BYTES, _host_problem, required=True)
    for name in ("target", "status", "trigger", "kind"):
        _string(f"record.{name}", getattr(record, name), MAX_LABEL_BYTES, _label_problem)
    _string("record.path", record.path, MAX_PATH_BYTES, _label_problem)
    _string("record.error", record.error, MAX_DETAIL_BYTES, _text_problem)
    _string("record.job", record.job, MAX_JOB_BYTES, lambda s: None)
    if record.HasField("pid"):
        _int("record.pid", record.pid, 1, MAX_PID, "a Linux pid")
    _count("record.gpus", len(record.gpus), MAX_DEVICES)
    for i, g in enumerate(record.gpus):
        _int(f"record.gpus[{i}]", g, 0, MAX_GPU_INDEX, "a GPU index")
    _time("record.start", record.start, now)
    if not (math.isfinite(record.end) and record.start <= record.end <= now + MAX_FUTURE_SKEW_S):
        raise BatchError(f"record.end: {record.end!r} is not between record.start ({record.start!r}) "
                         f"and {MAX_FUTURE_SKEW_S:.0f} s past the analyzer's clock")
    _int("record.duration_ms", record.duration_ms, 0, MAX_CAPTURE_DURATION_MS, "at most an hour")
    _bigint("record.size_bytes", record.size_bytes)
