#!/bin/bash
# GPU checks for a session lent an H200 (see bench/gpu/README.md). Prepare the
# wheel folder first, on the development machine:
#   bash bench/gpu/prepare.sh            # -> .gpuwheels/ (ignored; carry it)
# then run through the device tool with carry [".gpuwheels"], e.g.
#   bash bench/gpu/run.sh   (timeout 420 s leaves room for a second try)
set -u
export PYTHONUNBUFFERED=1
PY=$(command -v python3)
[ -x /opt/torch/.venv/bin/python ] && PY=/opt/torch/.venv/bin/python   # the image's env with jax + pynvml
mkdir -p /tmp/site
$PY -m pip install -q --no-index --no-deps --target /tmp/site .gpuwheels/*.whl 2>&1 | tail -2
# our packages straight from the tree: the folders map to gpuscope.* like the editable install
mkdir -p /tmp/gs/gpuscope
for p in daemon collectors analyzers; do ln -sfn "$PWD/$p" /tmp/gs/gpuscope/$p; done
ln -sfn "$PWD/protos/gpuscope/v1" /tmp/gs/gpuscope/v1
ln -sfn "$PWD/protos/gpuscope/xla" /tmp/gs/gpuscope/xla
export PYTHONPATH=/tmp/gs:/tmp/site
{ nvidia-smi -L; $PY -c "import pynvml, jax, grpc, google.protobuf as p; print(jax.__version__, grpc.__version__, p.__version__)"; } > $OUT/env.txt 2>&1
timeout 120 $PY bench/gpu/nvml_overhead.py --ticks 300 > $OUT/nvml_overhead.json 2> $OUT/nvml_overhead.err
# A real GPU trace through our reader and verdict: a bf16 matmul must come out compute-bound.
timeout 180 $PY - > $OUT/trace_check.json 2> $OUT/trace_check.err <<'PYEOF'
import json, tempfile, time, jax, jax.numpy as jnp
from gpuscope.collectors.trace_files import load_trace
from gpuscope.analyzers.trace_analysis import summarize
out = {}
for name, fn, shape in (("matmul_bf16", lambda x: x @ x, (8192, 8192)), ("stream_f32", lambda x: x * 2.0 + 1.0, (1 << 28,))):
    x = jnp.ones(shape, jnp.bfloat16 if "bf16" in name else jnp.float32)
    f = jax.jit(fn); f(x).block_until_ready()
    d = tempfile.mkdtemp()
    jax.profiler.start_trace(d)
    for _ in range(50): y = f(x)
    y.block_until_ready()
    jax.profiler.stop_trace()
    s = summarize(load_trace(d))
    out[name] = {k: s.get(k) for k in ("verdict", "confidence", "summary", "busy_fraction")}
print(json.dumps(out, indent=1))
PYEOF
ls -la $OUT
