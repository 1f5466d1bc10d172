"""A serving engine's process tree, as vLLM lays it out: this process is the
API server (its command line says `vllm serve ...`, it listens on --port),
it starts an engine core, which starts a worker (the process that would hold
the GPU). The worker's pid is written to --pid-file. Only the API server
listens."""
import argparse
import http.server
import subprocess
import sys
import threading

if sys.argv[1:2] == ["--child"]:              # engine core or worker
    if sys.argv[2] == "core":
        worker = subprocess.Popen([sys.executable, __file__, "--child", "worker", sys.argv[3]])
        worker.wait()
    else:
        with open(sys.argv[3], "w") as f:
            f.write(str(__import__("os").getpid()))
        threading.Event().wait()
    sys.exit(0)

ap = argparse.ArgumentParser()
ap.add_argument("vllm")
ap.add_argument("serve")
ap.add_argument("model")
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--profiler-config", default="")
ap.add_argument("--pid-file", required=True)
ns = ap.parse_args()


class Health(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        self.send_response(200)
        self.end_headers()


server = http.server.ThreadingHTTPServer(("127.0.0.1", ns.port), Health)
core = subprocess.Popen([sys.executable, __file__, "--child", "core", ns.pid_file])
try:
    server.serve_forever()
finally:
    core.kill()
