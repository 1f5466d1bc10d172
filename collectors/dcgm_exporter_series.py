"""dcgm-exporter's series: which GPU and which DCGM field a sample line is,
read the same way from files of saved scrapes (dcgm_exporter_saved.py) and
from a live exporter (dcgm_exporter.py).

dcgm-exporter writes a GPU's sample as
  DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-...",pci_bus_id="...",device="nvidia0",
                       modelName="NVIDIA H100 80GB HBM3",Hostname="node-1",
                       DCGM_FI_DRIVER_VERSION="...",container="...",namespace="...",pod="..."} 99
Label rules, from its render template and transformations (NVIDIA/dcgm-exporter,
internal/pkg/rendermetrics and internal/pkg/transformation):
- the GPU: `gpu` (its index), `UUID` (`uuid` with --use-old-namespace),
  `device` (nvidia0);
- the host: `Hostname` (`hostname` from 2026 on), or Prometheus' `instance`;
- a part of a GPU, not all of it: `GPU_I_ID` (a MIG instance), `nvlink` (one
  link; those series also name the GPU differently, `gpu_uuid`);
- the pod using the GPU, with Kubernetes mapping (-k): `pod`, `namespace`,
  `container` (`pod_name`, `pod_namespace`, `container_name` with
  --use-old-namespace). Pods sharing a GPU each get a copy of the GPU's
  series; with per-process mapping of shared GPUs, `DCGM_FI_DEV_GPU_UTIL`
  and `DCGM_FI_DEV_FB_USED` copies carry the pod's share and the GPU's own
  series is kept beside them without pod labels, so the GPU's reading is
  the series without pod labels where there is one (`device_level`).

Each series' name and labels are parsed by prometheus_client's parser, once
(`parse_head`): the parser costs ~50 us a line on these label sets, so the
readers key series by the text before the value and parse only new ones.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, NamedTuple

from prometheus_client.parser import text_string_to_metric_families

from . import dcgm_fields

PART_LABELS = ("GPU_I_ID", "nvlink")
HOST_LABELS = ("Hostname", "hostname", "instance")   # the first one any series carries decides
ID_LABELS = ("UUID", "uuid", "device")                # say which GPU where `gpu` is missing
POD_LABELS = (("namespace", "pod_namespace"), ("pod", "pod_name"), ("container", "container_name"))
NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
MAX_GPU = 65535                               # DCGM numbers GPUs from 0; a larger index is not one
UNIX_RANGE = (1e9, 1e10)                      # 2001 to 2286: anything else is not Unix seconds

Error = Callable[[str], None]                 # raises the caller's error with the message


@dataclass
class Series:
    name: str
    field: dcgm_fields.Field
    labels: dict[str, str]
    where: str
    gpu: int = -1


class Pod(NamedTuple):
    namespace: str
    pod: str
    container: str


def classify(name: str, labels: dict[str, str], where: str) -> Series | str:
    """The series, or why it is not read (the line the readers list as ignored)."""
    field = dcgm_fields.BY_NAME.get(name)
    if field is None:
        return name
    part = next((k for k in PART_LABELS if labels.get(k)), None)
    if part is not None:
        return f"{name} (per {'MIG instance' if part == 'GPU_I_ID' else 'NVLink link'})"
    if not any(labels.get(k) for k in ("gpu", *ID_LABELS)):
        return f"{name} (no gpu, UUID or device label)"
    return Series(name, field, labels, where)


def parse_head(head: str, where: str, error: Error) -> Series | str:
    """A sample line's name and labels (the text before its value) -> as
    `classify`. Fields not read are never parsed: dcgm-exporter writes some
    as strings."""
    name = NAME.match(head).group()
    if name not in dcgm_fields.BY_NAME:
        return name
    try:
        parsed = [s for fam in text_string_to_metric_families(head + " 0\n") for s in fam.samples]
    except ValueError as exc:
        error(f"{where}: {cut(head)!r} is not a Prometheus series ({exc or 'unreadable labels'})")
    if len(parsed) != 1:
        error(f"{where}: {cut(head)!r} is not one Prometheus series")
    return classify(parsed[0].name, dict(parsed[0].labels), where)


def sample_line(line: str, where: str, error: Error) -> tuple[str, str, str]:
    """A sample line's metric name, its series (name and labels: the text
    before the value) and what follows (value, timestamp)."""
    name = NAME.match(line)
    if name is None:
        error(f"{where}: {cut(line)!r} is neither a metric sample nor a comment: not Prometheus' text format")
    series = split(line, name.end())
    if series is None:
        error(f"{where}: {cut(line)!r}: its labels are not closed with '}}' (a line cut short?)")
    return name.group(), *series


def split(line: str, name_end: int) -> tuple[str, str] | None:
    """The series (name and labels) and what follows it (value, timestamp);
    None when the labels are never closed."""
    rest = line[name_end:].lstrip()
    if not rest.startswith("{"):
        return line[:name_end], rest
    end = line.rfind("}") + 1            # a label value may hold "}"; the value and timestamp cannot
    return (line[:end], line[end:].strip()) if end > name_end else None


def value_and_time(tail: str, where: str, error: Error) -> tuple[float, float | None]:
    """A sample's value and its Prometheus timestamp in Unix seconds (None
    without one)."""
    parts = tail.split()
    if not parts:
        return math.nan, None                  # dcgm-exporter leaves a field it could not read blank
    if len(parts) > 2 or "_" in tail:
        error(f"{where}: {cut(tail)!r} is not a value and an optional timestamp")
    try:
        value = float(parts[0])
    except ValueError:
        error(f"{where}: value {cut(parts[0])!r} is not a number")
    if len(parts) == 1:
        return value, None
    try:
        t = float(parts[1]) / 1000.0
    except ValueError:
        t = math.nan
    if not UNIX_RANGE[0] <= t < UNIX_RANGE[1]:
        error(f"{where}: timestamp {cut(parts[1])!r} is not Prometheus' (milliseconds since 1970)")
    return value, t


def number_gpus(series: list[Series], error: Error) -> None:
    """GPU index from the `gpu` label; a series with only UUID or device
    gets the index another series gave that UUID or device, else the next
    free index in order of first appearance."""
    by_id: dict[str, int] = {}
    for s in series:
        cell = s.labels.get("gpu")
        if not cell:
            continue
        if not cell.isdecimal() or int(cell) > MAX_GPU:
            error(f"{s.where}: label gpu={cut(cell)!r} is not a GPU index")
        s.gpu = int(cell)
        for k in ID_LABELS:
            if s.labels.get(k):
                by_id.setdefault(f"{k}={s.labels[k]}", s.gpu)
    taken = {s.gpu for s in series if s.gpu >= 0 and s.labels.get("gpu")}
    free = 0
    for s in series:
        if s.labels.get("gpu"):
            continue
        ids = [f"{k}={s.labels[k]}" for k in ID_LABELS if s.labels.get(k)]
        known = next((by_id[i] for i in ids if i in by_id), None)
        if known is None:
            while free in taken:
                free += 1
            known = free
            taken.add(known)
        for i in ids:
            by_id.setdefault(i, known)
        s.gpu = known


def one_host(series: list[Series], hint: str, error: Error) -> None:
    """Refuses series of two hosts: what is read is one host's GPUs."""
    label = next((k for k in HOST_LABELS if any(s.labels.get(k) for s in series)), None)
    if label is None:
        return
    first: Series | None = None
    for s in series:
        host = s.labels.get(label)
        if not host:
            continue
        if first is None:
            first = s
        elif host != first.labels[label]:
            error(f"{s.where}: a second host, {label}={host!r} (the first, {first.labels[label]!r}, at "
                  f"{first.where}): {hint}")


def pod(labels: dict[str, str]) -> Pod | None:
    """The pod a series is labelled with, None without one (dcgm-exporter
    writes empty pod labels on a GPU no pod uses)."""
    p = Pod(*(next((labels[k] for k in keys if labels.get(k)), "") for keys in POD_LABELS))
    return p if p.pod else None


def device_level(labels: dict[str, str]) -> bool:
    """Whether a series is the GPU's own, not a pod's copy or share of it."""
    return pod(labels) is None


def cut(s: str, n: int = 80) -> str:
    return s if len(s) <= n else s[:n] + "..."
