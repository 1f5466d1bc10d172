"""Measured ceilings of one device, with JAX: what this GPU (or CPU) really
reaches, next to the datasheet.

Each measurement is a microbenchmark repeated several times; its value is
the median of the repeats, with the best and the spread beside it, so that
one noisy repeat neither makes nor breaks a ceiling:

- `hbm_copy`, `hbm_triad`: device-memory bandwidth, counting bytes read and
  written, on arrays well past the last-level cache (STREAM's copy and triad);
- `matmul_<dtype>`: dense square products in each dtype the device takes
  (`tf32` is f32 at XLA's default precision, which GPUs run on TF32 tensor
  cores; `fp32` asks for full precision);
- `launch_roundtrip`: one tiny kernel launched and waited for (the launch
  path's latency); `dispatch_rate`: tiny kernels a host thread enqueues per
  second without waiting (the rate a launch-bound program cannot beat);
- `h2d`, `d2h`: host to device and back (pinned host memory where the
  backend has it, else pageable, said in `method`); `d2d`: from the device
  calibrated to the next one, when there are several.

While it runs, an optional probe (the caller's NVML reading) is sampled on a
thread, and each measurement keeps the clocks, power and temperatures seen
during it: a ceiling measured at a throttled clock says so.

JAX is imported lazily: the agent never loads it; `gpuscope calibrate` runs
this in its own process.
"""
from __future__ import annotations

import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

# Bytes each STREAM kernel moves per element: copy reads one array and writes
# one; triad reads two and writes one.
_STREAM = {"hbm_copy": 2, "hbm_triad": 3}
MATMUL_DTYPES = ("bf16", "fp16", "fp8", "tf32", "fp32")
UNITS = {"hbm_copy": "bytes_per_second", "hbm_triad": "bytes_per_second", "launch_roundtrip": "seconds",
         "dispatch_rate": "calls_per_second", "h2d": "bytes_per_second", "d2h": "bytes_per_second",
         "d2d": "bytes_per_second"}


class CalibrationError(RuntimeError):
    """Calibration cannot run at all (no JAX, no such device)."""


@dataclass(frozen=True)
class CalibrateConfig:
    device: int = 0                   # index among the backend's devices
    platform: str | None = None       # "gpu", "cpu"; None: JAX's default backend
    quick: bool = False
    dtypes: tuple[str, ...] = MATMUL_DTYPES
    # Sizes default per platform (see `_sizes`); tests shrink them.
    stream_bytes: int | None = None   # one array of the STREAM kernels
    matmul_n: int | None = None
    transfer_bytes: int | None = None
    repeats: int | None = None
    min_repeat_s: float | None = None  # each repeat enqueues enough calls to last this long


@dataclass
class Measurement:
    name: str
    unit: str
    value: float | None = None        # median of the repeats
    best: float | None = None         # the fastest repeat, in the same unit
    spread: float | None = None       # (max - min) / median of the repeats
    repeats: int = 0
    params: dict[str, Any] = field(default_factory=dict)
    conditions: dict[str, dict[str, float]] = field(default_factory=dict)   # metric -> min/median/max
    error: str | None = None          # why there is no value (dtype unsupported, one device, ...)


@dataclass
class Calibration:
    device: dict[str, Any]
    measurements: list[Measurement]
    started_at: float
    duration_s: float
    quick: bool

    def ceilings(self) -> dict[str, float]:
        """The numbers rooflines and evidence use: the best sustained median
        per dimension (bandwidth from copy or triad, whichever is higher)."""
        by = {m.name: m.value for m in self.measurements if m.value is not None}
        out: dict[str, float] = {}
        hbm = [by[k] for k in _STREAM if k in by]
        if hbm:
            out["hbm_bytes_per_second"] = max(hbm)
        for d in MATMUL_DTYPES:
            if f"matmul_{d}" in by:
                out[f"{d}_flop_per_second"] = by[f"matmul_{d}"]
        for k, name in (("launch_roundtrip", "launch_roundtrip_seconds"), ("dispatch_rate", "dispatch_per_second"),
                        ("h2d", "h2d_bytes_per_second"), ("d2h", "d2h_bytes_per_second"),
                        ("d2d", "d2d_bytes_per_second")):
            if k in by:
                out[name] = by[k]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "started_at": self.started_at, "duration_s": self.duration_s,
                "quick": self.quick, "ceilings": self.ceilings(),
                "measurements": [asdict(m) for m in self.measurements]}


class _Telemetry:
    """The probe sampled every `period` seconds on a thread; `during(t0, t1)`
    summarizes what it saw in that span (the nearest reading when the span
    was shorter than the period)."""

    def __init__(self, probe: Callable[[], dict[str, float]] | None, period: float = 0.1):
        self._probe, self._period = probe, period
        self._seen: list[tuple[float, dict[str, float]]] = []
        self.probe_error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="calibrate-telemetry", daemon=True)

    def __enter__(self) -> "_Telemetry":
        if self._probe is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._seen.append((time.monotonic(), self._probe()))
            except Exception as exc:     # a probe that fails must not end the calibration
                self.probe_error = f"{type(exc).__name__}: {exc}"
            self._stop.wait(self._period)

    def during(self, t0: float, t1: float) -> dict[str, dict[str, float]]:
        rows = [v for t, v in list(self._seen) if t0 <= t <= t1]
        if not rows and self._seen:
            rows = [min(self._seen, key=lambda s: abs(s[0] - t1))[1]]
        out: dict[str, dict[str, float]] = {}
        for key in sorted({k for r in rows for k in r}):
            vals = [r[key] for r in rows if r.get(key) is not None]
            if vals:
                out[key] = {"min": min(vals), "median": statistics.median(vals), "max": max(vals)}
        return out


def _jax():
    try:
        import jax
        import jax.numpy as jnp
    except ImportError as exc:
        raise CalibrationError("calibration needs JAX: pip install 'gpuscope[calibrate]' "
                               "(and the CUDA plugin, e.g. jax[cuda12], on a GPU host)") from exc
    return jax, jnp


GPU_PLATFORMS = ("gpu", "cuda", "rocm")


class NoGpuBackend(CalibrationError):
    """No platform was asked for and JAX has no GPU backend: the CPU is
    measured only when asked by name (someone who asked to calibrate their
    GPUs must not get the CPU's figures)."""


def default_platform() -> str:
    """JAX's GPU backend, when none is asked for. NoGpuBackend where JAX has
    none (its CUDA plugin missing or failing, even on a GPU host: JAX then
    falls back to the CPU), saying why as JAX does."""
    jax, _ = _jax()
    platform = jax.default_backend()
    if platform in GPU_PLATFORMS:
        return platform
    try:
        jax.devices("gpu")
        return "gpu"
    except RuntimeError as exc:   # "Unknown backend ..." or the plugin's "Unable to initialize backend 'cuda': ..."
        why = str(exc)
    raise NoGpuBackend(f"no GPU is visible to JAX ({why}); install JAX's CUDA plugin (e.g. pip install "
                       "'jax[cuda12]'; gpuscope's [calibrate] extra installs JAX alone), or pass --platform cpu to "
                       "measure this host's CPU on purpose")


def _device(jax, cfg: CalibrateConfig):
    try:
        devices = jax.devices(cfg.platform) if cfg.platform else jax.devices()
    except RuntimeError as exc:
        raise CalibrationError(f"no {cfg.platform} devices for JAX ({exc}); on a GPU host install the CUDA "
                               "plugin (jax[cuda12]); elsewhere use --platform cpu") from exc
    if not 0 <= cfg.device < len(devices):
        raise CalibrationError(f"device {cfg.device} does not exist: JAX sees {len(devices)} "
                               f"{devices[0].platform} device(s), numbered 0-{len(devices) - 1}")
    return devices[cfg.device], devices


def _sizes(cfg: CalibrateConfig, platform: str, free_bytes: int | None) -> dict[str, Any]:
    gpu = platform in GPU_PLATFORMS
    stream = cfg.stream_bytes or ((1 << 30) if gpu else (64 << 20))
    if free_bytes:                       # three arrays for triad, with room to spare
        stream = min(stream, free_bytes // 8)
    return {"stream_bytes": stream,
            "matmul_n": cfg.matmul_n or (8192 if gpu else 1024),
            "transfer_bytes": cfg.transfer_bytes or ((256 << 20) if gpu else (32 << 20)),
            "repeats": cfg.repeats or (5 if cfg.quick else 10),
            "min_repeat_s": cfg.min_repeat_s or (0.02 if cfg.quick else 0.05)}


def _summary(name: str, per_repeat: list[float], higher_is_better: bool = True) -> Measurement:
    """Median, best and spread: the whole range over a few repeats; over many
    (latencies) the 10th to 90th percentile, as one scheduler hiccup in 200
    round trips says nothing about the launch path."""
    med = statistics.median(per_repeat)
    if len(per_repeat) >= 20:
        deciles = statistics.quantiles(per_repeat, n=10)
        lo, hi = deciles[0], deciles[-1]
    else:
        lo, hi = min(per_repeat), max(per_repeat)
    return Measurement(name=name, unit=UNITS.get(name, "flop_per_second"), value=med,
                       best=max(per_repeat) if higher_is_better else min(per_repeat),
                       spread=(hi - lo) / med if med else None, repeats=len(per_repeat))


def _throughput(fn: Callable[[], Any], work: float, repeats: int, min_repeat_s: float) -> list[float]:
    """Work per second over `repeats` repeats of back-to-back calls. One call
    is timed first (after compiling) to size a repeat; calls are enqueued
    without waiting and only the last is waited for, so launch gaps hide
    behind the device's queue as they would in a real program."""
    fn().block_until_ready()                       # compile and warm up
    t = time.perf_counter()
    fn().block_until_ready()
    one = max(time.perf_counter() - t, 1e-7)
    calls = max(1, min(1000, int(min_repeat_s / one)))
    rates = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = None
        for _ in range(calls):
            out = fn()
        out.block_until_ready()
        rates.append(work * calls / (time.perf_counter() - t))
    return rates


class Calibrator:
    """Runs the microbenchmarks on one device and returns a `Calibration`."""

    def __init__(self, config: CalibrateConfig = CalibrateConfig(),
                 probe: Callable[[], dict[str, float]] | None = None,
                 progress: Callable[[str], None] | None = None):
        self.config = config
        self._probe = probe
        self._progress = progress or (lambda _msg: None)
        self._tel = _Telemetry(None)

    def _measured(self, name: str, per_repeat: list[float], t0: float, params: dict,
                  higher_is_better: bool = True) -> Measurement:
        """A measurement from its repeats, with the conditions the probe saw
        since `t0` (compile and warm-up included: clocks ramp up there)."""
        m = _summary(name, per_repeat, higher_is_better)
        m.params = params
        m.conditions = self._tel.during(t0, time.monotonic())
        return m

    def run(self) -> Calibration:
        jax, jnp = _jax()
        dev, devices = _device(jax, self.config)
        stats = _memory_stats(dev)
        free = stats.get("bytes_limit", 0) - stats.get("bytes_in_use", 0) if stats.get("bytes_limit") else None
        sizes = _sizes(self.config, dev.platform, free)
        started, t_start = time.time(), time.monotonic()
        steps: list[tuple[str, Callable[[], list[Measurement]]]] = [
            ("device memory bandwidth", lambda: self._stream(jax, jnp, dev, sizes)),
            ("matrix products", lambda: self._matmuls(jax, jnp, dev, sizes)),
            ("launch path", lambda: self._launch(jax, jnp, dev, sizes)),
            ("host transfers", lambda: self._transfers(jax, jnp, dev, sizes)),
            ("device to device", lambda: self._d2d(jax, jnp, devices, sizes)),
        ]
        measurements: list[Measurement] = []
        with _Telemetry(self._probe) as self._tel:
            for what, step in steps:
                self._progress(what)
                measurements += step()
        device = _describe(jax, dev, sizes)
        if self._tel.probe_error:          # conditions are missing: say why rather than leave them empty
            device["probe_error"] = self._tel.probe_error
        return Calibration(device=device, measurements=measurements, started_at=started,
                           duration_s=time.monotonic() - t_start, quick=self.config.quick)

    # -- the microbenchmarks ---------------------------------------------------
    def _stream(self, jax, jnp, dev, sizes) -> list[Measurement]:
        n = sizes["stream_bytes"] // 4
        a = jax.device_put(jnp.ones((n,), jnp.float32), dev)
        b = jax.device_put(jnp.full((n,), 2.0, jnp.float32), dev)
        copy = jax.jit(lambda x: x + 0.0)    # XLA keeps it: a fresh output buffer is written
        triad = jax.jit(lambda x, y: x + 3.0 * y)
        out = []
        for name, fn in (("hbm_copy", lambda: copy(a)), ("hbm_triad", lambda: triad(a, b))):
            t0 = time.monotonic()
            rates = _throughput(fn, _STREAM[name] * n * 4, sizes["repeats"], sizes["min_repeat_s"])
            out.append(self._measured(name, rates, t0, {"array_bytes": n * 4, "bytes_per_call": _STREAM[name] * n * 4}))
        del a, b
        return out

    def _matmuls(self, jax, jnp, dev, sizes) -> list[Measurement]:
        n = sizes["matmul_n"]
        out = []
        for d in self.config.dtypes:
            params, t0 = {"n": n, "dtype": d}, time.monotonic()
            try:
                fn = _matmul_fn(jax, jnp, dev, d, n)
                rates = _throughput(fn, 2.0 * n ** 3, sizes["repeats"], sizes["min_repeat_s"])
            except Exception as exc:     # an unsupported dtype fails in XLA's own ways; say which and go on
                first = str(exc).splitlines()[0][:300] if str(exc) else ""
                out.append(Measurement(name=f"matmul_{d}", unit="flop_per_second", params=params,
                                       error=f"{type(exc).__name__}: {first}"))
                continue
            out.append(self._measured(f"matmul_{d}", rates, t0, params))
        return out

    def _launch(self, jax, jnp, dev, sizes) -> list[Measurement]:
        x = jax.device_put(jnp.zeros((1,), jnp.float32), dev)
        tiny = jax.jit(lambda v: v + 1.0)
        t0 = time.monotonic()
        tiny(x).block_until_ready()
        waits = []
        for _ in range(50 if self.config.quick else 200):
            t = time.perf_counter()
            tiny(x).block_until_ready()
            waits.append(time.perf_counter() - t)
        rt = self._measured("launch_roundtrip", waits, t0, {"calls": len(waits)}, higher_is_better=False)
        t0 = time.monotonic()
        rates = _throughput(lambda: tiny(x), 1.0, sizes["repeats"], sizes["min_repeat_s"])
        return [rt, self._measured("dispatch_rate", rates, t0, {"kernel": "one-element add"})]

    def _transfers(self, jax, jnp, dev, sizes) -> list[Measurement]:
        import numpy as np
        nbytes, repeats = sizes["transfer_bytes"], sizes["repeats"]
        host = np.ones(nbytes // 4, np.float32)
        spaces = _pinned(jax, dev)
        if spaces:                       # staged in pinned memory once, outside the timing
            to_device, to_pinned = spaces
            src = jax.device_put(host, to_pinned)
            src.block_until_ready()
        else:
            to_device, to_pinned, src = dev, None, host
        t0 = time.monotonic()
        jax.device_put(src, to_device).block_until_ready()
        h2d = []
        for _ in range(repeats):
            t = time.perf_counter()
            on_dev = jax.device_put(src, to_device)
            on_dev.block_until_ready()
            h2d.append(nbytes / (time.perf_counter() - t))
        bump = jax.jit(lambda v: v + 1.0)
        d2h = []
        for _ in range(repeats):
            fresh = bump(on_dev)         # a new array: JAX caches an array's host copy after the first read
            fresh.block_until_ready()
            t = time.perf_counter()
            if to_pinned is not None:
                jax.device_put(fresh, to_pinned).block_until_ready()
            else:
                np.asarray(fresh)
            d2h.append(nbytes / (time.perf_counter() - t))
        params = {"bytes": nbytes, "method": "pinned" if spaces else "pageable"}
        return [self._measured(name, rates, t0, params) for name, rates in (("h2d", h2d), ("d2h", d2h))]

    def _d2d(self, jax, jnp, devices, sizes) -> list[Measurement]:
        if len(devices) < 2:
            return [Measurement(name="d2d", unit="bytes_per_second", error="one device: nothing to copy between")]
        nbytes = sizes["transfer_bytes"]
        i = self.config.device
        j = (i + 1) % len(devices)
        x = jax.device_put(jnp.ones((nbytes // 4,), jnp.float32), devices[i])
        rates, t0 = [], time.monotonic()
        jax.device_put(x, devices[j]).block_until_ready()
        for _ in range(sizes["repeats"]):
            t = time.perf_counter()
            jax.device_put(x, devices[j]).block_until_ready()
            rates.append(nbytes / (time.perf_counter() - t))
        return [self._measured("d2d", rates, t0, {"bytes": nbytes, "from": i, "to": j})]


def _matmul_fn(jax, jnp, dev, dtype: str, n: int):
    lax = jax.lax
    key = jax.random.PRNGKey(0)
    # random data: zeros let the tensor cores idle their multipliers and read ~10 % fast
    base = jax.device_put(jax.random.normal(key, (n, n), jnp.float32), dev)
    if dtype == "fp8":
        a = base.astype(jnp.float8_e4m3fn)
        f = jax.jit(lambda x, y: lax.dot(x, y, preferred_element_type=jnp.bfloat16))
    else:
        dt = {"bf16": jnp.bfloat16, "fp16": jnp.float16, "tf32": jnp.float32, "fp32": jnp.float32}[dtype]
        a = base.astype(dt)
        prec = lax.Precision.HIGHEST if dtype == "fp32" else lax.Precision.DEFAULT
        f = jax.jit(lambda x, y: lax.dot(x, y, precision=prec))
    b = a.T
    return lambda: f(a, b)


def _pinned(jax, dev):
    """Shardings to the device's own memory and to pinned host memory, when
    the backend has both memory spaces (GPUs do); else None."""
    try:
        kinds = {m.kind for m in dev.addressable_memories()}
    except Exception:                    # older JAX, or a backend without memory spaces
        return None
    if not {"pinned_host", "device"} <= kinds:
        return None
    S = jax.sharding.SingleDeviceSharding
    return S(dev, memory_kind="device"), S(dev, memory_kind="pinned_host")


def _memory_stats(dev) -> dict[str, int]:
    try:
        return dev.memory_stats() or {}
    except Exception:                    # the CPU backend has none
        return {}


def _describe(jax, dev, sizes) -> dict[str, Any]:
    import jaxlib
    return {"platform": dev.platform, "device_kind": dev.device_kind, "id": dev.id,
            "platform_version": getattr(getattr(dev, "client", None), "platform_version", None),
            "jax": jax.__version__, "jaxlib": jaxlib.__version__, "sizes": sizes}
