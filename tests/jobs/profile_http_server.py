"""A small serving-engine stand-in that speaks vLLM's profiling protocol:
POST /start_profile (200; 409 while a session runs), POST /stop_profile
(200 once the trace is written). The trace is real: a JAX program traces its
own jitted work with jax.profiler, writing *.trace.json.gz and an XSpace
under --trace-dir, as the torch profiler writes *.pt.trace.json.gz."""
import argparse
import http.server
import threading
import time

import jax
import jax.numpy as jnp

ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--trace-dir", required=True)
ap.add_argument("--stop-delay", type=float, default=0.5, help="vLLM answers stop only after writing: seconds")
ap.add_argument("--disabled", action="store_true", help="as vLLM without --profiler-config: the routes answer 404")
ns = ap.parse_args()
lock = threading.Lock()
state = {"active": False}
step = jax.jit(lambda x: jnp.tanh(x @ x).sum())
x = jnp.ones((128, 128))
step(x).block_until_ready()


def work():
    while True:
        step(x).block_until_ready()
        time.sleep(0.001)


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _answer(self, code, body=b"{}"):
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        with lock:
            if ns.disabled:
                return self._answer(404, b'{"detail": "Not Found"}')
            if self.path == "/start_profile":
                if state["active"]:
                    return self._answer(409, b'{"error": "profiler already running"}')
                jax.profiler.start_trace(ns.trace_dir)
                state["active"] = True
                return self._answer(200)
            if self.path == "/stop_profile":
                if not state["active"]:
                    return self._answer(400, b'{"error": "no profiler running"}')
                time.sleep(ns.stop_delay)
                jax.profiler.stop_trace()
                state["active"] = False
                return self._answer(200)
        self._answer(404, b'{"detail": "Not Found"}')


threading.Thread(target=work, daemon=True).start()
server = http.server.ThreadingHTTPServer(("127.0.0.1", ns.port), Handler)
print("ready", flush=True)
server.serve_forever()
