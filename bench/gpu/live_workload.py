"""A JAX job for the live check: known phases on GPU 0 with a profiler
server, each phase's span written to a JSON-lines file.

    python bench/gpu/live_workload.py PHASES.jsonl [--port 9999] [--scale 1]
"""
import argparse
import json
import time

import jax
import jax.numpy as jnp


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("phases")
    ap.add_argument("--port", type=int, default=9999)
    ap.add_argument("--seconds", type=float, default=25.0, help="per busy phase")
    ap.add_argument("--small", action="store_true", help="CPU-sized arrays (a dry run without a GPU)")
    a = ap.parse_args()
    jax.profiler.start_server(a.port)
    n, m = (1024, 1 << 22) if a.small else (8192, 1 << 28)
    x = jnp.ones((n, n), jnp.bfloat16)
    s = jnp.ones((m,), jnp.float32)
    t = jnp.zeros((16,), jnp.float32)
    mm, stream, tiny = jax.jit(lambda v: v @ v), jax.jit(lambda v: v * 2.0 + 1.0), jax.jit(lambda v: v + 1.0)
    for f, v in ((mm, x), (stream, s), (tiny, t)):
        f(v).block_until_ready()

    def busy(f, v, block_every):
        end, i = time.time() + a.seconds, 0
        while time.time() < end:
            y = f(v)
            i += 1
            if i % block_every == 0:
                y.block_until_ready()
        y.block_until_ready()

    with open(a.phases, "w") as out:
        for name, run in (("idle", lambda: time.sleep(15)), ("compute", lambda: busy(mm, x, 20)),
                          ("memory", lambda: busy(stream, s, 20)), ("launch", lambda: busy(tiny, t, 1)),
                          ("idle-after", lambda: time.sleep(15))):
            t0 = time.time()
            run()
            out.write(json.dumps({"phase": name, "start": t0, "end": time.time()}) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
