"""A job that runs as another user than the agent (the usual case: the
agent as root, training as a user) writes its own trace into the capture
directory, as JAX does, and can reach nothing else there."""
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from gpuscope.collectors.xla_profiler import CaptureResult
from gpuscope.daemon.captures import CaptureConfig, CaptureRunner

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="handing a directory to another user needs root")


class _ProfilerWritingAsTheJob:
    """Writes the trace the way a JAX profiler server does: as the job's user,
    at <root>/<session>/<host>.xplane.pb."""

    def __init__(self):
        self.wrote = None

    def capture(self, duration_ms, root: Path, session: str, host: str, margin_s: float = 0.0):
        target = root / session / f"{host}.xplane.pb"
        r = subprocess.run(["sh", "-c", f"mkdir -p '{target.parent}' && printf trace > '{target}'"],
                           user=NOBODY, group=NOBODY, capture_output=True, text=True, timeout=30)
        self.wrote = r
        return CaptureResult(xspace=b"", path=target if r.returncode == 0 else None, empty=False, seconds=0.0)


@pytest.fixture
def tmp_path():
    """Outside pytest's own 0700 tree, which another user could not traverse."""
    d = Path(tempfile.mkdtemp(prefix="gpuscope-capture-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_the_jobs_user_writes_its_trace_and_the_agent_keeps_it(tmp_path):
    job = subprocess.Popen(["sleep", "30"], user=NOBODY, group=NOBODY)
    try:
        runner = CaptureRunner(CaptureConfig(tmp_path / "captures", min_free_bytes=0), "h")
        client = _ProfilerWritingAsTheJob()
        rec, data = runner.capture("127.0.0.1:1", 100, pid=job.pid, client=client)
    finally:
        job.kill()
        job.wait()
    assert client.wrote.returncode == 0, client.wrote.stderr
    assert rec.status.startswith("ok"), rec.error
    assert data == b"trace"
    root = tmp_path / "captures"
    own = root / rec.id
    assert (os.stat(own).st_uid, os.stat(own).st_mode & 0o777) == (NOBODY, 0o700)
    assert os.stat(root).st_mode & 0o777 == 0o711           # search only: nobody lists or writes the root
    listing = subprocess.run(["ls", str(root)], user=NOBODY, capture_output=True, timeout=10)
    assert listing.returncode != 0
    planted = subprocess.run(["sh", "-c", f"echo x > '{root}/planted'"], user=NOBODY, capture_output=True, timeout=10)
    assert planted.returncode != 0 and not (root / "planted").exists()


def test_a_job_of_the_agents_own_user_keeps_a_private_root(tmp_path):
    runner = CaptureRunner(CaptureConfig(tmp_path / "captures", min_free_bytes=0), "h")
    rec, _ = runner.capture("127.0.0.1:1", 100, pid=os.getpid(), client=_ProfilerWritingAsTheJob())
    assert os.stat(tmp_path / "captures").st_mode & 0o777 == 0o700
