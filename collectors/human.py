"""Numbers for people: SI prefixes with three significant digits, the unit
after (`4.31 TB/s`, `792 TFLOP/s`, `8.2 µs`). JSON output never goes
through here: scripts get SI base units as plain numbers.

It lives beside the metric catalogue, whose units it speaks, because both
halves write for people: the CLI its tables, the analyzers their findings'
sentences, and the two must read alike."""
from __future__ import annotations

import math

_UP = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
_DOWN = ((1e-3, "m"), (1e-6, "µ"), (1e-9, "n"))


def si(value: float | None, unit: str) -> str:
    """`value` in `unit` with an SI prefix; "—" when unknown."""
    if value is None or not math.isfinite(value):
        return "—"
    scale, prefix = si_scale(value)
    return f"{_three(value / scale)} {prefix}{unit}"


def si_scale(value: float) -> tuple[float, str]:
    """The SI prefix `si` writes `value` with, and its scale: (1e9, "G")
    for 4.2e9. A chart's axis takes the prefix of its largest value."""
    mag = abs(value)
    for s, p in _UP:
        if mag >= s:
            return s, p
    if 0 < mag < 1:
        for s, p in _DOWN:
            if mag >= s:
                return s, p
        return _DOWN[-1]
    return 1.0, ""


def _three(x: float) -> str:
    """Three significant digits, no exponent, no trailing zeros past them."""
    mag = abs(x)
    decimals = 0 if mag >= 100 else 1 if mag >= 10 else 2
    return f"{x:.{decimals}f}"


def percent(ratio: float | None) -> str:
    return "—" if ratio is None or not math.isfinite(ratio) else f"{ratio * 100:.0f} %"


def iec(value: float | None, unit: str = "B") -> str:
    """Bytes with a binary prefix (`5.21 GiB`): memory sizes, as nvidia-smi shows them."""
    if value is None or not math.isfinite(value):
        return "—"
    mag, scale, prefix = abs(value), 1.0, ""
    for s, p in ((2.0 ** 50, "Pi"), (2.0 ** 40, "Ti"), (2.0 ** 30, "Gi"), (2.0 ** 20, "Mi"), (2.0 ** 10, "Ki")):
        if mag >= s:
            scale, prefix = s, p
            break
    return f"{value:.0f} {unit}" if not prefix else f"{_three(value / scale)} {prefix}{unit}"


# nvmlClocksEventReason bits (nvml.h), named as nvidia-smi -q names them
CLOCK_EVENTS = ((0x1, "gpu-idle"), (0x2, "applications-clocks-setting"), (0x4, "sw-power-cap"),
                (0x8, "hw-slowdown"), (0x10, "sync-boost"), (0x20, "sw-thermal-slowdown"),
                (0x40, "hw-thermal-slowdown"), (0x80, "hw-power-brake-slowdown"), (0x100, "display-clocks-setting"))


def clock_events(bits: float | None) -> str:
    """A clock-event (throttle) bitmask as the reasons' names; `none` for 0."""
    if bits is None or not math.isfinite(bits) or bits < 0:
        return "—"
    n = int(bits)
    names = [name for bit, name in CLOCK_EVENTS if n & bit]
    rest = n & ~sum(bit for bit, _ in CLOCK_EVENTS)
    if rest:
        names.append(f"0x{rest:x}")
    return ", ".join(names) or "none"


def value(unit: str, v: float | None) -> str:
    """A catalogue value (collectors/catalogue.py units) as a person reads it:
    `73 %`, `694 W`, `5.21 GiB`, `243 MB/s`, `1.96 GHz`, `61 °C`."""
    if v is None or not math.isfinite(v):
        return "—"
    if unit == "ratio":
        return f"{v * 100:.1f} %" if 0 < abs(v) < 0.1 else f"{v * 100:.0f} %"
    if unit == "bytes":
        return iec(v)
    if unit == "bitmask":
        return clock_events(v)
    if unit == "celsius":
        return f"{v:.0f} °C"
    if unit == "cores":                     # host CPU: `0.28 cores` beside `2.67 cores`, never "275 mcores"
        return f"{v:,.0f} cores" if float(v).is_integer() else f"{v:.2f} cores"
    if unit == "count" and float(v).is_integer():
        return f"{v:,.0f}"
    if unit in ("count", "1/s"):            # requests, tokens: plain numbers, never "500 m"
        text = f"{v:,.0f}" if abs(v) >= 100 else _three(v)
        return text + ("/s" if unit == "1/s" else "")
    return si(v, {"bytes/s": "B/s", "watts": "W", "hertz": "Hz", "seconds": "s", "joules": "J"}.get(unit, unit))


def many(n: int, noun: str, plural: str | None = None) -> str:
    """`1 host`, `2 hosts`, `1,204 findings`."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"
