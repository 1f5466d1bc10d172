"""The stated accuracy on the bundled H200 recording: for each phase that has
a trace, what the counters said (the majority of the 5 s windows inside the
phase) against what the trace said, through analyzers/accuracy.summarize.

    python bench/accuracy_bundled.py [--window 5] [--json]

One pair per phase and trace file (the XSpace and, where present, the trace
JSON of the same capture), as `gpuscope accuracy` would count them had each
capture been taken live during its phase.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
FIXTURE = ROOT.parent / "shared" / "fixtures" / "h200-run1"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--window", type=float, default=5.0)
    ap.add_argument("--json", action="store_true")
    ns = ap.parse_args()
    from gpuscope.analyzers.accuracy import summarize
    from gpuscope.analyzers.offline import classify_recording
    from gpuscope.analyzers.trace_analysis import summarize as summarize_trace
    from gpuscope.collectors.recording import read_recording
    from gpuscope.collectors.trace_files import parse_trace

    windows = classify_recording(read_recording(FIXTURE / "samples.csv"), ns.window)
    phases = [json.loads(line) for line in (FIXTURE / "phases.jsonl").read_text().splitlines() if line.strip()]
    counts: collections.Counter = collections.Counter()
    detail = []
    for p in phases:
        trace_dir = FIXTURE / "traces" / p["phase"]
        if "start" not in p or not trace_dir.is_dir():
            continue
        inside = [w.verdict for w in windows if w.start >= p["start"] and w.end <= p["end"]]
        if not inside:
            continue
        said = collections.Counter(inside).most_common(1)[0][0]
        for f in sorted(trace_dir.glob("plugins/profile/*/vm.*")):
            found = summarize_trace(parse_trace(f.read_bytes(), str(f))).get("verdict")
            counts[(said, found)] += 1
            detail.append(dict(phase=p["phase"], file=f.name, counters=said, windows=len(inside), trace=found))
    rows = [dict(model="NVIDIA H200", counters_verdict=s, trace_verdict=t, pairs=n) for (s, t), n in counts.items()]
    out = dict(summarize(rows), pairs=detail)
    if ns.json:
        print(json.dumps(out, indent=1))
        return
    for d in detail:
        print(f"{d['phase']:<14} {d['file']:<18} counters {d['counters']:<20} ({d['windows']} windows)  "
              f"trace {d['trace']}")
    o = out["overall"]
    print(f"agreed {o['agreed']} of {o['pairs']}, {o['same_family']} more within launch/host-bound")


if __name__ == "__main__":
    main()
