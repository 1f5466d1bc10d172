"""The fake DCGM bindings (tests/fakes/dcgm/), loaded the way the collector
loads NVIDIA's: through GPUSCOPE_DCGM_BINDINGS and `load_dcgm`. The fake's
modules import each other by top-level name, as the real ones do, so tests
reach the host engine behind them through this module only, never through
a second import path."""
from __future__ import annotations

from pathlib import Path

from gpuscope.collectors.dcgm_bindings import ENV, load_dcgm

BINDINGS = Path(__file__).resolve().parent / "dcgm"
bindings = load_dcgm({ENV: str(BINDINGS)})

import fake_hostengine  # noqa: E402  (on sys.path once the bindings are loaded)

FakeDcgmGpu, h200, a100, write_spec = (fake_hostengine.FakeDcgmGpu, fake_hostengine.h200, fake_hostengine.a100,
                                       fake_hostengine.write_spec)
MIB, KNOWN_FIELDS = fake_hostengine.MIB, fake_hostengine.KNOWN_FIELDS
ST = bindings.structs          # DCGM_ST_* codes and the DCGMError classes
BLANK_INT64, BLANK_FP64 = bindings.value.DCGM_INT64_BLANK, bindings.value.DCGM_FP64_BLANK


def engine(gpus: list, **kw):
    """A fresh host engine of these GPUs behind the bindings (kill(), restart(), switches on each GPU)."""
    return fake_hostengine.reset(gpus, **kw)
