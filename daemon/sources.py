"""Where an agent's samples come from (`--source`), and, for `auto`, the best
source this host has, said out loud.

`auto` tries, in order:

1. DCGM, through a host engine already running ($DCGM_HOSTENGINE, else
   127.0.0.1:5555). Never embedded: a DCGM started inside the agent would
   hold the GPUs' profiling counters against a host engine started later.
2. dcgm-exporter on this node ($GPUSCOPE_DCGM_EXPORTER, else
   http://127.0.0.1:9400/metrics): the GPUs are read by the exporter, and
   the agent touches none of them.
3. NVML, with GPM's profiling metrics on GPUs that have them.
4. `gpuscope up` only (or an explicit `--source auto` on the agent): the
   bundled H200 recording, so that a machine without a GPU shows something.

One profiler per GPU: where DCGM or dcgm-exporter is found, NVML's GPM is
not started (the DCGM collector asks NVML for processes alone), since the
two would fight over the same counters.
"""
from __future__ import annotations

import os
from typing import Callable

from gpuscope.collectors import dcgm_exporter
from gpuscope.collectors.nvml import NvmlCollector, NvmlConfig, SourceUnavailable
from gpuscope.collectors.recording import default_recording, read_recording
from gpuscope.collectors.replay import ReplayCollector

from . import logs
from .cliutil import UsageError

ENV_EXPORTER = "GPUSCOPE_DCGM_EXPORTER"
LOCAL_HOSTENGINE = "127.0.0.1"
LOCAL_EXPORTER = f"http://127.0.0.1:{dcgm_exporter.DEFAULT_PORT}/metrics"
EXPORTER_PROBE_S = 1.0           # an exporter on this node answers at once; auto must not stall start-up
KINDS = "nvml, dcgm[:HOST[:PORT]], dcgm-exporter:URL, replay:FILE or auto"


def make_source(spec: str | None, speed: float, allow_fallback: bool, environ=None, attribution=None):
    """Returns (collector, description). `spec` None is `auto` without the
    recording; `allow_fallback`: `auto` may end with the recording.
    `attribution` (an Attributor) names whose each GPU process is, where the
    processes come from NVML (NVML, or DCGM beside it)."""
    env = os.environ if environ is None else environ
    if spec is None or spec == "auto":
        return choose(speed, recording=allow_fallback, environ=env, attribution=attribution)
    if spec.startswith("replay:"):
        return replay(spec.removeprefix("replay:"), speed)
    if spec.startswith(dcgm_exporter.PREFIX):
        return _exporter(spec.removeprefix(dcgm_exporter.PREFIX))
    if spec == "dcgm" or spec.startswith("dcgm:"):
        return _dcgm(spec, env, attribution)
    if spec == "nvml":
        return _nvml(attribution)
    raise UsageError(f"--source: {spec!r}, expected {KINDS}")


def choose(speed: float, recording: bool, environ, openers: list[tuple[str, Callable]] | None = None,
           attribution=None):
    """The first source of `auto`'s order that starts; the log says which,
    and why each one before it did not."""
    exporter = environ.get(ENV_EXPORTER) or LOCAL_EXPORTER
    tried: list[str] = []
    for name, open_ in openers or [
            (f"DCGM (host engine at {environ.get('DCGM_HOSTENGINE') or LOCAL_HOSTENGINE})",
             lambda: _dcgm(f"dcgm:{environ.get('DCGM_HOSTENGINE') or LOCAL_HOSTENGINE}", environ, attribution)),
            (f"dcgm-exporter at {exporter}", lambda: _exporter(exporter, EXPORTER_PROBE_S)),
            ("NVML", lambda: _nvml(attribution))]:
        try:
            collector, description = open_()
        except (SourceUnavailable, UsageError) as exc:
            said = str(exc)
            tried.append(said if said.lower().startswith(name.split()[0].lower()) else f"{name}: {said}")
            continue
        logs.say(f"source: {description} ({_seen(collector)})"
                 + (f"; not before it: {'; '.join(tried)}" if tried else ""))
        return collector, description
    if not recording:
        raise SourceUnavailable("no GPU source on this host, tried in order:\n" + "".join(f"  - {t}\n" for t in tried)
                                + "(without a GPU: --source replay:FILE, or `gpuscope up`)")
    logs.say("no GPU source here, tried in order: " + "; ".join(tried), "warning")
    logs.say(f"replaying the bundled NVIDIA H200 recording at {speed:g}x instead.")
    return replay(str(default_recording()), speed)


def _seen(collector) -> str:
    """What the chosen source gives per GPU, grouped: `GPUs 0-7: dcgm (profiling)`."""
    by: dict[str, list[int]] = {}
    for d in collector.devices():
        by.setdefault(d.source or "?", []).append(d.gpu)
    return "; ".join(f"GPU{'s' if len(g) > 1 else ''} {','.join(map(str, g))}: {s}" for s, g in by.items())


def _dcgm(spec: str, environ, attribution=None):
    from gpuscope.collectors.dcgm import start_dcgm
    processes = NvmlCollector(NvmlConfig(gpm=False, processes=True), attribution=attribution)
    return Started(start_dcgm(spec, environ, processes=processes)), spec


def _exporter(address: str, timeout_s: float | None = None):
    try:
        collector = (dcgm_exporter.open_source(address) if timeout_s is None
                     else dcgm_exporter.open_source(address, timeout_s))
    except ValueError as exc:
        raise UsageError(f"--source {exc}") from None
    # the probe's longer deadline was for finding it; sampling waits as long as for a named exporter
    # (found in a trial: with auto, every scrape waited 1 s)
    collector.timeout_s = dcgm_exporter.TIMEOUT_S
    return Started(collector), dcgm_exporter.PREFIX + collector.url


def _nvml(attribution=None):
    collector = NvmlCollector(NvmlConfig(), attribution=attribution)
    collector.start()
    return Started(collector), "nvml"


def replay(path: str, speed: float):
    if speed <= 0:
        raise UsageError(f"--speed: must be > 0, got {speed}")
    rec = read_recording(path)
    for warning in rec.warnings:
        logs.say(warning, "warning")
    return ReplayCollector(rec, speed=speed, loop=True), f"replay:{path}"


class Started:
    """Wraps a collector already started (a source is probed before the agent starts)."""
    def __init__(self, inner):
        self._inner = inner

    def start(self):
        pass

    def __getattr__(self, name):
        return getattr(self._inner, name)
