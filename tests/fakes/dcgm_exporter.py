"""A fake of a node's dcgm-exporter: expositions in its own line format,
declared as data, served over real HTTP on loopback, able to fail the ways
a real one (or what stands in front of it) does. Answers past 2 KB are
chunked, as Go's net/http sends dcgm-exporter's.

The line format is dcgm-exporter's render template (NVIDIA/dcgm-exporter,
internal/pkg/rendermetrics): HELP and TYPE, then one line per GPU with
`gpu`, `UUID`, `pci_bus_id`, `device`, `modelName`, `Hostname`, the label
fields (`DCGM_FI_DRIVER_VERSION`) and, with its Kubernetes mapping, the
pod's `container`, `namespace` and `pod`. TYPEs are the ones its CSVs
declare (etc/default-counters.csv, etc/dcp-metrics-included.csv).
"""
from __future__ import annotations

import http.server
import socket
import threading
import time
from dataclasses import dataclass, field

# field -> (TYPE, HELP) as dcgm-exporter's counters CSVs declare them
FIELDS = {
    "DCGM_FI_DEV_SM_CLOCK": ("gauge", "SM clock frequency (in MHz)."),
    "DCGM_FI_DEV_MEM_CLOCK": ("gauge", "Memory clock frequency (in MHz)."),
    "DCGM_FI_DEV_MEMORY_TEMP": ("gauge", "Memory temperature (in C)."),
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C)."),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W)."),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("counter", "Total energy consumption since boot (in mJ)."),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("counter", "Total number of PCIe retries."),
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gauge", "Memory utilization (in %)."),
    "DCGM_FI_DEV_ENC_UTIL": ("gauge", "Encoder utilization (in %)."),
    "DCGM_FI_DEV_DEC_UTIL": ("gauge", "Decoder utilization (in %)."),
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last XID error encountered."),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_DEV_FB_RESERVED": ("gauge", "Framebuffer memory reserved (in MiB)."),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": ("counter", "Total number of NVLink bandwidth counters for all lanes."),
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": ("gauge", "vGPU License status"),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("counter", "Number of remapped rows for uncorrectable errors"),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("counter", "Number of remapped rows for correctable errors"),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gauge", "Whether remapping of rows has failed"),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gauge", "Ratio of time the graphics engine is active."),
    "DCGM_FI_PROF_SM_ACTIVE": ("gauge", "The ratio of cycles an SM has at least 1 warp assigned."),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("gauge", "The ratio of number of warps resident on an SM."),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("gauge", "Ratio of cycles the device memory interface is active sending or "
                                          "receiving data."),
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": ("gauge", "Ratio of cycles the fp64 pipes are active."),
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": ("gauge", "Ratio of cycles the fp32 pipes are active."),
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": ("gauge", "Ratio of cycles the fp16 pipes are active."),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("gauge", "The rate of data transmitted over the PCIe bus - including both "
                                            "protocol headers and data payloads - in bytes per second."),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("gauge", "The rate of data received over the PCIe bus - including both "
                                            "protocol headers and data payloads - in bytes per second."),
}

# a GPU running LLM decode: HBM busy, tensor pipes mostly idle, SMs occupied (what memory-bound reads)
MEMORY_BOUND = {"DCGM_FI_DEV_GPU_UTIL": 100, "DCGM_FI_DEV_MEM_COPY_UTIL": 85, "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.97,
                "DCGM_FI_PROF_SM_ACTIVE": 0.92, "DCGM_FI_PROF_SM_OCCUPANCY": 0.35,
                "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.04, "DCGM_FI_PROF_DRAM_ACTIVE": 0.88,
                "DCGM_FI_PROF_PIPE_FP32_ACTIVE": 0.06, "DCGM_FI_PROF_PIPE_FP16_ACTIVE": 0.02,
                "DCGM_FI_PROF_PCIE_TX_BYTES": 3.0e6, "DCGM_FI_PROF_PCIE_RX_BYTES": 9.0e6}
BUSY_H100 = {"DCGM_FI_DEV_SM_CLOCK": 1980, "DCGM_FI_DEV_MEM_CLOCK": 2619, "DCGM_FI_DEV_MEMORY_TEMP": 48,
             "DCGM_FI_DEV_GPU_TEMP": 61, "DCGM_FI_DEV_POWER_USAGE": 512.25,
             "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 3_456_789_012, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0,
             "DCGM_FI_DEV_ENC_UTIL": 0, "DCGM_FI_DEV_DEC_UTIL": 0, "DCGM_FI_DEV_XID_ERRORS": 0,
             "DCGM_FI_DEV_FB_FREE": 1204, "DCGM_FI_DEV_FB_USED": 79_407, "DCGM_FI_DEV_FB_RESERVED": 578,
             "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": 0, "DCGM_FI_DEV_VGPU_LICENSE_STATUS": 0,
             "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 0,
             "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0, "DCGM_FI_PROF_PIPE_FP64_ACTIVE": 0, **MEMORY_BOUND}


# dcgm-exporter's answer at / (internal/pkg/server/server.go): what a URL without /metrics gets
ROOT_PAGE = b"""<html>
\t\t\t<head><title>GPU Exporter</title></head>
\t\t\t<body>
\t\t\t<h1>GPU Exporter</h1>
\t\t\t<p><a href="./metrics">Metrics</a></p>
\t\t\t<p><a href="./health">Health</a></p>
\t\t\t</body>
\t\t\t</html>"""
GO_CHUNKING = 2048                   # net/http's bufferBeforeChunkingSize


@dataclass
class Gpu:
    index: int
    values: dict[str, float] = field(default_factory=lambda: dict(BUSY_H100))
    model: str = "NVIDIA H100 80GB HBM3"
    pods: list[tuple[str, str, str]] = field(default_factory=list)   # (namespace, pod, container)

    @property
    def uuid(self) -> str:
        return f"GPU-15704b32-f531-14ce-0530-1ac21e4b{self.index:04x}"

    def labels(self, host: str) -> str:
        bus = f"00000000:{0x18 + 0x11 * self.index:02X}:00.0"
        return (f'gpu="{self.index}",UUID="{self.uuid}",pci_bus_id="{bus}",device="nvidia{self.index}",'
                f'modelName="{self.model}",Hostname="{host}",DCGM_FI_DRIVER_VERSION="580.105.08"')


def exposition(gpus: list[Gpu], host: str = "gpu-node-1") -> str:
    """What dcgm-exporter answers for these GPUs: one series per GPU, or one
    per pod on the GPU (each a copy of the GPU's value)."""
    out = []
    names = list(dict.fromkeys(n for g in gpus for n in g.values))
    for name in names:
        kind, help_ = FIELDS.get(name, ("gauge", ""))
        out += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
        for g in gpus:
            if name not in g.values:
                continue
            base, value = g.labels(host), _number(g.values[name])
            for ns, pod, ctr in g.pods or [(None, None, None)]:
                extra = "" if ns is None else f',container="{ctr}",namespace="{ns}",pod="{pod}"'
                out.append(f"{name}{{{base}{extra}}} {value}")
    return "\n".join(out) + "\n"


def _number(v) -> str:
    # dcgm-exporter prints integers as such and doubles with %f; a str is written as it is (garbage, for tests)
    if isinstance(v, str):
        return v
    return str(int(v)) if float(v).is_integer() and abs(v) < 1e18 else f"{v:f}"


class FakeExporter:
    """An HTTP server on 127.0.0.1 answering /metrics with `body` (a str or
    a callable returning one), or failing as `fault` says (stop() closes
    the port: connection refused; start() opens the same port again):
    - "slow": the answer comes `delay_s` late;
    - "trickle": headers at once, the body a byte every 0.1 s;
    - "500": HTTP 500 with a Go-style error text;
    - "html": dcgm-exporter's own page at / (a URL without /metrics);
    - "cut": Content-Length promises the whole body, half is sent, the
      connection closed."""

    def __init__(self, body="", port: int = 0) -> None:
        self.body = body
        self.fault: str | None = None
        self.delay_s = 2.0
        self.requests = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self):
                super().setup()
                self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                outer._open.add(self.request)

            def do_GET(self):
                outer.requests += 1
                outer._answer(self)

            def log_message(self, *args):
                pass

        self._handler = Handler
        self._server: _Server | None = None
        self._open: set[socket.socket] = set()      # kept-alive connections: a stopped exporter drops them too
        self.port = port
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def start(self) -> None:
        server = _Server(("127.0.0.1", self.port), self._handler)
        self._server, self.port = server, server.server_port
        threading.Thread(target=server.serve_forever, name="fake-dcgm-exporter", daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        for sock in list(self._open):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._open.clear()

    def _answer(self, h) -> None:
        text = self.body() if callable(self.body) else self.body
        data = text.encode()
        if self.fault == "slow":
            time.sleep(self.delay_s)
        if self.fault == "500":
            data = b"failed to render metrics: DCGM error -33\n"
            h.send_response(500)
        elif self.fault == "html":
            data = ROOT_PAGE
            h.send_response(200)
        else:
            h.send_response(200)
        h.send_header("Content-Type", "text/html" if self.fault == "html" else "text/plain; version=0.0.4")
        if len(data) > GO_CHUNKING and self.fault is None:
            # Go's net/http: one Write past its 2 KB buffer, no Content-Length: one chunk, then the last
            h.send_header("Transfer-Encoding", "chunked")
            h.end_headers()
            h.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))
            return
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if self.fault == "cut":
            h.wfile.write(data[: len(data) // 2])
            h.wfile.flush()
            h.close_connection = True
            h.request.shutdown(socket.SHUT_RDWR)
            return
        if self.fault == "trickle":
            for i in range(len(data)):
                h.wfile.write(data[i:i + 1])
                h.wfile.flush()
                time.sleep(0.1)
            return
        h.wfile.write(data)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass                  # a client that gave up (a timeout under test) is no news
