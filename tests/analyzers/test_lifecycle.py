"""Lifecycle of GPUs and findings over time: a GPU whose agent goes silent
becomes stale and its finding closes at the end of the last window it
absorbed; after a restart status shows what the store holds. Real Analyzer
objects on real DuckDB files, an injected clock instead of sleeping."""
import math
import threading
import time

import duckdb
import numpy as np
import pytest
import structlog

from gpuscope.analyzers.analyzer import STALE_AFTER_WINDOWS, Analyzer, AnalyzerConfig
from gpuscope.analyzers.classify import Classification
from gpuscope.analyzers.findings import FindingsTracker
from gpuscope.analyzers.ingest import decode
from gpuscope.analyzers.store import Store, StoreConfig
from gpuscope.collectors.records import DeviceInfo, GpuSample
from gpuscope.daemon.convert import encode_batch

COMPUTE = dict(util_gpu_ratio=0.95, util_mem_ratio=0.2)
MEMORY = dict(util_gpu_ratio=0.95, util_mem_ratio=0.95)
T0 = math.floor(time.time() / 60) * 60 - 3600.0     # whole minute, an hour ago: inside decode's bounds


class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


def _analyzer(path, clock: Clock, **config) -> Analyzer:
    a = Analyzer(AnalyzerConfig(str(path), window_s=1.0, memory_limit="256MB", **config), clock=clock)
    a.writer.start()            # no scheduler: the test drives sweeps and the clock
    return a


def _batch(host: str, boot: str, seq: int, t_from: float, gpus: dict[int, dict], hz: int = 10):
    samples = [GpuSample(g, float(t), dict(v)) for t in t_from + np.arange(hz) / hz for g, v in gpus.items()]
    return encode_batch(host, boot, seq, samples, [DeviceInfo(gpu=g, name="NVIDIA H200") for g in gpus])


def _feed(a: Analyzer, clock: Clock, host: str, gpus: dict[int, dict], start: float, seconds: int,
          boot: str = "boot-1", seq0: int = 1) -> int:
    """One batch per second of samples, arriving just after its second ends."""
    for s in range(seconds):
        clock.t = start + s + 1
        assert a.submit(_batch(host, boot, seq0 + s, start + s, gpus)).result(timeout=10) == "committed"
    a.writer.call(lambda _s: None).result(timeout=10)     # after the analysis of what was committed
    return seq0 + seconds


def _findings(a: Analyzer, host: str, gpu: int) -> list[dict]:
    return sorted(a.list_findings(host=host, gpu=gpu), key=lambda f: f["start"])


def _gpu(status: dict, host: str, gpu: int) -> dict:
    return next(g for g in status["gpus"] if (g["host"], g["gpu"]) == (host, gpu))


def test_a_silent_gpu_goes_stale_and_its_finding_closes_at_its_last_window(tmp_path):
    clock = Clock(T0)
    a = _analyzer(tmp_path / "s.duckdb", clock)
    try:
        _feed(a, clock, "host-a", {0: COMPUTE, 1: MEMORY}, T0, 6)
        _feed(a, clock, "host-a", {0: COMPUTE}, T0 + 6, 4, seq0=7)      # GPU 1 stops reporting
        clock.t = T0 + 10.0
        st = a.status()
        g1, g0 = _gpu(st, "host-a", 1), _gpu(st, "host-a", 0)
        assert g1["stale"] and g1["last_seen_age_s"] == pytest.approx(4.0) and g1["verdict"] == "memory-bound"
        assert not g0["stale"] and g0["last_seen_age_s"] == pytest.approx(0.0)
        assert (st["gpus_stale"], st["hosts_stale"], st["hosts"]) == (1, 0, 1)
        assert STALE_AFTER_WINDOWS * 1.0 == st["stale_after_seconds"] == 3.0

        a.sweep().result(timeout=10)
        [f] = _findings(a, "host-a", 1)
        # its last (partial) window [T0+5, T0+6) was judged by the sweep and absorbed
        assert f["verdict"] == "memory-bound" and f["windows"] == 6
        assert f["start"] == T0 and f["end"] == T0 + 6.0      # not the sweep's time (T0+10)
        assert "ended: agent went silent (no samples for 4 s)" in f["summary"]
        assert _findings(a, "host-a", 0)[0]["end"] is None and a.status()["findings_open"] == 1

        clock.t = T0 + 20.0                                    # the whole host goes quiet
        a.sweep().result(timeout=10)
        [f0] = _findings(a, "host-a", 0)
        assert f0["end"] == T0 + 10.0 and "agent went silent" in f0["summary"]
        st = a.status()
        assert (st["gpus_stale"], st["hosts_stale"], st["findings_open"]) == (2, 1, 0)
        assert _gpu(st, "host-a", 0)["last_seen_age_s"] == pytest.approx(10.0)
    finally:
        a.close()


def test_an_analyzer_behind_its_agents_does_not_take_its_backlog_for_silence(tmp_path):
    """Batches waiting for the writer are not silence: the sweep and status
    judge it at when the writer last took everything queued. Before, a
    fleet's backlog closed findings "agent went silent", to reopen them at
    once, which made the backlog longer."""
    clock = Clock(T0)
    a = _analyzer(tmp_path / "b.duckdb", clock)
    try:
        for host in ("host-a", "host-b"):
            _feed(a, clock, host, {0: MEMORY}, T0, 6)
        release, taken = threading.Event(), threading.Event()
        a.writer.call(lambda _s: taken.set() or release.wait(10))
        assert taken.wait(10)          # taken alone: the writer had caught up at T0 + 6
        a.writer._max_group = 1        # a backlog longer than a group: each take leaves the rest queued
        clock.t = T0 + 40.0
        late_a = a.submit(_batch("host-a", "boot-1", 7, T0 + 6, {0: MEMORY}))
        swept = a.sweep()
        seen = a.writer.call(lambda _s: a.status())
        late_b = a.submit(_batch("host-b", "boot-1", 7, T0 + 6, {0: MEMORY}))
        release.set()
        assert late_a.result(timeout=10) == late_b.result(timeout=10) == "committed"
        swept.result(timeout=10)
        st = seen.result(timeout=10)
        assert st["ingest_behind_since"] == T0 + 6
        assert not _gpu(st, "host-b", 0)["stale"] and _gpu(st, "host-b", 0)["last_seen_age_s"] == 34.0
        for host in ("host-a", "host-b"):
            [f] = _findings(a, host, 0)
            assert f["end"] is None and f["windows"] >= 6, (host, f["summary"])
        assert a.writer.behind_since() is None and a.status()["ingest_behind_since"] is None

        clock.t = T0 + 50.0            # caught up, and silent for 10 s: now they are
        a.sweep().result(timeout=10)
        for host in ("host-a", "host-b"):
            [f] = _findings(a, host, 0)
            assert f["end"] == T0 + 7.0 and "agent went silent (no samples for 10 s)" in f["summary"]
        assert a.status()["gpus_stale"] == 2
    finally:
        a.close()


def test_a_changed_verdict_closes_the_finding_at_its_last_window_and_says_why():
    tracker = FindingsTracker(window_s=5.0, max_gap_s=15.0)
    w = lambda start, verdict: Classification(gpu=0, start=start, end=start + 5, verdict=verdict,  # noqa: E731
                                              confidence=0.9, summary=f"{verdict} summary", evidence={"x": 1.0})
    tracker.observe("h", w(100.0, "memory-bound"), "")
    tracker.observe("h", w(105.0, "memory-bound"), "")
    [closed, opened] = tracker.observe("h", w(110.0, "compute-bound"), "")
    assert closed["end"] == 110.0 and closed["summary"].endswith("ended: became compute-bound")
    # a window long after the last one: the agent was silent in between
    [closed, opened2] = tracker.observe("h", w(200.0, "compute-bound"), "")
    assert closed["id"] == opened["id"] and closed["end"] == 115.0
    assert "agent went silent (no samples for 85 s)" in closed["summary"] and opened2["start"] == 200.0
    [closed] = tracker.observe("h", w(205.0, "idle"), "")
    assert closed["end"] == 205.0 and closed["summary"].endswith("ended: GPU went idle")


def test_after_a_restart_status_shows_what_the_store_holds(tmp_path):
    path = tmp_path / "r.duckdb"
    clock = Clock(T0)
    a = _analyzer(path, clock)
    _feed(a, clock, "host-a", {0: MEMORY, 1: COMPUTE}, T0, 6)
    _feed(a, clock, "host-b", {0: COMPUTE}, T0, 6)
    a.close()

    clock = Clock(T0 + 100.0)
    b = _analyzer(path, clock)
    try:
        st = b.status()
        assert st["hosts"] == 2 and len(st["gpus"]) == 3
        assert st["samples_stored"] == 3 * 6 * 10 and st["samples_committed"] == 0
        assert st["findings_open"] == 3
        g = _gpu(st, "host-a", 0)
        assert g["name"] == "NVIDIA H200" and g["verdict"] == "memory-bound" and g["confidence"] > 0.5
        assert _gpu(st, "host-a", 1)["verdict"] == "compute-bound"
        assert g["last_sample"] == pytest.approx(T0 + 5.9) and g["open_finding"]
        # last seen: the host's last commit, on the analyzer's clock
        assert g["stale"] and g["last_seen_age_s"] == pytest.approx(100.0 - 6.0)
        assert (st["gpus_stale"], st["hosts_stale"]) == (3, 2)

        b.sweep().result(timeout=10)            # a resumed finding waits 3 windows for its agent
        assert b.status()["findings_open"] == 3
        clock.t += STALE_AFTER_WINDOWS + 1
        b.sweep().result(timeout=10)
        assert b.status()["findings_open"] == 0
        for host, gpu in (("host-a", 0), ("host-a", 1), ("host-b", 0)):
            [f] = _findings(b, host, gpu)
            # the last window judged before the stop was [T0+4, T0+5); not the restart's time
            assert f["end"] == T0 + 5.0 and f["windows"] == 5
            assert "not heard from since the analyzer restarted" in f["summary"]
    finally:
        b.close()


def test_a_restart_reads_the_gpu_state_snapshot_and_what_came_after_it(tmp_path):
    """Start-up does not scan every window and sample of a big store: it
    reads the snapshot written by the sweeps, and scans only from shortly
    before it (10 min)."""
    path = tmp_path / "g.duckdb"
    clock = Clock(T0)
    a = _analyzer(path, clock)
    seq = _feed(a, clock, "host-a", {0: MEMORY, 1: MEMORY}, T0, 6)
    a.sweep().result(timeout=10)                              # snapshot: both GPUs memory-bound
    seq = _feed(a, clock, "host-a", {0: MEMORY}, T0 + 900, 3, seq0=seq)
    a.sweep().result(timeout=10)         # again at T0+903, with GPU 1's last window judged by the sweep
    _feed(a, clock, "host-a", {0: COMPUTE}, T0 + 903, 3, seq0=seq)   # after the last snapshot
    a.close()
    b = _analyzer(path, Clock(T0 + 1000))
    try:
        rows = {(r["host"], r["gpu"]): r for r in b.store.gpu_states()}
        # owed since T0+903, not yet due: written with everything else at shutdown
        assert rows[("host-a", 1)]["verdict"] == "memory-bound" and rows[("host-a", 1)]["written"] == T0 + 906
        assert rows[("host-a", 1)]["last_window_end"] == T0 + 6
        st = b.status()
        g0, g1 = _gpu(st, "host-a", 0), _gpu(st, "host-a", 1)
        # GPU 1's windows end before the scanned range: the snapshot has them
        assert g1["verdict"] == "memory-bound" and g1["last_sample"] == pytest.approx(T0 + 5.9)
        # GPU 0 changed after the snapshot: the bounded scan finds it
        assert g0["verdict"] == "compute-bound" and g0["last_sample"] == pytest.approx(T0 + 905.9)
        assert b.findings.open[("host-a", 0)]["last_window_end"] == T0 + 905.0
    finally:
        b.close()


def test_a_state_row_a_kill_left_behind_is_owed_and_rewritten(tmp_path):
    """A kill -9 can leave a GPU's state row up to 30 s behind its windows.
    The restart's scan finds the newer windows; the row must then be written
    again, or a GPU that stays silent keeps the stale row, and a later
    restart, whose scan no longer reaches those windows, believes it (found
    in a trial)."""
    path = tmp_path / "k.duckdb"
    clock = Clock(T0)
    a = _analyzer(path, clock)
    _feed(a, clock, "h", {0: MEMORY}, T0, 6)
    a.close()
    con = duckdb.connect(str(path))          # what a kill -9 before the row's turn leaves
    right = con.execute("SELECT verdict, last_window_end FROM gpu_state").fetchone()
    con.execute("UPDATE gpu_state SET verdict = 'compute-bound', last_window_end = ? WHERE host = 'h'", [T0 + 2])
    con.close()
    b = _analyzer(path, Clock(T0 + 100))
    try:
        assert _gpu(b.status(), "h", 0)["verdict"] == "memory-bound"       # the scan found the windows
        assert ("h", 0) in b._dirty
    finally:
        b.close()
    row = Store(StoreConfig(str(path))).gpu_states()[0]
    assert (row["verdict"], row["last_window_end"]) == right == ("memory-bound", T0 + 5)


def test_owed_rows_whose_write_fails_are_owed_again(tmp_path, monkeypatch):
    clock = Clock(T0)
    a = _analyzer(tmp_path / "w.duckdb", clock)
    try:
        _feed(a, clock, "h", {0: MEMORY, 1: COMPUTE}, T0, 4)
        owed = len(a._dirty)
        assert owed == 2

        def full(_rows):
            raise duckdb.IOException("No space left on device")
        # the analysis's writes run on the commit thread's connection (Writer.defer)
        monkeypatch.setattr(a.writer._sink, "upsert_gpu_state", full)
        a.writer.call(lambda _s: a._write_owed(clock(), everything=True)).result(timeout=10)   # logged
        assert len(a._dirty) == owed
        monkeypatch.undo()
        clock.t += 1
        a.writer.call(lambda _s: a._write_owed(clock())).result(timeout=10)    # due at once: all written
        assert len(a._dirty) == 0 and len(a.store.gpu_states()) == 2
    finally:
        a.close()


def test_up_restarted_later_does_not_stretch_the_old_finding_over_the_gap(tmp_path):
    """`gpuscope up` stopped and started: the new agent boot's windows come
    long after the last one; the old finding ends at its last window."""
    path = tmp_path / "u.duckdb"
    clock = Clock(T0)
    a = _analyzer(path, clock)
    _feed(a, clock, "host-a", {0: MEMORY}, T0, 6)
    a.close()
    clock = Clock(T0 + 60.0)
    b = _analyzer(path, clock)
    try:
        _feed(b, clock, "host-a", {0: MEMORY}, T0 + 60.0, 4, boot="boot-2")
        old, new = _findings(b, "host-a", 0)
        assert old["end"] == T0 + 5.0 and "agent went silent (no samples for 55 s)" in old["summary"]
        assert new["start"] == T0 + 60.0 and new["end"] is None and new["verdict"] == "memory-bound"
        st = b.status()
        assert st["samples_stored"] == 100 and st["samples_committed"] == 40
        assert not _gpu(st, "host-a", 0)["stale"] and st["gpus_stale"] == 0
    finally:
        b.close()


def test_an_analyzer_restart_with_the_agent_resending_continues_the_episode(tmp_path):
    """The agent buffered while the analyzer was away: no gap in sample time."""
    path = tmp_path / "c.duckdb"
    clock = Clock(T0)
    a = _analyzer(path, clock)
    seq = _feed(a, clock, "host-a", {0: MEMORY}, T0, 6)
    a.close()
    clock = Clock(T0 + 30.0)
    b = _analyzer(path, clock)
    try:
        _feed(b, clock, "host-a", {0: MEMORY}, T0 + 6, 4, seq0=seq)   # resent from the agent's buffer
        [f] = _findings(b, "host-a", 0)
        # 5 windows before the stop, 3 after; [T0+5, T0+6) was still filling when
        # the first analyzer stopped (its samples are stored, the window is not judged)
        assert f["end"] is None and f["windows"] == 8
    finally:
        b.close()


def test_analysis_lag_is_zero_when_caught_up_and_counts_what_is_not_analysed(tmp_path):
    clock = Clock(T0)
    a = _analyzer(tmp_path / "l.duckdb", clock)
    try:
        assert a.status()["analysis_lag_seconds"] == 0.0
        _feed(a, clock, "host-a", {0: COMPUTE}, T0, 3)
        assert a.status()["analysis_lag_seconds"] == 0.0
        ahead = _batch("host-a", "boot-1", 4, T0 + 10, {0: COMPUTE})
        a.note_received(decode(ahead))          # received, not yet analysed
        assert a.status()["analysis_lag_seconds"] == pytest.approx(8.0)   # windows [T0+2, T0+10)
        clock.t = T0 + 11
        a.submit(ahead).result(timeout=10)
        a.writer.call(lambda _s: None).result(timeout=10)
        assert a.status()["analysis_lag_seconds"] == 0.0    # the empty windows between are not lag
    finally:
        a.close()


def test_the_live_view_shows_stale_gpus_with_their_age(tmp_path):
    import io

    from gpuscope.daemon.view import LiveView, render
    clock = Clock(T0)
    a = _analyzer(tmp_path / "v.duckdb", clock)
    try:
        _feed(a, clock, "host-a", {0: MEMORY, 1: COMPUTE}, T0, 3)
        out = io.StringIO()
        view = LiveView(out)
        view.show(a.status(), [], "hdr")
        clock.t = T0 + 200.0
        st = a.status()
        screen = render(st, [], "hdr", now=clock.t)
        assert "STALE 3m" in screen and "STALE: 2 GPU(s), 1 host(s) silent" in screen
        assert "hosts 1 (1 stale)" in screen and "samples stored 60" in screen
        view.show(st, [], "hdr")
        assert "host-a/gpu1: stale, no samples for 3m (last verdict compute-bound)" in out.getvalue()
    finally:
        a.close()


def test_an_extended_finding_is_written_within_the_snapshot_period_and_read_live_meanwhile(tmp_path):
    """Absorbing a window does not rewrite the finding (a fleet extends
    thousands a window); queries see its running numbers from memory, the
    store gets them within SNAPSHOT_EVERY_S and at shutdown."""
    clock = Clock(T0)
    path = tmp_path / "f.duckdb"
    a = _analyzer(path, clock)
    try:
        _feed(a, clock, "h", {0: MEMORY}, T0, 8)
        [live] = _findings(a, "h", 0)
        [stored] = a.store.findings(host="h", gpu=0)
        assert live["id"] == stored["id"] and live["end"] is None
        assert live["windows"] == 7 and stored["windows"] == 1        # the window of T0+7 is still open
        assert a.finding(live["id"])["windows"] == 7
        a.sweep().result(timeout=10)                                     # the first snapshot
        _feed(a, clock, "h", {0: MEMORY}, T0 + 8, 32, seq0=9)            # past SNAPSHOT_EVERY_S
        a.sweep().result(timeout=10)
        [stored], [live] = a.store.findings(host="h", gpu=0), _findings(a, "h", 0)
        # at most SNAPSHOT_EVERY_S (30 one-second windows) behind, and written once meanwhile
        assert stored["end"] is None and live["windows"] == 39 and 39 - 30 <= stored["windows"] < 39
        assert stored["absorbed_until"] == T0 + stored["windows"]
    finally:
        a.close()
    b = _analyzer(path, clock)
    try:
        [stored] = b.store.findings(host="h", gpu=0)
        assert stored["windows"] == 39 and stored["evidence"] == live["evidence"]      # shutdown wrote it whole
    finally:
        b.close()


def test_the_snapshot_period_is_the_operators_to_choose(tmp_path):
    """--snapshot-every 60s: an extended finding's row may lag 60 windows
    of one second, not 30; opening it was written at once all the same."""
    clock = Clock(T0)
    a = _analyzer(tmp_path / "p.duckdb", clock, snapshot_s=60.0)
    try:
        _feed(a, clock, "h", {0: MEMORY}, T0, 8)
        assert a.store.findings(host="h", gpu=0)[0]["windows"] == 1
        a.sweep().result(timeout=10)
        _feed(a, clock, "h", {0: MEMORY}, T0 + 8, 32, seq0=9)
        a.sweep().result(timeout=10)
        [stored], [live] = a.store.findings(host="h", gpu=0), _findings(a, "h", 0)
        # 39 windows absorbed; the 30 s period would have written it by now (the test above)
        assert live["windows"] == 39 and stored["windows"] < 39 - 30
        _feed(a, clock, "h", {0: MEMORY}, T0 + 40, 40, seq0=41)
        a.sweep().result(timeout=10)
        [stored], [live] = a.store.findings(host="h", gpu=0), _findings(a, "h", 0)
        assert live["windows"] == 79 and 79 - 60 <= stored["windows"] < 79
    finally:
        a.close()
    with pytest.raises(ValueError, match="snapshot period 0.5 s"):
        Analyzer(AnalyzerConfig(str(tmp_path / "q.duckdb"), snapshot_s=0.5))


def test_shutdown_writes_what_open_findings_absorbed(tmp_path):
    clock = Clock(T0)
    path = tmp_path / "g.duckdb"
    a = _analyzer(path, clock)
    _feed(a, clock, "h", {0: COMPUTE}, T0, 6)
    n = _findings(a, "h", 0)[0]["windows"]
    a.close()
    b = _analyzer(path, clock)
    try:
        [f] = b.store.findings(host="h", gpu=0)
        assert f["end"] is None and f["windows"] == n == 5
    finally:
        b.close()


def test_status_lists_the_gpus_asked_for_and_counts_the_whole_fleet(tmp_path):
    clock = Clock(T0)
    a = _analyzer(tmp_path / "st.duckdb", clock)
    try:
        for h in ("h-b", "h-a", "h-c"):
            _feed(a, clock, h, {0: COMPUTE, 1: MEMORY}, T0, 2)
        _feed(a, clock, "h-c", {0: COMPUTE, 1: MEMORY}, T0 + 2, 5, seq0=3)   # h-a and h-b go stale
        st = a.status(gpu_limit=3)
        assert [(g["host"], g["gpu"]) for g in st["gpus"]] == [("h-a", 0), ("h-a", 1), ("h-b", 0)]
        assert (st["gpus_total"], st["gpus_matching"], st["gpus_stale"], st["hosts"], st["hosts_stale"]) == (6, 6, 4, 3, 2)
        one = a.status(host="h-c")
        assert [(g["host"], g["gpu"], g["stale"]) for g in one["gpus"]] == [("h-c", 0, False), ("h-c", 1, False)]
        assert (one["gpus_total"], one["gpus_matching"], one["gpus_stale"]) == (6, 2, 4)
        assert a.status(host="nope")["gpus"] == [] and len(a.status()["gpus"]) == 6
    finally:
        a.close()


KILLED = """
import os, signal, sys
sys.path.insert(0, {root!r})
from tests.analyzers.test_lifecycle import Clock, _analyzer, _feed, _findings, MEMORY, T0
clock = Clock(T0)
a = _analyzer({path!r}, clock)
_feed(a, clock, "h", {{0: MEMORY}}, T0, 4)
a.sweep().result(timeout=10)                      # a snapshot: the row holds 3 windows
_feed(a, clock, "h", {{0: MEMORY}}, T0 + 4, 8, seq0=5)
print(_findings(a, "h", 0)[0]["windows"], flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_after_a_kill_the_resumed_finding_counts_every_stored_window(tmp_path):
    """Extended findings reach the store every 30 s; a kill -9 in between
    must not lose windows from the episode's count once it resumes."""
    import subprocess
    import sys
    from pathlib import Path
    path = tmp_path / "k.duckdb"
    root = str(Path(__file__).resolve().parents[2])
    proc = subprocess.run([sys.executable, "-c", KILLED.format(root=root, path=str(path))],
                          capture_output=True, text=True, timeout=120, cwd=root)
    assert proc.returncode == -9, proc.stderr
    live = int(proc.stdout.split()[-1])
    clock = Clock(T0 + 13)
    b = _analyzer(path, clock)
    try:
        [stored] = b.store.findings(host="h", gpu=0)
        assert stored["windows"] < live == 11                   # the row lagged when the process died
        [f] = _findings(b, "h", 0)
        assert f["windows"] == live and f["end"] is None        # every stored window counted again
    finally:
        b.close()


def test_a_transitional_window_neither_opens_nor_closes_a_finding():
    """Seen in a trial: a launch-bound finding at confidence 1.00 opened on
    the window of an idle -> matmul boundary. That window is transitional now,
    and only the windows on either side of the change move findings."""
    tracker = FindingsTracker(window_s=5.0, max_gap_s=15.0)
    w = lambda start, verdict, flags=(): Classification(gpu=0, start=start, end=start + 5, verdict=verdict,  # noqa: E731
                                                        confidence=0.9, summary=verdict, evidence={"x": 1.0},
                                                        flags=list(flags))
    assert tracker.observe("h", w(100.0, "idle"), "") == []
    assert tracker.observe("h", w(105.0, "launch-bound", ["transitional"]), "") == []
    [opened] = tracker.observe("h", w(110.0, "compute-bound"), "")
    assert opened["verdict"] == "compute-bound" and opened["start"] == 110.0
    assert tracker.observe("h", w(115.0, "memory-bound", ["transitional"]), "") == []
    [extended] = tracker.observe("h", w(120.0, "compute-bound"), "")
    assert extended["windows"] == 2 and extended["end"] is None


def test_a_starved_episode_split_between_launch_and_host_bound_says_so():
    """Counters cannot separate launch- from host-bound: an episode whose
    windows split says both, with the count of each, and its verdict share."""
    tracker = FindingsTracker(window_s=5.0, max_gap_s=15.0)
    w = lambda start, verdict: Classification(gpu=0, start=start, end=start + 5, verdict=verdict,  # noqa: E731
                                              confidence=0.6, summary="GPU starved by the host", evidence={"x": 1.0})
    verdicts = ["host-bound", "launch-bound", "launch-bound", "host-bound", "launch-bound", "launch-bound",
                "launch-bound", "host-bound"]
    for i, v in enumerate(verdicts):
        [f] = tracker.observe("h", w(100.0 + 5 * i, v), "")
    assert f["verdict"] == "launch-bound" and f["alternatives"] == ["host-bound"] and f["windows"] == 8
    assert f["summary"].startswith("launch or host-bound (launch-bound in 5 of 8 windows, host-bound in 3 of 8 "
                                   "windows): counters cannot tell them apart, a capture decides; GPU starved")
    assert tracker.evidence_of(f)["verdict_share"] == 0.625
    # a clear majority is not called a split
    for i in range(8, 20):
        [f] = tracker.observe("h", w(100.0 + 5 * i, "launch-bound"), "")
    assert f["summary"] == "GPU starved by the host" and tracker.evidence_of(f)["verdict_share"] == 0.85


def test_a_finding_whose_source_stopped_says_so_not_that_the_agent_went_silent(tmp_path):
    """Found in a trial: DCGM's host engine going down closed findings as
    'agent went silent' while the agent was talking all along."""
    from gpuscope.collectors.records import HealthKind, HealthRecord
    clock = Clock(T0)
    a = _analyzer(tmp_path / "s.duckdb", clock)
    said = "DCGM: lost the host engine at 127.0.0.1:5555 (DCGM_ST_CONNECTION_NOT_VALID)"
    try:
        _feed(a, clock, "host-a", {0: COMPUTE, 1: MEMORY}, T0, 6)
        clock.t = T0 + 7
        down = encode_batch("host-a", "boot-1", 7, [GpuSample(0, T0 + 6 + i / 10, dict(COMPUTE)) for i in range(10)],
                            [DeviceInfo(gpu=g, name="NVIDIA H200") for g in (0, 1)],
                            [HealthRecord(1, T0 + 6.1, HealthKind.SOURCE_ERROR, said)])
        assert a.submit(down).result(timeout=10) == "committed"
        _feed(a, clock, "host-a", {0: COMPUTE}, T0 + 7, 3, seq0=8)
        a.sweep().result(timeout=10)
        [f] = _findings(a, "host-a", 1)
        assert f["end"] == T0 + 6.0 and f"ended: its source stopped: no samples for 4 s; the agent said: {said}" \
            in f["summary"]
        assert "went silent" not in f["summary"]
    finally:
        a.close()


def test_a_resumed_finding_counts_only_the_windows_its_episode_absorbed(tmp_path):
    """Found in a trial: after a restart, every window stored after the row
    was counted in, whatever it said, and a replay's last windows took a 1.00
    finding to 0.43. Transitional windows are skipped, and one of another
    bottleneck family ended the episode."""
    from types import SimpleNamespace

    from gpuscope.analyzers.analyzer import Analyzer
    from gpuscope.analyzers.store import Store, StoreConfig
    store = Store(StoreConfig(str(tmp_path / "r.duckdb")))
    try:
        store.insert_windows([("h", 0, 100.0 + 5 * i, 105.0 + 5 * i, v, c, flags, "") for i, (v, c, flags) in enumerate([
            ("memory-bound", 1.0, "[]"), ("compute-bound", 0.2, '["transitional"]'), ("memory-bound", 0.8, "[]"),
            ("compute-bound", 0.9, "[]"), ("memory-bound", 1.0, "[]")])])
        f = dict(id="f1", host="h", gpu=0, start=80.0, verdict="memory-bound", counters_verdict="memory-bound",
                 windows=4, confidence=1.0, absorbed_until=100.0, evidence={"x": 1.0}, summary="",
                 decided_by="counters", alternatives=[])
        unwritten = Analyzer._unwritten(SimpleNamespace(store=store), [f])
        assert unwritten == {"f1": [("memory-bound", 1.0), ("memory-bound", 0.8)]}
        FindingsTracker(window_s=5.0).load([f], {}, unwritten)
        assert f["windows"] == 6 and f["confidence"] == round((4 + 1.0 + 0.8) / 6, 3)
    finally:
        store.close()


def test_a_split_episode_resumes_with_the_votes_it_had():
    """Found in a trial: after a kill -9 an episode split between launch-
    and host-bound came back with every window counted for the majority,
    0.75 sure instead of 0.375 (mean 0.6 x share 0.625), and kept it. The
    row's verdict share and alternatives give the votes back, and windows
    absorbed after the row was written add theirs."""
    import copy
    w = lambda i, verdict, conf=0.6: Classification(gpu=0, start=100.0 + 5 * i, end=105.0 + 5 * i,  # noqa: E731
                                                    verdict=verdict, confidence=conf, summary="GPU starved",
                                                    evidence={"x": float(i)})
    live = FindingsTracker(window_s=5.0, max_gap_s=15.0)
    verdicts = ["host-bound", "launch-bound", "launch-bound", "host-bound", "launch-bound", "launch-bound",
                "launch-bound", "host-bound"]
    for i, v in enumerate(verdicts):
        [f] = live.observe("h", w(i, v), "")
    row = copy.deepcopy(live.current(f))           # what the store holds
    assert (row["confidence"], row["evidence"]["verdict_share"]) == (0.375, 0.625)
    after = [w(8, "host-bound", 0.9), w(9, "host-bound", 0.7), w(10, "host-bound", 0.8)]   # row not written again
    for c in after:
        live.observe("h", c, "")

    resumed = FindingsTracker(window_s=5.0, max_gap_s=15.0)
    resumed.load([row], {("h", 0): 150.0}, {row["id"]: [(c.verdict, c.confidence) for c in after]})
    want = live.current(live.open[("h", 0)])
    got = resumed.current(resumed.open[("h", 0)])
    for key in ("windows", "confidence", "verdict", "counters_verdict", "summary"):
        assert got[key] == want[key], key
    assert got["verdict"] == "host-bound" and got["evidence"]["verdict_share"] == want["evidence"]["verdict_share"]
    assert got["evidence"]["x"] == row["evidence"]["x"]        # the means stay as written
    for i, v in enumerate(["host-bound", "launch-bound"], start=11):   # and both go on alike
        [a] = live.observe("h", w(i, v), "")
        [b] = resumed.observe("h", w(i, v), "")
        assert (a["verdict"], a["confidence"], a["summary"]) == (b["verdict"], b["confidence"], b["summary"])


def test_a_store_that_cannot_commit_does_not_take_its_agents_for_silent(tmp_path, monkeypatch):
    """Found in a trial on a full disk: the agent sent all along (and was told
    to resend), yet its GPU showed stale and its finding closed "agent went
    silent"; status never named the store. Now silence is judged at the first
    failed commit, status says what fails and since when, and once commits
    succeed again the agents' resends are stored and nothing was closed."""
    clock = Clock(T0)
    a = _analyzer(tmp_path / "f.duckdb", clock)
    try:
        _feed(a, clock, "host-a", {0: MEMORY}, T0, 6)
        real = a.writer._write

        def full(group):
            raise duckdb.IOException('IO Error: Could not write file "f.duckdb.wal": No space left on device')
        monkeypatch.setattr(a.writer, "_write", full)
        with structlog.testing.capture_logs() as logs:
            for s in range(6, 16):                  # 10 s of batches the store cannot commit
                clock.t = T0 + s + 1
                with pytest.raises(Exception, match="No space left on device"):
                    a.submit(_batch("host-a", "boot-1", s + 1, T0 + s, {0: MEMORY})).result(timeout=10)
        [line] = [x for x in logs if x["event"] == "commit failed; agents will resend"]     # said once, not 10 times
        assert "free space on the DB's file system" in line["what_to_do"]
        a.sweep().result(timeout=10)
        st = a.status()
        assert st["store_failing_since"] == T0 + 7 and "No space left on device" in st["store_error"]
        assert not _gpu(st, "host-a", 0)["stale"] and st["hosts_stale"] == 0
        [f] = _findings(a, "host-a", 0)
        assert f["end"] is None, f["summary"]

        monkeypatch.setattr(a.writer, "_write", real)      # room again: the agent's resends are stored
        clock.t = T0 + 17
        for s in range(6, 17):
            assert a.submit(_batch("host-a", "boot-1", s + 1, T0 + s, {0: MEMORY})).result(timeout=10) == "committed"
        a.writer.call(lambda _s: None).result(timeout=10)
        st = a.status()
        assert st["store_failing_since"] is None and st["store_error"] == ""
        [f] = _findings(a, "host-a", 0)
        assert f["end"] is None and f["windows"] >= 15
    finally:
        a.close()


def test_status_over_grpc_and_on_the_terminal_names_a_failing_store(tmp_path, monkeypatch, capsys):
    import grpc

    from gpuscope.daemon.cli import build_parser
    from gpuscope.daemon.cmd_oncall import cmd_status
    from gpuscope.v1 import analyzer_pb2 as apb, analyzer_pb2_grpc
    from tests.helpers import AnalyzerServer
    srv = AnalyzerServer(tmp_path / "g.duckdb")
    try:
        def full(group):
            raise duckdb.IOException('IO Error: Could not write file "g.duckdb.wal": No space left on device')
        monkeypatch.setattr(srv.analyzer.writer, "_write", full)
        with grpc.insecure_channel(srv.target) as ch:
            stub = analyzer_pb2_grpc.AnalyzerStub(ch)
            with pytest.raises(grpc.RpcError) as err:
                stub.Push(_batch("host-a", "boot-1", 1, time.time() - 2, {0: MEMORY}), timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            st = stub.GetStatus(apb.StatusRequest(), timeout=10)
        assert "No space left on device" in st.store_error and st.store_failing_seconds >= 0.0
        # the command itself, not cli.main, which would set up the process's logging for the tests after
        assert cmd_status(build_parser().parse_args(["status", "--server", srv.target, "--insecure"])) == 0
        out = capsys.readouterr().out
        assert "STORE FAILING for" in out and "No space left on device" in out
    finally:
        srv.stop()
