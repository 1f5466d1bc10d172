"""The systemd units as systemd reads them: `systemd-analyze verify` finds
nothing to say, and `systemd-analyze security --offline=yes` scores their
hardening within the targets (analyzer ≤ 2.5, agent ≤ 4.5; both were 8.4,
"EXPOSED"). systemd reads the units inside a scratch root holding the
system's own unit library and a stand-in for the installed gpuscope."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

UNITS = ROOT / "deploy" / "systemd"
TARGETS = {"gpuscope-analyzer.service": 2.5, "gpuscope-agent.service": 4.5}
SYSTEM_UNITS = next((p for p in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system")) if p.is_dir()), None)

pytestmark = pytest.mark.skipif(shutil.which("systemd-analyze") is None or SYSTEM_UNITS is None,
                                reason="systemd-analyze and the system's unit library are needed (Debian: systemd)")


@pytest.fixture()
def root(tmp_path):
    shutil.copytree(SYSTEM_UNITS, tmp_path / "usr/lib/systemd/system", symlinks=True)
    (tmp_path / "etc/systemd/system").mkdir(parents=True)
    for unit in TARGETS:
        shutil.copy(UNITS / unit, tmp_path / "etc/systemd/system" / unit)
    exe = tmp_path / "opt/gpuscope/.venv/bin/gpuscope"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    return tmp_path


def test_systemd_reads_the_units_without_a_word(root):
    out = subprocess.run(["systemd-analyze", "verify", "--man=no", f"--root={root}", *TARGETS],
                         capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout + out.stderr) == (0, "")


def test_a_mistyped_key_is_caught(root):
    """The check above can fail: systemd ignores an unknown key, but says so."""
    unit = root / "etc/systemd/system/gpuscope-agent.service"
    unit.write_text(unit.read_text().replace("UMask=0077", "UMask=0077\nProtectSytem=strict"))
    out = subprocess.run(["systemd-analyze", "verify", "--man=no", f"--root={root}", "gpuscope-agent.service"],
                         capture_output=True, text=True, timeout=60)
    assert "Unknown key 'ProtectSytem'" in out.stderr


@pytest.mark.parametrize("unit", TARGETS)
def test_hardening_scores_within_target(unit):
    out = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--no-pager", str(UNITS / unit)],
                         capture_output=True, text=True, timeout=60)
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d)", out.stdout + out.stderr)
    assert m, out.stdout + out.stderr
    assert float(m.group(1)) <= TARGETS[unit], out.stdout
    # the score in the unit's comment is the measured one
    assert f"scores this unit {m.group(1)}" in (UNITS / unit).read_text()
