"""How many bytes a batch may take on the wire, checked before it takes
byte budget or decoding time, so that one client's oversized batches do
not hold up the other agents' (docs/benchmarks.md, "One bad client").

Two checks, both before the byte budget:

- `check_size`, every batch, on the event loop, O(columns): the arrays'
  lengths against `count`, then the wire size against what the counts allow
  with every string at its limit (`wire_allowance`). It refuses a string far
  over its limit, or unknown fields, in a batch of few entries.
- `screen`, a batch over SCREEN_ABOVE_BYTES, off the loop, O(entries): each
  string against its limit, then the wire size against what the batch's
  own strings take. The counts alone allow each entry its longest strings,
  so a batch padded with empty entries (2 bytes each on the wire, a process
  allowed 20 KiB) carried 50 MB of over-long strings past `check_size`
  (found in a trial: the other agents' ack p99 x12).

A process's command line may travel as at most MAX_WIRE_COMMAND_CHARS
characters, what cleaning reads of it (ingest.clean_command); the agent
cuts it at 256 (collectors/procstat.py). A longer one is the sender's bug,
refused here and by decode alike.
"""
from __future__ import annotations

from gpuscope.collectors.records import ATTRIBUTION_FIELDS, MAX_ATTRIBUTION_BYTES
from gpuscope.v1 import samples_pb2 as pb

from .ingest import (MAX_DETAIL_BYTES, MAX_HOST_BYTES, MAX_LABEL_BYTES, MAX_TOKEN_LEN, MAX_WIRE_COMMAND_CHARS,
                     METRIC_NAMES, BatchError, _check_header, _count, check_length)

# A batch at most this large is only `check_size`d: whatever it holds, it
# holds 1/64 of the default byte budget for a moment.
SCREEN_ABOVE_BYTES = 1 << 20

# What one entry may take beyond its strings' bytes: each integer at 10
# bytes, tags and lengths included.
_WIRE_INT, _WIRE_STR = 11, 3          # a tagged varint; a string's tag and length, beyond its bytes
_DEVICE_LABELS = ("uuid", "name", "architecture", "source", "driver_version")
_DEVICE_INTS = 16
_WIRE_DEVICE = _DEVICE_INTS * _WIRE_INT + len(_DEVICE_LABELS) * (MAX_LABEL_BYTES + _WIRE_STR)
_PROCESS_INTS = 6
_WIRE_PROCESS = _PROCESS_INTS * _WIRE_INT + 4 * MAX_WIRE_COMMAND_CHARS + _WIRE_STR
_HEALTH_INTS = 6
_WIRE_HEALTH = _HEALTH_INTS * _WIRE_INT + MAX_DETAIL_BYTES + _WIRE_STR
_WIRE_ATTRIBUTION = _WIRE_INT + len(ATTRIBUTION_FIELDS) * (MAX_ATTRIBUTION_BYTES + _WIRE_STR)
_WIRE_HEADER = 8 * _WIRE_INT + MAX_HOST_BYTES + MAX_TOKEN_LEN + 4 * _WIRE_STR
_WIRE_METRIC = max(map(len, METRIC_NAMES)) + 4 * _WIRE_STR + _WIRE_INT
# fields a newer agent may add, which this analyzer does not know and skips
_WIRE_SLACK, _WIRE_SLACK_BYTES = 1.25, 64 << 10


def _arrays(batch: pb.SampleBatch) -> int:
    """The arrays' bytes, each checked against `count` first, so that a
    count/data mismatch is told as such and not as a size (decode's
    messages)."""
    n = batch.count
    check_length("t_f64le", batch.t_f64le, 8, n)
    check_length("gpu_u32le", batch.gpu_u32le, 4, n)
    total = 12 * n
    for i, c in enumerate(batch.columns):
        check_length(f"columns[{i}].f64le", c.f64le, 8, n)
        if c.valid and len(c.valid) != (n + 7) // 8:
            raise BatchError(f"columns[{i}].valid: {len(c.valid)} bytes, expected {(n + 7) // 8} "
                             f"(one bit a sample) for count={n}")
        total += 8 * n + len(c.valid) + _WIRE_METRIC
    return total


def _limited(exact: int) -> int:
    return int(exact * _WIRE_SLACK) + _WIRE_SLACK_BYTES


def wire_allowance(batch: pb.SampleBatch) -> int:
    """The most bytes a batch with these counts and arrays can take on the
    wire when every string is at its limit."""
    exact = (_WIRE_HEADER + _arrays(batch)
             + len(batch.devices) * _WIRE_DEVICE + len(batch.processes) * _WIRE_PROCESS
             + len(batch.health) * _WIRE_HEALTH + len(batch.attributions) * _WIRE_ATTRIBUTION)
    return _limited(exact)


def _counts(batch: pb.SampleBatch) -> str:
    return (f"count={batch.count}, {len(batch.columns)} columns, {len(batch.devices)} devices, "
            f"{len(batch.processes)} processes, {len(batch.health)} health events and "
            f"{len(batch.attributions)} attributions")


def check_size(batch: pb.SampleBatch, wire_bytes: int) -> None:
    """Refuses, naming the counts, a batch larger than its counts allow (a
    string over its limit, or fields this analyzer does not know), and one
    whose counts or arrays are out of their limits. Cheap enough for the
    event loop."""
    _check_header(batch)
    _count("columns", len(batch.columns), len(METRIC_NAMES))
    allowed = wire_allowance(batch)
    if wire_bytes > allowed:
        raise BatchError(
            f"batch: {wire_bytes} bytes on the wire, more than the {allowed} that {_counts(batch)} can take "
            f"within their limits: a string over its limit (device labels {MAX_LABEL_BYTES} bytes, health "
            f"details {MAX_DETAIL_BYTES}), or fields this analyzer does not know")


def _utf8(s: str) -> int:
    return len(s) if s.isascii() else len(s.encode())


def _label(where: str, s: str, most: int) -> int:
    size = _utf8(s)
    if size > most:
        raise BatchError(f"{where}: longer than {most} bytes of UTF-8 ({len(s)} characters)")
    return size + _WIRE_STR


def screen(batch: pb.SampleBatch, wire_bytes: int) -> None:
    """After `check_size`, for a large batch (off the event loop): refuses
    one with a string over its limit, naming it, or more bytes than its own
    strings and numbers take, plus room for a newer agent's fields."""
    exact = _WIRE_HEADER + _arrays(batch)
    for i, d in enumerate(batch.devices):
        exact += _DEVICE_INTS * _WIRE_INT
        for name in _DEVICE_LABELS:
            exact += _label(f"devices[{i}].{name}", getattr(d, name), MAX_LABEL_BYTES)
    commands: dict[str, int] = {}          # a process repeats its command line in every sample
    for i, p in enumerate(batch.processes):
        c = p.command
        size = commands.get(c)
        if size is None:
            if len(c) > MAX_WIRE_COMMAND_CHARS:
                raise BatchError(f"processes[{i}].command: {len(c)} characters, at most {MAX_WIRE_COMMAND_CHARS} "
                                 f"(the agent cuts command lines at 256)")
            size = commands[c] = _utf8(c) + _WIRE_STR
        exact += _PROCESS_INTS * _WIRE_INT + size
    for i, h in enumerate(batch.health):
        exact += _HEALTH_INTS * _WIRE_INT + _label(f"health[{i}].detail", h.detail, MAX_DETAIL_BYTES)
    for i, a in enumerate(batch.attributions):
        exact += _WIRE_INT
        for name in ATTRIBUTION_FIELDS:
            exact += _label(f"attributions[{i}].{name}", getattr(a, name), MAX_ATTRIBUTION_BYTES)
    allowed = _limited(exact)
    if wire_bytes > allowed:
        raise BatchError(f"batch: {wire_bytes} bytes on the wire, more than the {allowed} that its {_counts(batch)} "
                         f"take with the strings it holds: fields this analyzer does not know")
