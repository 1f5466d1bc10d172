"""Alert hooks against real HTTP receivers on loopback: Alertmanager's API
shape, a generic JSON POST, retries, the rate limit, and an end-to-end run
where a fake GPU's bottleneck opens a finding that reaches the receiver."""
import http.server
import json
import threading
import time

import pytest

from gpuscope.analyzers.alerts import ALERTMANAGER, JSON, AlertConfig, Alerter, Receiver, parse_receiver, severity
from tests.helpers import wait_for


class Receiver_:
    """An HTTP server that records every POST; `fail` answers that many with
    `fail_status` first."""

    def __init__(self, fail: int = 0, fail_status: int = 503):
        self.posts: list[tuple[str, object]] = []
        self.fail, self.fail_status = fail, fail_status
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if outer.fail > 0:
                    outer.fail -= 1
                    self.send_response(outer.fail_status)
                else:
                    outer.posts.append((self.path, body))
                    self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"

    def close(self):
        self.httpd.shutdown()


def finding(fid="f1", verdict="memory-bound", end=None, job="pid:461 python train.py --hf-token=abc"):
    return dict(kind="finding", t=100.0, host="gpu-7", gpu=3, verdict=verdict,
                record=dict(id=fid, verdict=verdict, start=50.0, end=end, confidence=0.8, flags=["power_capped"],
                            summary="DRAM 74 % busy", job=job))


def anomaly(kinds=("activity-drop",)):
    return dict(kind="anomaly", t=100.0, host="gpu-7", gpu=3, verdict=None,
                record=dict(id="a1", t=100.0, kinds=list(kinds), kind=kinds[0], reason="r", job="", finding_id="f1"))


@pytest.fixture
def receiver():
    r = Receiver_()
    yield r
    r.close()


def test_severities():
    assert severity(finding()) == "warning" and severity(finding(verdict="idle")) is None
    assert severity(anomaly(("xid",))) == "critical" and severity(anomaly(("bottleneck-changed",))) == "info"
    assert severity(anomaly(("bottleneck-changed", "activity-drop"))) == "warning"
    assert severity(dict(kind="decision", record={})) is None


def test_alertmanager_gets_firing_resends_and_resolved(receiver):
    clock = [1000.0]
    a = Alerter(AlertConfig((Receiver(receiver.url, ALERTMANAGER),), resend_s=0.3), clock=lambda: clock[0])
    a.start()
    try:
        w = a.watch()
        w.deliver(finding())
        wait_for(lambda: len(receiver.posts) >= 1)
        path, alerts = receiver.posts[0]
        assert path == "/api/v2/alerts" and len(alerts) == 1
        labels = alerts[0]["labels"]
        assert labels == dict(alertname="GPUBottleneck", severity="warning", host="gpu-7", gpu="3",
                              verdict="memory-bound", job="pid:461 python", finding_id="f1")     # no arguments
        assert alerts[0]["startsAt"] == "1970-01-01T00:00:50.000Z" and alerts[0]["endsAt"] > "1970-01-01T00:16"
        clock[0] += 1
        wait_for(lambda: len(receiver.posts) >= 2, timeout=5)               # still firing: sent again
        assert receiver.posts[1][1][0]["labels"]["finding_id"] == "f1"
        w.deliver(finding(end=1001.0))
        wait_for(lambda: any(p[1][0]["endsAt"] == "1970-01-01T00:16:41.000Z" for p in receiver.posts))
        n = len(receiver.posts)
        clock[0] += 1
        time.sleep(0.8)
        assert len(receiver.posts) == n                                     # resolved: not resent
    finally:
        a.stop()


def test_a_findings_alert_carries_its_pod_and_slurm_job_for_routing():
    from gpuscope.analyzers.alerts import alert_of
    e = finding()
    e["record"]["attribution"] = dict(namespace="ml", pod="trainer-0", container="main", user="alice",
                                      slurm_job="81234")
    a = alert_of(e, "warning")
    assert {k: a.labels[k] for k in ("namespace", "pod", "slurm_job")} == dict(namespace="ml", pod="trainer-0",
                                                                              slurm_job="81234")
    assert "user" not in a.labels and "container" not in a.body and a.body["pod"] == "trainer-0"
    assert alert_of(finding(), "warning").labels["pod"] == ""      # sent without it: empty labels are left out


def test_generic_json_is_retried_until_delivered_and_rate_limited():
    r = Receiver_(fail=2)
    slept = []
    a = Alerter(AlertConfig((Receiver(r.url, JSON),), per_minute=3), sleep=slept.append)
    a.start()
    try:
        w = a.watch()
        w.deliver(finding())
        wait_for(lambda: r.posts)
        assert slept == [1.0, 2.0] and r.posts[0][1]["state"] == "firing" and "hf-token" not in json.dumps(r.posts)
        for i in range(5):
            w.deliver(anomaly())
        wait_for(lambda: a.dropped == 3)
        assert len(r.posts) == 3 and r.posts[1][1]["kind"] == "anomaly"
        w.deliver(anomaly(("bottleneck-changed",)))                          # info: below warning, not sent
        time.sleep(0.2)
        assert a.dropped == 3 and len(r.posts) == 3
    finally:
        a.stop()
        r.close()


def test_a_receiver_that_refuses_is_given_up_and_a_dead_one_costs_only_its_queue():
    refusing = Receiver_(fail=100, fail_status=400)
    a = Alerter(AlertConfig((Receiver(refusing.url, JSON), Receiver("http://127.0.0.1:9/x", JSON)), timeout_s=0.5),
                sleep=lambda s: None)
    a.start()
    try:
        t = time.monotonic()
        assert a.watch().deliver(finding())                                 # never blocks the event bus
        assert time.monotonic() - t < 0.05
        wait_for(lambda: a.failed == 2, timeout=10)
        assert refusing.fail == 99                                          # a 400 is not retried
    finally:
        a.stop()
        refusing.close()


def test_bad_receivers_are_refused_by_name():
    for bad in ("ftp://x", "http://", "alertmanager:9093", "http://x:99999"):
        with pytest.raises(ValueError, match="expected an http|port"):
            parse_receiver(bad, JSON)
    assert parse_receiver("http://am:9093/", ALERTMANAGER).url == "http://am:9093"
    assert Receiver("https://hooks.example/services/T0/B0/SECRET").where == "https://hooks.example"


def test_a_finding_on_a_real_analyzer_reaches_the_receiver(tmp_path, receiver):
    from tests.fakes.nvml import FakeNvml, h200
    from tests.helpers import AnalyzerServer, fake_agent
    from tests.test_watch_report import MEMORY
    srv = AnalyzerServer(tmp_path / "a.duckdb", engine=True)
    alerter = Alerter(AlertConfig((Receiver(receiver.url, JSON),)))
    srv.analyzer.events.subscribe(alerter.watch())
    alerter.start()
    agent = fake_agent(FakeNvml([h200(**MEMORY)]), srv.target, host="gpu-node")
    try:
        wait_for(lambda: any(p[1].get("verdict") == "memory-bound" for p in receiver.posts), timeout=30)
        body = next(p[1] for p in receiver.posts if p[1].get("verdict") == "memory-bound")
        assert body["host"] == "gpu-node" and body["state"] == "firing" and body["summary"].startswith("gpu-node/gpu0")
    finally:
        agent.stop()
        srv.stop()
        alerter.stop()


def test_a_dead_receiver_delays_nobody_else():
    """Found in a trial: two failing webhooks held a healthy Alertmanager's
    alerts up by 16 minutes after 17 of running (one thread posted to all,
    each failure retried for 15 s)."""
    good, failing = Receiver_(), Receiver_(fail=10_000, fail_status=500)
    a = Alerter(AlertConfig((Receiver(failing.url, JSON), Receiver("http://127.0.0.1:9/down", JSON),
                             Receiver(good.url, JSON)), timeout_s=0.5, per_minute=1000))
    a.start()
    try:
        t = time.monotonic()
        for i in range(20):
            a.watch().deliver(finding(fid=f"f{i}"))
        wait_for(lambda: len(good.posts) == 20, timeout=10)
        assert time.monotonic() - t < 5                                  # the failing ones retry meanwhile
    finally:
        a.stop(timeout_s=1.0)
        good.close()
        failing.close()
