"""A real JAX job, traced with jax.profiler in a process of its own, for
the tests of program fingerprints and runs."""
import glob
import subprocess
import sys
from pathlib import Path

JOB = """
import sys, time, jax, jax.numpy as jnp
variant, out = sys.argv[1], sys.argv[2]

@jax.jit
def train_step(w, x):
    y = jnp.tanh(x @ w)
    if variant == "changed":
        y = y * jax.nn.sigmoid(y)          # another op: another program
    return w - 0.01 * (x.T @ y), y.sum()

w, x = jnp.ones((128, 128)), jnp.ones((64, 128))
w, loss = train_step(w, x)
loss.block_until_ready()
jax.profiler.start_trace(out)
for _ in range(12):
    w, loss = train_step(w, x)
    loss.block_until_ready()
    if variant == "slow":
        time.sleep(0.02)                   # the same program, waiting on the host each step
jax.profiler.stop_trace()
"""


def traced_job(tmp_path: Path, name: str, variant: str) -> bytes:
    """A JAX job run in its own process, traced with jax.profiler: its XSpace."""
    script = tmp_path / "job.py"
    script.write_text(JOB)
    out = tmp_path / name
    subprocess.run([sys.executable, str(script), variant, str(out)], check=True, timeout=120,
                   env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"})
    (pb,) = glob.glob(str(out / "**" / "*.xplane.pb"), recursive=True)
    return Path(pb).read_bytes()
