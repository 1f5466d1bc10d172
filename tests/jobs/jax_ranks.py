"""One rank of a real jax.distributed job on the CPU (gloo collectives), as
its launcher starts it: JAX_COORDINATOR_ADDRESS, JAX_PROCESS_ID and
JAX_NUM_PROCESSES in its environment. Every step each rank does its work and
then meets the others in an all-gather; the rank SLOW_RANK also does 50 ms of
host work (a slow data loader); STEP_SLEEP seconds of sleep end each step (a
paced job, leaving the CPUs idle). With GPUSCOPE_PROFILER_PORT it serves JAX's
profiler there (as a job an agent can trace) and prints "ready". It runs
STEPS steps (a count, not a time: every rank must take part in every
collective), then prints, last, one JSON line: its rank and each step's
seconds of own work and of waiting in the collective."""
import json
import os
import time

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=os.environ["JAX_COORDINATOR_ADDRESS"],
                           num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
                           process_id=int(os.environ["JAX_PROCESS_ID"]))
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

rank = jax.process_index()
slow = rank == int(os.environ.get("SLOW_RANK", "-1"))
if os.environ.get("GPUSCOPE_PROFILER_PORT"):
    jax.profiler.start_server(int(os.environ["GPUSCOPE_PROFILER_PORT"]))
    print("ready", flush=True)
x = np.ones((256, 256), np.float32)
out = []
for _ in range(int(os.environ.get("STEPS", "25"))):
    t0 = time.perf_counter()
    y = x @ x
    if slow:
        end = time.perf_counter() + 0.05
        while time.perf_counter() < end:      # host work: a slow data loader
            pass
    t1 = time.perf_counter()
    multihost_utils.process_allgather(jnp.sum(y))    # every rank meets here
    t2 = time.perf_counter()
    time.sleep(float(os.environ.get("STEP_SLEEP", "0")))   # a paced job (input waits), leaving the CPUs idle
    out.append(dict(work=t1 - t0, wait=t2 - t1))
print(json.dumps(dict(rank=rank, steps=out)), flush=True)
jax.distributed.shutdown()
