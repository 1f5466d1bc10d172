"""`gpuscope report --html/--png` as on-call runs it, checked in a browser.

A real analyzer (gRPC, DuckDB, its analysis in a process of its own, as
`gpuscope analyzer` runs it) judges the bundled H200 recording, pushed over
gRPC as if it had been recorded within the hour (its times moved by whole
hours: the analyzer refuses samples older than a week), and stores three captures of it reported as an
agent reports them (the recording's own XLA traces of matmul_bf16,
hbm_stream and the remote decode_gemv). The command line writes the report;
headless Chromium (Debian's `chromium`) renders it and the screenshot is
read: each phase's verdict colour where the time axis puts the phase (the
fixture's phases.jsonl says when), in the order the phases ran; the
captured ops where the roofline's axes put them."""
import base64
import io
import json
import os
import re
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import grpc
import numpy as np
import pytest
from PIL import Image

from gpuscope.collectors.recording import read_recording
from gpuscope.collectors.records import DeviceInfo, GpuSample
from gpuscope.daemon import clients
from gpuscope.daemon.convert import encode_batch
from gpuscope.daemon.report_html import NO_WINDOW, VERDICT_COLOURS
from gpuscope.v1 import analyzer_pb2_grpc, samples_pb2 as pb
from tests.helpers import AnalyzerServer, in_terminal, wait_for

CHROMIUM = "/usr/bin/chromium"
needs_chromium = pytest.mark.skipif(
    not os.path.exists(CHROMIUM),
    reason=f"{CHROMIUM} is missing: the report is not rendered in a browser (Debian's package: "
           "apt-get install chromium; .ci/run installs it)")
GPUSCOPE = [sys.executable, "-m", "gpuscope.daemon.cli"]
HOST = "h200-host"
# what the counters say of each phase (the fixture's README); idle_end is the last window,
# which no later sample closes
EXPECTED = {"idle": "idle", "matmul_bf16": "compute-bound", "hbm_stream": "memory-bound",
            "decode_gemv": "memory-bound", "launch_bound": "launch-bound", "host_stall": "host-bound",
            "pcie_h2d_d2h": "communication-bound", "train_mlp": "compute-bound"}
CAPTURES = (("matmul", "traces/matmul_bf16", "matmul_bf16"), ("hbm", "traces/hbm_stream", "hbm_stream"),
            ("decode", "remote", "decode_gemv"))


@pytest.fixture(scope="module")
def judged(tmp_path_factory, fixture_dir, phases):
    """The analyzer, once it has judged the recording and stored its captures."""
    srv = AnalyzerServer(tmp_path_factory.mktemp("report") / "r.duckdb", window_s=5.0, engine=True)
    rec = read_recording(fixture_dir / "samples.csv")
    # whole hours: windows, minutes and the phases' places in them stay as recorded
    shift = np.floor((time.time() - 600 - float(rec.t[-1])) / 3600) * 3600
    rec.t = rec.t + shift
    devices = [DeviceInfo(gpu=g, name="NVIDIA H200") for g in rec.gpus()]
    names = list(rec.metrics)
    try:
        with grpc.insecure_channel(srv.target) as ch:
            stub = analyzer_pb2_grpc.AnalyzerStub(ch)
            edges = np.arange(rec.t[0], rec.t[-1] + 1.0, 1.0)
            for seq, (lo, hi) in enumerate(zip(edges, edges[1:]), 1):    # a batch a second, as an agent sends
                idx = np.flatnonzero((rec.t >= lo) & (rec.t < hi))
                samples = [GpuSample(int(rec.gpu[i]), float(rec.t[i]),
                                     {n: float(rec.metrics[n][i]) for n in names if rec.metrics[n][i] == rec.metrics[n][i]},
                                     rec.processes[i]) for i in idx]
                stub.Push(encode_batch(HOST, "boot-1", seq, samples, devices), timeout=30)
        wait_for(lambda: srv.analyzer.store.count("windows") >= 18, timeout=60)
        at = {p["phase"]: dict(p, start=p["start"] + shift, end=p["end"] + shift) for p in phases}
        for name, where, phase in CAPTURES:
            path = next((fixture_dir / where).glob("plugins/profile/*/*.xplane.pb"))
            t = (at[phase]["start"] + at[phase]["end"]) / 2
            rec_pb = pb.CaptureRecord(id=f"cap-{name}", host=HOST, gpus=[0], start=t, end=t + 0.5, duration_ms=500,
                                      path=str(path), status="ok", kind="jax", target="127.0.0.1:9012",
                                      trigger="on-call", job="pid:4242 python3 workload.py")
            clients.report_capture(srv.target, rec_pb, path.read_bytes())
        yield srv, at, (float(rec.t[0]) - 5, float(rec.t[-1]) + 5)
    finally:
        srv.stop()


def run(*args, timeout=180):
    return subprocess.run(GPUSCOPE + list(args), capture_output=True, text=True, timeout=timeout)


def _chromium(page: Path, tmp: Path, *mode: str) -> subprocess.CompletedProcess:
    """Headless Chromium as the CI runs it: no sandbox (root in a container),
    and none of its background connections (refused on a closed network)."""
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                           "--no-first-run", "--disable-background-networking", "--disable-component-update",
                           "--disable-sync", f"--user-data-dir={tmp / 'chromium'}", "--force-device-scale-factor=1",
                           "--hide-scrollbars", "--window-size=1400,2600", *mode, page.resolve().as_uri()],
                          capture_output=True, text=True, timeout=180)


def _images(html: str) -> dict[str, tuple[np.ndarray, dict]]:
    """The page's charts by id: pixels as embedded, and their axes."""
    out = {}
    for m in re.finditer(r'<img class="chart" id="(\w+)"[^>]*data-axes=\'([^\']+)\' src="data:image/png;base64,'
                         r'([^"]+)"', html):
        pixels = np.asarray(Image.open(io.BytesIO(base64.b64decode(m.group(3)))).convert("RGB"))
        out[m.group(1)] = pixels, json.loads(m.group(2).replace("&quot;", '"').replace("&#x27;", "'"))
    return out


def _locate(shot: np.ndarray, img: np.ndarray, row: int) -> tuple[int, int]:
    """Where the browser drew `img` in the screenshot (its top left): the
    column where its row `row` matches best, then, of the places that row
    matches (a lane's band is many equal rows), the one where all of it does."""
    h, w = img.shape[:2]
    best = (np.inf, 0)
    for x in range(0, min(shot.shape[1] - w + 1, 100)):         # the page's margin: a few pixels
        diffs = np.abs(shot[:, x:x + w].astype(int) - img[row].astype(int)).mean(axis=(1, 2))
        best = min(best, (float(diffs.min()), x))
    diff, x = best
    assert diff < 2.0, "the chart is not in the screenshot at its own size"
    diffs = np.abs(shot[:, x:x + w].astype(int) - img[row].astype(int)).mean(axis=(1, 2))
    tops = [y - row for y in np.flatnonzero(diffs < 2.0) if 0 <= y - row <= shot.shape[0] - h]
    whole = [(np.abs(shot[y:y + h, x:x + w].astype(int) - img.astype(int)).mean(), y) for y in tops]
    diff, y = min(whole, default=(np.inf, 0))
    assert diff < 2.0, f"the chart is drawn, but not as embedded (mean difference {diff:.1f})"
    return x, int(y)


def _colour(pixel) -> str | None:
    for verdict, hex_colour in list(VERDICT_COLOURS.items()) + [("no window", NO_WINDOW)]:
        if all(abs(int(p) - int(hex_colour[i:i + 2], 16)) <= 8 for p, i in zip(pixel[:3], (1, 3, 5))):
            return verdict
    return None


class _Text(HTMLParser):
    def __init__(self):
        super().__init__()
        self.parts = []

    def handle_data(self, data):
        self.parts.append(data)


@needs_chromium
def test_the_html_report_shows_each_phase_in_its_colour_and_the_captured_ops_on_the_roofline(judged, tmp_path):
    srv, at, (start, end) = judged
    out, png = tmp_path / "report.html", tmp_path / "timeline.png"
    r = run("report", "--server", srv.target, "--insecure", "--start", str(start), "--end", str(end),
            "--html", str(out), "--png", str(png))
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", r.stderr                     # no terminal: no progress, nothing else either
    assert f"wrote {out}" in r.stdout and "1 GPU, " in r.stdout and "3 captures" in r.stdout
    html = out.read_text()
    # one file that opens offline: every src and href is the page's own data
    refs = re.findall(r"""(?:src|href)\s*=\s*["']?([^"' >]+)""", html, re.I)
    assert len(refs) == 2 and all(x.startswith("data:image/png;base64,") for x in refs)
    assert not re.search(r"https?://", html) and "<script" not in html

    shot = tmp_path / "shot.png"
    c = _chromium(out, tmp_path, f"--screenshot={shot}")
    assert shot.exists(), c.stderr[-2000:]
    pixels = np.asarray(Image.open(shot).convert("RGB"))
    charts = _images(html)
    timeline, g = charts["timeline"]
    lane = g["lanes"][0]
    lane_row = round((lane["y0"] + lane["y1"]) / 2)
    ox, oy = _locate(pixels, timeline, lane_row)

    def x_of(t: float) -> int:
        return ox + round(g["x0"] + (t - g["t0"]) / (g["t1"] - g["t0"]) * (g["x1"] - g["x0"]))
    seen = {phase: _colour(pixels[oy + lane_row, x_of((at[phase]["start"] + at[phase]["end"]) / 2)])
            for phase in EXPECTED}
    assert seen == EXPECTED
    # ... and in the order the phases ran, read along the lane as drawn
    row = [_colour(p) for p in pixels[oy + lane_row, x_of(start):x_of(end)]]
    runs = [v for i, v in enumerate(row) if v and (i == 0 or v != row[i - 1])]
    ran = [EXPECTED[p] for p in sorted(EXPECTED, key=lambda p: at[p]["start"])]
    order = [v for i, v in enumerate(ran) if i == 0 or v != ran[i - 1]]       # hbm_stream, decode_gemv: one run
    it = iter(runs)
    assert all(v in it for v in order), (runs, order)

    # the roofline: each capture's top op where its intensity and FLOP/s put it, in its bound's colour
    roof, rg = charts["roofline"]
    rx, ry = _locate(pixels, roof, round((rg["y0"] + rg["y1"]) / 2))
    rep = clients.range_report(srv.target, start, end)
    assert [cap["id"] for cap in rep["captures"]] == ["cap-matmul", "cap-hbm", "cap-decode"]
    assert rep["peaks"][0]["source"] == "trace"
    for cap, verdict in zip(rep["captures"], ("compute-bound", "memory-bound", "memory-bound")):
        op = cap["top_ops"][0]
        (lx, hx), (ly, hy) = rg["xlim"], rg["ylim"]
        fx = np.log10(op["intensity_flops_per_byte"] / lx) / np.log10(hx / lx)
        fy = np.log10(op["achieved_flops_per_s"] / ly) / np.log10(hy / ly)
        px, py = rx + round(rg["x0"] + fx * (rg["x1"] - rg["x0"])), ry + round(rg["y1"] - fy * (rg["y1"] - rg["y0"]))
        assert _colour(pixels[py, px]) == verdict, (cap["id"], op)

    # the page's words, as the browser has them
    dom = _chromium(out, tmp_path, "--dump-dom")
    text = _Text()
    text.feed(dom.stdout)
    words = " ".join(" ".join(text.parts).split())
    for label in ("SM active (%)", "tensor active (%)", "DRAM active (%)", "PCIe (", "host CPU (cores)",
                  "power (W)", "time (UTC)" if "UTC" in g["time_axis"] else "time ("):
        assert label in words, label
    findings = clients.findings(srv.target, host=HOST, start=start, end=end)
    assert len(findings) >= 4 and all(f["id"] in words for f in findings)
    assert "a larger batch" in words or "more work per byte" in words        # memory-bound's what to try
    assert "from the trace" in words and "ridge point 222 FLOP/byte" in words
    for n in (1, 2, 3):
        assert f"C{n}" in words
    assert "custom-call.1" in words and "loop_add_fusion" in words

    # --png: the timeline alone, the same picture
    alone = Image.open(png)
    assert alone.format == "PNG" and alone.size == (g["width"], g["height"])
    assert np.abs(np.asarray(alone.convert("RGB")).astype(int) - timeline.astype(int)).mean() < 1.0


def test_a_finding_id_draws_its_context_with_the_finding_marked(judged, tmp_path):
    srv, at, _ = judged
    mem = next(f for f in clients.findings(srv.target, host=HOST, verdicts=["memory-bound"]))
    out = tmp_path / "finding.html"
    r = run("report", mem["id"][:6], "--server", srv.target, "--insecure", "--html", str(out))
    assert r.returncode == 0, r.stderr
    html = out.read_text()
    assert f"finding {mem['id']} (memory-bound on {HOST}/gpu0)" in html
    assert f'<tr class="this"><td><code>{mem["id"]}</code>' in html
    assert "what changed against the job" in html                     # the story, as `report ID` prints it
    # without --html, the story as it always was
    r = run("report", mem["id"][:6], "--server", srv.target, "--insecure")
    assert r.returncode == 0 and r.stdout.startswith(f"finding {mem['id']}: {HOST}/gpu0 memory-bound")


def test_an_empty_range_says_where_the_samples_are_and_writes_nothing(judged, tmp_path):
    srv, _, (start, _) = judged
    out = tmp_path / "empty.html"
    r = run("report", "--server", srv.target, "--insecure", "--start", "1000000000", "--end", "1000003600",
            "--html", str(out))
    assert r.returncode == 1 and not out.exists()
    assert r.stderr.startswith("no samples from ") and "nothing to draw (its samples run from" in r.stderr, r.stderr
    r = run("report", "--server", srv.target, "--insecure", "--start", str(start), "--end", str(start + 60),
            "--host", "no-such-host")
    assert r.returncode == 0 and "no samples of host 'no-such-host'" in r.stdout and "no samples of host" in r.stdout


def test_a_long_range_is_bounded_and_says_so(judged, tmp_path):
    srv, _, (start, end) = judged
    out = tmp_path / "month.html"
    r = run("report", "--server", srv.target, "--insecure", "--start", str(end - 30 * 86400), "--end", str(end),
            "--points", "50", "--html", str(out), "--json")
    assert r.returncode == 0, r.stderr
    said = json.loads(r.stdout)
    assert said["wrote"]["html"]["bytes"] == out.stat().st_size and said["gpus"] == 1
    # a month asked, minutes held: drawn over what holds samples, and said (a trial found 90 % of every chart
    # empty); the bounds of a range full of samples: tests/analyzers/test_range_report.py
    assert any(n.startswith("drawn over the ") and n.endswith("that hold samples, of the 720.0 h asked for")
               for n in said["notes"]), said["notes"]
    assert "of the 720.0 h asked for" in out.read_text()
    rep = clients.range_report(srv.target, end - 30 * 86400, end, max_points=50)
    assert all(len(s["t"]) <= 50 for s in rep["counters"]["series"])


def test_progress_is_shown_on_a_terminal_only(judged, tmp_path):
    srv, _, (start, end) = judged
    out = tmp_path / "tty.html"
    text, status = in_terminal(GPUSCOPE + ["report", "--server", srv.target, "--insecure", "--start", str(start),
                                           "--end", str(end), "--html", str(out)], cols=120, rows=30, seconds=25)
    assert os.waitstatus_to_exitcode(status) == 0, text
    assert "asking" in text and "drawing the timeline" in text and f"wrote {out}" in text
    r = run("report", "--server", srv.target, "--insecure", "--start", str(start), "--end", str(end),
            "--html", str(out), "--json")
    assert r.stderr == "" and json.loads(r.stdout)["wrote"]["html"]["path"] == str(out)
