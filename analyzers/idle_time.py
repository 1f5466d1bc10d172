"""Where a GPU's idle time went, as time, not as a count of gaps.

Over the trace, minus the profiler's own start and stop while the GPU was
idle (a `jax.profiler.trace()` block spends its last seconds in
`stop_trace`; that is not the job), every idle nanosecond of a device gets
one cause:

- **dispatch**: the GPU waited for work the host had not launched yet, and
  the launching thread was inside the runtime's dispatch path (launch-bound);
- **host work**: the same wait, with the launching thread doing anything else:
  Python, input pipelines, sampling, synchronisation (host-bound); time in no
  traced event counts here too, as `untraced`, when the next launch came late;
- **host transfers**: the launching thread was staging data to or from a device;
- **device wait**: the next activity had been launched before the GPU went
  idle, so the GPU waited on something on its side (a copy, a collective
  peer, an event);
- **waiting for work**: the launching thread was blocked with nothing to do
  (sleeping, polling, a queue) — nothing pending;
- **unattributed**: no launch record and no host trace to say.

The launching thread is the host thread that issued the most launches (or
ran the most dispatch, when launches carry no correlation id). What it was
doing at an instant is its innermost open event, so time inside `PjitFunction`
nested in `host_step` is dispatch, and the rest of `host_step` is host work.
Everything is vectorised over events: the largest bundled XSpace has 395,000
host events.
"""
from __future__ import annotations

import numpy as np

from gpuscope.collectors.host_model import (CATEGORY_NAMES, DISPATCH, OTHER, PROFILER, TRANSFER, WAITING,
                                            HostEvents, category_of)
from gpuscope.collectors.intervals import EMPTY, complement, covered_before, intersect, length, merge, minus
from gpuscope.collectors.trace_model import DeviceTimeline, Trace

CAUSES = ("dispatch", "host_work", "host_transfer", "device_wait", "waiting_for_work", "unattributed")
DISPATCH_GAP_NS = 100_000    # without a host trace: gaps this short are the dispatch path itself
LATE_SLACK_NS = 1_000        # a launch within 1 µs of the GPU running dry counts as late
FRAMEWORK_OPS = ("aten::", "torch::", "c10d::")
DEVICE_LAUNCH_GAP_NS = 10_000   # between queued kernels, up to this is the GPU's own launch latency
TOP_ACTIVITIES = 5
_CAUSE_OF = {DISPATCH: "dispatch", OTHER: "host_work", TRANSFER: "host_transfer", WAITING: "waiting_for_work",
             PROFILER: "waiting_for_work"}


# -- the host's launching thread -------------------------------------------------------------
def launching_thread(ev: HostEvents, launch_corr: np.ndarray, dev: DeviceTimeline | None = None) -> int | None:
    """The thread that issued the most of this device's launches (one thread
    may feed each GPU); without correlated launches, the one that spent the
    most time dispatching; None when neither."""
    if not len(ev):
        return None
    # time in the runtime's dispatch path proper (by name: PjitFunction, Execute, cuLaunch...),
    # not counting events that are dispatch only because they carry a launch's id
    path = np.asarray([category_of(n) == DISPATCH for n in ev.names], bool)[ev.name_idx]
    per = np.bincount(ev.thread[path], weights=(ev.end_ns - ev.start_ns)[path], minlength=len(ev.threads))
    top = None
    if len(ev.launch_thread) and dev is not None and len(dev):
        mine = np.isin(launch_corr, dev.correlation[dev.correlation >= 0])
        if mine.any():
            top = int(np.argmax(np.bincount(ev.launch_thread[mine], minlength=len(ev.threads))))
    if top is None and ev.launches.any():
        top = int(np.argmax(ev.launches))
    # A runtime worker (PjRt's async runner) that only issues the launches: the job's
    # thread is the one running the dispatch path, and its time is what decides.
    if per.max(initial=0) > 0 and (top is None or per[top] == 0):
        return int(np.argmax(per))
    return top


def _parents(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Parent (-1 at top level) and depth of each event of one thread, sorted
    by start, longest first, none of zero length (an instant contains
    nothing and would read as closed before its siblings start)."""
    n = len(s)
    closed = np.searchsorted(np.sort(e), s, side="right")
    depth = np.maximum(np.arange(n) - closed, 0)
    parent = np.full(n, -1, np.int64)
    for d in range(1, int(depth.max(initial=0)) + 1):
        up = np.flatnonzero(depth == d - 1)
        kids = np.flatnonzero(depth == d)
        pos = np.searchsorted(up, kids) - 1
        ok = pos >= 0
        cand = up[np.maximum(pos, 0)]
        ok &= e[cand] >= e[kids]              # a partial overlap is not nesting
        parent[kids[ok]] = cand[ok]
    return parent, depth


def _categories(ev: HostEvents, names: np.ndarray, parent: np.ndarray, depth: np.ndarray,
                dev: DeviceTimeline) -> np.ndarray:
    """What each event of the launching thread is, in context: an event named
    after one of the device's ops or kernels is the runtime launching it (XLA's
    thunk `custom-call.1`), plain work nested in the dispatch path is part of
    it (`Build buffer allocations` under PjRt's Execute), and plain frames
    inside a wait are the wait (`sched_yield` under `acquire_read`)."""
    cat = ev.category[names].copy()
    device_names = set(dev.names) | {op for _, op in dev.ops if op}
    ids = [i for i, n in enumerate(ev.names) if n in device_names]
    cat[np.isin(names, ids) & (cat == OTHER)] = DISPATCH
    # torch eager: an op (aten::add) that launches kernels is the framework's path to them;
    # one that launches nothing (aten::index_select on the CPU) is host work
    framework = np.asarray([n.startswith(FRAMEWORK_OPS) for n in ev.names], bool)[names]
    for d in range(int(depth.max(initial=0)), 0, -1):
        kids = np.flatnonzero((depth == d) & (parent >= 0) & (cat == DISPATCH))
        up = parent[kids]
        cat[up[framework[up] & (cat[up] == OTHER)]] = DISPATCH
    for d in range(1, int(depth.max(initial=0)) + 1):
        # plain frames inside the dispatch path, or inside a wait (a lock, a spin), are that too
        kids = np.flatnonzero((depth == d) & (parent >= 0) & (cat == OTHER))
        up = cat[parent[kids]]
        inherit = (up == DISPATCH) | (up == WAITING)
        cat[kids[inherit]] = up[inherit]
    return cat


def _self_time_in(s: np.ndarray, e: np.ndarray, parent: np.ndarray, iv) -> np.ndarray:
    """Each event's own time (minus its children's) inside the intervals."""
    inside = covered_before(iv, e) - covered_before(iv, s)
    has = parent >= 0
    children = np.bincount(parent[has], weights=inside[has], minlength=len(s))
    return np.maximum(inside - children, 0)


# -- the accounting --------------------------------------------------------------------------
def account(trace: Trace, dev: DeviceTimeline, active) -> dict:
    lo, hi = trace.start_ns, trace.end_ns
    idle_all = complement(active, lo, hi)
    ev = trace.host.events
    main = launching_thread(ev, trace.host.launch_correlation, dev) if ev is not None else None
    mine = None
    if main is not None:
        mine = (ev.thread == main) & (ev.end_ns > ev.start_ns)
        # the profiler's own start/stop, called by the thread that runs the job
        prof = _intervals(ev, mine & (ev.category[ev.name_idx] == PROFILER))
    else:
        prof = EMPTY
    excluded = intersect(idle_all, prof)
    idle = minus(idle_all, excluded)
    span = max(hi - lo - length(excluded), 1)
    busy_ns = length(active)
    idle_ns = length(idle)
    causes = dict.fromkeys(CAUSES, 0.0)
    # device wait: idle stretches before an activity launched before they began
    waited, late, unknown_next = _by_launch(trace, dev, active, idle)
    # a few microseconds between kernels already queued is the GPU launching the next one
    # (a CUDA graph of tiny kernels): launch overhead, not a wait on a dependency
    short = (waited[1] - waited[0]) <= DEVICE_LAUNCH_GAP_NS
    causes["dispatch"] += float((waited[1] - waited[0])[short].sum())
    causes["device_wait"] = float((waited[1] - waited[0])[~short].sum())
    if main is None:        # no host trace: an idle stretch before a known next activity is the host's too
        followed = unknown_next[1] < hi
        late = _merged_union(late, (unknown_next[0][followed], unknown_next[1][followed]))
        unknown_next = (unknown_next[0][~followed], unknown_next[1][~followed])
    host_idle = late
    activities: list[dict] = []
    if main is not None:
        s, e, names = ev.start_ns[mine], ev.end_ns[mine], ev.name_idx[mine]
        parent, depth = _parents(s, e)
        cat = _categories(ev, names, parent, depth, dev)
        own = _fit(_self_time_in(s, e, parent, host_idle), length(host_idle))
        for c, cause in _CAUSE_OF.items():
            causes[cause] += float(own[cat == c].sum())
        untraced = max(0, length(host_idle) - float(own.sum()))
        causes["host_work"] += untraced
        # idle stretches whose next launch is unknown (or none: the trailing edge) are the
        # host's only where the thread was busy; otherwise nobody can say
        own_u = _fit(_self_time_in(s, e, parent, unknown_next), length(unknown_next))
        for c, cause in _CAUSE_OF.items():
            causes[cause] += float(own_u[cat == c].sum())
        causes["unattributed"] += max(0, length(unknown_next) - float(own_u.sum()))
        fed, fed_by = _waiting_on_others(ev, main, merge(s[cat == WAITING], e[cat == WAITING]),
                                         _merged_union(host_idle, unknown_next))
        moved = min(fed, causes["waiting_for_work"])
        causes["waiting_for_work"] -= moved
        causes["host_work"] += moved
        by_name = np.bincount(names, weights=own + own_u, minlength=len(ev.names))
        activities = [dict(name=ev.names[i] or "(unnamed)", category=_category_name(cat, names, i),
                           idle_fraction=round(float(by_name[i]) / max(idle_ns, 1), 4))
                      for i in np.argsort(-by_name)[:TOP_ACTIVITIES]]
        extra = [("no traced event", "host work", untraced)]
        if moved:
            extra.append((f"waiting while other threads worked ({fed_by})", "host work", moved))
            activities = [a for a in activities if a["category"] != "waiting for work"]   # that row says it
        activities += [dict(name=n, category=c, idle_fraction=round(v / max(idle_ns, 1), 4)) for n, c, v in extra]
        activities = sorted((a for a in activities if a["idle_fraction"] >= 0.005),
                            key=lambda a: -a["idle_fraction"])[:TOP_ACTIVITIES]
        basis = "host trace"
    else:
        # no launching thread in the trace: the size of each late gap stands in for what the host did
        a, b = host_idle
        g = b - a
        short = g <= DISPATCH_GAP_NS
        causes["dispatch"] += int(g[short].sum())
        causes["host_work"] += int(g[~short].sum())
        causes["unattributed"] += length(unknown_next)
        basis = ("gap sizes (no host trace)" if ev is None or not len(ev)
                 else "gap sizes (the host trace names no launching thread)")
    return dict(span_seconds=span / 1e9, busy_fraction=busy_ns / span, idle_fraction=idle_ns / span,
                excluded=dict(profiler_seconds=length(excluded) / 1e9),
                idle_causes={k: v / span for k, v in causes.items()}, basis=basis,
                launching_thread=ev.threads[main] if main is not None else None,
                host_during_idle=activities)


def _category_name(cat: np.ndarray, names: np.ndarray, name: int) -> str:
    """The category the name's events mostly had in context."""
    c = cat[names == name]
    return CATEGORY_NAMES[int(np.bincount(c).argmax())] if len(c) else "host work"


def _waiting_on_others(ev: HostEvents, main: int, waiting, idle) -> tuple[float, str]:
    """How long the launching thread waited while the GPU idled and other
    host threads worked (an input pipeline feeding a consumer that blocks on
    its queue: host-bound, not idle), and the work they did most."""
    if not len(waiting[0]):
        return 0.0, ""
    other = (ev.thread != main) & (ev.end_ns > ev.start_ns)
    cat = ev.category[ev.name_idx]
    # the innermost frames of the other threads: an outer frame (`serve_forever`, a
    # thread's `run`) is where a thread is, not what it does
    leaf = np.zeros(len(ev), bool)
    for t in np.unique(ev.thread[other]):
        idx = np.flatnonzero(other & (ev.thread == t))
        parent = _parents(ev.start_ns[idx], ev.end_ns[idx])[0]
        is_leaf = np.ones(len(idx), bool)
        is_leaf[parent[parent >= 0]] = False
        leaf[idx[is_leaf]] = True
    # a frame as long as half the trace is a thread's whole life (a server's serve()), not a task
    task = (ev.end_ns - ev.start_ns) < max(1, ev.end_ns.max(initial=0) - ev.start_ns.min(initial=0)) // 2
    working = leaf & task & ((cat == OTHER) | (cat == TRANSFER) | (cat == DISPATCH))
    if not working.any():
        return 0.0, ""
    when = intersect(intersect(waiting, idle), merge(ev.start_ns[working], ev.end_ns[working]))
    fed = length(when)
    if not fed:
        return 0.0, ""
    s, e = ev.start_ns[working], ev.end_ns[working]
    inside = covered_before(when, e) - covered_before(when, s)
    top = np.bincount(ev.name_idx[working], weights=inside, minlength=len(ev.names))
    return float(fed), ev.names[int(np.argmax(top))] or "(unnamed)"


def _fit(own: np.ndarray, total: int) -> np.ndarray:
    """Events that overlap without nesting (async work on one line) can claim
    the same instant twice; their shares are scaled so they never claim more
    time than there was."""
    claimed = float(own.sum())
    return own * (total / claimed) if claimed > total else own


def _intervals(ev: HostEvents, mask: np.ndarray):
    return merge(ev.start_ns[mask], ev.end_ns[mask])


def _merged_union(x, y):
    return merge(np.concatenate([x[0], y[0]]), np.concatenate([x[1], y[1]]))


def next_launch(trace: Trace, dev: DeviceTimeline, block_starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For blocks of device activity starting at `block_starts`: whether the
    launch of each block's first activity is in the host trace (by
    correlation id), and when it was issued."""
    host = trace.host
    known = np.zeros(len(block_starts), bool)
    launch = np.full(len(block_starts), -1, np.int64)
    if len(host.launch_correlation) and len(dev) and len(block_starts):
        order = np.argsort(host.launch_correlation, kind="stable")
        corr_sorted, launch_sorted = host.launch_correlation[order], host.launch_start_ns[order]
        first = np.minimum(np.searchsorted(dev.start_ns, block_starts), len(dev) - 1)
        nxt_corr = dev.correlation[first]
        pos = np.minimum(np.searchsorted(corr_sorted, nxt_corr), len(corr_sorted) - 1)
        known = (corr_sorted[pos] == nxt_corr) & (nxt_corr >= 0)
        launch = launch_sorted[pos]
    return known, launch


def _by_launch(trace: Trace, dev: DeviceTimeline, active, idle):
    """Splits idle stretches by when the activity after them was launched:
    before the stretch began (the device waited), after (the host was late),
    or unknown (no correlation id, or no activity after it)."""
    a, b = idle
    starts = active[0]
    nxt = np.searchsorted(starts, b)                     # the block that ends each idle stretch
    block = starts[np.minimum(nxt, len(starts) - 1)] if len(starts) else np.zeros(len(a), np.int64)
    known, launch = next_launch(trace, dev, block)
    known &= nxt < len(starts)
    waited = known & (launch < a - LATE_SLACK_NS)
    late = known & ~waited
    unknown = ~known
    return (a[waited], b[waited]), (a[late], b[late]), (a[unknown], b[unknown])
