"""The analyzer's live event stream: findings, anomalies, capture decisions
and capture results, pushed to every on-call watcher whose filter matches.
A watcher that cannot keep up loses events (counted), never the analyzer."""
from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import Callable


@dataclass
class Watch:
    host: str = ""
    gpu: int | None = None
    verdicts: frozenset[str] = frozenset()
    kinds: frozenset[str] = frozenset()
    deliver: Callable[[dict], bool] = lambda e: False    # False: the watcher's queue is full
    dropped: int = 0

    def matches(self, e: dict) -> bool:
        if self.kinds and e["kind"] not in self.kinds:
            return False
        if self.host and e.get("host") != self.host:
            return False
        if self.gpu is not None and e.get("gpu") != self.gpu:
            return False
        return not self.verdicts or e.get("verdict") in self.verdicts


class EventBus:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watches: dict[int, Watch] = {}
        self._ids = itertools.count()
        self.published = 0

    def subscribe(self, w: Watch) -> int:
        with self._lock:
            wid = next(self._ids)
            self._watches[wid] = w
            return wid

    def unsubscribe(self, wid: int) -> None:
        with self._lock:
            self._watches.pop(wid, None)

    def publish(self, event: dict) -> None:
        self.published += 1
        with self._lock:
            watches = list(self._watches.values())
        for w in watches:
            if w.matches(event) and not w.deliver(event):
                w.dropped += 1
