"""Numbers for people: SI prefixes with three significant digits, the unit
after (`4.31 TB/s`, `792 TFLOP/s`, `8.2 µs`). JSON output never goes
through here: scripts get SI base units as plain numbers."""
from __future__ import annotations

import math

_UP = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
_DOWN = ((1e-3, "m"), (1e-6, "µ"), (1e-9, "n"))


def si(value: float | None, unit: str) -> str:
    """`value` in `unit` with an SI prefix; "—" when unknown."""
    if value is None or not math.isfinite(value):
        return "—"
    mag = abs(value)
    scale, prefix = 1.0, ""
    for s, p in _UP:
        if mag >= s:
            scale, prefix = s, p
            break
    else:
        if 0 < mag < 1:
            for s, p in _DOWN:
                if mag >= s:
                    scale, prefix = s, p
                    break
            else:
                scale, prefix = _DOWN[-1]
    return f"{_three(value / scale)} {prefix}{unit}"


def _three(x: float) -> str:
    """Three significant digits, no exponent, no trailing zeros past them."""
    mag = abs(x)
    decimals = 0 if mag >= 100 else 1 if mag >= 10 else 2
    return f"{x:.{decimals}f}"


def percent(ratio: float | None) -> str:
    return "—" if ratio is None or not math.isfinite(ratio) else f"{ratio * 100:.0f} %"
