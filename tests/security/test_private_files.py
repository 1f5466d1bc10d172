"""What a server writes is readable by its own user only, whatever the
shell's umask: the DB holds job command lines only operators may read
(found in a trial: `analyzer --db X` made X 0644 beside a 0700 tls/)."""
import stat
import subprocess
import sys

from tests.conftest import free_port


def test_the_analyzers_files_are_its_own_under_a_lax_umask(tmp_path):
    db = tmp_path / "a.duckdb"
    # the shell sets the umask: preexec_fn would run Python in a forked copy of this threaded process
    cmd = [sys.executable, "-m", "gpuscope.daemon.cli", "--log-level", "warning", "analyzer",
           "--db", str(db), "--listen", f"127.0.0.1:{free_port()}", "--insecure", "--duration", "1"]
    proc = subprocess.run(["sh", "-c", 'umask 022 && exec "$@"', "sh", *cmd],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    made = [p for p in tmp_path.rglob("*")]
    assert db in made
    for p in made:
        mode = stat.S_IMODE(p.stat().st_mode)
        assert mode & 0o077 == 0, f"{p.name}: {oct(mode)}"


def test_a_db_left_readable_by_others_is_made_private_again(tmp_path):
    db = tmp_path / "old.duckdb"
    cmd = [sys.executable, "-m", "gpuscope.daemon.cli", "--log-level", "warning", "analyzer",
           "--db", str(db), "--listen", f"127.0.0.1:{free_port()}", "--insecure", "--duration", "1"]
    assert subprocess.run(cmd, capture_output=True, timeout=60).returncode == 0
    db.chmod(0o644)                              # found in a trial: it stayed so after a restart
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    assert "was readable by others (0o644); now 0o600" in proc.stderr
