"""Rows owed to the store, written a share at a time.

A fleet changes in step: every open finding absorbs a window at each window
boundary, and every GPU's state with it. Written all at once every
SNAPSHOT_EVERY_S, that is one upsert of ~11,000 finding rows and 12,000 GPU
rows at 1,500 agents: a pause of the writer and ~150 MB more in the analysis
process for the moment it lasts (rows, their DuckDB upsert, their pickle to
the findings mirror). Written a share per commit group, the same rows cost
the same in all and nothing at once.

The promise stays: an item is written no later than `every_s` after it
first changed (every call writes what is due), and a steady set of `n`
changed items is written at about n / every_s a second (every call writes
at least the share of the rest that the time since the last call is of
`every_s`).
"""
from __future__ import annotations

import math
from typing import Generic, Hashable, TypeVar

V = TypeVar("V")


class Trickle(Generic[V]):
    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self._items: dict[Hashable, tuple[float, V]] = {}   # key -> (changed first at, value); oldest first
        self._at: float | None = None
        self._credit = 0.0

    def add(self, key: Hashable, value: V, now: float) -> None:
        """Owed since its first change not yet written; the newest value is what is written."""
        old = self._items.get(key)
        self._items[key] = (old[0] if old is not None else now, value)

    def discard(self, key: Hashable) -> None:
        """Written another way (a change written at once)."""
        self._items.pop(key, None)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def take(self, now: float) -> list[V]:
        """What to write now: everything due, and at least this call's share of the rest."""
        share = 0.0 if self._at is None else min(1.0, max(0.0, now - self._at) / self.every_s)
        self._at = now
        # fractions carry over: one item owed, asked every second, is written every every_s, not every call
        self._credit = min(self._credit + len(self._items) * share, float(len(self._items)))
        n = math.floor(self._credit)
        self._credit -= n
        due = now - self.every_s
        keys = []
        for key, (since, _) in self._items.items():
            if len(keys) >= n and since > due:
                break
            keys.append(key)
        return [self._items.pop(k)[1] for k in keys]

    def take_all(self) -> list[V]:
        out = [v for _, v in self._items.values()]
        self._items.clear()
        return out

    def put_back(self, items: dict[Hashable, V], now: float) -> None:
        """Items taken for a write that failed: owed again, and due at once."""
        for key, value in items.items():
            if key not in self._items:
                self._items[key] = (now - self.every_s, value)
        # keep the order oldest first: the due ones lead
        self._items = dict(sorted(self._items.items(), key=lambda kv: kv[1][0]))
