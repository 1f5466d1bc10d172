#!/bin/bash
# GPU checks for a session lent an H200 (see bench/gpu/README.md). Prepare the
# wheel folder first, on the development machine:
#   bash bench/gpu/prepare.sh            # -> .gpuwheels/ (ignored; carry it)
# then run through the device tool with carry [".gpuwheels"], e.g.
#   bash bench/gpu/run.sh   (timeout 480 s; the steps run most valuable first,
#   each under its own limit, so a slow one costs only itself)
# Results: at most 8 files under $OUT (the device tool's limit).
set -u
export PYTHONUNBUFFERED=1
PY=${PY:-$(command -v python3)}
[ -x /opt/torch/.venv/bin/python ] && PY=/opt/torch/.venv/bin/python   # the image's env with jax + torch + pynvml
LOG=$OUT/log.txt
mkdir -p /tmp/site
$PY -m pip install -q --no-index --no-deps --target /tmp/site .gpuwheels/*.whl >> $LOG 2>&1
# our packages straight from the tree: the folders map to gpuscope.* like the editable install
mkdir -p /tmp/gs/gpuscope
for p in daemon collectors analyzers security; do ln -sfn "$PWD/$p" /tmp/gs/gpuscope/$p; done
ln -sfn "$PWD/protos/gpuscope/v1" /tmp/gs/gpuscope/v1
ln -sfn "$PWD/protos/gpuscope/xla" /tmp/gs/gpuscope/xla
export PYTHONPATH=/tmp/gs:/tmp/site
step() { echo "== $1 $(date +%T)" >> $LOG; }
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current,clocks.max.sm,power.limit --format=csv
  $PY -c "import pynvml, jax, torch, grpc, google.protobuf as p; print('jax', jax.__version__, 'torch', torch.__version__, 'grpc', grpc.__version__, 'protobuf', p.__version__)"; } > $OUT/env.txt 2>&1

step "calibrate --quick"
t0=$(date +%s%N)
timeout 150 $PY -m gpuscope.daemon.cli calibrate --quick --json --output $OUT/calibrate_quick.json > /dev/null 2>> $LOG
echo "calibrate --quick wall (process start to exit): $(( ($(date +%s%N) - t0) / 1000000 )) ms" >> $LOG

# A real GPU trace through our reader and verdict: a bf16 matmul must come out
# compute-bound, an f32 stream memory-bound, tiny kernels launch-bound.
step "jax trace check"
timeout 150 $PY - > $OUT/trace_check.json 2>> $LOG <<'PYEOF'
import json, tempfile, time, jax, jax.numpy as jnp
from gpuscope.collectors.trace_files import load_trace
from gpuscope.analyzers.trace_analysis import summarize
for name, fn, shape, n in (("matmul_bf16", lambda x: x @ x, (8192, 8192), 50),
                           ("stream_f32", lambda x: x * 2.0 + 1.0, (1 << 28,), 50),
                           ("launch_tiny", lambda x: x + 1.0, (16,), 3000)):
    x = jnp.ones(shape, jnp.bfloat16 if "bf16" in name else jnp.float32)
    f = jax.jit(fn); f(x).block_until_ready()
    d = tempfile.mkdtemp()
    jax.profiler.start_trace(d)
    for _ in range(n): y = f(x)
    y.block_until_ready()
    jax.profiler.stop_trace()
    try:
        s = summarize(load_trace(d))
        row = {k: s.get(k) for k in ("verdict", "confidence", "summary", "busy_fraction")}
    except Exception as exc:
        row = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps({"workload": name, **row}), flush=True)   # one line each: a timeout keeps the rest
PYEOF

step "torch trace check"
timeout 120 $PY bench/gpu/torch_trace_check.py /tmp/torch_traces > $OUT/torch_check.json 2>> $LOG
tar -C /tmp -czf $OUT/torch_traces.tgz torch_traces 2>> $LOG

step "nvml overhead"
timeout 90 $PY bench/gpu/nvml_overhead.py --ticks 300 > $OUT/nvml_overhead.json 2>> $LOG

step "calibrate (full)"
timeout 150 $PY -m gpuscope.daemon.cli calibrate --json --output $OUT/calibrate_full.json > /dev/null 2>> $LOG
step done
ls -la $OUT >> $LOG
