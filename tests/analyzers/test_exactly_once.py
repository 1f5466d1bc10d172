"""An acknowledgement means stored: poison batches, failed groups, a full
disk and resends, counted exactly."""
import os
import subprocess
import threading
import time
from concurrent.futures import wait

import pytest

from gpuscope.analyzers.analyzer import Analyzer, AnalyzerConfig
from gpuscope.analyzers.ingest import decode
from gpuscope.analyzers.seqset import SeqSet
from gpuscope.analyzers.writer import COMMITTED, DUPLICATE, BatchRejected, StoreUnavailable
from gpuscope.collectors.records import DeviceInfo, GpuSample
from gpuscope.daemon.convert import encode_batch

T0 = time.time() - 7200


def batch(seq, host="h1", boot="b1", n=4):
    samples = [GpuSample(0, T0 + seq * 10 + i / 1000, {"power_watts": 100.0 + i}) for i in range(n)]
    return encode_batch(host, boot, seq, samples, [DeviceInfo(gpu=0, name="NVIDIA H200")])


@pytest.fixture
def analyzer(tmp_path):
    a = Analyzer(AnalyzerConfig(str(tmp_path / "x.duckdb"), memory_limit="256MB"))
    a.start()
    yield a
    a.close()


def _held(a: Analyzer):
    """Holds the writer so that what is submitted next lands in one group."""
    gate = threading.Event()
    a.writer.call(lambda _s: gate.wait(10))
    return gate


def _rows_per_seq(a: Analyzer, host="h1") -> dict[int, int]:
    rows = a.store.reader().execute(
        "SELECT floor((t - ?) / 10)::INT AS seq, count(*) FROM samples WHERE host = ? GROUP BY 1", [T0, host]).fetchall()
    return dict(rows)


def test_seqset_tracks_holes_exactly():
    s = SeqSet()
    for q in (1, 2, 3, 7, 8, 5):
        s.add(q)
    assert s.ranges == [(1, 3), (5, 5), (7, 8)]
    assert 4 not in s and 6 not in s and 5 in s and 9 not in s
    s.add(4)
    s.add(6)
    assert s.ranges == [(1, 8)]
    s.add(12)
    s.close_below(10)           # the agent will never resend 9
    assert s.ranges == [(1, 9), (12, 12)]


def test_one_poison_batch_in_a_group_fails_alone(analyzer):
    gate = _held(analyzer)
    futs = []
    for seq in range(1, 41):
        d = decode(batch(seq))
        if seq == 17:           # past storage types; only the writer can find out
            d.health.append(("h1", 0, T0, "xid", "x", 2 ** 64 + 5))
        futs.append(analyzer.writer.submit(d))
    gate.set()
    wait(futs, timeout=30)
    assert isinstance(futs[16].exception(), BatchRejected)
    assert [f.result() for i, f in enumerate(futs) if i != 16] == [COMMITTED] * 39
    assert _rows_per_seq(analyzer) == {s: 4 for s in range(1, 41) if s != 17}
    assert analyzer.writer.rejected == 1


def test_a_resend_inside_one_group_shares_the_first_copys_outcome(analyzer):
    gate = _held(analyzer)
    first, again = analyzer.writer.submit(decode(batch(1))), analyzer.writer.submit(decode(batch(1)))
    gate.set()
    assert first.result(10) == COMMITTED and again.result(10) == DUPLICATE
    assert _rows_per_seq(analyzer) == {1: 4}


def _mount_tmpfs(path, size="64m") -> bool:
    path.mkdir()
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                           capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def _fill(path) -> None:
    try:
        with open(path / "filler", "wb") as f:
            while True:
                f.write(b"\0" * (1 << 16))
                f.flush()
    except OSError:
        pass


def test_full_disk_acks_nothing_and_the_resend_after_later_batches_is_stored(tmp_path):
    """The reported loss: a failed group, later seqs commit, the resend of
    the failed ones was answered DUPLICATE. A real full file system."""
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk):
        pytest.skip("cannot mount a size-capped tmpfs here (needs root)")
    try:
        a = Analyzer(AnalyzerConfig(str(disk / "x.duckdb"), memory_limit="128MB"))
        a.start()
        try:
            for seq in range(1, 6):
                assert a.writer.submit(decode(batch(seq, n=400))).result(30) == COMMITTED
            _fill(disk)
            failed = []
            for seq in range(6, 11):
                fut = a.writer.submit(decode(batch(seq, n=400)))
                try:
                    assert fut.result(30) == COMMITTED     # DuckDB may still have room in its blocks
                except StoreUnavailable:
                    failed.append(seq)
            assert failed, "the full disk failed no commit"
            os.unlink(disk / "filler")
            for seq in range(11, 16):
                assert a.writer.submit(decode(batch(seq, n=400))).result(30) == COMMITTED
            for seq in failed:            # the agent resends what was not acked
                assert a.writer.submit(decode(batch(seq, n=400))).result(30) == COMMITTED
            assert _rows_per_seq(a) == {s: 400 for s in range(1, 16)}
        finally:
            a.close()
        a = Analyzer(AnalyzerConfig(str(disk / "x.duckdb"), memory_limit="128MB"))   # the marks were persisted
        a.start()
        try:
            assert {a.writer.submit(decode(batch(s, n=400))).result(30) for s in range(1, 16)} == {DUPLICATE}
            assert a.writer.submit(decode(batch(16, n=400))).result(30) == COMMITTED
        finally:
            a.close()
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_the_next_group_commits_while_the_last_one_is_analysed(tmp_path):
    """The commit thread stores group 2 while group 1's analysis runs: here
    group 2's commit waits for group 1's analysis to begin, and group 1's
    analysis for group 2's commit. Run one after the other, they deadlock
    (each gives up after 10 s and the test fails)."""
    from gpuscope.analyzers.store import Store, StoreConfig
    from gpuscope.analyzers.writer import Writer
    store = Store(StoreConfig(str(tmp_path / "o.duckdb"), memory_limit="128MB"))
    analysing, second_committed, overlapped = threading.Event(), threading.Event(), []
    analysed: list[list[int]] = []

    def analyse(batches):
        analysed.append([b.seq for b in batches])
        if len(analysed) == 1:
            analysing.set()
            overlapped.append(second_committed.wait(10))

    w = Writer(store, analyse, max_group=1)
    commit = w._sink.commit

    def slow_commit():
        if w.batches == 1:                    # group 2's commit, with group 1 committed
            overlapped.append(analysing.wait(10))
        commit()
        if w.batches == 1:
            second_committed.set()
    w._sink.commit = slow_commit
    w.start()
    try:
        futs = [w.submit(decode(batch(seq))) for seq in (1, 2)]
        assert [f.result(30) for f in futs] == [COMMITTED, COMMITTED]
        w.call(lambda _s: None).result(30)   # a task runs after the analysis of all before it
        assert overlapped == [True, True] and analysed == [[1], [2]]
    finally:
        w.stop()
        store.close()


def test_a_fatal_error_reopens_the_store_and_both_connections_carry_on(analyzer):
    """DuckDB refuses every statement after a fatal error until the file is
    opened again: the group fails as UNAVAILABLE (the agents resend), the
    writer reopens once the analysis is done with the old connection, and
    the commit thread's connection follows."""
    import duckdb
    sink, calls = analyzer.writer._sink, []
    append = sink.append

    def fatal_once(table, rows, replace=False):
        calls.append(table)
        if len(calls) == 1:
            raise duckdb.FatalException("FATAL Error: database has been invalidated (injected)")
        return append(table, rows, replace)
    sink.append = fatal_once
    generation = analyzer.store._generation
    with pytest.raises(StoreUnavailable, match="invalidated"):
        analyzer.writer.submit(decode(batch(1))).result(30)
    assert analyzer.writer.submit(decode(batch(1))).result(30) == COMMITTED     # the resend
    assert analyzer.writer.submit(decode(batch(2))).result(30) == COMMITTED
    analyzer.writer.call(lambda _s: None).result(30)
    assert analyzer.store._generation == generation + 1
    assert _rows_per_seq(analyzer) == {1: 4, 2: 4}
    assert analyzer.store.count("windows") >= 0 and analyzer.writer.failed_groups == 1


def test_a_stopping_writer_does_not_count_as_caught_up(tmp_path):
    """Found in a trial: stopping an analyzer that was behind closed 570
    findings of agents that still held batches, as "went silent". A
    stopping writer takes nothing new, so its queue empties without it
    having caught up: silence is still judged at when it last had."""
    from gpuscope.analyzers.store import Store, StoreConfig
    from gpuscope.analyzers.writer import Writer
    clock = [100.0]
    store = Store(StoreConfig(str(tmp_path / "s.duckdb"), memory_limit="128MB"))
    w = Writer(store, lambda batches: None, clock=lambda: clock[0])
    w.start()
    try:
        gate, taken = threading.Event(), threading.Event()
        w.call(lambda _s: taken.set() or gate.wait(10))
        assert taken.wait(10)                          # taken alone at 100: caught up then
        clock[0] = 200.0
        late = w.submit(decode(batch(1)))
        seen = w.call(lambda _s: w.behind_since())
        assert w.behind_since() == 100.0
        stopper = threading.Thread(target=w.stop, args=(10,))
        stopper.start()
        while not w._stopping:
            time.sleep(0.01)
        gate.set()
        stopper.join(15)
        assert late.result(10) == COMMITTED and seen.result(10) == 100.0
    finally:
        w.stop()
        store.close()
