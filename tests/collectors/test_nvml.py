import pytest

from gpuscope.collectors.nvml import NvmlCollector, NvmlConfig, SourceUnavailable
from gpuscope.collectors.procstat import ProcStat
from gpuscope.collectors.records import HealthKind
from tests.fakes.nvml import GPU_IS_LOST, UNKNOWN, FakeNvml, h200, older_gpu


def started(*gpus, **kw):
    fake = FakeNvml(list(gpus))
    c = NvmlCollector(NvmlConfig(**kw), nvml=fake)
    c.start()
    return fake, c


def test_values_are_normalised_to_catalogue_units():
    fake, c = started(h200(util_gpu=95, util_mem=23, power_mw=669_885, sm_clock_mhz=1472,
                           gpm_values={2: 91.4, 5: 89.1, 10: 16.6, 21: 16.5}))
    c.scrape()
    v = c.scrape().samples[0].values
    assert v["util_gpu_ratio"] == pytest.approx(0.95)
    assert v["power_watts"] == pytest.approx(669.885)
    assert v["sm_clock_hertz"] == pytest.approx(1.472e9)
    assert v["gpm_sm_util_ratio"] == pytest.approx(0.914)
    assert v["gpm_pcie_rx_bytes_per_second"] == pytest.approx(16.5 * 1048576)
    assert v["mem_temp_celsius"] == 35


def test_gpm_needs_two_samples_before_it_reports():
    _, c = started(h200(gpm_values={2: 50.0}))
    assert "gpm_sm_util_ratio" not in c.scrape().samples[0].values
    assert c.scrape().samples[0].values["gpm_sm_util_ratio"] == pytest.approx(0.5)


def test_slow_fields_stay_off_the_fast_path():
    _, c = started(h200())
    fast = c.scrape().samples[0].values
    for slow in ("energy_joules_total", "throttle_hw_thermal_seconds_total",
                 "throttle_hw_power_brake_seconds_total", "pcie_replay_total", "ecc_uncorrected_total"):
        assert slow not in fast
    slow = c.scrape_slow().samples[0].values
    assert slow["energy_joules_total"] == pytest.approx(1000.0)
    assert slow["power_limit_watts"] == pytest.approx(700.0)


def test_not_supported_is_remembered_per_device_and_call():
    fake, c = started(h200(), h200(unsupported={"nvmlDeviceGetTemperature"}))
    c.scrape()
    before = fake.calls
    c.scrape()
    per_tick = fake.calls - before
    c.scrape()
    assert fake.calls - before == 2 * per_tick        # the failing call is not retried
    s = c.scrape()
    assert "temp_celsius" in s.samples[0].values and "temp_celsius" not in s.samples[1].values
    assert not s.errors


def test_not_supported_field_is_dropped_from_later_requests():
    _, c = started(older_gpu())
    v = c.scrape().samples[0].values
    assert "mem_temp_celsius" not in v and "pcie_tx_bytes_total" in v
    assert c.devices()[0].gpm_supported is False
    assert not any(k.startswith("gpm_") for k in c.scrape().samples[0].values)


def test_other_errors_are_counted_not_raised():
    _, c = started(h200(failing={"nvmlDeviceGetPowerUsage": UNKNOWN}))
    s = c.scrape()
    assert "power_watts" not in s.samples[0].values
    assert any("power" in k for k in s.errors)


def test_lost_gpu_becomes_a_health_event_and_others_keep_sampling():
    fake, c = started(h200(util_gpu=10), h200(util_gpu=20), h200(util_gpu=30))
    c.scrape()
    fake.gpus[1].lost = True
    s = c.scrape()
    assert [x.gpu for x in s.samples] == [0, 2]
    assert [(h.gpu, h.kind) for h in s.health] == [(1, HealthKind.GPU_LOST)]
    assert c.devices()[1].lost
    s = c.scrape()
    assert [x.gpu for x in s.samples] == [0, 2] and not s.health   # reported once


def test_lost_during_gpm_is_caught_too():
    fake, c = started(h200(), h200(failing={"nvmlGpmSampleGet": GPU_IS_LOST}))
    s = c.scrape()
    assert [x.gpu for x in s.samples] == [0] and s.health[0].kind is HealthKind.GPU_LOST


def test_xid_and_new_ecc_errors_are_health_events():
    fake, c = started(h200(), h200())
    c.scrape_slow()
    fake.gpus[1].xids.append(79)
    fake.gpus[0].ecc_uncorrected = 3
    kinds = sorted((h.gpu, h.kind.value, h.code) for h in c.scrape_slow().health)
    assert kinds == [(0, "ecc_uncorrected", 3), (1, "xid", 79)]


def test_missing_library_says_what_to_do():
    c = NvmlCollector(nvml=FakeNvml([h200()], library_missing=True))
    with pytest.raises(SourceUnavailable, match="libnvidia-ml.so.1.*replay"):
        c.start()


def test_processes_carry_host_cpu_from_proc(tmp_path):
    (tmp_path / "4242").mkdir()
    stat = tmp_path / "4242" / "stat"
    (tmp_path / "4242" / "cmdline").write_bytes(b"python\0train.py\0")
    clock = [100.0]
    stat.write_text("4242 (python train) S " + " ".join(["0"] * 10) + " 100 50 0 0")
    fake = FakeNvml([h200(processes=[(4242, 1 << 30)])])
    c = NvmlCollector(nvml=fake, procstat=ProcStat(tmp_path, clock=lambda: clock[0]))
    c.start()
    first = c.scrape().samples[0]
    assert first.processes[0].cpu_cores is None and first.processes[0].command == "python train.py"
    clock[0] += 1.0
    stat.write_text("4242 (python train) S " + " ".join(["0"] * 10) + " 200 100 0 0")  # +150 ticks
    s = c.scrape().samples[0]
    assert s.processes[0].cpu_cores == pytest.approx(1.5)
    assert s.values["procs_cpu_cores"] == pytest.approx(1.5)
    assert s.processes[0].used_memory_bytes == 1 << 30


def test_the_link_s_best_is_read_beside_the_link_it_trained_to():
    """A card seated at x8 in an x16 slot: NVML's max width says what it could be."""
    _, c = started(h200(pcie_width=8, pcie_gen=4))
    d = c.devices()[0]
    assert (d.pcie_generation, d.pcie_width, d.pcie_max_generation, d.pcie_max_width) == (4, 8, 5, 16)
    assert d.driver_version == "570.124.06"


def test_a_driver_without_the_max_link_calls_leaves_them_unknown():
    _, c = started(h200(unsupported={"nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth"}))
    d = c.devices()[0]
    assert d.pcie_max_generation is None and d.pcie_max_width is None and d.pcie_width == 16


def test_the_link_under_load_is_the_best_seen_while_busy_and_idle_readings_never_lower_it():
    """An idle H200 rests its link at Gen1: nothing is said of the busy link
    until the GPU works, and a rest between steps does not take it back."""
    fake, c = started(h200(pcie_gen=1))
    c.scrape(), c.scrape_slow()
    d = c.devices()[0]
    assert d.pcie_generation == 1 and (d.pcie_busy_generation, d.pcie_busy_width) == (None, None)
    g = fake.gpus[0]
    g.util_gpu, g.pcie_gen = 95, 4        # busy, and the link trained to Gen4 only
    c.scrape(), c.scrape_slow()
    assert (c.devices()[0].pcie_busy_generation, c.devices()[0].pcie_busy_width) == (4, 16)
    g.util_gpu, g.pcie_gen = 0, 1         # resting again: the reading at idle is not the link
    c.scrape(), c.scrape_slow()
    assert c.devices()[0].pcie_busy_generation == 4
    g.util_gpu, g.pcie_gen = 100, 5
    c.scrape(), c.scrape_slow()
    assert c.devices()[0].pcie_busy_generation == 5
