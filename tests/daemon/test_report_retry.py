"""Capture reports the analyzer did not store are sent again later (found
in a trial: a report refused while the analyzer's disk was full was lost
once its three quick resends had failed)."""
import threading

from gpuscope.daemon.report_retry import ReportRetry
from gpuscope.v1 import samples_pb2 as pb


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _rec(cid, error=""):
    return pb.CaptureRecord(id=cid, host="h", target="t", status="ok", error=error)


def test_a_held_report_is_sent_as_captured_once_the_analyzer_stores_again():
    sent, down = [], [True]

    def send(rec, data):
        if down[0]:
            raise RuntimeError("UNAVAILABLE: the capture was not stored, resend later: No space left on device")
        sent.append((rec.id, rec.error, data))
    clock = Clock()
    r = ReportRetry(send, threading.Event(), every_s=3600, clock=clock)
    a = _rec("a", "trace partly read; not reported to the analyzer: no space")
    r.add(a, b"trace-a", "trace partly read")
    r.add(_rec("b"), b"trace-b", "")
    r.retry()
    assert r.pending() == 2 and a.error.endswith("not reported to the analyzer: no space") and not sent
    down[0] = False
    clock.t = 120.0
    r.retry()
    assert sent == [("a", "trace partly read", b"trace-a"), ("b", "", b"trace-b")] and r.pending() == 0


def test_held_traces_are_bounded_and_a_report_is_given_up_after_its_time(caplog):
    def send(rec, data):
        raise RuntimeError("UNAVAILABLE")
    clock = Clock()
    r = ReportRetry(send, threading.Event(), every_s=3600, keep_s=600, max_bytes=10, clock=clock)
    for cid in "abc":
        r.add(_rec(cid), b"xxxx", "")
    r.add(_rec("d"), b"xxxx", "")            # 16 bytes held > 10: the oldest go
    assert r.pending() == 2 and r.dropped == 2
    clock.t = 601.0
    r.retry()
    assert r.pending() == 0 and r.dropped == 4


def test_the_thread_stops_with_the_agent():
    stop = threading.Event()
    calls = []
    r = ReportRetry(lambda rec, data: calls.append(rec.id), stop, every_s=0.05)
    r.add(_rec("a"), b"", "")
    for _ in range(100):
        if calls:
            break
        threading.Event().wait(0.02)
    assert calls == ["a"] and r.pending() == 0
    stop.set()
    r._thread.join(2)
    assert not r._thread.is_alive()


def test_an_agent_holds_what_it_could_not_report():
    from gpuscope.daemon.agent import Agent, AgentConfig

    class _Collector:
        def devices(self):
            return []
    agent = Agent(AgentConfig(host="h", source="nvml"), _Collector())
    agent.capture_reporter = lambda rec, data: (_ for _ in ()).throw(RuntimeError("cannot reach analyzer"))
    agent.report_retry = ReportRetry(agent.capture_reporter, agent.stopping, every_s=3600)
    rec = _rec("c1")
    agent._report(rec, b"t")
    assert agent.report_retry.pending() == 1 and "not reported to the analyzer" in rec.error
    agent.stopping.set()
