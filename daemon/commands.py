"""The agent's end of the analyzer's command stream: holds Commands open,
runs each command on its own thread, reconnects with backoff. The stream
goes over what `security` presents (the agent's certificate, mutual TLS)."""
from __future__ import annotations

import threading

import grpc
import structlog

from gpuscope.security.tls import INSECURE, ClientSecurity, explain_failure
from gpuscope.v1 import ACCEPTED_KEY, analyzer_pb2 as apb, analyzer_pb2_grpc

log = structlog.get_logger("gpuscope.commands")


class CommandListener:
    def __init__(self, target: str, host: str, boot_id: str, run, backoff_s: float = 1.0, max_backoff_s: float = 15.0,
                 security: ClientSecurity = INSECURE):
        self.target, self.host, self.boot_id = target, host, boot_id
        self._security = security
        self._run = run
        self._backoff, self._max = backoff_s, max_backoff_s
        self._stop = threading.Event()
        self._call = None
        self._thread = threading.Thread(target=self._loop, name="commands", daemon=True)
        self.received = 0
        self.connected = False
        self._accepted = False
        self.last_error = ""

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
            try:
                ch = self._security.channel(self.target)
            except ValueError as exc:       # TLS files unreadable or expired (TlsConfigError): retry, never die
                if self.last_error != str(exc):
                    log.error("command stream cannot open a channel", analyzer=self.target, error=str(exc))
                self.last_error = str(exc)
                if self._stop.wait(backoff):
                    return
                backoff = min(backoff * 2, self._max)
                continue
            with ch:
                try:
                    self._call = analyzer_pb2_grpc.AnalyzerStub(ch).Commands(
                        apb.AgentHello(host=self.host, boot_id=self.boot_id))
                    self.connected = True
                    # the analyzer's headers say it accepted the stream (a refused one ends with none)
                    self._accepted = any(k == ACCEPTED_KEY for k, _ in self._call.initial_metadata() or ())
                    for cmd in self._call:
                        self.last_error = ""
                        backoff = self._backoff
                        self.received += 1
                        log.info("command", id=cmd.id, kind=cmd.kind, gpu=cmd.gpu, reason=cmd.reason)
                        threading.Thread(target=self._run, args=(cmd,), name=f"command-{cmd.id}", daemon=True).start()
                except grpc.RpcError as exc:
                    if not self._stop.is_set() and exc.code() != grpc.StatusCode.CANCELLED:
                        self._lost(exc)
                finally:
                    self.connected = False
                    self._call = None
            if self._stop.wait(backoff):
                return
            backoff = min(backoff * 2, self._max)

    def _lost(self, exc: grpc.RpcError) -> None:
        """Logs a refusal (TLS, authentication, permission) once as an error
        naming the fix; an analyzer that is merely away, at debug."""
        explained = explain_failure(exc, self.target, self._security, established=self._accepted)
        message = explained or f"{exc.code().name}: {exc.details()}"
        if explained and message != self.last_error:
            log.error("command stream refused", analyzer=self.target, error=message)
        else:
            log.debug("command stream lost", error=message)
        self.last_error = message
