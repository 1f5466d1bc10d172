"""Detection latency: how many classification windows after a phase's onset
the analyzer knows an open finding of the phase's verdict, on the labelled
H200 recording through the live path (agent encoder -> decode -> live
windows -> findings), batches of 1 s as the agent sends them.

    python bench/detection.py [--windows 1,2,5]
"""
import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.live_replay import replay_findings  # noqa: E402
from gpuscope.collectors.recording import read_recording  # noqa: E402
from tests.analyzers.test_classify_fixture import EXPECTED  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "h200-run1"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--windows", default="1,2,5")
    ns = ap.parse_args()
    rec = read_recording(FIXTURE / "samples.csv")
    phases = [json.loads(x) for x in (FIXTURE / "phases.jsonl").read_text().splitlines() if '"start"' in x]
    out = dict(date=time.strftime("%Y-%m-%d %H:%M"), results={})
    for w in (float(x) for x in ns.windows.split(",")):
        events = replay_findings(rec, w)
        res = {}
        for p in phases:
            want = EXPECTED[p["phase"]]
            if want == {"idle"}:
                continue
            known = [e["seen_at"] for e in events if e["verdict"] in want and e["end"] is None
                     and p["start"] <= e["seen_at"] <= p["end"]]
            res[p["phase"]] = round((known[0] - p["start"]) / w, 2) if known else None
        out["results"][f"window_{w:g}s"] = res
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
