"""Reads recordings in the format of shared/fixtures/h200-run1/samples.csv,
and dispatches the other formats to their readers: nvidia-smi's CSV
(collectors/nvidia_smi_csv.py, told by its header) and dcgm-exporter's
scrapes or Prometheus' query_range JSON (collectors/dcgm_exporter_saved.py,
told by the file's first characters).

Any subset and order of columns; `t` (Unix seconds) is required; `gpu` is
optional (absent: GPU 0); `procs` is `pid:used_bytes;...`; raw units are the
NVML ones and are normalised through the catalogue. A `phase` column, if any,
is a human label and is never read. Columns named after catalogue metrics are
taken as already normalised, so our own exports read back.
"""
from __future__ import annotations

import csv
import gzip
import io
import math
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from . import catalogue as cat
from . import dcgm_exporter_saved, nvidia_smi_csv
from .records import ProcessRecord

NEVER_READ = frozenset({"phase"})


class RecordingError(ValueError):
    """A recording that cannot be read; the message names file, line and column."""


@dataclass
class Recording:
    path: str
    t: np.ndarray                      # float64 Unix seconds, sorted
    gpu: np.ndarray                    # int64
    metrics: dict[str, np.ndarray]     # catalogue name -> float64, NaN = missing
    processes: list[tuple[ProcessRecord, ...]] = field(default_factory=list)
    ignored_columns: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)   # what was read past (a cut last line), for the user

    def __len__(self) -> int:
        return len(self.t)

    def gpus(self) -> list[int]:
        return sorted(set(self.gpu.tolist()))


def default_recording() -> Path:
    """The H200 recording shipped as demo data (phase labels removed)."""
    return Path(str(resources.files("gpuscope.collectors") / "data" / "h200-run1.csv.gz"))


def _text(path: Path) -> str:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise RecordingError(f"{path}: corrupt or truncated gzip ({exc})") from exc
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecordingError(f"{path}: not a UTF-8 text file (byte {exc.start}): not a recording "
                             "(docs/recordings.md lists the formats)") from exc


def _procs(cell: str, where: str) -> tuple[ProcessRecord, ...]:
    if not cell:
        return ()
    out = []
    for item in cell.split(";"):
        pid, sep, used = item.partition(":")
        try:
            out.append(ProcessRecord(pid=int(pid), used_memory_bytes=int(used) if sep and used not in ("", "None") else None))
        except ValueError:
            raise RecordingError(f"{where}, column procs: {item!r} is not pid:bytes") from None
    return tuple(out)


def read_recording(path: str | Path) -> Recording:
    path = Path(path)
    try:
        text = _text(path)
    except FileNotFoundError:
        raise RecordingError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise RecordingError(f"{path}: is a directory: classify reads one recording file, as does replay "
                             "(docs/recordings.md)") from None
    except OSError as exc:
        raise RecordingError(f"{path}: {exc}") from exc
    kind = dcgm_exporter_saved.sniff(text)
    if kind is not None:
        return _dcgm_exporter(path, text, kind)
    try:
        reader = csv.reader(io.StringIO(text))
        header = next(reader)
    except StopIteration:
        raise RecordingError(f"{path}: empty file, expected a CSV header with a 't' column") from None
    except (csv.Error, OSError) as exc:
        raise RecordingError(f"{path}: {exc}") from exc
    header = [h.strip() for h in header]
    if "t" not in header and nvidia_smi_csv.looks_like(header):
        return _nvidia_smi(path, header, reader)
    if "t" not in header:
        if header and re.match(r"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d", header[0]):
            raise RecordingError(f"{path}: nvidia-smi's CSV without its header (--format=csv,noheader): keep the "
                                 "header, it names the columns (docs/recordings.md)")
        raise RecordingError(f"{path}: no 't' column (Unix seconds) in the header {header[:8]}, and not nvidia-smi's "
                             "CSV either (docs/recordings.md lists the formats)")
    columns: list[tuple[int, cat.Metric, bool]] = []   # index, metric, already normalised
    ignored = []
    for i, name in enumerate(header):
        if name in NEVER_READ or name in ("t", "gpu", "procs"):
            continue
        if name in cat.BY_CSV:
            columns.append((i, cat.BY_CSV[name], False))
        elif name in cat.BY_NAME:
            columns.append((i, cat.BY_NAME[name], True))
        else:
            ignored.append(name)
    ti, gi = header.index("t"), header.index("gpu") if "gpu" in header else None
    pi = header.index("procs") if "procs" in header else None
    width = len(header)
    t: list[float] = []
    gpu: list[int] = []
    cols: dict[str, list[float]] = {m.name: [] for _, m, _ in columns}
    procs: list[tuple[ProcessRecord, ...]] = []
    nan = math.nan
    try:
        for line, row in enumerate(reader, start=2):
            if not row:
                continue
            where = f"{path}:{line}"
            if len(row) != width:
                raise RecordingError(f"{where}: {len(row)} cells where the header has {width} "
                                     "(truncated or garbled row)")
            try:
                ts = float(row[ti])
            except ValueError:
                raise RecordingError(f"{where}, column t: {row[ti]!r} is not a Unix time") from None
            if not math.isfinite(ts) or ts <= 0:
                raise RecordingError(f"{where}, column t: {row[ti]!r} is not a Unix time")
            t.append(ts)
            if gi is not None:
                try:
                    gpu.append(int(row[gi]))
                except ValueError:
                    raise RecordingError(f"{where}, column gpu: {row[gi]!r} is not a GPU index") from None
            for i, m, done in columns:
                cell = row[i]
                if cell == "" or cell == "nan" or cell == "None":
                    cols[m.name].append(nan)
                    continue
                try:
                    v = float(cell)
                except ValueError:
                    raise RecordingError(f"{where}, column {header[i]}: {cell!r} is not a number") from None
                cols[m.name].append(v if done else cat.normalise(m, v))
            if pi is not None:
                procs.append(_procs(row[pi], where))
    except csv.Error as exc:
        raise RecordingError(f"{path}: {exc}") from exc
    return _recording(path, t, gpu, cols, procs, ignored)


def _nvidia_smi(path: Path, header: list[str], reader) -> Recording:
    def error(message: str):
        raise RecordingError(message)
    warnings: list[str] = []
    try:
        t, gpu, cols, ignored = nvidia_smi_csv.read(path, header, reader, error, warnings.append)
    except csv.Error as exc:
        raise RecordingError(f"{path}: {exc}") from exc
    rec = _recording(path, t, gpu, cols, [], ignored)
    rec.warnings = warnings
    return rec


def _dcgm_exporter(path: Path, text: str, kind: str) -> Recording:
    def error(message: str):
        raise RecordingError(message)
    t, gpu, cols, ignored = dcgm_exporter_saved.read(path, text, kind, error)
    return _recording(path, t, gpu, cols, [], ignored)


def _recording(path: Path, t: list, gpu: list, cols: dict, procs: list, ignored: list) -> Recording:
    if not t:
        raise RecordingError(f"{path}: header but no samples")
    t_arr = np.asarray(t)
    order = np.argsort(t_arr, kind="stable")
    gpu_arr = np.asarray(gpu, dtype=np.int64) if gpu else np.zeros(len(t), dtype=np.int64)
    return Recording(
        path=str(path), t=t_arr[order], gpu=gpu_arr[order],
        metrics={k: np.asarray(v, dtype=np.float64)[order] for k, v in cols.items()},
        processes=[procs[i] for i in order] if procs else [() for _ in order],
        ignored_columns=ignored)
