"""Commands from the analyzer to agents: each connected agent holds one
server-streaming call; the hub keeps a queue per host."""
from __future__ import annotations

import queue
import threading


class CommandHub:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: dict[str, queue.Queue] = {}

    def subscribe(self, host: str) -> queue.Queue:
        q: queue.Queue = queue.Queue(maxsize=100)
        with self._lock:
            self._queues[host] = q       # a reconnecting agent replaces its old stream
        return q

    def unsubscribe(self, host: str, q: queue.Queue) -> None:
        with self._lock:
            if self._queues.get(host) is q:
                del self._queues[host]

    def connected(self, host: str) -> bool:
        with self._lock:
            return host in self._queues

    def send(self, host: str, command) -> bool:
        with self._lock:
            q = self._queues.get(host)
        if q is None:
            return False
        try:
            q.put_nowait(command)
            return True
        except queue.Full:
            return False

    @property
    def hosts(self) -> list[str]:
        with self._lock:
            return list(self._queues)
