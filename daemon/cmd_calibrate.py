"""`gpuscope calibrate`: measure one GPU's ceilings (collectors.calibrate)
with its clocks, power and temperature read through NVML while it runs.

It refuses a GPU that another process holds: a job beside it would be
slowed, and the ceilings read low. `--force` overrides, and says so."""
from __future__ import annotations

import json
import os
import socket
import sys

from gpuscope.collectors.calibrate import (GPU_PLATFORMS, MATMUL_DTYPES, CalibrateConfig, CalibrationError,
                                           Calibrator, NoGpuBackend, default_platform)
from gpuscope.collectors.nvml import NvmlCollector, SourceUnavailable

from . import clients
from .client_config import ANALYZER_PORT, with_port
from .cliutil import UsageError, print_json
from .security_flags import add_server_flags, agent_security
from gpuscope.collectors.human import percent, si

# What the probe keeps from each NVML reading: the conditions a ceiling depends on.
# power_watts is the driver's one-second average, which lags a short
# measurement; the instantaneous reading is what the ceiling ran at.
_CONDITIONS = ("sm_clock_hertz", "mem_clock_hertz", "power_instant_watts", "power_watts", "temp_celsius",
               "mem_temp_celsius", "power_limit_watts")


def add_calibrate_parser(sub) -> None:
    sp = sub.add_parser("calibrate", help="measure this GPU's real ceilings: HBM bandwidth, matmul FLOP/s per "
                                          "dtype, launch latency, host and peer transfers (needs JAX)")
    sp.add_argument("--gpu", type=int, default=0, help="device index (default 0)")
    sp.add_argument("--quick", action="store_true", help="fewer repeats (about 30 s on an H200)")
    sp.add_argument("--platform", choices=("gpu", "cpu"), default=None,
                    help="JAX backend (default: the GPU; with no GPU visible to JAX the command stops, and "
                         "cpu measures the CPU on purpose)")
    sp.add_argument("--dtypes", default=",".join(MATMUL_DTYPES),
                    help=f"matmul dtypes, comma-separated (default {','.join(MATMUL_DTYPES)})")
    sp.add_argument("--force", action="store_true", help="run even though another process holds the GPU")
    sp.add_argument("--output", default=None, metavar="FILE", help="also write the JSON result to FILE")
    sp.add_argument("--json", action="store_true", help="JSON output")
    sp.add_argument("--send", default=None, metavar="HOST[:PORT]",
                    help="also send the result to this analyzer, which keeps it per GPU UUID and uses it for "
                         "rooflines (with this host's agent certificate, as the agent presents it)")
    sp.add_argument("--host", default=socket.gethostname(),
                    help="host name the result is sent for (default: this host's; must match the certificate)")
    add_server_flags(sp, "NAME is agent: --send presents this host's agent certificate", agent_links=True)
    sp.set_defaults(fn=cmd_calibrate)


def cmd_calibrate(ns, nvml_module=None) -> int:
    """`nvml_module`: pynvml, or a stand-in with its API (tests)."""
    dtypes = tuple(dict.fromkeys(d.strip() for d in ns.dtypes.split(",") if d.strip()))   # once each
    unknown = [d for d in dtypes if d not in MATMUL_DTYPES]
    if unknown or not dtypes:
        raise UsageError(f"--dtypes: unknown {', '.join(unknown) or '(none given)'}; "
                         f"choose from {', '.join(MATMUL_DTYPES)}")
    if ns.gpu < 0:
        raise UsageError(f"--gpu {ns.gpu}: a device index is 0 or more")
    if ns.output:
        _check_writable(ns.output)       # before minutes of measuring, not after
    try:
        platform = ns.platform or default_platform()
    except NoGpuBackend as exc:
        raise UsageError(str(exc), exit_status=2) from None
    except CalibrationError as exc:
        raise UsageError(str(exc)) from None
    send = _sender(ns) if ns.send else None
    if platform in GPU_PLATFORMS:
        nvml, gpu_info, note = _nvml(ns, nvml_module)
    else:   # --platform cpu: no GPU is used, so none is read or named
        nvml, gpu_info, note = None, {}, f"JAX runs on the {platform} here: these are its figures, not a GPU's"
    probe = None
    if nvml is not None:
        def probe() -> dict[str, float]:
            for s in nvml.scrape().samples:
                if s.gpu == ns.gpu:
                    return {k: s.values[k] for k in _CONDITIONS if k in s.values}
            return {}

    def progress(what: str) -> None:
        if not ns.json:
            print(f"  measuring {what} …", file=sys.stderr, flush=True)

    try:
        cfg = CalibrateConfig(device=ns.gpu, platform=platform, quick=ns.quick, dtypes=dtypes)
        result = Calibrator(cfg, probe=probe, progress=progress).run()
    except CalibrationError as exc:
        raise UsageError(str(exc)) from None
    finally:
        if nvml is not None:
            nvml.close()
    out = result.to_dict()
    out["gpu"] = gpu_info
    out["forced"] = bool(ns.force)
    if note:
        out["note"] = note
    if ns.json:
        print_json(out)
    else:
        _print(out)
    rc = 0
    if ns.output:
        try:
            with open(ns.output, "w") as f:
                json.dump(out, f, indent=1)
        except OSError as exc:      # the results are printed above: only the file is lost
            print(f"gpuscope calibrate: error: --output {ns.output}: {exc.strerror or exc}", file=sys.stderr)
            rc = 1
    if send is not None:
        send(out)
    return rc


def _sender(ns):
    """Checks --send before measuring: its address, the TLS flags, and a dry
    run the analyzer answers only if it would take this host's result from
    this certificate. Returns what sends a result (a failure then raises
    ClientError: the result is printed).
    The analyzer takes calibrations from agents only, each for its own host:
    this presents what this host's agent does."""
    if ns.tokens:
        raise UsageError("--tokens: a calibration is sent with this host's agent certificate, not a token")
    server, security = with_port(ns.send, ANALYZER_PORT, flag="--send"), agent_security(ns)
    try:
        clients.check_calibration_send(server, ns.host, security=security)
    except clients.ClientError as exc:
        raise clients.ClientError(f"{exc}; nothing was measured (--send is checked first)") from None

    def send(out: dict) -> None:
        ack = clients.report_calibration(server, ns.host, out, security=security)
        cpu = out["device"]["platform"] not in GPU_PLATFORMS
        print(f"sent to {server}: calibration {ack['id']} ({ack['ceilings']} measurements)"
              + (f"; stored as the {out['device']['platform']}'s, marked: no GPU's roofline uses it" if cpu else ""),
              file=sys.stderr)
    return send


def _check_writable(path: str) -> None:
    if os.path.isdir(path):
        raise UsageError(f"--output {path}: is a directory; give a file name")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UsageError(f"--output {path}: no directory {parent}")
    if not os.access(parent if not os.path.exists(path) else path, os.W_OK):
        raise UsageError(f"--output {path}: not writable")


def _nvml(ns, module):
    """NVML for the probe and the in-use check, or (None, {}, why not)."""
    nvml = NvmlCollector(nvml=module)
    try:
        nvml.start()
    except SourceUnavailable as exc:
        if ns.platform == "gpu":
            # the collector's own hint is the agent's (--source replay:FILE)
            raise UsageError(f"{str(exc).split('; on a machine')[0]}; without a GPU use --platform cpu") from None
        return None, {}, "no NVML here: clocks, power and GPU use not read"
    devs = {d.gpu: d for d in nvml.devices()}
    if ns.gpu not in devs:
        nvml.close()
        raise UsageError(f"--gpu {ns.gpu}: NVML sees {len(devs)} GPU(s), numbered 0-{len(devs) - 1}")
    d = devs[ns.gpu]
    info = {"index": d.gpu, "uuid": d.uuid, "name": d.name, "memory_total_bytes": d.memory_total_bytes,
            "power_limit_watts": d.power_limit_watts, "pcie_generation": d.pcie_generation,
            "pcie_width": d.pcie_width, "driver": nvml.driver_version()}
    others = [p for s in nvml.scrape().samples if s.gpu == ns.gpu for p in s.processes if p.pid != os.getpid()]
    if others and not ns.force:
        nvml.close()
        who = ", ".join(f"pid {p.pid}" + (f" ({p.command[:60]})" if p.command else "") for p in others[:3])
        raise UsageError(f"GPU {ns.gpu} is in use by {who}: calibrating now would slow that job and read "
                         "low ceilings; run when it is idle, or pass --force")
    return nvml, info, None


def _print(out: dict) -> None:
    dev, gpu = out["device"], out.get("gpu") or {}
    name = gpu.get("name") or dev["device_kind"]
    print(f"{name} ({dev['platform']}, JAX {dev['jax']}"
          + (f", {dev['platform_version']}" if dev.get("platform_version") not in (None, dev["platform"]) else "")
          + f") in {out['duration_s']:.0f} s" + (" — forced while in use" if out.get("forced") else ""))
    units = {"bytes_per_second": "B/s", "flop_per_second": "FLOP/s", "seconds": "s", "calls_per_second": "calls/s"}
    for m in out["measurements"]:
        if m["value"] is None:
            print(f"  {m['name']:<18} —   {m['error']}")
            continue
        u = units[m["unit"]]
        cond = m["conditions"]
        clock = cond.get("sm_clock_hertz", {}).get("median")
        power = (cond.get("power_instant_watts") or cond.get("power_watts") or {}).get("max")
        extra = ", ".join(x for x in (clock and f"SM {si(clock, 'Hz')}", power and f"≤ {si(power, 'W')}") if x)
        print(f"  {m['name']:<18} {si(m['value'], u):>14}  best {si(m['best'], u):>12}  "
              f"spread {percent(m['spread']):>5}" + (f"  ({extra})" if extra else ""))
    if out.get("note"):
        print(f"  note: {out['note']}")
