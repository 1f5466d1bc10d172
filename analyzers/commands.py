"""Commands from the analyzer to agents: each connected agent holds one
server-streaming call; the hub keeps one delivery callback per host (the
stream's own queue, on whatever loop or thread serves it)."""
from __future__ import annotations

import threading
from typing import Callable

Deliver = Callable[[object], bool]     # False when the stream's queue is full


class CommandHub:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: dict[str, Deliver] = {}

    def subscribe(self, host: str, deliver: Deliver) -> None:
        with self._lock:
            self._streams[host] = deliver       # a reconnecting agent replaces its old stream

    def unsubscribe(self, host: str, deliver: Deliver) -> None:
        with self._lock:
            if self._streams.get(host) is deliver:
                del self._streams[host]

    def connected(self, host: str) -> bool:
        with self._lock:
            return host in self._streams

    def send(self, host: str, command) -> bool:
        with self._lock:
            deliver = self._streams.get(host)
        return deliver is not None and deliver(command)

    @property
    def hosts(self) -> list[str]:
        with self._lock:
            return list(self._streams)
