"""Which batch sequence numbers of one agent boot are stored: a compact set
of closed ranges.

A high-water mark is not enough: when a group commit fails, later batches of
the same boot may commit in another group, and a mark would then answer the
failed batch's resend DUPLICATE without it ever being stored. Ranges record
exactly what committed, holes included. An agent sends in order, so the set
is one range almost always; a hole lasts until its batch is resent, or until
the agent says it will never be (its `min_unacked_seq` moves past it, after
dropping the batch for lack of buffer), when it is closed.
"""
from __future__ import annotations

import bisect

MAX_RANGES = 4096   # holes kept per boot before the oldest are closed (see close_below)


class SeqSet:
    __slots__ = ("ranges",)

    def __init__(self, ranges: list[tuple[int, int]] | None = None):
        self.ranges: list[tuple[int, int]] = sorted(ranges or [])

    def __contains__(self, seq: int) -> bool:
        i = bisect.bisect_right(self.ranges, (seq, float("inf"))) - 1
        return i >= 0 and self.ranges[i][0] <= seq <= self.ranges[i][1]

    def copy(self) -> "SeqSet":
        return SeqSet(list(self.ranges))

    @property
    def max(self) -> int:
        return self.ranges[-1][1] if self.ranges else 0

    def add(self, seq: int) -> None:
        r = self.ranges
        i = bisect.bisect_right(r, (seq, float("inf")))
        if i > 0 and r[i - 1][0] <= seq <= r[i - 1][1]:
            return
        lo, hi = seq, seq
        if i > 0 and r[i - 1][1] == seq - 1:        # extends the range before
            lo = r[i - 1][0]
            i -= 1
            del r[i]
        if i < len(r) and r[i][0] == seq + 1:       # and/or the range after
            hi = r[i][1]
            del r[i]
        r.insert(i, (lo, hi))

    def close_below(self, floor: int) -> None:
        """Everything below `floor` counts as settled: the agent holds no
        batch under it any more, so no resend can arrive there."""
        if floor <= 1:
            return
        keep = [(lo, hi) for lo, hi in self.ranges if hi >= floor]
        if keep and keep[0][0] < floor:
            keep[0] = (1, keep[0][1])
        else:
            keep.insert(0, (1, floor - 1))
        self.ranges = keep
        # merge the first range with the next if they now touch
        if len(keep) > 1 and keep[0][1] + 1 >= keep[1][0]:
            self.ranges = [(1, keep[1][1])] + keep[2:]

    def bound(self) -> int:
        """Closes the oldest holes once there are more than MAX_RANGES;
        returns how many ranges were merged (the caller logs it)."""
        over = len(self.ranges) - MAX_RANGES
        if over <= 0:
            return 0
        self.close_below(self.ranges[over][0])
        return over
