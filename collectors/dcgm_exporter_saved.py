"""Reads dcgm-exporter's metrics saved over time into a Recording, in the
two shapes people already keep (docs/recordings.md, "dcgm-exporter"):

- exposition: dcgm-exporter's /metrics text, scrape after scrape in one
  file, what `while sleep 1; do curl -s node:9400/metrics; done >> f` keeps;
- query_range: Prometheus' JSON answer to /api/v1/query_range over the
  DCGM_FI_* series (resultType matrix).

Fields are mapped through collectors/dcgm_fields.py; a field it does not
map is listed as ignored. A recording is one host's GPUs: series of two
hosts are refused, not merged.

Times in an exposition: a sample's own Prometheus timestamp (ms) when it
has one, else the time in the nearest comment line before it (`TIME_HELP`
says how to write them). dcgm-exporter writes no timestamps, so a plain
curl loop cannot be placed in time and is refused with the loop that can.
A scrape ends where a time comment appears or where a series (name and
labels) repeats; a scrape that began with a repeat has no time of its own,
and its samples without a timestamp are refused rather than given the
previous scrape's time.

Parsing: each series' name and labels are parsed once, by prometheus_client's
parser, the first time its line is met; later lines of the series are
matched by the text before their value and only the value and timestamp
are read. The parser costs ~50 us a line on dcgm-exporter's long label
sets, and an hour of 8 GPUs at 1 s is ~600,000 lines (200 MB), all but the
first scrape's of series already seen: ~30 s parsed whole, ~2.5 s so.
"""
from __future__ import annotations

import datetime as dt
import json
import re

import numpy as np

from . import dcgm_fields
from .dcgm_exporter_series import (UNIX_RANGE, Series, classify, cut, device_level, number_gpus, one_host,
                                    parse_head, sample_line, value_and_time)

EXPOSITION, QUERY_RANGE = "dcgm-exporter scrapes", "Prometheus query_range JSON"
LOOP = 'while sleep 1; do echo "# $(date +%s.%N)"; curl -s NODE:9400/metrics; done >> scrapes.prom'
TIME_HELP = (f"write the time before each scrape, e.g. {LOOP} (the comment may also be `date -Is` output; "
             "docs/recordings.md lists the forms)")
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_ISO = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d")
_TIME_LABEL = re.compile(r"(?:time|t)\s*[:=]\s*", re.IGNORECASE)   # says a time follows: anything else is an error
_TIME_WORD = re.compile(r"time\s+", re.IGNORECASE)                  # "# time 17645...", but also "# time to go"
_DIRECTIVES = frozenset({"HELP", "TYPE", "UNIT", "EOF"})


def sniff(text: str) -> str | None:
    """EXPOSITION, QUERY_RANGE, or None (not this module's: a CSV)."""
    body = text.lstrip("\ufeff \t\r\n")
    if body[:1] in ("{", "["):                  # no CSV header starts so
        return QUERY_RANGE
    first = body.split("\n", 1)[0]
    if first.startswith("#") or first.startswith("DCGM_FI_"):
        return EXPOSITION
    return None


def read(path, text: str, kind: str, error):
    """(t, gpu, {metric: values}, ignored) from a file `sniff` named;
    `error(message)` raises the caller's error."""
    text = text.removeprefix("\ufeff")           # a byte-order mark some editors write
    samples = _Samples(path, kind, error)
    if kind == QUERY_RANGE:
        _read_query_range(path, text, samples, error)
        hint = 'add the host to the query\'s selector, e.g. {__name__=~"DCGM_FI_.*",Hostname="HOST"}'
    else:
        _read_exposition(path, text, samples, error)
        hint = "save each node's exporter to a file of its own"
    return samples.assemble(hint)


class _Samples:
    """Series and their samples, from either shape, into rows of (t, GPU)."""

    def __init__(self, path, kind: str, error):
        self.path, self.kind, self.error = path, kind, error
        self.series: list[Series] = []
        self.ignored: dict[str, None] = {}          # in order of first appearance
        self.sid: list[int] = []
        self.t: list[float] = []
        self.v: list[float] = []

    def add_series(self, name: str, labels: dict[str, str], where: str) -> int | None:
        """The series' id, or None when it is not read (listed as ignored)."""
        return self.add_classified(classify(name, labels, where))

    def add_classified(self, series: Series | str) -> int | None:
        if isinstance(series, str):
            self.ignored.setdefault(series)
            return None
        self.series.append(series)
        return len(self.series) - 1

    def add(self, sid: int, t: float, value: float) -> None:
        self.sid.append(sid)
        self.t.append(t)
        self.v.append(value)

    def assemble(self, hint: str):
        if not self.series:
            seen = list(self.ignored)
            what = (f"no series in it is one gpuscope reads (ignored: {', '.join(seen[:4])}"
                    f"{', ...' if len(seen) > 4 else ''})" if seen else "it holds no samples")
            self.error(f"{self.path}: read as {self.kind}, but {what}: is it dcgm-exporter's output (DCGM_FI_* "
                       "metrics with a gpu or UUID label)? docs/recordings.md lists the fields read")
        one_host(self.series, f"a recording is one host's GPUs; {hint}", self.error)
        number_gpus(self.series, self.error)
        if not self.t:
            self.error(f"{self.path}: DCGM series but no samples")
        sid = np.asarray(self.sid, dtype=np.int64)
        t = np.asarray(self.t, dtype=np.float64)
        metrics = list(dict.fromkeys(s.field.metric for s in self.series))
        col_of = np.array([metrics.index(s.field.metric) for s in self.series], dtype=np.int64)[sid]
        gpu = np.array([s.gpu for s in self.series], dtype=np.int64)[sid]
        raw = np.asarray(self.v, dtype=np.float64)
        with np.errstate(over="ignore"):                    # 1e308 MiB is no reading either: NaN below
            value = raw * np.array([s.field.scale for s in self.series])[sid]
        value[~np.isfinite(value)] = np.nan                 # nor is +Inf
        value[raw >= np.array([dcgm_fields.blank_at(s.field) for s in self.series])[sid]] = np.nan  # nor DCGM's blank
        keys, row = np.unique(np.column_stack([t, gpu.astype(np.float64)]), axis=0, return_inverse=True)
        row = row.reshape(-1)
        matrix = np.full((len(keys), len(metrics)), np.nan)
        # Series that differ only in labels gpuscope does not read (dcgm-exporter's pod, container
        # and namespace, one series per pod sharing a GPU) carry the same device reading, but for a
        # pod's share of a shared GPU: the GPU's own series (no pod labels) is kept where there is
        # one, else the first one read, picked explicitly (numpy does not say which of repeated
        # indices wins).
        known = np.flatnonzero(~np.isnan(value))
        cell = row[known] * len(metrics) + col_of[known]
        pod_copy = np.array([not device_level(s.labels) for s in self.series])[sid][known]
        order = np.lexsort((known, pod_copy, cell))
        first = order[np.r_[True, cell[order][1:] != cell[order][:-1]]]
        pick = known[first]
        matrix[row[pick], col_of[pick]] = value[pick]
        cols = {m: matrix[:, j] for j, m in enumerate(metrics)}
        return keys[:, 0].tolist(), keys[:, 1].astype(np.int64).tolist(), cols, list(self.ignored)


def _read_exposition(path, text: str, samples: _Samples, error) -> None:
    heads: dict[str, int | None] = {}        # text before the value -> series id (None: not read)
    in_scrape: set[str] = set()
    comment_time: float | None = None
    timed = False                             # whether the scrape under way began at a time comment
    for lineno, line in enumerate(text.split("\n"), start=1):
        line = line.strip()
        if not line:
            continue
        where = f"{path}:{lineno}"
        if line[0] == "#":
            t = _comment_time(line, where, error)
            if t is not None:
                comment_time, timed = t, True
                in_scrape.clear()
            continue
        name, head, tail = sample_line(line, where, error)
        if head in in_scrape:             # the series repeats: the next scrape began, with no time comment
            in_scrape.clear()
            timed = False
        in_scrape.add(head)
        if head not in heads:
            heads[head] = samples.add_classified(parse_head(head, where, error))
        sid = heads[head]
        if sid is None:
            continue
        value, t = value_and_time(tail, where, error)
        if t is None:
            if comment_time is None:
                error(f"{where}: {name} has no time: dcgm-exporter writes none, and no comment before "
                      f"it gives one; {TIME_HELP}")
            if not timed:
                error(f"{where}: {name} repeats with no time comment since its last sample: a scrape "
                      f"with no time of its own; {TIME_HELP}")
            t = comment_time
        samples.add(sid, t, value)


def _comment_time(line: str, where: str, error) -> float | None:
    """The time a comment line gives, None for any other comment."""
    body = line[1:].strip()
    if body.split(" ", 1)[0] in _DIRECTIVES:
        return None
    label = _TIME_LABEL.match(body)
    word = None if label else _TIME_WORD.match(body)
    text = body[(label or word).end():].strip() if label or word else body
    if _NUMBER.fullmatch(text):
        t = float(text)
        if not UNIX_RANGE[0] <= t < UNIX_RANGE[1]:
            error(f"{where}: {text!r} is not Unix seconds (`date +%s.%N` writes them)"
                  + (" (milliseconds? divide by 1000)" if UNIX_RANGE[0] * 1e3 <= t < UNIX_RANGE[1] * 1e3 else ""))
        return t
    if _ISO.match(text):
        try:
            stamp = dt.datetime.fromisoformat(text)
        except ValueError:
            error(f"{where}: {cut(text)!r} is not an ISO 8601 time (`date -Is` writes one)")
        return stamp.timestamp()                # no offset: local time, as nvidia-smi's timestamps
    if label:
        error(f"{where}: {cut(text)!r} is not a time: Unix seconds (`date +%s.%N`) or ISO 8601 (`date -Is`)")
    return None                                 # a comment of the user's own


def _read_query_range(path, text: str, samples: _Samples, error) -> None:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        error(f"{path}:{exc.lineno}:{exc.colno}: not JSON ({exc.msg}): a Prometheus answer cut short or garbled?")
    except RecursionError:
        error(f"{path}: JSON nested too deep to be a Prometheus answer")
    if not isinstance(doc, dict):
        error(f"{path}: JSON, but not a Prometheus API answer (an object with status and data)")
    if doc.get("status") == "error":
        error(f"{path}: Prometheus answered with an error ({doc.get('errorType')}: {doc.get('error')})")
    data = doc.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("result"), list):
        error(f"{path}: JSON, but no data.result: not a Prometheus query_range answer")
    if data.get("resultType") != "matrix":
        error(f"{path}: resultType {data.get('resultType')!r}, not 'matrix': "
              + ("an instant query (/api/v1/query) holds one time; ask /api/v1/query_range with start, end and step"
                 if data.get("resultType") == "vector" else "ask /api/v1/query_range for the DCGM_FI_* series"))
    for i, series in enumerate(data["result"]):
        where = f"{path}, data.result[{i}]"
        labels, values = (series.get("metric"), series.get("values")) if isinstance(series, dict) else (None, None)
        if not isinstance(labels, dict) or not isinstance(values, list):
            error(f"{where}: not a series (an object with metric and values)")
        name = labels.get("__name__")
        if not name:
            error(f"{where}: a series without __name__: query the DCGM_FI_* series themselves, not an "
                  "expression over them (sum, rate and the like drop the name)")
        if not isinstance(name, str):
            error(f"{where}: __name__ {cut(json.dumps(name))} is not a metric name")
        sid = samples.add_series(name, {str(k): str(v) for k, v in labels.items() if k != "__name__"}, where)
        if sid is None:
            continue
        for j, pair in enumerate(values):
            try:
                t, raw = pair
                t, value = float(t), float(raw)
            except (TypeError, ValueError):
                error(f"{where}.values[{j}]: {cut(json.dumps(pair))} is not [unix_seconds, \"value\"]")
            if not UNIX_RANGE[0] <= t < UNIX_RANGE[1]:
                error(f"{where}.values[{j}]: time {t!r} is not Unix seconds")
            samples.add(sid, t, value)
