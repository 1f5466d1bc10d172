"""Rules on hand-made windows: the reasoning holds beyond the one recording."""
import numpy as np
import pytest

from gpuscope.analyzers.classify import classify
from gpuscope.analyzers.features import Columns, compute_window
from gpuscope.collectors import catalogue as cat


def window(n=10, **metrics):
    t = np.arange(n, dtype=float) + 1e9
    cols = {k: np.asarray(v, dtype=float) if np.ndim(v) else np.full(n, float(v)) for k, v in metrics.items()}
    return compute_window(0, t[0], t[-1] + 1, t, Columns.from_dict(cols, n), pcie_generation=4, pcie_width=16,
                          power_limit_watts=700)


def test_nvlink_collective_saturating_the_link_is_communication_bound():
    w = window(util_gpu_ratio=0.6, gpm_sm_util_ratio=0.3, gpm_tensor_util_ratio=0.1, gpm_dram_bw_util_ratio=0.1,
               gpm_nvlink_tx_bytes_per_second=200e9, gpm_nvlink_rx_bytes_per_second=200e9,
               gpm_pcie_tx_bytes_per_second=1e6, gpm_pcie_rx_bytes_per_second=1e6)
    assert classify(w).verdict == "communication-bound"


def test_pcie_link_near_peak_is_communication_bound_even_with_busy_sms():
    # gen4 x16 ~ 31.5 GB/s per direction; 50 GB/s both ways is ~80 %
    w = window(util_gpu_ratio=0.9, gpm_sm_util_ratio=0.8, gpm_tensor_util_ratio=0.2, gpm_dram_bw_util_ratio=0.3,
               gpm_pcie_tx_bytes_per_second=25e9, gpm_pcie_rx_bytes_per_second=25e9)
    c = classify(w)
    assert c.verdict == "communication-bound"
    assert "PCIe 50.0 GB/s = 79 % of the link's peak per direction" in c.summary


def test_idle_gpu_held_by_a_sleeping_process():
    c = classify(window(util_gpu_ratio=0.0, util_mem_ratio=0.0, procs_cpu_cores=0.02, procs_count=1,
                        mem_used_bytes=40e9))
    assert c.verdict == "idle" and "1 process" in c.summary


def test_thermal_throttling_from_the_counter():
    w = window(util_gpu_ratio=0.95, util_mem_ratio=0.2,
               throttle_sw_thermal_seconds_total=np.arange(10) * 0.5)   # half of each second
    c = classify(w)
    assert c.verdict == "compute-bound" and c.flags == ["thermal-throttled"]


def test_power_cap_from_reason_bits_when_counters_are_missing():
    w = window(util_gpu_ratio=0.95, util_mem_ratio=0.95, clock_event_reasons=0x4)
    c = classify(w)
    assert c.verdict == "memory-bound" and c.flags == ["power-capped"]


def test_boundary_window_has_lower_confidence():
    clear = classify(window(util_gpu_ratio=0.95, util_mem_ratio=0.2)).confidence
    borderline = classify(window(util_gpu_ratio=0.95, util_mem_ratio=0.53)).confidence
    assert clear >= 0.85 and borderline < clear - 0.3


def test_window_without_activity_readings_is_not_classified():
    assert window(power_watts=300.0) is None


def test_every_catalogue_unit_is_declared():
    assert all(m.unit and m.kind in cat.Kind for m in cat.METRICS)
    assert len(cat.NAMES) == len(set(cat.NAMES))


def test_a_window_straddling_idle_to_busy_is_transitional_not_starved():
    """One idle second then busy ones average into "starved by the host";
    the window is marked transitional, with low confidence, instead."""
    util = [0.0, 0.0, 0.0, 0.0, 0.95, 0.96, 0.95, 0.97, 0.96, 0.95]
    sm = [0.0, 0.0, 0.0, 0.0, 0.9, 0.91, 0.9, 0.92, 0.9, 0.91]
    c = classify(window(util_gpu_ratio=util, gpm_sm_util_ratio=sm, procs_cpu_cores=1.0))
    assert "transitional" in c.flags and c.confidence <= 0.3
    assert c.evidence["activity_shift_ratio"] == pytest.approx(0.907, abs=1e-3)
    assert "straddles a change of regime" in c.summary


def test_a_bursty_job_whose_busy_and_idle_samples_interleave_is_not_transitional():
    util = [0.0, 0.95] * 5
    c = classify(window(util_gpu_ratio=util, gpm_sm_util_ratio=util, procs_cpu_cores=1.0))
    assert "transitional" not in c.flags
    assert c.evidence["activity_shift_ratio"] < 0.35


def test_too_few_samples_to_split_say_nothing_of_a_shift():
    c = classify(window(n=3, util_gpu_ratio=[0.0, 0.9, 0.9]))
    assert "activity_shift_ratio" not in c.evidence and "transitional" not in c.flags
