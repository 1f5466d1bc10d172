"""Alert hooks against real HTTP receivers on loopback: Alertmanager's API
shape, a generic JSON POST, which findings alert and when, retries while a
receiver is away, the rate limit, and an end-to-end run where a fake GPU's
bottleneck opens a finding that reaches the receiver."""
import http.server
import json
import threading
import time

import pytest

from gpuscope.analyzers.alerts import ALERTMANAGER, JSON, AlertConfig, Alerter, Receiver, parse_receiver, severity
from tests.conftest import free_port
from tests.helpers import wait_for


class Receiver_:
    """An HTTP server that records every POST; `fail` answers that many with
    `fail_status` first."""

    def __init__(self, fail: int = 0, fail_status: int = 503):
        self.posts: list[tuple[str, object]] = []
        self.fail, self.fail_status, self.tries = fail, fail_status, 0
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.tries += 1
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


def finding(fid="f1", verdict="memory-bound", end=None, job="pid:461 python train.py --hf-token=abc", t=100.0):
    return dict(kind="finding", t=end or t, host="gpu-7", gpu=3, verdict=verdict,
                record=dict(id=fid, verdict=verdict, start=50.0, end=end, confidence=0.8, flags=["power_capped"],
                            summary="DRAM 74 % busy", job=job))


def anomaly(kinds=("activity-drop",), aid="a1"):
    return dict(kind="anomaly", t=100.0, host="gpu-7", gpu=3, verdict=None,
                record=dict(id=aid, t=100.0, kinds=list(kinds), kind=kinds[0], reason="r", job="", finding_id="f1"))


@pytest.fixture
def receiver():
    r = Receiver_()
    yield r
    r.close()


NOW = dict(alert_after_s=0.0)        # every finding alerts at once: what the tests of delivery want
FAST = dict(backoff_s=0.05, backoff_max_s=0.2, timeout_s=0.5)


def test_severities():
    assert severity(finding()) == "warning" and severity(finding(verdict="launch-bound")) == "warning"
    # the GPU doing its job, or nothing: a record, never a page
    assert severity(finding(verdict="compute-bound")) == "info" and severity(finding(verdict="idle")) == "info"
    assert severity(anomaly(("xid",))) == "critical" and severity(anomaly(("bottleneck-changed",))) == "info"
    assert severity(anomaly(("bottleneck-changed", "activity-drop"))) == "warning"
    assert severity(dict(kind="decision", record={})) is None


def test_alertmanager_gets_firing_resends_and_resolved(receiver):
    clock = [1000.0]
    a = Alerter(AlertConfig((Receiver(receiver.url, ALERTMANAGER),), resend_s=0.3, **NOW), clock=lambda: clock[0])
    a.start()
    try:
        w = a.watch()
        w.deliver(finding())
        wait_for(lambda: len(receiver.posts) >= 1)
        path, alerts = receiver.posts[0]
        assert path == "/api/v2/alerts" and len(alerts) == 1
        # the labels say which alert it is (Alertmanager's identity, for dedupe and grouping); the rest is detail
        assert alerts[0]["labels"] == dict(alertname="GPUBottleneck", severity="warning", host="gpu-7", gpu="3",
                                           verdict="memory-bound")
        notes = alerts[0]["annotations"]
        assert notes["finding_id"] == "f1" and notes["job"] == "pid:461 python"                # no arguments
        assert notes["report"] == "gpuscope report f1" and notes["summary"].startswith("gpu-7/gpu3 memory-bound")
        assert alerts[0]["startsAt"] == "1970-01-01T00:00:50.000Z" and alerts[0]["endsAt"] > "1970-01-01T00:16"
        clock[0] += 1
        wait_for(lambda: len(receiver.posts) >= 2, timeout=5)               # still firing: sent again
        assert receiver.posts[1][1][0]["annotations"]["finding_id"] == "f1"
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
    assert "pod" not in alert_of(finding(), "warning").labels       # unknown: left out, not an empty label


def test_a_degraded_gpu_is_its_own_alert_not_a_bottleneck():
    """Hardware under its peers routes to whoever fixes hardware: its own alertname, its weak dimension
    in the annotations."""
    from gpuscope.analyzers.alerts import alert_of, severity
    e = finding(verdict="degraded", job=None)
    e["record"].update(kind="degraded", flags=["hbm"], summary="HBM 3.50 TB/s, 18 % under the median")
    a = alert_of(e, severity(e))
    assert a.labels == dict(alertname="GPUDegraded", severity="warning", host="gpu-7", gpu="3", verdict="degraded")
    assert a.annotations["flags"] == "hbm" and "18 % under" in a.annotations["summary"]
    assert alert_of(finding(), "warning").labels["alertname"] == "GPUBottleneck"


def test_a_finding_alerts_once_it_has_lasted_and_its_episodes_are_one_alert(receiver):
    """Found in a trial: at the default severity every compute-bound episode
    (a healthy GEMM) was a GPUBottleneck on open and again on close, each
    with its finding id as a label: every 5-20 s episode a separate alert."""
    clock = [1000.0]
    a = Alerter(AlertConfig((Receiver(receiver.url, ALERTMANAGER),), resend_s=3600), clock=lambda: clock[0])
    a.start()
    try:
        w = a.watch()
        for v in ("compute-bound", "idle"):                                 # info: below the default warning
            w.deliver(finding(fid=v, verdict=v))
            w.deliver(finding(fid=v, verdict=v, end=400.0))
        held = a.receivers[0].held
        w.deliver(finding(fid="short", t=60.0))                            # memory-bound, 10 s so far ...
        wait_for(lambda: "finding/short" in held)
        clock[0] += 30
        w.deliver(finding(fid="short", end=80.0))                          # ... and over after 30: never sent
        w.deliver(finding(fid="long", t=60.0))
        wait_for(lambda: list(held) == ["finding/long"])
        clock[0] += 100
        time.sleep(0.5)
        assert receiver.posts == [] and a.sent == 0
        clock[0] += 11                                                      # 10 + 111 s: it has lasted 2 minutes
        wait_for(lambda: receiver.posts)
        first = receiver.posts[0][1]
        assert [x["annotations"]["finding_id"] for x in first] == ["long"]
        w.deliver(finding(fid="long", end=300.0))
        wait_for(lambda: len(receiver.posts) == 2)
        w.deliver(finding(fid="again", t=60.0))                             # the next episode of the same bottleneck
        wait_for(lambda: list(held) == ["finding/again"])
        clock[0] += 200
        wait_for(lambda: len(receiver.posts) == 3)
        resolved, again = receiver.posts[1][1][0], receiver.posts[2][1][0]
        assert resolved["endsAt"] == "1970-01-01T00:05:00.000Z"
        assert first[0]["labels"] == resolved["labels"] == again["labels"]  # one alert, firing and resolving
        assert again["annotations"]["finding_id"] == "again"
    finally:
        a.stop()


def test_generic_json_is_retried_until_delivered_and_rate_limited():
    r = Receiver_(fail=2)
    a = Alerter(AlertConfig((Receiver(r.url, JSON),), per_minute=3, **NOW, **FAST))
    a.start()
    try:
        w = a.watch()
        w.deliver(finding())
        wait_for(lambda: r.posts)
        assert a.retried == 2 and r.posts[0][1]["state"] == "firing" and "hf-token" not in json.dumps(r.posts)
        assert r.posts[0][1]["finding_id"] == "f1"
        for i in range(5):
            w.deliver(anomaly(aid=f"a{i}"))
        wait_for(lambda: a.dropped == 3)
        wait_for(lambda: len(r.posts) == 3)
        assert r.posts[1][1]["kind"] == "anomaly" and a.counters()[0]["dropped"]["rate-limit"] == 3
        w.deliver(anomaly(("bottleneck-changed",)))                          # info: below warning, not sent
        time.sleep(0.2)
        assert a.dropped == 3 and len(r.posts) == 3
    finally:
        a.stop()
        r.close()


def test_a_receiver_that_refuses_is_given_up_and_a_dead_one_costs_only_its_queue():
    refusing = Receiver_(fail=100, fail_status=400)
    dead = f"http://127.0.0.1:{free_port()}/x"
    a = Alerter(AlertConfig((Receiver(refusing.url, JSON), Receiver(dead, JSON)), retry_for_s=1.0, **NOW, **FAST))
    a.start()
    try:
        t = time.monotonic()
        assert a.watch().deliver(finding())                                 # never blocks the event bus
        assert time.monotonic() - t < 0.05
        wait_for(lambda: [c["dropped"] for c in a.counters()] == [
            dict(refused=1, **{"rate-limit": 0, "queue-full": 0, "expired": 0, "shutdown": 0}),
            dict(expired=1, **{"rate-limit": 0, "queue-full": 0, "refused": 0, "shutdown": 0})], timeout=10)
        assert refusing.fail == 99                                          # a 400 is not retried
        assert a.counters()[1]["retried"] >= 3 and a.counters()[1]["pending"] == 0
    finally:
        a.stop()
        refusing.close()


def test_alerts_wait_for_a_receiver_that_comes_back():
    """Found in a trial: an alert was dropped after 5 tries in ~15 s, and
    once the receiver was back the dropped alerts were never sent."""
    am = Receiver_(fail=10**9)
    a = Alerter(AlertConfig((Receiver(am.url, ALERTMANAGER),), resend_s=3600, queue_size=3, **NOW, **FAST))
    a.start()
    try:
        w = a.watch()
        w.deliver(finding(fid="before"))
        am.fail = 0
        wait_for(lambda: am.posts)                                          # sent; then the receiver goes away
        am.fail = 10**9
        for i in range(5):
            w.deliver(anomaly(aid=f"a{i}"))
        wait_for(lambda: am.tries >= 8, timeout=10)                         # past the 5 tries of old
        c = a.counters()[0]
        assert c["dropped"]["queue-full"] == 2 and c["pending"] == 3 and c["retried"] >= 6
        am.fail = 0                                                         # back
        wait_for(lambda: len(am.posts) == 2, timeout=5)
        back = am.posts[1][1]
        ids = [x["annotations"].get("anomaly_id") or x["annotations"]["finding_id"] for x in back]
        assert len(ids) == 4 and "before" in ids                            # what waited, and what still fires
        wait_for(lambda: a.counters()[0]["pending"] == 0)                   # once the receiver's answer is read
        assert a.sent == 4
    finally:
        a.stop()
        am.close()


def test_bad_receivers_are_refused_by_name():
    for bad in ("ftp://x", "http://", "alertmanager:9093", "http://x:99999"):
        with pytest.raises(ValueError, match="expected an http|port"):
            parse_receiver(bad, JSON)
    with pytest.raises(ValueError, match="API v1 was removed"):
        parse_receiver("http://am:9093/api/v1/alerts", ALERTMANAGER)
    assert Receiver("https://hooks.example/services/T0/B0/XkrTqLmNvBwPsZyHcQdRfGtJ").shown == \
        "https://hooks.example/services/T0/B0/<redacted>"


@pytest.mark.parametrize("given, base", [
    ("http://am:9093", "http://am:9093"), ("http://am:9093/", "http://am:9093"),
    ("http://am:9093/api/v2/alerts", "http://am:9093"),
    ("https://x/alertmanager/api/v2/alerts/", "https://x/alertmanager"),
])
def test_alertmanager_is_its_base_url_or_its_endpoint(given, base):
    """Found in a trial: `--alertmanager http://host:9093/api/v2/alerts` was
    accepted and posted to /api/v2/alerts/api/v2/alerts."""
    r = parse_receiver(given, ALERTMANAGER)
    assert r.url == base and r.endpoint == base + "/api/v2/alerts"


def test_the_endpoint_given_whole_gets_the_alerts(receiver):
    a = Alerter(AlertConfig((parse_receiver(receiver.url + "/api/v2/alerts", ALERTMANAGER),), **NOW))
    a.start()
    try:
        a.watch().deliver(finding())
        wait_for(lambda: receiver.posts)
        assert receiver.posts[0][0] == "/api/v2/alerts"
    finally:
        a.stop()


def test_a_finding_on_a_real_analyzer_reaches_the_receiver(tmp_path, receiver):
    from tests.fakes.nvml import FakeNvml, h200
    from tests.helpers import AnalyzerServer, fake_agent
    from tests.test_watch_report import MEMORY
    srv = AnalyzerServer(tmp_path / "a.duckdb", engine=True)
    alerter = Alerter(AlertConfig((Receiver(receiver.url, JSON),), **NOW))
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
    a = Alerter(AlertConfig((Receiver(failing.url, JSON), Receiver(f"http://127.0.0.1:{free_port()}/down", JSON),
                             Receiver(good.url, JSON)), timeout_s=0.5, per_minute=1000, **NOW))
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
