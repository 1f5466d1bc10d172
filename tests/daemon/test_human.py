"""Numbers for people (collectors/human.py) and the report as a person reads it:
the outputs below are the reviewed formats."""
import time
from pathlib import Path

import pytest

from gpuscope.collectors import human
from gpuscope.daemon.cmd_oncall import render_report


@pytest.mark.parametrize("unit, v, said", [
    # found in a trial: `694.2760000000001 watts`, `5597167616.0 bytes`, `4.0 bitmask`
    ("watts", 694.2760000000001, "694 W"), ("bytes", 5597167616.0, "5.21 GiB"), ("bytes", 512.0, "512 B"),
    ("bitmask", 12.0, "sw-power-cap, hw-slowdown"), ("bitmask", 0.0, "none"), ("bitmask", 4096.0 + 4, "sw-power-cap, 0x1000"),
    ("ratio", 0.739, "74 %"), ("ratio", 0.046, "4.6 %"), ("ratio", 0.0, "0 %"),
    ("bytes/s", 2.43e8, "243 MB/s"), ("hertz", 1.96e9, "1.96 GHz"), ("celsius", 61.4, "61 °C"),
    ("seconds", 0.297, "297 ms"), ("1/s", 2126.4, "2,126/s"), ("1/s", 3.5, "3.50/s"), ("count", 40.0, "40"),
    ("count", 0.5, "0.50"), ("cores", 1.25, "1.25 cores"), ("cores", 0.275, "0.28 cores"), ("watts", None, "—"), ("watts", float("nan"), "—"),
])
def test_values_read_at_a_glance(unit, v, said):
    assert human.value(unit, v) == said


def _report(**finding):
    f = dict(id="a1b2c3d4e5f6", host="gpu-7", gpu=3, verdict="memory-bound", start=time.time() - 600,
             end=time.time() - 60, windows=108, confidence=0.83, job="pid:461 python train.py",
             summary="memory-bound: DRAM 74 % busy", flags=["power_capped"])
    f.update(finding)
    before = dict(samples=600, gpm_dram_bw_util_ratio=0.046, sm_clock_hertz=1.96e9, power_watts=694.276)
    during = dict(samples=540, gpm_dram_bw_util_ratio=0.739, sm_clock_hertz=1.49e9, power_watts=700.0)
    return dict(finding=f, counters=dict(context_seconds=600, before=before, during=during, after=None),
                verdict=dict(decided="memory-bound", by="counters", counters="memory-bound", trace=None),
                changes=[dict(metric="gpm_dram_bw_util_ratio", before=0.046, during=0.739, change=0.693,
                              relative=0.938),
                         dict(metric="sm_clock_hertz", before=1.96e9, during=1.49e9, change=-4.7e8, relative=-0.24)],
                captures=[], anomalies=[], decisions=[])


def test_a_report_says_changes_relative_to_before_and_names_flags_and_clocks():
    """Found in a trial: `0.046 -> 0.739 (+94%)` for a 16x rise, and neither
    the power-capped flag nor the SM clock's drop was mentioned."""
    text = render_report(_report())
    assert "  flags: power-capped" in text
    assert "  gpm_dram_bw_util_ratio: 4.6 % -> 74 % (16.1× more)" in text
    assert "  sm_clock_hertz: 1.96 GHz -> 1.49 GHz (-24 %)" in text
    assert "  power_watts                             694 W        700 W            —" in text
    yesterday = render_report(_report(start=time.time() - 2 * 86400, end=None))
    assert time.strftime("%Z") in yesterday.splitlines()[1] and "-> open" in yesterday


def test_every_verdict_and_flag_has_advice_and_the_docs_list_it_word_for_word():
    from pathlib import Path

    from gpuscope.analyzers.rules import RULES, flags, what_to_try
    doc = (Path(__file__).parents[2] / "docs" / "verdicts.md").read_text()
    lines = [t for r in RULES for t in r.TRY] + [t for v in flags.TRY.values() for t in v]
    assert all(r.TRY for r in RULES) and set(flags.TRY) == {"power-capped", "thermal-throttled"}
    assert [t for t in lines if f"- {t}\n" not in doc] == []
    said = what_to_try("memory-bound", ["power_capped"])
    assert said[0].startswith("more work per byte") and said[-1].startswith("the clocks are held")


SNAPSHOT = Path(__file__).parent / "snapshots" / "report.txt"


def test_a_whole_report_reads_as_reviewed(monkeypatch):
    """The human report, byte for byte (regenerate with GPUSCOPE_SNAPSHOTS=write
    and review the diff): times in UTC on a fixed day long gone."""
    import os
    from gpuscope.analyzers.rules import what_to_try
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        start = 1764547200.0                     # 2025-12-01 00:00:00 UTC
        rep = _report(start=start, end=start + 540)
        rep["what_to_try"] = what_to_try("memory-bound", ["power_capped"])
        rep["captures"] = [dict(id="c0ffee", kind="trace", status="ok", path="/var/lib/gpuscope/captures/c0ffee",
                                trace_summary=dict(verdict="memory-bound", summary="78 % of device time in loops",
                                                   top_ops=[dict(time_fraction=0.41, op="fusion.12",
                                                                 kernel="loop_add_fusion")]))]
        rep["anomalies"] = [dict(t=start + 5, kinds=["bottleneck-changed"], reason="compute-bound -> memory-bound")]
        rep["decisions"] = [dict(t=start + 6, action="capture", status="started", reason="bottleneck changed")]
        text = render_report(rep) + "\n"
    finally:
        monkeypatch.undo()
        time.tzset()
    if os.environ.get("GPUSCOPE_SNAPSHOTS") == "write":
        SNAPSHOT.parent.mkdir(exist_ok=True)
        SNAPSHOT.write_text(text)
    assert text == SNAPSHOT.read_text()


@pytest.mark.parametrize("before, during, said", [
    (0.19, 0.000127, "1,496× less"), (0.046, 0.739, "16.1× more"), (0.38, 0.0, "to 0"), (0.0, 0.4, "from 0"),
    (100.0, 124.0, "+24 %"), (2.82, 0.09, "31.3× less"),
])
def test_moves_read_without_exponents(before, during, said):
    """Found in a trial: `(1.49e+03× less)` and `(-100 %)` beside `(891× less)`."""
    from gpuscope.daemon.cmd_oncall import _moved
    assert _moved(dict(before=before, during=during)) == said


def test_report_json_says_relative_change_as_people_mean_it(tmp_path):
    """Found in a trial: JSON had "relative": 0.94 for a 17x rise while the
    text said 17.1x more."""
    from gpuscope.analyzers.report import _changes
    ch = {c["metric"]: c for c in _changes(dict(gpm_tensor_util_ratio=0.046, sm_clock_hertz=1.96e9),
                                           dict(gpm_tensor_util_ratio=0.794, sm_clock_hertz=1.49e9))}
    t = ch["gpm_tensor_util_ratio"]
    assert round(t["factor"], 2) == 17.26 and round(t["relative"], 2) == 16.26
    assert round(ch["sm_clock_hertz"]["relative"], 2) == -0.24 and "_rank" not in t
