#!/bin/bash
# The whole path on a real GPU: `gpuscope up` sampling NVML while a JAX job
# runs known phases (idle, compute, memory, launch, idle); a manual capture
# during the compute phase and whatever the detector triggers; then the
# findings, captures and per-phase means, for docs/benchmarks.md.
# Run after bench/gpu/run.sh has installed the wheels (same machine), or alone.
# SOURCE=replay:FILE SMALL=--small runs it without a GPU (a dry run of the script).
set -u
PY=${PY:-$(command -v python3)}
[ -x /opt/torch/.venv/bin/python ] && PY=/opt/torch/.venv/bin/python
if [ ! -d /tmp/gs/gpuscope ]; then
  mkdir -p /tmp/site /tmp/gs/gpuscope
  $PY -m pip install -q --no-index --no-deps --target /tmp/site .gpuwheels/*.whl > /dev/null 2>&1
  for p in daemon collectors analyzers security; do ln -sfn "$PWD/$p" /tmp/gs/gpuscope/$p; done
  ln -sfn "$PWD/protos/gpuscope/v1" /tmp/gs/gpuscope/v1; ln -sfn "$PWD/protos/gpuscope/xla" /tmp/gs/gpuscope/xla
fi
export PYTHONPATH=/tmp/gs:/tmp/site PYTHONUNBUFFERED=1
W=/tmp/live; rm -rf $W; mkdir -p $W
G="$PY -m gpuscope.daemon.cli"
S="--server 127.0.0.1:9403 --insecure"
$G up --no-view --insecure --source ${SOURCE:-nvml} --db $W/db.duckdb --capture-dir $W/captures \
  --profiler 127.0.0.1:9999 --host-cooldown 20s --capture-duration-ms 1000 --duration 240s > $W/up.log 2>&1 &
UP=$!
sleep 8
$PY bench/gpu/live_workload.py $W/phases.jsonl --port 9999 ${SMALL:-} > $W/workload.log 2>&1 &
JOB=$!
sleep 35    # JAX start-up (~5 s) + idle 15 s + ~15 s into the compute phase
$G capture $S --jax 127.0.0.1:9999 --duration-ms 1000 --json > $W/manual_capture.json 2>&1
wait $JOB
sleep 12    # the last windows reach the analyzer
$G findings $S --since 1h --json > $W/findings.json 2>&1
$G captures $S --json > $W/captures.json 2>&1
$G decisions $S --since 1h --json > $W/decisions.json 2>&1
$G status $S --json > $W/status.json 2>&1
$PY - "$W" "$PY" > ${OUT:-$W}/live_check.json <<'PYEOF'
import json, sys, subprocess, pathlib
w = pathlib.Path(sys.argv[1])
phases = [json.loads(l) for l in (w / "phases.jsonl").read_text().splitlines() if l.strip()]
def load(name):
    try:
        return json.loads((w / name).read_text())
    except Exception as exc:
        return {"error": f"{exc}", "text": (w / name).read_text()[-2000:] if (w / name).exists() else None}
out = {"phases": phases, "findings": load("findings.json"), "captures": load("captures.json"),
       "manual_capture": load("manual_capture.json"), "decisions": load("decisions.json"), "status": load("status.json"),
       "phase_means": {}}
metrics = ("gpm_sm_util_ratio", "gpm_tensor_util_ratio", "gpm_dram_bw_util_ratio", "util_gpu_ratio", "power_watts",
           "sm_clock_hertz")
for ph in phases:   # the middle of each phase: its edges hold the last window of the one before
    for m in metrics:
        r = subprocess.run([sys.argv[2], "-m", "gpuscope.daemon.cli", "query", "--server", "127.0.0.1:9403", "--insecure",
                            "--metric", m, "--aggregate", "mean", "--start", str(ph["start"] + 3),
                            "--end", str(ph["end"] - 1), "--json"], capture_output=True, text=True)
        try:
            out["phase_means"].setdefault(ph["phase"], {})[m] = json.loads(r.stdout)
        except ValueError:
            out["phase_means"].setdefault(ph["phase"], {})[m] = (r.stdout + r.stderr)[-300:]
out["up_log_tail"] = (w / "up.log").read_text()[-3000:]
out["workload_log_tail"] = (w / "workload.log").read_text()[-1500:]
print(json.dumps(out, indent=1, default=str))
PYEOF
kill $UP 2>/dev/null; wait $UP
echo "live check done"
