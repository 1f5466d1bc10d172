"""The DCGM collector against fake bindings of DCGM's exact shape
(tests/fakes/dcgm/): units, blanks, the host engine dying and coming back,
profiling refused, paused around captures, the bindings missing, and an
agent run as a command feeding a real analyzer."""
import os
import subprocess
import sys

import pytest

from gpuscope.collectors import dcgm_fields as df
from gpuscope.collectors.dcgm import DcgmCollector, DcgmConfig, parse_source
from gpuscope.collectors.dcgm_bindings import ENV, INSTALL_DIRS, load_dcgm
from gpuscope.collectors.nvml import NvmlCollector, NvmlConfig, SourceUnavailable
from gpuscope.collectors.procstat import ProcStat
from gpuscope.collectors.records import HealthKind
from gpuscope.collectors.xla_profiler import CaptureResult
from gpuscope.daemon.captures import CaptureConfig, CaptureRunner
from tests.conftest import free_port
from tests.fakes.fake_dcgm import (BINDINGS, BLANK_FP64, BLANK_INT64, KNOWN_FIELDS, MIB, ST, a100, bindings, engine,
                                   h200, write_spec)
from tests.fakes.nvml import FakeNvml, h200 as nvml_h200
from tests.helpers import AnalyzerServer, wait_for

STANDALONE = "127.0.0.1:5555"


class Clock:
    """A monotonic clock the test moves: reconnect backoff and profiling retries."""
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def started(*gpus, address=None, nvml=None, clock=None, **config):
    eng = engine(list(gpus), address=address)
    c = DcgmCollector(DcgmConfig(address=address, processes=nvml is not None, **config), bindings,
                      processes=nvml, monotonic=clock or Clock())
    c.start()
    return eng, c


def values(c, gpu=0):
    return next(s for s in c.scrape().samples if s.gpu == gpu).values


# -- units --------------------------------------------------------------------------------------------------------
def test_values_are_normalised_to_catalogue_units():
    _, c = started(h200(values={203: 95, 204: 23, 155: 669.885, 100: 1472, 252: 20_480, 250: 143_771},
                        prof={1002: 0.914, 1004: 0.891, 1005: 0.166, 1010: int(16.5 * MIB), 1011: 3_000_000_000}))
    v = values(c)
    assert v["util_gpu_ratio"] == pytest.approx(0.95) and v["util_mem_ratio"] == pytest.approx(0.23)    # % -> 0-1
    assert v["power_watts"] == pytest.approx(669.885)
    assert v["sm_clock_hertz"] == pytest.approx(1.472e9)                                                # MHz -> Hz
    assert v["mem_used_bytes"] == 20_480 * MIB and v["mem_total_bytes"] == 143_771 * MIB               # MiB -> B
    assert v["gpm_sm_util_ratio"] == pytest.approx(0.914) and v["gpm_tensor_util_ratio"] == pytest.approx(0.891)
    assert v["gpm_dram_bw_util_ratio"] == pytest.approx(0.166)                                          # ratios stay
    assert v["gpm_pcie_rx_bytes_per_second"] == int(16.5 * MIB)                                         # B/s stays
    assert v["gpm_nvlink_tx_bytes_per_second"] == 3e9
    assert v["temp_celsius"] == 40 and v["mem_temp_celsius"] == 35


def test_every_value_read_maps_through_the_field_table():
    """No second table: what the collector reports is what dcgm_fields maps, and the slow path holds the slow ones."""
    _, c = started(h200())
    fast, slow = values(c), c.scrape_slow().samples[0].values
    table = {f.metric for f in df.FIELDS}
    assert set(fast) <= table and set(slow) <= table
    assert not set(fast) & set(slow)
    assert {"energy_joules_total", "power_limit_watts", "ecc_uncorrected_total", "pcie_replay_total"} <= set(slow)
    assert slow["energy_joules_total"] == pytest.approx(1000.0)                                          # mJ -> J
    assert slow["power_limit_watts"] == 700.0


def test_blank_and_unavailable_values_are_missing_not_zero():
    gpu = h200(values={**h200().values, 155: BLANK_FP64, 100: BLANK_INT64, 101: BLANK_INT64 + 2},
               prof={**h200().prof, 1002: BLANK_FP64 + 1}, no_data={150})
    del gpu.values[140]                                           # this GPU has no HBM temperature
    _, c = started(gpu)
    s = c.scrape()
    v = s.samples[0].values
    for gone in ("power_watts", "sm_clock_hertz", "mem_clock_hertz", "gpm_sm_util_ratio", "temp_celsius",
                 "mem_temp_celsius"):
        assert gone not in v, gone
    assert v["util_gpu_ratio"] == 0.0 and v["gpm_tensor_util_ratio"] == 0.0    # real zeros stay zeros
    assert not s.errors and not s.health


def test_values_answered_in_another_order_still_land_on_their_gpu():
    eng, c = started(h200(values={203: 10}, prof={1002: 0.1}), h200(values={203: 20}),
                     h200(values={203: 30}, prof={1002: 0.3}))
    eng.reorder = True                    # "the returned entities are not guaranteed to be in any order"
    s = c.scrape()
    assert [(x.gpu, x.values["util_gpu_ratio"]) for x in s.samples] == [(0, 0.1), (1, 0.2), (2, 0.3)]
    assert s.samples[2].values["gpm_sm_util_ratio"] == 0.3 and s.samples[0].values["gpm_sm_util_ratio"] == 0.1
    assert len(s.samples[1].values) == len(s.samples[0].values)


def test_device_info_comes_from_dcgm_and_says_its_source():
    _, c = started(h200(), a100())
    d0, d1 = c.devices()
    assert (d0.name, d0.uuid, d0.architecture, d0.memory_total_bytes) == (
        "NVIDIA H200", "GPU-fake-0000", "hopper", 143_771 * MIB)
    assert d0.power_limit_watts == 700.0 and (d0.pcie_generation, d0.pcie_width) == (5, 16)
    assert (d0.pcie_max_generation, d0.pcie_max_width) == (5, 16)
    assert d0.driver_version == "570.124.06"
    assert d0.source == "dcgm (profiling)" and d0.gpm_supported
    assert d1.architecture == "ampere" and d1.source.startswith("dcgm (profiling; core fields only")


# -- the host engine dying and coming back ----------------------------------------------------------------------
def test_host_engine_killed_and_restarted_mid_run():
    clock = Clock()
    nvml = NvmlCollector(NvmlConfig(gpm=False), nvml=FakeNvml([nvml_h200(processes=[(4242, 1 << 30)]),
                                                               nvml_h200()]), procstat=ProcStat())
    eng, c = started(h200(values={**h200().values, 203: 80}), h200(), address=STANDALONE, nvml=nvml,
                     clock=clock)
    assert values(c)["util_gpu_ratio"] == pytest.approx(0.8)
    eng.kill()
    s = c.scrape()
    assert [(h.gpu, h.kind) for h in s.health] == [(0, HealthKind.SOURCE_ERROR), (1, HealthKind.SOURCE_ERROR)]
    assert "CONNECTION_NOT_VALID" in s.health[0].detail and "reconnecting" in s.health[0].detail
    assert c.source_status()[0].startswith("dcgm (host engine down:")
    # sampling goes on with what is left: NVML's processes, nothing made up
    assert s.samples[0].values == {"procs_count": 1.0} and s.samples[0].processes[0].pid == 4242
    connects = eng.connects
    for _ in range(5):                                        # no retry before the backoff is up
        s = c.scrape()
        assert not s.health and not s.errors
    assert eng.connects == connects
    clock.now += 1.0
    s = c.scrape()                                            # down still: the attempt is counted, not raised
    assert list(s.errors) == ["dcgm.reconnect: The connection to the host engine is not valid any longer"]
    eng.restart()
    assert not eng.watched(0)                                 # a restarted host engine holds no watch of ours
    clock.now += 1.5
    assert not c.scrape().health                              # the backoff doubled: 2 s
    clock.now += 0.5
    s = c.scrape()
    assert [(h.gpu, h.kind) for h in s.health] == [(0, HealthKind.RECOVERED), (1, HealthKind.RECOVERED)]
    assert "every field watched again (profiling watched on GPU 0, 1)" in s.health[0].detail
    assert {f.id for f in df.FIELDS if not f.metric.startswith(("energy", "power_limit", "pcie_replay", "ecc",
                                                                 "throttle_hw"))} <= eng.watched(0)
    assert s.samples[0].values["util_gpu_ratio"] == pytest.approx(0.8) and "gpm_sm_util_ratio" in s.samples[0].values
    assert c.source_status() == {0: "dcgm (profiling)", 1: "dcgm (profiling)"}
    assert c.scrape_slow().samples[0].values["energy_joules_total"] == 1000.0     # the slow watch is back too


def test_reconnect_backoff_doubles_up_to_its_ceiling():
    clock = Clock()
    eng, c = started(h200(), address=STANDALONE, clock=clock, reconnect_initial_s=1.0, reconnect_max_s=4.0)
    eng.kill()
    c.scrape()                                                # lost at 0 s
    attempts = []
    for step in range(1, 40):
        clock.now = step * 0.5
        if c.scrape().errors:
            attempts.append(clock.now)
    assert attempts[:5] == [1.0, 3.0, 7.0, 11.0, 15.0]


def test_gpu_lost_is_a_health_event_and_the_others_keep_sampling():
    eng, c = started(h200(), h200(), h200())
    c.scrape()
    eng.gpus[1].lost = True
    s = c.scrape()
    assert [x.gpu for x in s.samples] == [0, 2]
    assert [(h.gpu, h.kind) for h in s.health] == [(1, HealthKind.GPU_LOST)]
    assert [x.gpu for x in c.scrape().samples] == [0, 2] and c.devices()[1].lost


def test_a_gpu_missing_when_the_host_engine_comes_back_is_lost():
    clock = Clock()
    eng, c = started(h200(), h200(), address=STANDALONE, clock=clock)
    eng.kill()
    c.scrape()
    eng.gpus[1].lost = True
    eng.restart()
    clock.now += 1.0
    s = c.scrape()
    assert [(h.gpu, h.kind) for h in s.health] == [(1, HealthKind.GPU_LOST), (0, HealthKind.RECOVERED)]
    assert [x.gpu for x in s.samples] == [0] and c.source_status()[1] == "dcgm (GPU lost)"


def test_new_uncorrected_ecc_errors_are_a_health_event():
    eng, c = started(h200())
    c.scrape_slow()
    eng.gpus[0].values[311] = 3
    s = c.scrape_slow()
    assert [(h.kind, h.detail) for h in s.health] == [(HealthKind.ECC_UNCORRECTED, "3 new uncorrected ECC errors")]


def test_an_older_host_engine_without_the_newest_fields_is_still_read():
    engine([h200()], known_fields=KNOWN_FIELDS - df.SINCE_4_2)
    c = DcgmCollector(DcgmConfig(processes=False), bindings)
    c.start()
    v = values(c)
    assert "power_watts" in v and "gpm_sm_util_ratio" in v
    assert not any(k.startswith("throttle_") for k in v)
    assert "throttle_hw_thermal_seconds_total" not in c.scrape_slow().samples[0].values


# -- profiling refused, retried, tiered ---------------------------------------------------------------------------
def test_profiling_refused_on_one_gpu_leaves_its_device_fields_sampled_and_says_why():
    _, c = started(h200(), h200(profiling_refusal=ST.DCGM_ST_PROFILING_NOT_SUPPORTED, mig=True,
                            values={**h200().values, 203: 55}))
    s = c.scrape()
    v0, v1 = s.samples[0].values, s.samples[1].values
    assert "gpm_sm_util_ratio" in v0
    assert v1["util_gpu_ratio"] == pytest.approx(0.55) and not any(k.startswith("gpm_") for k in v1)
    assert c.source_status()[1] == "dcgm (no profiling: DCGM does not profile a GPU in MIG mode as a whole)"
    assert [d.gpm_supported for d in c.devices()] == [True, False]
    assert not s.errors


def test_profiling_held_by_another_profiler_is_asked_again_and_taken_when_free():
    clock = Clock()
    eng, c = started(h200(profiling_refusal=ST.DCGM_ST_IN_USE, prof={**h200().prof, 1002: 0.5}), clock=clock,
                     profiling_retry_s=60.0)
    assert "another profiler holds the GPU's performance counters" in c.source_status()[0]
    assert "asked again every 60 s" in c.source_status()[0]
    eng.gpus[0].profiling_refusal = None                      # the other profiler finished
    clock.now = 59.0
    assert "gpm_sm_util_ratio" not in values(c)
    clock.now = 60.0
    assert values(c)["gpm_sm_util_ratio"] == 0.5
    assert c.source_status()[0] == "dcgm (profiling)"


@pytest.mark.parametrize("refusal,words", [
    ("DCGM_ST_REQUIRES_ROOT", "needs nv-hostengine to run as root"),
    ("DCGM_ST_MODULE_NOT_LOADED", "profiling module did not load"),
    ("DCGM_ST_PROFILING_NOT_SUPPORTED", "DCGM cannot profile this GPU"),
])
def test_each_refusal_is_told_in_words_an_operator_can_act_on(refusal, words):
    _, c = started(h200(profiling_refusal=getattr(ST, refusal)))
    assert words in c.source_status()[0]
    assert "power_watts" in values(c)


def test_fields_that_need_a_second_pass_fall_back_to_the_core_set():
    eng, c = started(a100(prof={**a100().prof, 1014: 0.4, 1002: 0.7}))
    v = values(c)
    assert v["gpm_sm_util_ratio"] == 0.7 and "gpm_hmma_util_ratio" not in v
    assert 1014 not in eng.watched(0) and 1002 in eng.watched(0)


def test_profiling_turned_off_watches_none():
    eng, c = started(h200(), profiling=False)
    assert not any(f in eng.watched(0) for f in range(1001, 1100))
    assert c.source_status()[0] == "dcgm (no profiling: turned off in the agent's configuration)"


# -- paused around deep captures --------------------------------------------------------------------------------
class Profiler:
    """A capture client that looks at DCGM while the capture runs."""
    def __init__(self, eng, c):
        self.eng, self.c, self.seen = eng, c, []

    def capture(self, duration_ms, root, capture_id, host, margin_s=0.0):
        self.seen.append((self.eng.paused, {k for k in values(self.c) if k.startswith("gpm_")},
                          self.c.source_status()[0]))
        return CaptureResult(xspace=b"x", path=None, empty=False, seconds=0.1)


def test_profiling_is_paused_while_a_capture_runs_and_resumed_after(tmp_path):
    eng, c = started(a100(values={**a100().values, 203: 90}))
    prof = Profiler(eng, c)
    runner = CaptureRunner(CaptureConfig(tmp_path / "caps"), "host-a", profiling=c)
    rec, _ = runner.capture("job:1234", 100, client=prof)
    assert rec.status == "ok"
    paused, gpm, status = prof.seen[0]
    assert paused and not gpm and status == "dcgm (profiling paused while a capture runs)"
    assert (eng.pauses, eng.resumes, eng.paused) == (1, 1, False)
    assert "gpm_sm_util_ratio" in values(c) and values(c)["util_gpu_ratio"] == 0.9   # device fields all along


def test_overlapping_captures_resume_when_the_last_ends():
    eng, c = started(a100())
    c.pause_profiling()
    c.pause_profiling()
    c.resume_profiling()
    assert eng.paused
    c.resume_profiling()
    assert not eng.paused and (eng.pauses, eng.resumes) == (1, 1)
    c.resume_profiling()                                       # one too many: nothing
    assert eng.resumes == 1


def test_pausing_is_a_no_op_when_no_profiling_is_watched_and_hopper_does_not_pause():
    eng, c = started(a100(), profiling=False)
    c.pause_profiling()
    c.resume_profiling()
    assert eng.pauses == 0
    eng, c = started(h200())                                   # GPM: DCGM answers NOT_SUPPORTED to a pause
    c.pause_profiling()
    s = c.scrape()
    assert not s.errors and "gpm_sm_util_ratio" in s.samples[0].values
    assert "does not pause profiling it reads through GPM" in c.pause_note
    c.resume_profiling()
    assert eng.resumes == 0


def test_a_pause_outlives_a_host_engine_restart_and_close_resumes():
    clock = Clock()
    eng, c = started(a100(), address=STANDALONE, clock=clock)
    c.pause_profiling()
    eng.kill()
    c.scrape()
    eng.restart()                                              # a new host engine is not paused
    clock.now += 1.0
    c.scrape()
    assert eng.paused                                          # the capture still runs: paused again
    c.close()
    assert not eng.paused and not eng.connections


# -- start-up ---------------------------------------------------------------------------------------------------
def test_bindings_missing_is_a_clear_refusal(tmp_path):
    with pytest.raises(SourceUnavailable) as err:
        load_dcgm({ENV: str(tmp_path)})
    assert f"{ENV}={tmp_path} holds no dcgm_agent.py" in str(err.value)
    assert "datacenter-gpu-manager-4-core" in str(err.value) and "--source nvml" in str(err.value)
    if not any(os.path.exists(d) for d in INSTALL_DIRS):
        with pytest.raises(SourceUnavailable) as err:
            load_dcgm({})
        assert all(d in str(err.value) for d in INSTALL_DIRS)


@pytest.mark.parametrize("switch,address,words", [
    (dict(library_missing=True), None, "libdcgm.so.4 is not installed"),
    (dict(running=False), STANDALONE, f"no nv-hostengine answers at {STANDALONE}"),
    (dict(driver_missing=True), None, "is the NVIDIA driver loaded?"),
])
def test_start_fails_fast_saying_what_to_do(switch, address, words):
    engine([h200()], **switch)
    with pytest.raises(SourceUnavailable) as err:
        DcgmCollector(DcgmConfig(address=address, processes=False), bindings).start()
    assert words in str(err.value)


def test_processes_come_from_nvml_without_gpm_matched_by_uuid():
    fake = FakeNvml([nvml_h200(processes=[(os.getpid(), 1 << 30)]), nvml_h200()])
    nvml = NvmlCollector(NvmlConfig(gpm=False), nvml=fake, procstat=ProcStat())
    # DCGM numbers the GPUs the other way round: the UUID decides
    _, c = started(h200(uuid="GPU-fake-0001"), h200(uuid="GPU-fake-0000"), nvml=nvml)
    s = c.scrape()
    assert s.samples[1].values["procs_count"] == 1 and s.samples[1].processes[0].pid == os.getpid()
    assert s.samples[0].values["procs_count"] == 0
    assert not fake._gpm_owner                                 # NVML's GPM never sampled beside DCGM's profiling
    c.close()
    assert not fake.initialised


def test_without_nvml_there_are_no_processes_and_it_says_so(monkeypatch):
    import pynvml
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: (_ for _ in ()).throw(pynvml.NVMLError(12)))
    engine([h200()])
    c = DcgmCollector(DcgmConfig(), bindings)
    c.start()
    assert "procs_count" not in values(c) and "NVML did not load" in c.processes_note


@pytest.mark.parametrize("spec,env,address", [
    ("dcgm", {}, None),
    ("dcgm", {"DCGM_HOSTENGINE": "10.0.0.7"}, "10.0.0.7:5555"),
    ("dcgm:gpu-host-3", {"DCGM_HOSTENGINE": "10.0.0.7"}, "gpu-host-3:5555"),
    ("dcgm:127.0.0.1:6000", {}, "127.0.0.1:6000"),
])
def test_source_specs(spec, env, address):
    assert parse_source(spec, env) == address


@pytest.mark.parametrize("spec", ["dcgm:host:port", "dcgm:host:0", "dcgm::5555"])
def test_bad_source_specs_say_what_is_expected(spec):
    with pytest.raises(SourceUnavailable, match="expected HOST or HOST:PORT"):
        parse_source(spec, {})


def test_make_source_starts_dcgm(monkeypatch):
    from gpuscope.daemon.sources import make_source
    engine([h200(), h200()], address=STANDALONE)
    monkeypatch.setenv(ENV, str(BINDINGS))
    collector, source = make_source(f"dcgm:{STANDALONE}", 1.0, allow_fallback=False)
    try:
        assert source == f"dcgm:{STANDALONE}" and len(collector.devices()) == 2
        assert hasattr(collector, "pause_profiling")
    finally:
        collector.close()


# -- the agent as people run it, feeding a real analyzer ----------------------------------------------------------
IDLE = dict(values={"203": 0, "204": 0, "155": 90.0}, prof={"1001": 0.0, "1002": 0.0, "1004": 0.0, "1005": 0.0})
COMPUTE = dict(values={"203": 95, "204": 23, "155": 650.0},
               prof={"1001": 0.95, "1002": 0.91, "1003": 0.14, "1004": 0.89, "1005": 0.17, "1007": 0.01,
                     "1008": 0.0, "1009": 7 * MIB, "1010": 16 * MIB})
MEMORY = dict(values={"203": 95, "204": 96, "155": 450.0},
              prof={"1001": 0.95, "1002": 0.86, "1003": 0.70, "1004": 0.0, "1005": 0.80, "1007": 0.10,
                    "1008": 0.0, "1009": 12 * MIB, "1010": 28 * MIB})


def test_agent_with_source_dcgm_feeds_an_analyzer_that_finds_the_right_verdicts(tmp_path):
    from gpuscope.daemon import clients
    spec = tmp_path / "gpus.json"
    write_spec(spec, [dict(preset="h200", **IDLE), dict(preset="h200", **COMPUTE)])
    srv = AnalyzerServer(tmp_path / "a.duckdb")
    env = {**os.environ, ENV: str(BINDINGS), "GPUSCOPE_FAKE_DCGM_SPEC": str(spec)}
    env.pop("DCGM_HOSTENGINE", None)
    agent = subprocess.Popen([sys.executable, "-m", "gpuscope.daemon.cli", "agent", "--source", "dcgm",
                              "--analyzer", srv.target, "--listen", f"127.0.0.1:{free_port()}", "--insecure",
                              "--interval", "0.1", "--host", "dcgm-host", "--duration", "120s",
                              "--capture-dir", str(tmp_path / "caps")],
                             env=env, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: srv.analyzer.writer.samples > 20, timeout=60)
        write_spec(spec, [dict(preset="h200", **MEMORY), dict(preset="h200", **COMPUTE)])

        def verdicts():
            found = clients.findings(srv.target, host="dcgm-host", open_only=True)
            return {f["gpu"]: f["verdict"] for f in found if f["windows"] >= 3}
        got = wait_for(lambda: (v := verdicts()) and len(v) == 2 and v, timeout=60)
        assert got == {0: "memory-bound", 1: "compute-bound"}
        st = clients.status(srv.target)
        assert {g["gpu"] for g in st["gpus"] if g["host"] == "dcgm-host"} == {0, 1}
    finally:
        agent.send_signal(2)
        _, err = agent.communicate(timeout=30)
        srv.stop()
    assert agent.returncode == 0, err
    assert "agent: dcgm" in err


def test_the_link_under_load_is_read_while_the_gpu_is_busy():
    """DCGM's link fields (237/238) at start-up are an idle link's; the busy
    link is read at the slow scrape while utilisation says the GPU works."""
    eng, c = started(h200(values={237: 1}))
    c.scrape(), c.scrape_slow()
    assert c.devices()[0].pcie_busy_generation is None
    gpu = eng.gpus[0]
    gpu.values.update({203: 90, 237: 4})
    c.scrape(), c.scrape_slow()
    d = c.devices()[0]
    assert (d.pcie_generation, d.pcie_busy_generation, d.pcie_busy_width, d.pcie_max_generation) == (1, 4, 16, 5)
    gpu.values.update({203: 0, 237: 1})
    c.scrape(), c.scrape_slow()
    assert c.devices()[0].pcie_busy_generation == 4
