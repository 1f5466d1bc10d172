"""A real JAX program for capture tests: starts its profiler server, then
runs a jitted step until told to stop (or for --seconds)."""
import argparse
import time

import jax
import jax.numpy as jnp

ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--seconds", type=float, default=60)
ns = ap.parse_args()
jax.profiler.start_server(ns.port)
step = jax.jit(lambda x: jnp.tanh(x @ x).sum())
x = jnp.ones((128, 128))
step(x).block_until_ready()
print("ready", flush=True)
end = time.time() + ns.seconds
while time.time() < end:
    step(x).block_until_ready()
