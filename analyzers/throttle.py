"""At most one log line per interval for something that can happen hundreds
of times a second (refused batches from a broken client, anomaly storms of
a fleet changing phase at once): the first occurrence is logged at once,
later ones are counted into the next line, so nothing goes unsaid and the
log stays readable."""
from __future__ import annotations

import threading
import time
from typing import Callable


class Throttle:
    def __init__(self, every_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self._clock = clock
        self._last = float("-inf")
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def hit(self, **counts: int) -> dict[str, int] | None:
        """Adds `counts`. Returns the sums since the last line (this hit's
        included) when a line is due, else None: say nothing now."""
        now = self._clock()
        with self._lock:
            for k, v in counts.items():
                self._held[k] = self._held.get(k, 0) + v
            if now - self._last < self.every_s:
                return None
            self._last = now
            out, self._held = self._held, {}
            return out
