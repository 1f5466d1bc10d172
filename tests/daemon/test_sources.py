"""`--source auto`: the best source this host has, in the documented order
(a running DCGM host engine, the node's dcgm-exporter, NVML), said out loud,
with the fakes that stand in for DCGM and NVML and a real HTTP exporter."""
import pytest

from gpuscope.collectors.dcgm_bindings import ENV
from gpuscope.collectors.nvml import SourceUnavailable
from gpuscope.daemon import sources
from tests.fakes.dcgm_exporter import FakeExporter, Gpu, exposition
from tests.fakes.fake_dcgm import BINDINGS, engine, h200

STANDALONE = "127.0.0.1:5555"


@pytest.fixture
def exporter():
    srv = FakeExporter()
    srv.body = exposition([Gpu(0), Gpu(1)])
    yield srv
    srv.stop()


def _choose(env, recording=False):
    collector, description = sources.make_source(None, 1.0, allow_fallback=recording, environ=env)
    return collector, description


def test_a_running_host_engine_wins_and_no_gpm_runs_beside_it(exporter, monkeypatch):
    engine([h200(), h200()], address=STANDALONE)
    monkeypatch.setenv(ENV, str(BINDINGS))
    said = []
    monkeypatch.setattr(sources.logs, "say", lambda text, *a: said.append(text))
    collector, description = _choose({"DCGM_HOSTENGINE": STANDALONE, ENV: str(BINDINGS),
                                      sources.ENV_EXPORTER: exporter.url})
    try:
        assert description == f"dcgm:{STANDALONE}" and exporter.requests == 0
        assert all(d.source.startswith("dcgm") for d in collector.devices())
        assert said[0].startswith(f"source: dcgm:{STANDALONE} (GPUs 0,1: dcgm")
    finally:
        collector.close()


def test_without_a_host_engine_the_nodes_exporter_is_read_and_why_dcgm_was_not_is_said(exporter, monkeypatch):
    said = []
    monkeypatch.setattr(sources.logs, "say", lambda text, *a: said.append(text))
    collector, description = _choose({ENV: "/nonexistent", sources.ENV_EXPORTER: exporter.url})
    try:
        assert description == f"dcgm-exporter:{exporter.url}"
        assert {d.source for d in collector.devices()} == {"dcgm-exporter (profiling)"}
        assert "not before it: DCGM" in said[0] and "bindings not found" in said[0]
        # found with the probe's deadline, sampled with a named exporter's (a trial saw 1 s per scrape)
        from gpuscope.collectors import dcgm_exporter
        assert collector.timeout_s == dcgm_exporter.TIMEOUT_S < sources.EXPORTER_PROBE_S
    finally:
        collector.close()


def test_nothing_found_names_each_try_and_only_up_falls_back_to_the_recording(monkeypatch):
    env = {ENV: "/nonexistent", sources.ENV_EXPORTER: "http://127.0.0.1:9/metrics"}
    with pytest.raises(SourceUnavailable) as err:
        _choose(env)
    tried = str(err.value).splitlines()
    assert tried[0] == "no GPU source on this host, tried in order:"
    assert [t.split()[1] for t in tried[1:4]] == ["DCGM", "dcgm-exporter:", "NVML:"]
    monkeypatch.setattr(sources.logs, "say", lambda *a: None)
    collector, description = _choose(env, recording=True)
    assert description.startswith("replay:") and collector.devices()[0].source.startswith("replay")
