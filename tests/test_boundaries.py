"""Who may import what (shared/ARCHITECTURE.md): collectors <- vendor
libraries only; analyzers <- protos, collectors' shared records, DuckDB;
never the other way. Only collectors/nvml.py imports pynvml. The XLA
profiler client is a collector that speaks gRPC to the job (a client, never
a server) and parses the vendor's wire schemas (gpuscope.xla); so is the
kubelet's pod-resources client (gpuscope.k8s)."""
import ast
from pathlib import Path

from .conftest import ROOT

FORBIDDEN = {
    "collectors": ("gpuscope.daemon", "gpuscope.analyzers", "gpuscope.v1", "grpc", "duckdb"),
    "analyzers": ("gpuscope.daemon", "pynvml"),
    "daemon": ("pynvml", "duckdb", "gpuscope.analyzers"),
}

# collectors that are clients of a vendor's gRPC service
GRPC_CLIENTS = ("xla_profiler.py", "kubelet.py")


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


def test_packages_respect_their_boundaries():
    bad = []
    for package, forbidden in FORBIDDEN.items():
        for path in (ROOT / package).rglob("*.py"):
            for mod in _imports(path):
                command_line = path.name == "cli.py" or path.name.startswith("cmd_")   # the composition root
                allowed = ((package == "daemon" and command_line and mod.startswith("gpuscope.analyzers"))
                           or (package == "collectors" and path.name in GRPC_CLIENTS and mod == "grpc"))
                if mod.startswith(forbidden) and not allowed:
                    bad.append(f"{path.relative_to(ROOT)} imports {mod}")
    assert not bad, bad


def test_only_the_nvml_collector_imports_pynvml():
    users = [p.relative_to(ROOT).as_posix() for pkg in ("collectors", "daemon", "analyzers")
             for p in (ROOT / pkg).rglob("*.py") if any(m == "pynvml" for m in _imports(p))]
    assert users == ["collectors/nvml.py"]
