"""The trigger policy: every anomaly gets a decision with a reason, and never
more captures than the policy allows, whatever the storm."""
import pytest

from gpuscope.analyzers.detector import Anomaly
from gpuscope.analyzers.trigger import TriggerConfig, TriggerPolicy


class Clock:
    def __init__(self):
        self.t = 1_000_000.0

    def __call__(self):
        return self.t


def anomaly(host="h1", gpu=0, kind="bottleneck-changed", job="pid:42 python train.py"):
    return Anomaly(id=f"a-{host}-{gpu}", t=0, host=host, gpu=gpu, job=job, kind=kind, kinds=[kind], reason="r")


def test_capture_then_cooldown_then_job_limit():
    clock = Clock()
    p = TriggerPolicy(TriggerConfig(host_cooldown_s=600, job_captures_per_hour=2), clock)
    d = p.decide(anomaly(), 10, True)
    assert d.action == "capture" and d.status == "pending" and d.pid == 42
    assert p.decide(anomaly(gpu=1, job="pid:43"), 10, True).reason == "this host is already capturing"
    assert p.decide(anomaly(), 10, True).reason == "a capture of this process is already running"
    p.finished(d.id, "c1", True)
    clock.t += 60
    assert p.decide(anomaly(), 10, True).reason.startswith("host cooldown")
    clock.t += 600
    d2 = p.decide(anomaly(), 10, True)
    p.finished(d2.id, "c2", True)
    clock.t += 601
    assert p.decide(anomaly(), 10, True).reason.startswith("job limit: 2 captures")
    clock.t += 3600
    assert p.decide(anomaly(), 10, True).status == "pending"


def test_dry_run_and_disconnected_agents_record_why():
    p = TriggerPolicy(TriggerConfig(dry_run=True))
    d = p.decide(anomaly(), 1, True)
    assert d.action == "dry-run" and d.status == "skipped" and "would start a capture" in d.reason
    p = TriggerPolicy(TriggerConfig())
    assert "not connected" in p.decide(anomaly(), 1, False).reason


def test_a_dry_run_applies_the_whole_policy():
    """Found in a trial: a dry run "would have started" 35 captures in 10
    minutes on one host (cooldown 10 min, 3 a job an hour), with no agent
    connected. It says what the policy would have done."""
    clock = Clock()
    p = TriggerPolicy(TriggerConfig(dry_run=True, host_cooldown_s=600, job_captures_per_hour=2,
                                    fleet_fraction=0.1), clock)
    assert "not connected" in p.decide(anomaly(), 10, False).reason
    assert "would start a capture (bottleneck-changed: r)" in p.decide(anomaly(), 10, True).reason
    assert p.decide(anomaly(gpu=1, job="pid:43"), 10, True).reason == "this host is already capturing"
    assert p.decide(anomaly(host="h2"), 10, True).reason.startswith("fleet cap: 1 of 1")
    clock.t += 3
    assert p.decide(anomaly(), 10, True).reason.startswith("host cooldown")
    assert p.decide(anomaly(host="h2"), 10, True).action == "dry-run"     # h1's would-be capture has ended
    clock.t += 601
    assert p.decide(anomaly(), 10, True).action == "dry-run"
    clock.t += 601
    assert p.decide(anomaly(), 10, True).reason.startswith("job limit: 2 captures")
    decisions = [p.decide(anomaly(), 10, True) for _ in range(35)]
    assert sum(d.action == "dry-run" for d in decisions) == 0 and p.in_flight == 0


@pytest.mark.parametrize("hosts,fraction,allowed", [(1000, 0.05, 50), (10, 0.05, 1), (100, 0.2, 20)])
def test_storm_on_many_hosts_respects_the_fleet_cap(hosts, fraction, allowed):
    p = TriggerPolicy(TriggerConfig(fleet_fraction=fraction))
    decisions = [p.decide(anomaly(host=f"h{i}", gpu=g), hosts, True) for i in range(hosts) for g in range(2)]
    started = [d for d in decisions if d.status == "pending"]
    assert len(started) == allowed == p.in_flight
    assert all(d.reason for d in decisions)
    assert sum("fleet cap" in d.reason for d in decisions) == 2 * (hosts - allowed)
    assert len({d.host for d in started}) == allowed                # one capture per host at a time


def test_agent_gone_mid_capture_expires_the_decision():
    clock = Clock()
    p = TriggerPolicy(TriggerConfig(timeout_s=30, capture_duration_ms=2000), clock)
    d = p.decide(anomaly(), 1, True)
    clock.t += 20
    assert p.expire() == []
    clock.t += 15
    (gone,) = p.expire()
    assert gone.id == d.id and gone.status == "failed" and "no report from the agent" in gone.reason
    assert p.in_flight == 0


def test_health_events_ask_for_counter_bursts_and_lost_gpus_for_nothing():
    p = TriggerPolicy(TriggerConfig())
    assert p.decide(anomaly(kind="xid"), 1, True).action == "counter-burst"
    assert "lost" in p.decide(anomaly(host="h2", kind="gpu_lost"), 1, True).reason
