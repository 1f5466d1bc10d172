"""A GPU's measured ceilings move its roofline: the real H200 matmul trace,
with a calibration planted for its GPU, gets the calibrated ridge point and
says so; without one the trace's own peaks stand."""
import json

from gpuscope.analyzers.calibrations import parse_calibration
from gpuscope.analyzers.roofline import choose_peaks, Peaks
from gpuscope.analyzers.store import DEVICE_COLUMNS
from gpuscope.analyzers.trace_analysis import summarize
from gpuscope.collectors.trace_files import load_trace
from gpuscope.v1 import samples_pb2 as pb
from tests.conftest import FIXTURE
from tests.helpers import AnalyzerServer, calibration_record

WHEN = 1_764_400_000.0          # 2025-11-29
HBM, BF16 = 4.3e12, 7.1e14


def _matmul_xspace():
    return next((FIXTURE / "traces" / "matmul_bf16" / "plugins" / "profile").iterdir()) / "vm.xplane.pb"


def test_measured_peaks_replace_the_traces_and_say_so(fixture_dir):
    trace_only = summarize(load_trace(_matmul_xspace()))["roofline"]
    assert trace_only["peaks_source"] == "trace"
    s = summarize(load_trace(_matmul_xspace()), measured={0: (HBM, BF16, WHEN)})
    roof = s["roofline"]
    assert roof["peaks_source"] == "measured (calibrated 2025-11-29)"
    assert roof["ridge_flops_per_byte"] == BF16 / HBM != trace_only["ridge_flops_per_byte"]
    top = s["top_ops"][0]
    assert top["bound"] == "compute" and abs(top["fraction_of_peak"] - top["achieved_flops_per_s"] / BF16) < 1e-9
    assert "of measured peak FLOP/s" in s["summary"]


def test_choosing_peaks():
    trace = Peaks(9.9e14, 4.8e12)
    assert choose_peaks(trace, "NVIDIA H200", None) == (trace, "trace")
    assert choose_peaks(Peaks(None, None), "NVIDIA H200", None) == (Peaks(989e12, 4.8e12), "datasheet")
    assert choose_peaks(Peaks(None, None), "mystery", None) == (Peaks(None, None), None)
    assert choose_peaks(Peaks(None, None), 17, None) == (Peaks(None, None), None)
    peaks, source = choose_peaks(trace, "NVIDIA H200", (HBM, None, WHEN))
    assert peaks == Peaks(9.9e14, HBM) and source == "measured (calibrated 2025-11-29); FLOP/s from the trace"


def test_the_analyzer_uses_the_captured_gpus_calibration(fixture_dir, tmp_path):
    srv = AnalyzerServer(tmp_path / "m.duckdb")
    try:
        a = srv.analyzer
        device = dict(host="h1", gpu=0, uuid="GPU-h200", name="NVIDIA H200", last_seen=1.0)
        cal, rows = parse_calibration("h1", calibration_record(uuid="GPU-h200", started_at=WHEN, hbm=HBM, bf16=BF16),
                                      received=WHEN + 60)

        def plant(st):
            st.upsert_devices([tuple(device.get(k) for k in DEVICE_COLUMNS)])
            st.add_calibration(cal, rows)
        a.writer.call(plant).result()
        rec = pb.CaptureRecord(id="cap-m", host="h1", target="x:1", gpus=[0], status="ok")
        row = a.report_capture(rec, _matmul_xspace().read_bytes())
        roof = json.loads(row["summary"])["roofline"]
        assert roof["peaks_source"].startswith("measured (calibrated 2025-11-29")
        assert roof["peak_bytes_per_s"] == HBM and roof["peak_flops_per_s"] == BF16
        # another host's capture of the same slot has no calibration: the trace's peaks
        other = a.report_capture(pb.CaptureRecord(id="cap-o", host="h2", target="x:1", gpus=[0], status="ok"),
                                 _matmul_xspace().read_bytes())
        assert json.loads(other["summary"])["roofline"]["peaks_source"] == "trace"
    finally:
        srv.stop()
