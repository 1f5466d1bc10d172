"""The host side of a trace: every traced event of every host thread, and
what kind of host work each is.

The verdict needs to know what the thread that launches GPU work was doing
while the GPU waited (analyzers/idle_time.py): inside the dispatch path
(launch-bound), in the profiler's own start/stop (not the job), waiting for
work (nothing pending), or doing anything else (host-bound). Categories come
from event names, the same across XLA's TraceMes, the Python tracer
(`$file.py:line function`) and torch's CPU ops.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from .intervals import union_ns

OTHER, DISPATCH, TRANSFER, PROFILER, WAITING = range(5)
CATEGORY_NAMES = ("host work", "dispatch", "host transfer", "profiler", "waiting for work")

# The runtime's path from the framework to the driver.
# An event that carries a launch's correlation id is dispatch too, whatever its
# name (XLA names its launch after the kernel: `loop_add_fusion`).
DISPATCH_MARKERS = ("PjitFunction", "PjRt", "PJRT_", "Executable::Execute", "ExecuteHelper", "ExecutePrepare",
                    "GpuExecutable", "XLA GPU module", "Thunks::", "ThunkExecutor", "command_buffer::",
                    "Build buffer allocations", "AllocateOutputBuffers", "BufferAllocations", "ExecuteOnStream",
                    "cuLaunch", "cudaLaunch", "hipLaunch", "LaunchKernel", "cudaGraphLaunch", "cuGraphLaunch")
# Host-side events that move data between host and device (framework TraceMes).
TRANSFER_MARKERS = ("H2D", "D2H", "Memcpy", "Staging", "DevicePut", "device_put", "BufferFromHostBuffer",
                    "ToLiteral", "CopyRawToHost", "TransferTo", "TransferFrom", "np.asarray(jax.Array)")
# The profiler starting and stopping itself (jax.profiler.start_trace/stop_trace
# and trace(), the C++ session, torch's profiler): time the job did not choose.
# Whole names only: a user's `start_trace_upload` is not the profiler, nor is
# torch's `ProfilerStep#N` (the user's step, annotated).
PROFILER_NAME = re.compile(r"(?<![\w])(start_trace|stop_trace|_start_trace|_stop_trace|StartTrace|StopTrace|"
                           r"StartProfiling|StopProfiling|ProfilerStart|ProfilerStop|cuptiActivityFlushAll)(?![\w])"
                           r"|^ProfilerSession::|^profiler\.(start|stop)\b|^PyTorch Profiler \(\d+\)$")
# Blocked with nothing to do: sleeping, polling a socket, waiting on a queue.
# (whole words: `threading.py:... run` is every thread's root, not a wait)
WAITING_NAME = re.compile(r"(?:^|[\s.])(sleep|epoll_wait|select|poll|sched_yield|nanosleep|futex_wait|"
                          r"wait|wait_for|acquire|acquire_read|join|recv|recv_into|accept|dequeue)$|"
                          r"::Timer::Run$|"
                          r"\$(queue|selectors|asyncio/[\w/]+|threading)\.py:\d+ (get|select|wait|acquire|join|"
                          r"_run_once|run_forever)$")


def category_of(name: str) -> int:
    if PROFILER_NAME.search(name):
        return PROFILER
    if any(m in name for m in TRANSFER_MARKERS):      # before dispatch: PjRt...BufferFromHostBuffer moves data
        return TRANSFER
    if any(m in name for m in DISPATCH_MARKERS):
        return DISPATCH
    if WAITING_NAME.search(name) and not name.startswith("aten::"):     # aten::select is a tensor op
        return WAITING
    return OTHER


@dataclass
class HostEvents:
    """Every traced host event, sorted by (thread, start, longest first), so a
    parent precedes the events nested in it."""
    start_ns: np.ndarray               # int64
    end_ns: np.ndarray                 # int64
    name_idx: np.ndarray               # int32 into names
    thread: np.ndarray                 # int32 into threads
    names: list[str]
    category: np.ndarray               # int8 per name, see CATEGORY_NAMES
    threads: list[str]
    launches: np.ndarray               # int64 per thread: launches it issued (events with a correlation id)
    launch_thread: np.ndarray          # int32 per launch (HostTimeline.launch_correlation order): its thread

    def __len__(self) -> int:
        return len(self.start_ns)


@dataclass
class HostTimeline:
    launch_correlation: np.ndarray     # int64: correlation id of each launch API event
    launch_start_ns: np.ndarray        # int64
    dispatch_ns: int = 0               # time inside the runtime's dispatch path (framework -> driver)
    busy_ns: int = 0                   # union of the busiest host thread's events that are work (not interpreter frames)
    threads: int = 0
    transfer_ns: int = 0               # host time spent moving data to/from devices (staging, device_put, ...)
    events: HostEvents | None = field(default=None, repr=False)


class HostBuilder:
    """Collects host events thread by thread (both trace readers), then
    builds the timeline: the arrays and the per-trace totals."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.threads: dict[object, int] = {}
        self._labels: list[str] = []
        self._launch_name: set[int] = set()
        self.corr: list[int] = []
        self.launch: list[int] = []
        self._launch_thread: list[int] = []
        self._chunks: list[tuple] = []

    def name_index(self, name: str) -> int:
        return self.names.setdefault(name, len(self.names))

    def thread_index(self, key: object, label: str = "") -> int:
        if key not in self.threads:
            self.threads[key] = len(self.threads)
            self._labels.append(label or str(key))
        return self.threads[key]

    def add_many(self, thread: int | np.ndarray, start: np.ndarray, end: np.ndarray, name: np.ndarray,
                 corr: np.ndarray, no_launch: int, frame: np.ndarray | None = None) -> None:
        """Events as arrays (name and thread as indices); `corr` holds
        `no_launch` where an event is not a launch; `frame` marks events
        that are not work (torch's Python frames, the profiler's own span),
        which do not count as a thread's busy time: a torch trace's
        outermost Python frame covers the whole capture, and the thread
        looked 100 % busy whatever it did."""
        thread = np.broadcast_to(np.asarray(thread, np.int32), start.shape)
        work = np.ones(start.shape, bool) if frame is None else ~np.asarray(frame, bool)
        self._chunks.append((thread, start, end, name.astype(np.int32), work))
        launch = corr != no_launch
        if launch.any():
            self.corr.extend(corr[launch].tolist())
            self.launch.extend(start[launch].tolist())
            self._launch_thread.extend(thread[launch].tolist())
            self._launch_name.update(name[launch].tolist())

    def build(self) -> HostTimeline:
        empty = (np.empty(0, np.int32), np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int32),
                 np.empty(0, bool))
        chunks = [empty] + self._chunks
        thread, start, end, name, work = (np.concatenate([c[i] for c in chunks]) for i in range(5))
        if not _in_order(thread, start, end):        # readers give lines in time order, usually
            order = np.lexsort((-(end - start), start, thread))
            start, end, name, thread, work = start[order], end[order], name[order], thread[order], work[order]
        names = list(self.names)
        category = np.asarray([category_of(n) for n in names], np.int8)
        launch_names = np.asarray(sorted(self._launch_name), np.int64)
        if len(launch_names):
            category[launch_names] = np.where(category[launch_names] == OTHER, DISPATCH, category[launch_names])
        cat = category[name] if len(name) else np.empty(0, np.int8)
        n_threads = len(self.threads)
        launches = np.bincount(np.asarray(self._launch_thread, np.int64), minlength=n_threads)
        dispatch = cat == DISPATCH
        busiest = dispatch_ns = 0
        bounds = np.searchsorted(thread, np.arange(n_threads + 1))
        for t in range(n_threads):
            lo, hi = bounds[t], bounds[t + 1]
            w = work[lo:hi]
            busiest = max(busiest, union_ns(start[lo:hi][w], end[lo:hi][w]))
            d = dispatch[lo:hi]
            if d.any():
                dispatch_ns += union_ns(start[lo:hi][d], end[lo:hi][d])
        xfer = cat == TRANSFER
        events = HostEvents(start, end, name, thread, names, category, self._labels, launches,
                            np.asarray(self._launch_thread, np.int32))
        return HostTimeline(np.asarray(self.corr, np.int64), np.asarray(self.launch, np.int64),
                            dispatch_ns=dispatch_ns, busy_ns=busiest, threads=n_threads,
                            transfer_ns=union_ns(start[xfer], end[xfer]), events=events)


def _in_order(thread: np.ndarray, start: np.ndarray, end: np.ndarray) -> bool:
    """Sorted by (thread, start, longest first) already?"""
    if len(start) < 2:
        return True
    dt, ds = np.diff(thread), np.diff(start)
    same = dt == 0
    if (dt < 0).any() or (ds[same] < 0).any():
        return False
    tie = same & (ds == 0)
    dur = end - start
    return not (dur[1:][tie] > dur[:-1][tie]).any()
