"""Backpressure: a budget of bytes queued for the writer.

When the writer falls behind, streams stop reading (they wait here before
taking the next message), gRPC's flow control then stops the agents'
sends, and agents keep their batches in their own bounded buffers. Memory
on the analyzer is bounded by the budget, not by how many agents connect.

Waiters are served first come, first served, and a release hands bytes to
the waiters directly, so a release wakes only those it admits.
"""
from __future__ import annotations

import asyncio
import collections
import queue
import threading
import time
from typing import Callable


class _Waiter:
    __slots__ = ("n", "wake", "granted")

    def __init__(self, n: int, wake: Callable[[], None]):
        self.n, self.wake, self.granted = n, wake, False


class ByteBudget:
    def __init__(self, limit_bytes: int):
        if limit_bytes <= 0:
            raise ValueError(f"limit_bytes: must be > 0, got {limit_bytes}")
        self.limit = limit_bytes
        self.used = 0
        self.waits = 0                      # times a stream had to wait: the backpressure count
        self._lock = threading.Lock()
        self._waiters: collections.deque[_Waiter] = collections.deque()

    def _fits(self, n: int) -> bool:
        # One message larger than the whole budget still passes when nothing
        # else is queued, or it could never be admitted.
        return self.used + n <= self.limit or self.used == 0

    def _enqueue(self, n: int, wake: Callable[[], None]) -> _Waiter | None:
        """Takes the bytes at once (None) or queues a waiter."""
        with self._lock:
            if not self._waiters and self._fits(n):
                self.used += n
                return None
            w = _Waiter(n, wake)
            self._waiters.append(w)
            self.waits += 1
            return w

    def _abandon(self, w: _Waiter) -> None:
        """A waiter gave up: drop it, or give back the bytes it was granted meanwhile."""
        with self._lock:
            if not w.granted:
                self._waiters.remove(w)
                return
        self.release(w.n)

    async def acquire(self, n: int) -> None:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        w = self._enqueue(n, lambda: loop.call_soon_threadsafe(_resolve, fut))
        if w is None:
            return
        try:
            await fut
        except asyncio.CancelledError:
            self._abandon(w)
            raise

    def acquire_blocking(self, n: int, timeout: float | None = None) -> bool:
        event = threading.Event()
        w = self._enqueue(n, event.set)
        if w is None or event.wait(timeout):
            return True
        self._abandon(w)
        return False

    def release(self, n: int) -> None:
        admitted = []
        with self._lock:
            self.used = max(0, self.used - n)
            while self._waiters and self._fits(self._waiters[0].n):
                w = self._waiters.popleft()
                w.granted = True
                self.used += w.n
                admitted.append(w)
        for w in admitted:
            w.wake()


class ReadGate:
    """Bytes read from agents' streams and not yet queued for the writer.

    The writer's budget bounds what is queued; a stream that waits for it
    holds the message it read (its bytes and the parsed batch), and gRPC
    reads a whole message once a read is pending. So a stream whose last
    message was large reserves that much here before its next read, and a
    message larger than reserved waits here, its bytes read but not yet
    parsed: at most `limit` bytes of large messages are parsed and waiting
    for the writer at once, however many streams send them. Streams of small
    batches (an agent's few seconds of samples) never wait here: a
    reservation held across an idle agent's seconds between batches would
    block the others' reads for nothing.
    """

    def __init__(self, limit_bytes: int, free_bytes: int):
        self.budget = ByteBudget(limit_bytes)
        self.free = free_bytes

    def stream(self) -> "GateSlot":
        return GateSlot(self)


class GateSlot:
    """One stream's place at the read gate: what it holds, and the size of
    its last message."""
    __slots__ = ("gate", "held", "last")

    def __init__(self, gate: ReadGate):
        self.gate, self.held, self.last = gate, 0, 0

    async def reserve(self) -> None:
        """Before a read: room for a message like the last, if that was large."""
        if self.last > self.gate.free:
            await self.gate.budget.acquire(self.last)
            self.held = self.last

    async def read(self, size: int) -> None:
        """After a read of `size` bytes: waits for room for all of it if it
        is large and more than reserved. The reservation is given back while
        it waits, or streams holding part and waiting for more would wait
        for each other."""
        self.last = size
        if size <= max(self.held, self.gate.free):
            return
        self.release()
        await self.gate.budget.acquire(size)
        self.held = size

    def release(self) -> None:
        """Once the message is queued for the writer (whose budget then
        holds it), refused, or abandoned."""
        held, self.held = self.held, 0
        if held:
            self.gate.budget.release(held)


def _resolve(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


def take_queued(q: "queue.SimpleQueue", first, limit: int) -> tuple[list, bool]:
    """`first` and whatever else is already queued, up to `limit` items, for
    one group commit or one pipe write; True when the stop sentinel (None)
    came up, which is not returned."""
    items = [first]
    while len(items) < limit:
        try:
            nxt = q.get_nowait()
        except queue.Empty:
            return items, False
        if nxt is None:
            return items, True
        items.append(nxt)
    return items, False


HOST_BURST_BYTES = 64 << 20     # what a host may send at once before its rate applies: two of the largest messages


class HostRate:
    """Each host's share of the disk: the bytes of its batches, at most
    `bytes_per_s` over time after a first `burst_bytes` (a token bucket per
    host). A host over its rate has its next batch held back until its debt
    is paid, so only its own stream slows (flow control, as for the byte
    budget), and its agent buffers. A host that owes more than `max_debt`
    bytes (by default the burst: more than one stream's largest message,
    so only a host sending on many streams at once) has its next batch
    refused as transient instead. Without it one valid client filled the
    disk at the writer's full speed (found in a trial).

    Only as good as the host's name: under mutual TLS that is the name its
    certificate proves; without, a client may claim many."""

    PRUNE_EVERY = 4096

    def __init__(self, bytes_per_s: float, burst_bytes: float, max_debt: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if bytes_per_s <= 0 or burst_bytes <= 0:
            raise ValueError(f"host rate: bytes_per_s and burst_bytes must be > 0, got {bytes_per_s}, {burst_bytes}")
        self.rate, self.burst = float(bytes_per_s), float(burst_bytes)
        self.max_debt = self.burst if max_debt is None else float(max_debt)
        self._clock = clock
        self._level: dict[str, tuple[float, float]] = {}     # host -> (bytes it may still send, as of)
        self._calls = 0
        self.held = 0          # batches made to wait
        self.refused = 0       # batches refused: their host owed more than max_debt

    def charge(self, host: str, n: int) -> float | None:
        """Takes `n` bytes of `host`'s rate: the seconds to wait before
        storing them (0: at once), or None, charging nothing, when the host
        already owes more than max_debt. The wait is the debt earlier
        batches left, so batches of one host arriving together are spaced,
        not all woken at once."""
        now = self._clock()
        level, at = self._level.get(host, (self.burst, now))
        level = min(self.burst, level + (now - at) * self.rate)
        if -level > self.max_debt:
            self.refused += 1
            return None
        self._level[host] = (level - n, now)
        wait = max(0.0, -level / self.rate)
        if wait:
            self.held += 1
        self._calls += 1
        if self._calls % self.PRUNE_EVERY == 0:
            self._prune(now)
        return wait

    def refund(self, host: str, n: int) -> None:
        """Gives back what a batch was charged that was not stored after all."""
        if host in self._level:
            now = self._clock()
            level, at = self._level[host]
            self._level[host] = (min(self.burst, level + (now - at) * self.rate + n), now)

    def _prune(self, now: float) -> None:
        """Forgets hosts whose bucket has refilled: they start full anyway."""
        full = [h for h, (level, at) in self._level.items() if level + (now - at) * self.rate >= self.burst]
        for h in full:
            del self._level[h]
