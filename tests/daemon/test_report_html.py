"""The pictures of `gpuscope report --html/--png` (daemon/report_html.py),
drawn from a range report whose content is known: each colour is where the
time axis says it is, the page holds everything it shows, and nothing it
needs is fetched."""
import base64
import io
import json
import re

import pytest
from PIL import Image

from gpuscope.daemon import report_html as rh
from gpuscope.daemon.cliutil import VERDICTS

T0 = 1_795_989_600.0
H = "gpu-host-1"


def _series(gpu: int, metric: str, value: float, n: int = 60) -> dict:
    return dict(host=H, gpu=gpu, metric=metric, t=[T0 + i * 10 + 5 for i in range(n)], v=[value] * n)


def _report(captures: bool = True) -> dict:
    runs = [("idle", 0, 60), ("compute-bound", 60, 240), ("memory-bound", 240, 420), ("host-bound", 420, 540)]
    ops = [dict(op="dot.1", kernel="nvjet_sm90_gemm", time_fraction=0.8, intensity_flops_per_byte=2500.0,
                achieved_flops_per_s=6.9e14, achieved_bytes_per_s=2.7e11, bound="compute", bound_source="hlo",
                fraction_of_peak=0.64),
           dict(op="loop_add_fusion", kernel="loop_add_fusion", time_fraction=0.2, intensity_flops_per_byte=0.25,
                achieved_flops_per_s=1.0e12, achieved_bytes_per_s=4.0e12, bound="memory", bound_source="hlo",
                fraction_of_peak=0.83),
           dict(op="", kernel="memcpy", time_fraction=0.0, bound=None, bound_source="unknown")]
    return dict(
        start=T0, end=T0 + 600, host=H, gpu=None, notes=["counters: means over 10 s (up to 10 samples each)"],
        gpus=[dict(host=H, gpu=0, name="NVIDIA H200", samples=6000, bottleneck_seconds=480.0),
              dict(host=H, gpu=1, name="NVIDIA H200", samples=6000, bottleneck_seconds=0.0)],
        gpus_in_range=2,
        lanes=dict(step=None, windows=120, flag_runs=[dict(host=H, gpu=0, start=T0 + 60, end=T0 + 240,
                                                           flag="power-capped")],
                   runs=[dict(host=H, gpu=0, start=T0 + a, end=T0 + b, verdict=v) for v, a, b in runs]
                   + [dict(host=H, gpu=1, start=T0, end=T0 + 300, verdict="idle")]),
        counters=dict(step=10.0, samples_per_point=10, series=[
            _series(0, "gpm_sm_util_ratio", 0.9), _series(0, "gpm_tensor_util_ratio", 0.85),
            _series(0, "gpm_dram_bw_util_ratio", 0.2), _series(0, "gpm_pcie_rx_bytes_per_second", 2.5e9),
            _series(0, "procs_cpu_cores", 1.5), _series(0, "power_watts", 650.0),
            _series(1, "util_gpu_ratio", 0.0), _series(1, "power_watts", 120.0)]),
        findings=[dict(id="f00dfeed1234", host=H, gpu=0, verdict="memory-bound", start=T0 + 240, end=T0 + 420,
                       confidence=0.9, flags=["power_capped"], summary="DRAM 80 % busy <b>not markup</b>",
                       what_to_try=["a larger batch", "fewer bytes: quantised weights"])],
        findings_total=1,
        captures=[dict(id="cap-1", host=H, gpus=[0], start=T0 + 100, end=T0 + 100.5, kind="jax", status="ok",
                       verdict="compute-bound", trace_summary="GPU busy 97 %", top_ops=ops, device="NVIDIA H200",
                       roofline=dict(peak_flops_per_s=1.07e15, peak_bytes_per_s=4.81e12))] if captures else [],
        peaks=[dict(device="NVIDIA H200", flops_per_s=1.07e15, bytes_per_s=4.81e12, ridge=1.07e15 / 4.81e12,
                    source="trace", how="from the trace's device properties")] if captures else [])


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))


def _near(pixel, hex_colour: str, tol: int = 8) -> bool:
    return all(abs(int(a) - b) <= tol for a, b in zip(pixel[:3], _rgb(hex_colour)))


def _x(geometry: dict, t: float) -> int:
    return round(geometry["x0"] + (t - geometry["t0"]) / (geometry["t1"] - geometry["t0"])
                 * (geometry["x1"] - geometry["x0"]))


def test_each_verdict_has_its_own_fixed_colour():
    assert set(rh.VERDICT_COLOURS) == set(VERDICTS)
    colours = list(rh.VERDICT_COLOURS.values()) + [rh.NO_WINDOW] + list(rh.FLAG_COLOURS.values())
    assert len(set(colours)) == len(colours)


def test_timeline_puts_each_verdict_where_the_time_axis_says():
    png, g = rh.timeline_png(_report())
    img = Image.open(io.BytesIO(png)).convert("RGB")
    assert img.size == (g["width"], g["height"]) == (1300, g["height"])
    lane0, lane1 = g["lanes"]
    assert lane0["gpu"] == f"{H}/gpu0" and lane1["gpu"] == f"{H}/gpu1"
    y0 = round((lane0["y0"] + lane0["y1"]) / 2)
    for verdict, t in (("idle", 30), ("compute-bound", 150), ("memory-bound", 330), ("host-bound", 480)):
        assert _near(img.getpixel((_x(g, T0 + t), y0)), rh.VERDICT_COLOURS[verdict]), verdict
    assert _near(img.getpixel((_x(g, T0 + 570), y0)), rh.NO_WINDOW)          # nothing judged: said, not white
    y1 = round((lane1["y0"] + lane1["y1"]) / 2)
    assert _near(img.getpixel((_x(g, T0 + 150), y1)), rh.VERDICT_COLOURS["idle"])
    assert _near(img.getpixel((_x(g, T0 + 450), y1)), rh.NO_WINDOW)
    strip = round(lane0["y1"] + 2)                                            # the power cap, under the band
    assert _near(img.getpixel((_x(g, T0 + 150), strip)), rh.FLAG_COLOURS["power-capped"])
    assert not _near(img.getpixel((_x(g, T0 + 330), strip)), rh.FLAG_COLOURS["power-capped"])
    # the panels, with units: ratios as %, bytes/s with the prefix of the largest value
    assert g["panels"] == ["verdict per GPU", "SM active (%)", "tensor active (%)", "DRAM active (%)",
                           "PCIe (GB/s)", "host CPU (cores)", "power (W)"]


def test_roofline_places_each_op_by_intensity_and_achieved_flops():
    png, g = rh.roofline_png(_report())
    img = Image.open(io.BytesIO(png)).convert("RGB")
    import math

    def at(intensity: float, flops: float) -> tuple[int, int]:
        (lx, hx), (ly, hy) = g["xlim"], g["ylim"]
        fx = (math.log10(intensity) - math.log10(lx)) / (math.log10(hx) - math.log10(lx))
        fy = (math.log10(flops) - math.log10(ly)) / (math.log10(hy) - math.log10(ly))
        return round(g["x0"] + fx * (g["x1"] - g["x0"])), round(g["y1"] - fy * (g["y1"] - g["y0"]))
    assert _near(img.getpixel(at(2500.0, 6.9e14)), rh.VERDICT_COLOURS["compute-bound"])
    assert _near(img.getpixel(at(0.25, 1.0e12)), rh.VERDICT_COLOURS["memory-bound"])
    # the compute roof is black at the peak, right of the ridge point
    x, y = at(8000.0, 1.07e15)
    assert any(_near(img.getpixel((x, y + d)), "#000000", 40) for d in (-1, 0, 1))
    assert rh.roofline_png(_report(captures=False)) is None


def test_the_page_holds_everything_and_fetches_nothing():
    rep = _report()
    page = rh.page(rep, title="gpuscope report: test", timeline=rh.timeline_png(rep),
                   roofline=rh.roofline_png(rep), highlight="f00dfeed1234")
    refs = re.findall(r"""(?:src|href)\s*=\s*["']?([^"' >]+)""", page, re.I)
    assert refs and all(r.startswith("data:image/png;base64,") for r in refs), [r[:40] for r in refs]
    assert "<script" not in page.lower() and "@import" not in page and "url(" not in page
    assert "http://" not in page and "https://" not in page
    for data in re.findall(r'src="data:image/png;base64,([^"]+)"', page):
        assert Image.open(io.BytesIO(base64.b64decode(data))).format == "PNG"
    axes = [json.loads(a.replace("&quot;", '"')) for a in re.findall(r"data-axes='([^']+)'", page)]
    assert {tuple(sorted(a)) for a in axes} >= {tuple(sorted(rh.timeline_png(rep)[1]))}
    # the findings with what to try, the peaks and where they come from, the ops
    assert "f00dfeed1234" in page and "<li>a larger batch</li>" in page and 'class="this"' in page
    assert "DRAM 80 % busy &lt;b&gt;not markup&lt;/b&gt;" in page             # stored words are text, never markup
    assert "<b>from the trace</b>" in page and "1.07 PFLOP/s compute, 4.81 TB/s memory bandwidth" in page
    assert "loop_add_fusion" in page and "C1" in page
    assert "SM active (%)" in page and "PCIe (GB/s)" in page and "power (W)" in page
    assert "counters: means over 10 s" in page
    for verdict in VERDICTS:
        assert verdict in page


def test_a_range_without_captures_says_so_and_draws_no_roofline():
    rep = _report(captures=False)
    page = rh.page(rep, title="t", timeline=rh.timeline_png(rep), roofline=None)
    assert "No captures in this range" in page and "Peaks of" not in page


@pytest.mark.parametrize("gpus", [1, 16])
def test_many_gpus_stay_one_lane_each(gpus):
    rep = _report(captures=False)
    rep["gpus"] = [dict(host=f"h{i:02d}", gpu=0, name="x", samples=1, bottleneck_seconds=0) for i in range(gpus)]
    rep["lanes"]["runs"] = [dict(host=f"h{i:02d}", gpu=0, start=T0, end=T0 + 600,
                                 verdict=VERDICTS[i % len(VERDICTS)]) for i in range(gpus)]
    png, g = rh.timeline_png(rep)
    img = Image.open(io.BytesIO(png)).convert("RGB")
    assert len(g["lanes"]) == gpus
    for i, lane in enumerate(g["lanes"]):
        y = round((lane["y0"] + lane["y1"]) / 2)
        assert _near(img.getpixel((_x(g, T0 + 300), y)), rh.VERDICT_COLOURS[VERDICTS[i % len(VERDICTS)]])


def test_a_page_that_cannot_be_written_is_one_line_not_a_traceback(tmp_path):
    """Found in a trial: --html into a directory one cannot write gave a PermissionError traceback."""
    from gpuscope.daemon.cliutil import UsageError
    from gpuscope.daemon.cmd_report import _write
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match=r"cannot write there \(Not a directory\); give a path"):
        _write(str(tmp_path / "file" / "r.html"), b"<html>")
    assert _write(str(tmp_path / "r.html"), b"<html>") == (str(tmp_path / "r.html"), 6)
