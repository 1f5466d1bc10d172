"""Real processes, real faults: an analyzer killed -9 while an agent catches
up, a poison batch from another client at the same time, and a second
analyzer on a busy port. Every acknowledged batch is stored, once."""
import signal
import subprocess
import sys
import threading
import time

import duckdb
import grpc

from gpuscope.collectors.records import DeviceInfo, GpuSample
from gpuscope.daemon.convert import encode_batch
from gpuscope.daemon.uplink import Uplink, UplinkConfig
from gpuscope.v1 import analyzer_pb2_grpc, samples_pb2 as pb
from tests.conftest import free_port
from tests.helpers import wait_for


def _analyzer(db, port, *extra):
    return subprocess.Popen([sys.executable, "-m", "gpuscope.daemon.cli", "--log-level", "warning", "analyzer",
                             "--db", str(db), "--listen", f"127.0.0.1:{port}", "--insecure", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _ready(port: int, timeout: float = 30.0) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        grpc.channel_ready_future(ch).result(timeout=timeout)


def _backlog(port: int, host: str) -> tuple[Uplink, int]:
    """An agent's uplink holding the backlog of an outage: 1,000 ticks x 8 GPUs,
    sent in small batches as fast as the analyzer acks them."""
    up = Uplink(UplinkConfig(target=f"127.0.0.1:{port}", flush_interval_s=0.02, max_batch_samples=20,
                             buffer_samples=1_000_000, backoff_initial_s=0.05, backoff_max_s=0.3),
                host, "boot-1", lambda: [DeviceInfo(gpu=g, name="NVIDIA H200") for g in range(8)])
    up.start()
    t0 = time.time() - 1800
    for i in range(1000):
        up.submit([GpuSample(g, t0 + i, {"power_watts": 100.0 + g, "util_gpu_ratio": 0.5}) for g in range(8)])
    up.flush()
    return up, 8 * 1000


def _poison(port: int, stop: threading.Event, answers: list) -> None:
    """Another client pushing batches that storage cannot hold."""
    seq = 0
    while not stop.is_set():
        seq += 1
        s = [GpuSample(0, time.time() - 1, {"power_watts": 1.0})]
        b = encode_batch("poison", "p", seq, s, [DeviceInfo(gpu=0, memory_total_bytes=2 ** 64 - 1)])
        try:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
                analyzer_pb2_grpc.AnalyzerStub(ch).Push(b, timeout=5)
            answers.append("OK")
        except grpc.RpcError as exc:
            answers.append(exc.code().name)
        stop.wait(0.05)


def test_kill_9_during_catch_up_with_a_poison_client_loses_no_acked_batch(tmp_path):
    db, port = tmp_path / "k.duckdb", free_port()
    up, total = _backlog(port, "catch-up")
    proc = _analyzer(db, port)
    stop, answers = threading.Event(), []
    poison = threading.Thread(target=_poison, args=(port, stop, answers), daemon=True)
    try:
        _ready(port)
        poison.start()
        wait_for(lambda: up.stats()["batches_acked"] >= 60, timeout=60, step=0.005)
        proc.send_signal(signal.SIGKILL)        # mid catch-up
        proc.wait(10)
        acked_before = up.stats()["batches_acked"]
        assert 0 < acked_before < total // 20
        proc = _analyzer(db, port)
        _ready(port)
        wait_for(lambda: up.stats()["unacked_samples"] == 0, timeout=120)
    finally:
        stop.set()
        up.stop()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err[-2000:]
    assert "INVALID_ARGUMENT" in answers and "OK" not in answers
    con = duckdb.connect(str(db), read_only=True)
    rows, distinct = con.execute("SELECT count(*), count(DISTINCT (gpu, t)) FROM samples WHERE host = 'catch-up'"
                                 ).fetchone()
    poisoned = con.execute("SELECT count(*) FROM samples WHERE host = 'poison'").fetchone()[0]
    con.close()
    assert (rows, distinct, poisoned) == (total, total, 0)
    assert up.stats()["dropped_samples"] == 0


def test_a_second_analyzer_on_a_busy_port_exits_naming_the_holder(tmp_path):
    port = free_port()
    first = _analyzer(tmp_path / "a.duckdb", port)
    try:
        _ready(port)
        for address in (f"127.0.0.1:{port}", f"localhost:{port}"):     # localhost is also ::1
            second = subprocess.run([sys.executable, "-m", "gpuscope.daemon.cli", "analyzer", "--insecure",
                                     "--db", str(tmp_path / "b.duckdb"), "--listen", address],
                                    capture_output=True, text=True, timeout=60)
            assert second.returncode != 0
            assert second.stderr.count("\n") == 1, second.stderr       # one line, nothing of grpc's own
            assert second.stderr.startswith(f"gpuscope analyzer: error: cannot listen on {address}")
            assert f"pid {first.pid}" in second.stderr
            assert not (tmp_path / "b.duckdb").exists()                 # failed before opening anything
        assert first.poll() is None             # the first one keeps serving
        _ready(port, timeout=5)
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=20)


def _analysis_child(pid: int) -> int:
    """The analyzer's analysis process (multiprocessing's spawn child)."""
    from pathlib import Path
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        if b"spawn_main" in cmdline:
            return int(child)
    raise AssertionError(f"no analysis process under pid {pid}")


def test_a_second_analyzer_on_a_db_in_use_is_refused_at_once_naming_the_first(tmp_path):
    """Found by a tester: it waited 20 s before saying so."""
    db, port = tmp_path / "a.duckdb", free_port()
    first = _analyzer(db, port)
    try:
        _ready(port)
        t0 = time.monotonic()
        second = subprocess.run([sys.executable, "-m", "gpuscope.daemon.cli", "--log-level", "warning", "analyzer",
                                 "--insecure", "--db", str(db), "--listen", "127.0.0.1:0"],
                                capture_output=True, text=True, timeout=60)
        took = time.monotonic() - t0
        child = _analysis_child(first.pid)
        assert first.poll() is None
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=20)
    assert second.returncode == 1 and second.stderr.strip().splitlines()[-1].endswith(
        f"(PID {child} is the analysis process of gpuscope PID {first.pid}: stop PID {first.pid}, or pass "
        "another --db)"), second.stderr
    assert "waiting" not in second.stderr and took < 15, took     # start-up alone takes 2-5 s here


def test_the_analysis_process_of_an_analyzer_killed_9_is_waited_for(tmp_path):
    """The one holder worth waiting for: the analysis process of an analyzer
    killed -9 closes the store on its way out (held here, stopped, until the
    new analyzer says it waits)."""
    import os
    db, port = tmp_path / "k.duckdb", free_port()
    first = _analyzer(db, port)
    _ready(port)
    orphan = _analysis_child(first.pid)
    os.kill(orphan, signal.SIGSTOP)
    first.kill()
    first.wait(20)                  # not its pipes: the orphan holds them
    first.stdout.close()
    first.stderr.close()
    second = _analyzer(db, free_port(), "--duration", "1s")
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(second.stderr), daemon=True)
    reader.start()
    try:
        wait_for(lambda: any("waiting for it to close" in line for line in lines), timeout=60)
        assert second.poll() is None
    finally:
        os.kill(orphan, signal.SIGCONT)
    second.wait(60)
    reader.join(10)
    assert second.returncode == 0, "".join(lines)[-2000:]
    assert f'"pid": {orphan}' in "".join(lines)


def test_kill_9_of_the_analysis_process_loses_no_acked_batch_and_the_analyzer_carries_on(tmp_path):
    """The store and live analysis run in a child process (--engine process):
    when it dies, batches in flight are refused UNAVAILABLE, the agent
    resends, a new child opens the same store, and every acknowledged batch
    is there once."""
    import os
    db, port = tmp_path / "c.duckdb", free_port()
    up, total = _backlog(port, "child")
    proc = _analyzer(db, port)
    try:
        _ready(port)
        wait_for(lambda: up.stats()["batches_acked"] >= 60, timeout=60, step=0.005)
        first = _analysis_child(proc.pid)
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: up.stats()["unacked_samples"] == 0, timeout=120)
        assert proc.poll() is None                         # the analyzer itself never went down
        assert _analysis_child(proc.pid) != first
    finally:
        up.stop()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-2000:]
    assert "analysis process died" in err and "analysis process restarted" in err
    con = duckdb.connect(str(db), read_only=True)
    rows, distinct = con.execute("SELECT count(*), count(DISTINCT (gpu, t)) FROM samples WHERE host = 'child'"
                                 ).fetchone()
    con.close()
    assert (rows, distinct) == (total, total)
    assert up.stats()["dropped_samples"] == 0


def test_a_stop_sent_to_the_whole_process_group_is_a_clean_stop(tmp_path):
    """Ctrl-C and systemd signal every process of the analyzer at once: the
    analysis process leaves its shutdown to the analyzer, which drains it."""
    import os
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gpuscope.daemon.cli", "analyzer", "--db", str(tmp_path / "g.duckdb"),
                             "--listen", f"127.0.0.1:{port}", "--insecure"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _ready(port)
        child = _analysis_child(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert "died" not in err and "Traceback" not in err
    wait_for(lambda: not os.path.exists(f"/proc/{child}"), timeout=10)


def test_an_analyzer_whose_log_reader_went_away_still_serves_and_stops(tmp_path):
    """Found in a trial: `gpuscope analyzer ... 2>&1 | head -3`. Once the pipe
    closed, a log line raised in the shutdown path, the analysis process was
    never stopped, and only kill -9 ended the analyzer."""
    import os
    port = free_port()
    read_end, write_end = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "gpuscope.daemon.cli", "analyzer", "--db", str(tmp_path / "p.duckdb"),
                             "--listen", f"127.0.0.1:{port}", "--insecure"], stdout=write_end, stderr=write_end)
    os.close(write_end)
    try:
        os.read(read_end, 100)           # its first line, then the reader goes away, as `head` does
        os.close(read_end)
        _ready(port)
        stub = analyzer_pb2_grpc.AnalyzerStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        batch = encode_batch("piped", "b", 1, [GpuSample(0, time.time() - 1, {"power_watts": 90.0})],
                             [DeviceInfo(gpu=0, name="NVIDIA H200")])
        assert stub.Push(batch, timeout=20).status == pb.BatchAck.COMMITTED     # it logs, and carries on
        child = _analysis_child(proc.pid)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode in (0, 120)   # 120: Python could not flush stderr at exit, nothing else
    wait_for(lambda: not os.path.exists(f"/proc/{child}"), timeout=10)
    con = duckdb.connect(str(tmp_path / "p.duckdb"), read_only=True)
    assert con.execute("SELECT count(*) FROM samples WHERE host = 'piped'").fetchone()[0] == 1


def test_ctrl_c_at_any_moment_of_start_up_stops_quietly(tmp_path):
    """Found in a trial: Ctrl-C in the first second of `gpuscope up` printed a
    traceback from an import; later in start-up a KeyboardInterrupt could leave
    threads behind; and one raised inside the import system's weakref callback
    was swallowed by Python, so `up` ran on. Every moment now ends with 130
    (still loading) or a clean stop (0), and no traceback."""
    import os
    entry = "import sys; from gpuscope.daemon.entry import run; sys.argv[0] = 'gpuscope'; run()"
    for i, delay in enumerate((0.1, 0.4, 0.8, 1.2, 2.0)):
        proc = subprocess.Popen([sys.executable, "-c", entry, "up", "--insecure", "--no-view", "--db",
                                 str(tmp_path / f"u{i}.duckdb"), "--listen", f"127.0.0.1:{free_port()}"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        time.sleep(delay)
        os.killpg(proc.pid, signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode in (0, 130) and "Traceback" not in out and "Exception ignored" not in out, \
            (delay, proc.returncode, out[-2000:])
