"""Finding NVIDIA's DCGM Python bindings, and what their status codes mean.

The bindings are not a package on PyPI: DCGM installs them as plain modules
(dcgm_agent.py, dcgm_structs.py, dcgm_fields.py, dcgmvalue.py, pydcgm.py,
DcgmReader.py) in a directory of its own, and they load libdcgm.so.4 when
first used. So they are imported at run time from, in order,
$GPUSCOPE_DCGM_BINDINGS, then the DCGM 4 package's directory, then DCGM 3's.
A directory named by the variable is the only one tried: asking for one and
quietly getting another would be worse than a clear refusal.

Their modules import one another by top-level name (`import dcgm_structs`),
so the directory goes on sys.path, and one process holds one copy of them.
"""
from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from .nvml import SourceUnavailable

ENV = "GPUSCOPE_DCGM_BINDINGS"
INSTALL_DIRS = ("/usr/share/datacenter-gpu-manager-4/bindings/python3",   # DCGM 4 (datacenter-gpu-manager-4-core)
                "/usr/local/dcgm/bindings/python3")                      # DCGM 3 and older
MODULES = ("dcgmvalue", "dcgm_structs", "dcgm_fields", "dcgm_agent")
_INSTALL = ("install DCGM (datacenter-gpu-manager-4-core, which ships the Python bindings), or set "
            f"{ENV} to the directory holding dcgm_agent.py; or sample through NVML with --source nvml")


@dataclass(frozen=True)
class DcgmBindings:
    structs: ModuleType     # dcgm_structs: DCGM_ST_* codes, DCGMError classes, ctypes structures
    agent: ModuleType       # dcgm_agent: the API calls
    fields: ModuleType      # dcgm_fields: DCGM_FE_* entity groups, DCGM_FT_* types
    value: ModuleType       # dcgmvalue: the BLANK sentinels
    path: str


def load_dcgm(environ: dict | None = None) -> DcgmBindings:
    """The bindings, or SourceUnavailable saying where they were looked for and what to do."""
    env = os.environ if environ is None else environ
    wanted = env.get(ENV)
    candidates = [wanted] if wanted else list(INSTALL_DIRS)
    found = next((d for d in candidates if (Path(d) / "dcgm_agent.py").is_file()), None)
    if found is None:
        where = f"{ENV}={wanted} holds no dcgm_agent.py" if wanted else \
            f"no dcgm_agent.py in {' or '.join(INSTALL_DIRS)}"
        raise SourceUnavailable(f"DCGM Python bindings not found ({where}): {_INSTALL}")
    path = str(Path(found).resolve())
    loaded = sys.modules.get("dcgm_agent")
    if loaded is not None and Path(getattr(loaded, "__file__", "")).resolve().parent != Path(path):
        raise SourceUnavailable(f"DCGM Python bindings are already loaded in this process from "
                                f"{Path(loaded.__file__).parent}, not {path}: one process holds one copy")
    if path not in sys.path:
        sys.path.insert(0, path)
    try:
        mods = {name: importlib.import_module(name) for name in MODULES}
    except ImportError as exc:
        raise SourceUnavailable(f"DCGM Python bindings in {path} did not import ({exc}): {_INSTALL}") from exc
    return DcgmBindings(mods["dcgm_structs"], mods["dcgm_agent"], mods["dcgm_fields"], mods["dcgmvalue"], path)


def status_name(structs: ModuleType, code: int) -> str:
    """DCGM_ST_IN_USE for -34: the name people find in DCGM's documentation."""
    return next((n for n in dir(structs) if n.startswith("DCGM_ST_") and getattr(structs, n) == code),
                f"DCGM status {code}")


def profiling_refusal(structs: ModuleType, code: int) -> str:
    """Why DCGM would not watch a GPU's profiling fields, in words an operator
    can act on (dcgmproftester's messages for the same codes, NVIDIA/DCGM)."""
    s = structs
    reasons = {
        s.DCGM_ST_PROFILING_NOT_SUPPORTED: "DCGM cannot profile this GPU (MIG mode, a virtual GPU, or a model "
                                           "without DCGM profiling)",
        s.DCGM_ST_IN_USE: "another profiler holds the GPU's performance counters (Nsight, a CUPTI tool, or "
                          "another DCGM)",
        s.DCGM_ST_REQUIRES_ROOT: "DCGM profiling needs nv-hostengine to run as root",
        s.DCGM_ST_MODULE_NOT_LOADED: "DCGM's profiling module did not load (is libnvperf_dcgm_host.so installed "
                                     "with DCGM?)",
        s.DCGM_ST_INSUFFICIENT_DRIVER_VERSION: "the NVIDIA driver is too old for DCGM profiling",
        s.DCGM_ST_PROFILING_MULTI_PASS: "the profiling fields need more passes than the GPU runs at once",
        s.DCGM_ST_NOT_SUPPORTED: "the GPU does not support these profiling fields",
        s.DCGM_ST_PROFILING_LIBRARY_ERROR: "DCGM's profiling library failed",
    }
    return reasons.get(code, f"DCGM refused the watch: {status_name(s, code)}")
