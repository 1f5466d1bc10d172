"""`gpuscope top` lists open degraded and regression findings under its
ranking, with the command that lists them all."""
import time
from types import SimpleNamespace

from gpuscope.daemon.cmd_oncall import render_top


def _top(conditions):
    now = time.time()
    return dict(start=now - 3600, end=now, by="gpu", rows=[], conditions=conditions)


def test_the_hint_names_the_kinds_of_the_findings_it_lists():
    reg = dict(host="h9", gpu=0, kind="regression", flags=["slower-step"], id="e2b3967cb5f6",
               summary="jit_train_step (same HLO as 3 earlier runs) is 23 % slower on h9")
    out = render_top(_top([reg]), SimpleNamespace(host="", since=3600.0))
    assert "`gpuscope findings --kind regression --open` lists all" in out
    deg = dict(reg, kind="degraded", flags=["hbm"], id="aa11bb22cc33", summary="HBM 18 % under its peers")
    out = render_top(_top([reg, deg]), SimpleNamespace(host="", since=3600.0))
    assert "`gpuscope findings --kind degraded --kind regression --open` lists all" in out
