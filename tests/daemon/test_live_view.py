"""The live view of `gpuscope up` in a real terminal (a pty) at two sizes:
it fits the width, shows the warm-up and a minute of activity, keeps log
lines out, and leaves a summary on the shell's screen at Ctrl-C."""
import os
import re
import sys

import pytest

from tests.conftest import free_port
from tests.helpers import ANSI, in_terminal, last_frame


def _drive(tmp_path, cols: int, rows: int, seconds: float) -> tuple[str, int]:
    db = tmp_path / f"v{cols}.duckdb"
    return in_terminal([sys.executable, "-m", "gpuscope.daemon.cli", "up", "--insecure", "--listen",
                        f"127.0.0.1:{free_port()}", "--db", str(db), "--speed", "5", "--window", "1",
                        "--interval", "0.2"], cols, rows, seconds)


@pytest.mark.parametrize("cols, rows", [(120, 30), (72, 24)])
def test_the_live_view_in_a_terminal(tmp_path, cols, rows):
    text, status = _drive(tmp_path, cols, rows, seconds=12)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, text[-2000:]
    assert "\x1b[?1049h" in text and "\x1b[?1049l" in text            # the alternate screen, given back at exit
    screens = ANSI.sub("", text).replace("\r", "")
    view = last_frame(text)
    assert all(len(line.rstrip()) <= cols for line in view.split("\n")), [(len(x), x) for x in view.split("\n")]
    assert "VERDICT" in view and "CONF" in view and "SEEN" in view
    assert ("ACTIVITY" in view) == (cols >= 80) and ("NAME" in view) == (cols >= 100)
    assert "detector warming up:" in view
    assert '"event"' not in view and "[info" not in view                 # no log line inside the view
    assert re.search(r"gpuscope up ran \d+s: \d+ episodes? \(", screens), screens[-600:]
    assert (tmp_path / "gpuscope-up.log").stat().st_size > 0            # the logs went here meanwhile
