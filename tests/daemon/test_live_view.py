"""The live view of `gpuscope up` in a real terminal (a pty) at two sizes:
it fits the width, shows the warm-up and a minute of activity, keeps log
lines out, and leaves a summary on the shell's screen at Ctrl-C."""
import fcntl
import os
import pty
import re
import select
import signal
import struct
import sys
import termios
import time

import pytest

from tests.conftest import free_port

ANSI = re.compile(r"\x1b\[[0-9;?]*[a-zA-Z]|\x1b[()][A-Z0-9]|\x1b[=>]")


def _drive(tmp_path, cols: int, rows: int, seconds: float) -> tuple[str, int]:
    db = tmp_path / f"v{cols}.duckdb"
    pid, fd = pty.fork()
    if pid == 0:                                 # the child: gpuscope up on the pty
        # os.environ, not the C environment: readline (loaded with pytest) exports COLUMNS=80 there
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        env["TERM"] = "xterm-256color"
        os.execve(sys.executable, [sys.executable, "-m", "gpuscope.daemon.cli", "up", "--insecure", "--listen",
                                   f"127.0.0.1:{free_port()}", "--db", str(db), "--speed", "5", "--window", "1",
                                   "--interval", "0.2"], env)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    out = b""

    def read_for(s: float) -> bytes:
        got, end = b"", time.monotonic() + s
        while time.monotonic() < end:
            if select.select([fd], [], [], 0.2)[0]:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                got += chunk
        return got
    try:
        out += read_for(seconds)
        os.kill(pid, signal.SIGINT)
        out += read_for(20)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _, status = os.waitpid(pid, 0)
    return out.decode("utf-8", "replace"), status


@pytest.mark.parametrize("cols, rows", [(120, 30), (72, 24)])
def test_the_live_view_in_a_terminal(tmp_path, cols, rows):
    text, status = _drive(tmp_path, cols, rows, seconds=12)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, text[-2000:]
    assert "\x1b[?1049h" in text and "\x1b[?1049l" in text            # the alternate screen, given back at exit
    screens = ANSI.sub("", text).replace("\r", "")
    view = ANSI.sub("", text[text.rindex("\x1b[H"):text.rindex("\x1b[?1049l")]).replace("\r", "")   # the last frame
    assert all(len(line.rstrip()) <= cols for line in view.split("\n")), [(len(x), x) for x in view.split("\n")]
    assert "VERDICT" in view and "CONF" in view and "SEEN" in view
    assert ("ACTIVITY" in view) == (cols >= 80) and ("NAME" in view) == (cols >= 100)
    assert "detector warming up:" in view
    assert '"event"' not in view and "[info" not in view                 # no log line inside the view
    assert re.search(r"gpuscope up ran \d+s: \d+ episodes? \(", screens), screens[-600:]
    assert (tmp_path / "gpuscope-up.log").stat().st_size > 0            # the logs went here meanwhile
