"""Settings a server refuses before it says, starts or writes anything:
real `gpuscope` processes, their exit status and their one line."""
import os
import subprocess
import sys

import pytest

GPUSCOPE = [sys.executable, "-m", "gpuscope.daemon.cli"]
PHYSICAL = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def run(*args, timeout=120):
    return subprocess.run(GPUSCOPE + list(args), capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("command", ["analyzer", "up"])
@pytest.mark.parametrize("value", ["1KB", "63MB", "99999TB", f"{PHYSICAL + 2**20}B"])
def test_a_memory_limit_duckdb_cannot_work_in_or_the_machine_does_not_have_is_refused(tmp_path, command, value):
    """Found by a tester: 1KB and 99999TB were taken (DuckDB then fails its
    first query, or the cap is no cap)."""
    r = run(command, "--insecure", "--listen", "127.0.0.1:0", "--db", str(tmp_path / "m.duckdb"),
            "--memory-limit", value, "--duration", "1s")
    assert r.returncode == 2, r.stderr
    assert f"--memory-limit {value}:" in r.stderr and f"give 64MB to {PHYSICAL >> 20}MiB" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "m.duckdb").exists()


def test_a_memory_limit_in_the_range_runs(tmp_path):
    r = run("analyzer", "--insecure", "--listen", "127.0.0.1:0", "--db", str(tmp_path / "m.duckdb"),
            "--memory-limit", "64MB", "--duration", "1s")
    assert r.returncode == 0, r.stderr
