"""The agent's end of the analyzer's command stream: holds Commands open,
runs each command on its own thread, reconnects with backoff."""
from __future__ import annotations

import threading

import grpc
import structlog

from gpuscope.v1 import analyzer_pb2 as apb, analyzer_pb2_grpc

log = structlog.get_logger("gpuscope.commands")


class CommandListener:
    def __init__(self, target: str, host: str, boot_id: str, run, backoff_s: float = 1.0, max_backoff_s: float = 15.0):
        self.target, self.host, self.boot_id = target, host, boot_id
        self._run = run
        self._backoff, self._max = backoff_s, max_backoff_s
        self._stop = threading.Event()
        self._call = None
        self._thread = threading.Thread(target=self._loop, name="commands", daemon=True)
        self.received = 0
        self.connected = False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._call is not None:
            self._call.cancel()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        backoff = self._backoff
        while not self._stop.is_set():
            with grpc.insecure_channel(self.target) as ch:
                try:
                    self._call = analyzer_pb2_grpc.AnalyzerStub(ch).Commands(
                        apb.AgentHello(host=self.host, boot_id=self.boot_id))
                    self.connected = True
                    for cmd in self._call:
                        backoff = self._backoff
                        self.received += 1
                        log.info("command", id=cmd.id, kind=cmd.kind, gpu=cmd.gpu, reason=cmd.reason)
                        threading.Thread(target=self._run, args=(cmd,), name=f"command-{cmd.id}", daemon=True).start()
                except grpc.RpcError as exc:
                    if not self._stop.is_set() and exc.code() != grpc.StatusCode.CANCELLED:
                        log.debug("command stream lost", error=exc.details())
                finally:
                    self.connected = False
                    self._call = None
            if self._stop.wait(backoff):
                return
            backoff = min(backoff * 2, self._max)
