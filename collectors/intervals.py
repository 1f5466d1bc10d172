"""Arithmetic on interval lists: two int64 arrays (starts, ends), sorted and
disjoint once merged. Everything a timeline needs (busy time, idle time,
what overlaps what) in array operations, never a loop over events."""
from __future__ import annotations

import numpy as np

EMPTY = (np.empty(0, np.int64), np.empty(0, np.int64))


def merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if not len(starts):
        return starts.astype(np.int64), ends.astype(np.int64)
    o = np.argsort(starts, kind="stable")
    s, e = starts[o], np.maximum.accumulate(ends[o])
    new = np.empty(len(s), bool)
    new[0] = True
    new[1:] = s[1:] > e[:-1]
    idx = np.flatnonzero(new)
    return s[idx], np.maximum.reduceat(e, idx)


def complement(iv, lo: int, hi: int):
    """[lo, hi] minus the intervals."""
    a, b = iv
    a, b = np.clip(a, lo, hi), np.clip(b, lo, hi)
    starts = np.concatenate([[lo], b])
    ends = np.concatenate([a, [hi]])
    keep = ends > starts
    return starts[keep], ends[keep]


def _combine(x, y, keep) -> tuple[np.ndarray, np.ndarray]:
    """The parts of the line where keep(inside x, inside y) holds, merged."""
    (xa, xb), (ya, yb) = x, y
    pts = np.concatenate([xa, xb, ya, yb]).astype(np.int64)
    nx, ny = len(xa), len(ya)
    dx = np.concatenate([np.ones(nx, np.int64), -np.ones(nx, np.int64), np.zeros(2 * ny, np.int64)])
    dy = np.concatenate([np.zeros(2 * nx, np.int64), np.ones(ny, np.int64), -np.ones(ny, np.int64)])
    if len(pts) < 2:
        return EMPTY
    o = np.lexsort((dx + dy, pts))          # at one point, ends before starts: [a, b) intervals
    p, cx, cy = pts[o], np.cumsum(dx[o]), np.cumsum(dy[o])
    m = keep(cx[:-1] > 0, cy[:-1] > 0) & (p[1:] > p[:-1])
    return merge(p[:-1][m], p[1:][m])


def intersect(x, y):
    return _combine(x, y, lambda in_x, in_y: in_x & in_y)


def minus(x, y):
    return _combine(x, y, lambda in_x, in_y: in_x & ~in_y)


def length(iv) -> int:
    return int((iv[1] - iv[0]).sum())


def covered_before(iv, t: np.ndarray) -> np.ndarray:
    """How much of the merged intervals lies before each time t (int64)."""
    a, b = iv
    if not len(a):
        return np.zeros(len(t), np.int64)
    cum = np.concatenate([[0], np.cumsum(b - a)])
    i = np.searchsorted(a, t, side="right")          # intervals starting at or before t
    last = np.maximum(i - 1, 0)
    partial = np.where(i > 0, np.minimum(t, b[last]) - a[last], 0)
    return cum[last] * (i > 0) + partial


def union_ns(starts: np.ndarray, ends: np.ndarray) -> int:
    """Total length of the union of intervals."""
    return length(merge(starts, ends))
