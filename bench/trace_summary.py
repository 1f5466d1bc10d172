"""Summarizing the largest fixture trace (host_stall, 5.7 MB XSpace, ~395 k
events), against XProf's own conversion of the same file in the same run.

    python bench/trace_summary.py [--runs 5] [--xprof-python PATH]

Each run is a fresh process (import + read + summarize), timed from outside,
with its peak RSS. The peer is `xprof` (PyPI, a benchmark peer only, not a
dependency) converting the XSpace to its overview page and trace viewer, in
a virtual environment of its own: `python -m venv /tmp/xprofvenv &&
/tmp/xprofvenv/bin/pip install xprof`.
"""
import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT.parent / "shared" / "fixtures" / "h200-run1" / "traces" / "host_stall" / "plugins" / "profile"

OURS = """
import resource, sys, time
t0 = time.perf_counter()
from gpuscope.collectors.trace_files import load_trace
from gpuscope.analyzers.trace_analysis import summarize
s = summarize(load_trace(sys.argv[1]))
print(s["verdict"], time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""
PEER = """
import resource, sys, time
t0 = time.perf_counter()
from xprof.convert import _pywrap_profiler_plugin as pp
for tool in ("overview_page", "trace_viewer"):
    data, ok = pp.xspace_to_tools_data([sys.argv[1]], tool, {})
    assert ok, tool
print("-", time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def run(python: str, code: str, path: Path, runs: int) -> dict:
    walls, inner, rss, verdict = [], [], [], None
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as tmp:     # a fresh copy: XProf caches beside the trace
            run_dir = Path(tmp) / "plugins" / "profile" / path.parent.name
            run_dir.mkdir(parents=True)
            target = run_dir / path.name
            shutil.copy(path, target)
            t0 = time.perf_counter()
            out = subprocess.run([python, "-c", code, str(target)], capture_output=True, text=True, check=True)
            walls.append(time.perf_counter() - t0)
        v, seconds, maxrss = out.stdout.split()[-3:]
        verdict, inner = v, inner + [float(seconds)]
        rss.append(int(maxrss) / 1024)
    return dict(verdict=verdict, wall_s_median=round(statistics.median(walls), 3),
                in_process_s_median=round(statistics.median(inner), 3), peak_rss_mb_max=round(max(rss), 1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--xprof-python", default="/tmp/xprofvenv/bin/python")
    ns = ap.parse_args()
    run_dir = next(FIXTURE.iterdir())
    out = dict(date=time.strftime("%Y-%m-%d %H:%M"), machine=f"{platform.node()} {os.cpu_count()} cpu",
               trace_bytes=(run_dir / "vm.xplane.pb").stat().st_size)
    out["gpuscope_xplane"] = run(sys.executable, OURS, run_dir / "vm.xplane.pb", ns.runs)
    out["gpuscope_trace_json"] = run(sys.executable, OURS, run_dir / "vm.trace.json.gz", ns.runs)
    if Path(ns.xprof_python).exists():
        out["xprof_overview_and_trace_viewer"] = run(ns.xprof_python, PEER, run_dir / "vm.xplane.pb", ns.runs)
        out["ratio_wall_gpuscope_over_xprof"] = round(out["gpuscope_xplane"]["wall_s_median"]
                                                      / out["xprof_overview_and_trace_viewer"]["wall_s_median"], 3)
    else:
        out["xprof"] = f"not run: no peer interpreter at {ns.xprof_python}"
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
