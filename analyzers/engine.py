"""The analyzer in a process of its own: its writer, store, live analysis,
findings, detector and policy (the whole Analyzer) run in a child process;
the gRPC servers, validation and decoding stay in the parent.

Why: one Python process holds one GIL. The writer with the live analysis
needs most of a core at a fleet's load, and the event loop that serves the
agents and on-call tools needs the rest. Under one GIL every handoff between
them waits, and the loop's latency grows with the writer's work
(docs/benchmarks.md, part 4). Two processes use both cores.

The parent's EngineClient stands in for Analyzer where the servicer uses it:
- `submit` decodes (a refusal is raised at once, naming the field) and sends
  the decoded batch; its future resolves with the child's commit outcome.
  The byte budget stays in the parent, so flow control is unchanged.
- `status` and most `list_findings` are answered here, from mirrors the
  child keeps current (analyzers/status.py, analyzers/findings_mirror.py);
  other queries (`finding`, `report`, `report_capture`, `store.*`, a list the
  mirror cannot answer exactly) are calls answered by the child's own pool
  of threads.
- the agents' command streams and the on-call watchers live in the parent:
  the child learns which hosts are connected and sends their commands up;
  it forwards events only while someone watches.

If the child dies, nothing acknowledged is lost (an ack is sent only after
its commit): every batch in flight fails as StoreUnavailable (the agents
resend), queries fail, and the parent starts a new child on the same file.
"""
from __future__ import annotations

import asyncio
import atexit
import gc
import itertools
import multiprocessing as mp
import queue
import sys
import threading
import time
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import duckdb
import structlog

from gpuscope.v1 import analyzer_pb2 as apb, samples_pb2 as pb

from .commands import CommandHub
from .events import EventBus, Watch
from .findings_mirror import FindingsMirror
from .flow import ByteBudget, take_queued
from .ingest import DecodedBatch, decode_counted
from .status import StatusMirror
from .store import merge_live
from .writer import DEFAULT_QUEUE_BYTES, StoreUnavailable

log = structlog.get_logger("gpuscope.engine")

START_TIMEOUT_S = 300.0       # opening a large store (a first gpu_state scan) takes a while
RANGE_REPORT_TIMEOUT_S = 60.0
CALL_TIMEOUT_S = 8.0          # a query the child does not answer by then is UNAVAILABLE (clients wait 10 s)
CAPTURE_TIMEOUT_S = 60.0      # summarizing a large trace takes seconds
RESTART_DELAY_S = 2.0
# Threads that give the GIL up often (the event loop decoding, queries, the
# pipe) wait behind a busy writer thread for up to the switch interval each
# time; Python's default 5 ms turned a 0.8 ms decode into 25 ms
# (docs/benchmarks.md). Both of the analyzer's processes use this.
SWITCH_INTERVAL_S = 0.0005
# The live analysis keeps per-GPU state (windows, trackers, detector history)
# as a great many small container objects, next to none of them in a cycle.
# Python's default thresholds (700, 10, 10) had the cyclic collector rescan
# them every few hundred allocations: 15-25 % of the analysis's CPU
# (bench/analysis_cost.py --default-gc, docs/benchmarks.md). Reference
# counting still frees everything at once; only cycles wait longer.
GC_THRESHOLDS = (50_000, 50, 100)


def tune_runtime() -> None:
    """The thread switch interval and collector thresholds of both of the analyzer's processes."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    gc.set_threshold(*GC_THRESHOLDS)


def settle_heap() -> None:
    """After start-up: what it built (restored state, imports) lives as long as the process,
    so the collector stops rescanning it; reference counting still frees it."""
    gc.collect()
    gc.freeze()


LOCK_WAIT_S = 20.0            # how long a new child waits for the store's lock held by an orphaned one
# What the parent may call in the child, by name: nothing else crosses.
CALLS = {"status", "list_findings", "findings_payload", "finding", "report", "range_report", "report_capture",
         "report_calibration", "top", "list_programs", "list_jobs", "job_ranks", "job_skew", "store.captures", "store.ceilings", "store.metric", "store.records",
         "store.verdict_pairs", "store.count", "store.degraded_inputs"}


class EngineUnavailable(StoreUnavailable):
    """The analysis process is down or restarting; try again shortly."""


class _Pipe:
    """One end of the pipe after the start-up handshake. Messages are queued
    and one thread sends whatever has queued as one bundle: one pickling and
    one write for many batches or acks, and a caller (the event loop, the
    writer) never waits on the pipe, even when the other side stalls. What
    queues is bounded by the byte budget (batches) and the callers' timeouts."""

    MAX_BUNDLE = 256

    def __init__(self, conn, name: str) -> None:
        self.conn = conn
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, msg: tuple) -> None:
        self._q.put(msg)

    def close(self, timeout: float | None = None) -> None:
        """Stops after sending what is queued (waits up to `timeout`)."""
        self._q.put(None)
        if timeout is not None:
            self._thread.join(timeout)

    def recv(self) -> list[tuple]:
        return self.conn.recv()

    def _run(self) -> None:
        while True:
            msg = self._q.get()
            if msg is None:
                return
            bundle, last = take_queued(self._q, msg, self.MAX_BUNDLE)
            try:
                self.conn.send(bundle)
            except (OSError, ValueError):     # the other side is gone; its reader notices
                return
            if last:
                return


def _settle_on_loops(settle: list[tuple]) -> None:
    """Resolves asyncio futures from another thread: one wake-up per loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple]] = {}
    for item in settle:
        by_loop.setdefault(item[0].get_loop(), []).append(item)
    for loop, items in by_loop.items():
        try:
            loop.call_soon_threadsafe(_settle, items)
        except RuntimeError:          # the loop is closed: nobody waits for these
            pass


def _settle(items: list[tuple]) -> None:
    for fut, ok, value in items:
        if not fut.done():
            (fut.set_result if ok else fut.set_exception)(value)


# -- the child ---------------------------------------------------------------------------
def _child_main(conn, config, init: Callable | None, init_args: tuple) -> None:
    import signal
    # Ctrl-C reaches the whole process group, and systemd's stop the whole unit:
    # the parent drains and closes this process itself, in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    tune_runtime()
    if init is not None:
        init(*init_args)
    from .analyzer import Analyzer
    from .store import lock_holder
    deadline, waited = time.monotonic() + LOCK_WAIT_S, False
    while True:
        try:
            analyzer = Analyzer(config)
            break
        except Exception as exc:  # reported to the parent, which says it and exits
            # the analysis process of an analyzer killed -9 closes the store on its way out: worth a wait;
            # any other holder (a running analyzer, another program) is refused at once, naming it
            holder = lock_holder(str(exc))
            if holder is not None and holder.orphan and time.monotonic() < deadline:
                if not waited:
                    log.warning("the store is held by the analysis process of an analyzer that is gone; "
                                "waiting for it to close", pid=holder.pid, seconds=LOCK_WAIT_S)
                    waited = True
                time.sleep(0.25)
                continue
            try:
                conn.send(("failed", said(exc)))
            except OSError:          # the parent is gone already
                pass
            return
    analyzer.start()
    settle_heap()
    try:
        conn.send(("ready", None))
    except OSError:                  # the parent went away while this process started
        analyzer.close()
        return
    _Child(_Pipe(conn, "engine-sender"), analyzer).serve()


def said(exc: BaseException) -> str:
    """An error as a person reads it at start-up: its own words where they
    explain themselves (ours, which say what to do; an OSError's errno and
    file; DuckDB's, which name their kind, e.g. "IO Error: ..."), the class
    name only where the words alone would not (a KeyError's bare key)."""
    text = str(exc)
    if text and (type(exc) in (RuntimeError, ValueError) or isinstance(exc, (OSError, duckdb.Error))
                 or type(exc).__module__.startswith("gpuscope.")):
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _Child:
    def __init__(self, pipe: _Pipe, analyzer) -> None:
        self.pipe, self.a = pipe, analyzer
        self.send = pipe.put
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="engine-call")
        self._forwards: dict[str, Callable] = {}
        self._watch: int | None = None
        analyzer.on_status = lambda *published: self.send(("status", *published))
        analyzer.publish_status()

    def serve(self) -> None:
        while True:
            try:
                bundle = self.pipe.recv()
            except (EOFError, OSError):          # the parent is gone: stop as cleanly as we can
                self.a.close()
                return
            for msg in bundle:
                if not self._handle(msg):
                    return

    def _handle(self, msg: tuple) -> bool:
        """False once told to close."""
        kind = msg[0]
        if kind == "batch":
            self._batch(msg[1], msg[2])
        elif kind == "call":
            self._pool.submit(self._call, *msg[1:])
        elif kind == "connected":
            self._connected(msg[1], msg[2])
        elif kind == "watch":
            self._watching(msg[1])
        elif kind == "undelivered":
            self._undelivered(msg[1])
        elif kind == "held":
            self.a.note_held(msg[1])
        elif kind == "rejected":
            self.a.count_rejected(pb.SampleBatch(host=msg[1], seq=msg[2]) if msg[1] else None, msg[3])
        elif kind == "drain":
            self.a.drain(msg[1])
            self.send(("drained", None))
        elif kind == "close":
            self.a.close()
            self.send(("closed", None))
            self.pipe.close(timeout=5)
            return False
        return True

    def _batch(self, rid: int, decoded) -> None:
        self.a.note_received(decoded)
        fut = self.a.writer.submit(decoded)
        fut.add_done_callback(lambda f: self._answer(rid, f))

    def _answer(self, rid: int, f: Future) -> None:
        exc = f.exception()
        self.send(("result", rid, exc is None, f.result() if exc is None else exc))

    def _call(self, rid: int, name: str, args: tuple, kwargs: dict) -> None:
        try:
            owner, _, attr = name.rpartition(".")
            fn = getattr(self.a.store if owner == "store" else self.a, attr)
            value, ok = fn(*args, **kwargs), True
        except Exception as exc:  # raised again in the parent, where the caller handles it
            value, ok = _portable(exc), False
        self.send(("result", rid, ok, value))

    def _connected(self, host: str, up: bool) -> None:
        hub = self.a.commands
        if up:
            def forward(cmd, host=host) -> bool:
                self.send(("command", host, cmd.SerializeToString()))
                return True
            self._forwards[host] = forward
            hub.subscribe(host, forward)
        elif host in self._forwards:
            hub.unsubscribe(host, self._forwards.pop(host))

    def _watching(self, on: bool) -> None:
        if on and self._watch is None:
            self._watch = self.a.events.subscribe(Watch(deliver=lambda e: self.send(("event", e)) or True))
        elif not on and self._watch is not None:
            self.a.events.unsubscribe(self._watch)
            self._watch = None

    def _undelivered(self, command_id: str) -> None:
        def run(_store) -> None:
            d = self.a.policy.finished(command_id, "", False, "the command could not be delivered")
            if d is not None:
                self.a._decided([d])
        self.a.writer.call(run)


def _portable(exc: Exception) -> Exception:
    """An exception the parent can unpickle: our own and the builtins travel
    as they are; anything else as a RuntimeError that keeps its text."""
    import pickle
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}")


# -- the parent --------------------------------------------------------------------------
class _Hub(CommandHub):
    """The parent's command streams; the child learns who is connected."""

    def __init__(self, notify: Callable[[str, bool], None]) -> None:
        super().__init__()
        self._notify = notify

    def subscribe(self, host: str, deliver) -> None:
        super().subscribe(host, deliver)
        self._notify(host, True)

    def unsubscribe(self, host: str, deliver) -> None:
        super().unsubscribe(host, deliver)
        if not self.connected(host):
            self._notify(host, False)


class _Bus(EventBus):
    """The parent's watchers; the child forwards events while there are any."""

    def __init__(self, notify: Callable[[bool], None]) -> None:
        super().__init__()
        self._notify = notify

    def subscribe(self, w: Watch) -> int:
        wid = super().subscribe(w)
        self._notify(True)
        return wid

    def unsubscribe(self, wid: int) -> None:
        super().unsubscribe(wid)
        with self._lock:
            idle = not self._watches
        if idle:
            self._notify(False)


class _Writer:
    def __init__(self) -> None:
        self.budget = ByteBudget(DEFAULT_QUEUE_BYTES)


class _Store:
    def __init__(self, client: "EngineClient") -> None:
        self._client = client

    def __getattr__(self, name: str):
        if f"store.{name}" not in CALLS:
            raise AttributeError(name)
        return lambda *args, **kwargs: self._client.call(f"store.{name}", *args, **kwargs)


class EngineClient:
    """Analyzer's face for the servicer, with the Analyzer in a child process."""

    def __init__(self, config, init: Callable | None = None, init_args: tuple = ()) -> None:
        self.config = config
        self._init, self._init_args = init, init_args
        self._ctx = mp.get_context("spawn")
        self._ids = itertools.count(1)
        self._pending: dict[int, Future] = {}
        self._lock = threading.Lock()
        self._proc = None
        self._up = False
        self._pipe: _Pipe | None = None
        self._closing = False
        self.restarts = 0
        self.commands = _Hub(lambda host, up: self._tell(("connected", host, up)))
        self.events = _Bus(lambda on: self._tell(("watch", on)))
        self.writer = _Writer()
        self.store = _Store(self)
        self.mirror = StatusMirror()
        self.findings_mirror = FindingsMirror()
        # the child publishes after every commit group and every sweep (one a window)
        self.mirror_max_age_s = 3 * config.window_s + 5.0

    # -- life of the child
    def start(self) -> None:
        """Starts the child and waits until its store is open; raises
        RuntimeError with the child's own error when it cannot start."""
        self._spawn()
        # A process that exits without close() (an error past every handler) would otherwise hang in
        # multiprocessing's own exit hook, which waits for the child, and the child ignores SIGTERM
        # (its parent stops it): found in a trial, only kill -9 ended such an analyzer.
        atexit.register(self._kill_child)

    def _kill_child(self) -> None:
        proc = self._proc
        if proc is not None and proc.is_alive():
            proc.kill()
            proc.join(5)

    def _spawn(self, restart: bool = False) -> None:
        parent, child = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(target=_child_main, args=(child, self.config, self._init, self._init_args),
                                 name="gpuscope-analysis", daemon=True)
        proc.start()
        child.close()
        if not parent.poll(START_TIMEOUT_S):
            proc.kill()
            raise RuntimeError(f"the analysis process did not start within {START_TIMEOUT_S:.0f} s")
        try:
            kind, detail = parent.recv()
        except EOFError:
            proc.join(5)
            raise RuntimeError(f"the analysis process exited at start-up (exit code {proc.exitcode})") from None
        if kind != "ready":
            proc.join(5)
            raise RuntimeError(detail)
        self._proc = proc
        self._pipe = _Pipe(parent, "engine-sender")
        if restart:                  # counted before it shows as up: whoever sees it up sees the count
            self.restarts += 1
        self._up = True
        threading.Thread(target=self._read, args=(parent, proc), name="engine-reader", daemon=True).start()
        for host in self.commands.hosts:               # after a restart: who is connected, who watches
            self._tell(("connected", host, True))
        with self.events._lock:
            watching = bool(self.events._watches)
        if watching:
            self._tell(("watch", True))
        if self._closing:                              # stopped while this child was starting
            self._tell(("close", None))

    def _read(self, conn, proc) -> None:
        while True:
            try:
                bundle = conn.recv()
            except (EOFError, OSError):
                break
            settle: list[tuple] = []
            for msg in bundle:
                if msg[0] == "result":
                    self._result(msg, settle)
                else:
                    self._handle(msg)
            _settle_on_loops(settle)
        self._down(proc)

    def _result(self, msg: tuple, settle: list[tuple]) -> None:
        with self._lock:
            fut = self._pending.pop(msg[1], None)
        if isinstance(fut, asyncio.Future):
            settle.append((fut, msg[2], msg[3]))
        elif fut is not None and not fut.done():
            (fut.set_result if msg[2] else fut.set_exception)(msg[3])

    def _handle(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "status":
            _, rows, totals, findings, findings_start = msg
            if findings_start is not None:
                self.findings_mirror.reset(*findings_start)
            self.findings_mirror.apply(findings)
            self.mirror.apply(rows, totals)
        elif kind == "event":
            self.events.publish(msg[1])
        elif kind == "command":
            cmd = apb.Command.FromString(msg[2])
            if not self.commands.send(msg[1], cmd):
                self._tell(("undelivered", cmd.id))
        elif kind in ("drained", "closed"):
            with self._lock:
                fut = self._pending.pop(-1, None)
            if fut is not None:
                fut.set_result(kind)

    def _down(self, proc) -> None:
        self._up = False
        self._pipe.close()
        with self._lock:
            pending, self._pending = self._pending, {}
        gone = EngineUnavailable("the analysis process stopped")
        settle = []
        for fut in pending.values():
            if isinstance(fut, asyncio.Future):
                settle.append((fut, False, gone))
            elif not fut.done():
                fut.set_exception(gone)
        _settle_on_loops(settle)
        if self._closing:
            return
        proc.join(1)
        log.error("analysis process died; starting a new one on the same store", exit_code=proc.exitcode,
                  restarts=self.restarts + 1)
        threading.Thread(target=self._respawn, name="engine-restart", daemon=True).start()

    def _respawn(self) -> None:
        while not self._closing:
            time.sleep(RESTART_DELAY_S)
            if self._closing:
                return
            try:
                self._spawn(restart=True)
                log.warning("analysis process restarted", restarts=self.restarts)
                return
            except Exception as exc:  # keep trying: the parent never dies for this
                log.error("analysis process failed to restart", error=str(exc)[:300])

    def _tell(self, msg: tuple) -> None:
        if self._up:
            self._pipe.put(msg)

    def _request(self, msg_of: Callable[[int], tuple], rid: int | None = None,
                 loop: asyncio.AbstractEventLoop | None = None) -> Future | asyncio.Future:
        """Sends msg_of(rid); the future resolves with the child's answer to rid
        (rid -1: drain and close, which answer once). With `loop`, an asyncio
        future of that loop."""
        fut = loop.create_future() if loop is not None else Future()
        if not self._up:
            fut.set_exception(EngineUnavailable("the analysis process is restarting"))
            return fut
        rid = next(self._ids) if rid is None else rid
        with self._lock:
            self._pending[rid] = fut
        self._pipe.put(msg_of(rid))
        return fut

    # -- what the servicer uses
    def submit(self, batch: pb.SampleBatch) -> Future | asyncio.Future:
        """Validate, decode, and hand to the child; raises BatchError (nothing
        sent) for invalid input."""
        return self.submit_decoded(self.check(batch))

    def check(self, batch: pb.SampleBatch) -> DecodedBatch:
        """Validates and decodes, on any thread; raises BatchError, counted
        and logged by the child, for invalid input."""
        return decode_counted(batch, self.count_rejected)

    def submit_decoded(self, decoded: DecodedBatch) -> Future | asyncio.Future:
        """Hands a decoded batch to the child. Called on an event loop, the
        future is one of that loop: the reader thread then wakes the loop
        once per bundle of answers, not once per batch."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        return self._request(lambda rid: ("batch", rid, decoded), loop=loop)

    def note_held(self, host: str) -> None:
        self._tell(("held", host))

    def count_rejected(self, batch: pb.SampleBatch | None, error: str) -> None:
        self._tell(("rejected", batch.host[:253] if batch is not None else "", batch.seq if batch is not None else 0,
                    error[:1000]))

    def call(self, name: str, *args, timeout: float = CALL_TIMEOUT_S, **kwargs) -> Any:
        assert name in CALLS, name
        rid = next(self._ids)
        fut = self._request(lambda r: ("call", r, name, args, kwargs), rid=rid)
        try:
            return fut.result(timeout=timeout)
        except TimeoutError:
            with self._lock:                 # a late answer finds nobody waiting
                self._pending.pop(rid, None)
            raise EngineUnavailable(f"the analysis process did not answer within {timeout:g} s") from None

    def status(self, host: str = "", gpu_limit: int | None = None) -> dict:
        """Answered here, from the mirror of the child's state as of its last
        commit group or sweep: the child's GIL belongs to its writer."""
        if not self._mirrored():                          # none yet, or the child is stuck: ask it
            return self.call("status", host, gpu_limit)
        return self.mirror.status(time.time(), host, gpu_limit, agents_connected=len(self.commands.hosts))

    def list_findings(self, **query) -> list[dict]:
        """Answered here from the mirror of the findings the child wrote
        when it can answer exactly (analyzers/findings_mirror.py); otherwise
        the child finds the rows (DuckDB, without its GIL) and the live
        numbers of open ones, and the rows are built here."""
        rows = self.findings_mirror.answer(**query) if self._mirrored() else None
        return rows if rows is not None else merge_live(*self.call("findings_payload", **query))

    def findings_messages(self, convert: Callable[[dict], Any], variant: str, **query) -> list:
        """`list_findings`' rows as `convert` makes them (the reply's
        messages); from the mirror, what it made of a row is kept until the
        row is written again."""
        made = self.findings_mirror.messages(convert, variant, **query) if self._mirrored() else None
        return made if made is not None else [convert(r) for r in self.list_findings(**query)]

    def _mirrored(self) -> bool:
        """Whether the child published lately: a stuck or restarting one's
        mirrors are not answered from."""
        return self.mirror.age() <= self.mirror_max_age_s

    def finding(self, finding_id: str) -> dict | None:
        return self.call("finding", finding_id)

    def report(self, finding_id: str, context_s: float = 0.0) -> dict | None:
        return self.call("report", finding_id, context_s)

    def range_report(self, start: float, end: float, host: str = "", gpu: int | None = None,
                     max_points: int = 0, max_gpus: int = 0) -> dict:
        # a month of a host's samples is a few scans of millions of rows: longer than a lookup's 8 s
        return self.call("range_report", start, end, host, gpu, max_points, max_gpus, timeout=RANGE_REPORT_TIMEOUT_S)

    def top(self, start: float, end: float, host: str = "", by: str = "gpu", limit: int = 20) -> list[dict]:
        return self.call("top", start, end, host, by, limit)

    def report_capture(self, record, xspace: bytes) -> dict:
        return self.call("report_capture", record, xspace, timeout=CAPTURE_TIMEOUT_S)

    def list_programs(self, start: float, host: str = "", fingerprint: str = "", limit: int = 200) -> list[dict]:
        return self.call("list_programs", start, host, fingerprint, limit)

    def list_jobs(self, start: float, job: str = "", limit: int = 200) -> list[dict]:
        return self.call("list_jobs", start, job, limit)

    def job_ranks(self, job: str, since_s: float = 600.0) -> list[dict]:
        return self.call("job_ranks", job, since_s)

    def job_skew(self, group: str) -> dict:
        return self.call("job_skew", group)

    def report_calibration(self, host: str, record: dict) -> dict:
        return self.call("report_calibration", host, record)

    def drain(self, timeout_s: float = 6.0) -> None:
        """The child commits what it holds (bounded in time) and answers it."""
        if self._up:
            try:
                self._request(lambda _rid: ("drain", timeout_s), rid=-1).result(timeout=timeout_s + 1)
            except Exception as exc:  # a child that cannot drain is stopped by close()
                log.warning("analysis process did not drain", error=str(exc)[:200])

    def close(self) -> None:
        self._closing = True
        if self._up:
            try:
                self._request(lambda _rid: ("close", None), rid=-1).result(timeout=3)
            except Exception as exc:  # noqa: BLE001 - stopped below either way
                log.warning("analysis process did not close", error=str(exc)[:200])
        if self._proc is not None:
            self._proc.join(2)
            if self._proc.is_alive():      # stalled: stop within the 10 s a stop may take
                self._kill_child()
        atexit.unregister(self._kill_child)
