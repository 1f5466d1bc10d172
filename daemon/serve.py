"""gRPC servers: grpc.aio on a loop thread of their own, with the standard
health service, authentication of every call, graceful shutdown, and a
refusal to share a port.

Async servicers (the analyzer's) run on the loop with no thread per call;
sync servicers (the agent's) run on a small pool. A port already in use is
an error at start-up naming the process that holds it: grpcio otherwise
sets SO_REUSEPORT and two analyzers would split the agents between them.
"""
from __future__ import annotations

import asyncio
import errno
import inspect
import itertools
import os
import socket
import threading
import traceback
from concurrent import futures
from typing import Callable, Iterable

import grpc
import structlog
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from gpuscope.security.context import CALLER
from gpuscope.security.redact import redact_command

MAX_MESSAGE_BYTES = 256 * 1024 * 1024   # a capture's XSpace travels in one reply (Agent.Capture)
# The most a server takes in one message. Agents' batches are cut at 8 MiB
# (daemon/uplink.py) and their traces come in 1 MiB chunks (UploadCapture):
# every message a server receives is copied on its event loop before any
# check of ours, so a larger limit is what one bad client's garbage costs
# every other stream (docs/benchmarks.md, "One bad client").
MAX_RECEIVE_BYTES = 32 * 1024 * 1024
# The most a server on an extra port (the on-call token port: TLS without
# client certificates, so anyone may connect) takes in one message. On-call
# requests are small; a caller's 30 MiB message passes through memory the
# allocator keeps (docs/benchmarks.md), and there the caller may be anyone.
EXTRA_PORT_RECEIVE_BYTES = 1024 * 1024

# authenticate(method, auth_context, metadata) -> (caller, denial, done): denial None or (code, message);
# done None or a callable told how an allowed call ended ("ok" or its status code's name) and what its request
# named (_acted_on), for the audit log
Authenticate = Callable[[str, dict, tuple], tuple[object, tuple[grpc.StatusCode, str] | None,
                                                 Callable[[str, str], None] | None]]


class ListenError(RuntimeError):
    pass


def parse_hostport(value: str, flag: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{flag}: {value!r} is not HOST:PORT")
    return value


class Server:
    """Runs a grpc.aio server on its own event loop thread, so the rest of
    the process (writer, scheduler, agent) keeps its threads; extra ports
    (the on-call token port) are a second server on the same loop, with the
    same services and a small receive limit."""

    def __init__(self, listen: str, register: Iterable[tuple[Callable, object, str]], *,
                 credentials: grpc.ServerCredentials | None = None, authenticate: Authenticate | None = None,
                 sync_workers: int = 8, max_concurrent_rpcs: int | None = None,
                 extra_ports: Iterable[tuple[str, grpc.ServerCredentials | None, str]] = ()):
        self.listen = listen
        self._extra_ports = list(extra_ports)
        self.extra_ports: list[int] = []
        self._extra = None            # the server of the extra ports
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="grpc-aio", daemon=True)
        self._thread.start()
        self._pool = futures.ThreadPoolExecutor(max_workers=sync_workers, thread_name_prefix="grpc-sync")
        self._register = list(register)
        try:
            self.port = self._run(self._build(credentials, authenticate, max_concurrent_rpcs))
        except BaseException:
            self._close_loop()
            raise

    def _run(self, coro, timeout: float | None = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _build(self, credentials, authenticate, max_concurrent_rpcs) -> int:
        self.health = health_aio.HealthServicer()
        self._server = await self._aio_server(authenticate, max_concurrent_rpcs, MAX_RECEIVE_BYTES)
        for add, servicer, name in self._register:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        port = self._bind(self._server, self.listen, credentials)
        # e.g. the on-call port: TLS without client certificates, for bearer tokens; a server of its
        # own, because gRPC's receive limit is a server's, and this one takes small messages only
        if self._extra_ports:
            self._extra = await self._aio_server(authenticate, max_concurrent_rpcs, EXTRA_PORT_RECEIVE_BYTES)
            self.extra_ports = [self._bind(self._extra, addr, creds, flag) for addr, creds, flag in self._extra_ports]
        return port

    async def _aio_server(self, authenticate, max_concurrent_rpcs, receive_bytes: int):
        interceptors = [_ReleaseOnError(), *([_AuthInterceptor(authenticate)] if authenticate is not None else []),
                        _WireErrors()]
        server = grpc.aio.server(
            migration_thread_pool=self._pool, interceptors=interceptors,
            options=[("grpc.max_receive_message_length", receive_bytes),
                     ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                     ("grpc.so_reuseport", 0),
                     # gRPC's bandwidth-delay probing grows each stream's window for large messages,
                     # and gRPC then reads that far ahead of the stream's handler, outside any budget
                     # of ours: 12 streams of 7 MB batches held ~45 MB each (docs/benchmarks.md,
                     # "Streams of large batches"). Without it a stream buffers 64 KiB ahead, and a
                     # pending read still takes its whole message at once.
                     ("grpc.http2.bdp_probe", 0)],
            maximum_concurrent_rpcs=max_concurrent_rpcs)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        for add, servicer, _name in self._register:
            add(servicer, server)
        return server

    @staticmethod
    def _bind(server, listen: str, credentials: grpc.ServerCredentials | None, flag: str = "--listen") -> int:
        ensure_free(listen, flag)
        try:
            port = (server.add_secure_port(listen, credentials) if credentials is not None
                    else server.add_insecure_port(listen))
        except RuntimeError as exc:
            raise ListenError(_busy_message(listen, str(exc), flag)) from None
        if port == 0 and not listen.endswith(":0"):
            raise ListenError(_busy_message(listen, "bind failed", flag))
        return port

    def start(self) -> None:
        self._run(self._server.start())
        if self._extra is not None:
            self._run(self._extra.start())

    def stop(self, grace_s: float = 2.0) -> None:
        """Health says NOT_SERVING, calls in progress get grace_s to finish,
        then are cancelled."""
        if not self._thread.is_alive():
            return
        try:
            self._run(self.health.enter_graceful_shutdown(), timeout=5)
            self._run(self._stop_servers(grace_s), timeout=grace_s + 5)
        except (futures.TimeoutError, RuntimeError):
            pass
        self._close_loop()

    async def _stop_servers(self, grace_s: float) -> None:
        await asyncio.gather(*(s.stop(grace_s) for s in (self._server, self._extra) if s is not None))

    def _close_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)


def build_server(listen: str, register: Iterable[tuple[Callable, object, str]], max_workers: int = 8,
                 **security) -> tuple[Server, int, object]:
    """register: (add_XServicer_to_server, servicer, full service name).
    max_workers sizes the pool for sync servicers only; async ones need none."""
    server = Server(listen, register, sync_workers=max_workers, **security)
    return server, server.port, server.health


def shutdown(server: Server, _health=None, grace_s: float = 2.0) -> None:
    server.stop(grace_s)


# -- requests that are not messages ---------------------------------------------------------

class _Undecodable:
    __slots__ = ("error",)

    def __init__(self, error: str):
        self.error = error


class _ReleaseOnError(grpc.aio.ServerInterceptor):
    """An aborted call lets go of what it received at once. grpc.aio keeps
    the abort's exception on the call's state, which the handler's frames
    reference: a cycle that holds the request and everything the handler
    made of it until the cyclic collector's oldest generation runs, which
    the analyzer's thresholds make rare (engine.GC_THRESHOLDS). Found in a
    trial: each refused 6 MB batch kept 12 MB, 2.3 GB after 200 refusals.
    The outermost wrapper clears the frames the exception passed through
    (they have returned), and holds no request itself."""

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None:
            return None
        for k in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
            behavior = getattr(handler, k)
            if behavior is not None and inspect.iscoroutinefunction(behavior):
                return handler._replace(**{k: _released(behavior)})
            if behavior is not None and inspect.isasyncgenfunction(behavior):
                return handler._replace(**{k: _released_gen(behavior)})
        return handler


def _released(behavior):
    async def coro(request, context):
        box = [request]
        del request                     # this frame is still running when the others are cleared
        try:
            return await behavior(box.pop(), context)
        except BaseException as exc:
            _clear(exc)
            raise
    return coro


def _released_gen(behavior):
    async def agen(request, context):
        box = [request]
        del request
        try:
            async for item in behavior(box.pop(), context):
                yield item
        except BaseException as exc:
            _clear(exc)
            raise
    return agen


def _clear(exc: BaseException | None) -> None:
    """The frames of an exception and of those it was raised while handling
    (`except UploadError: await context.abort(...)`: the upload's frames)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)
        exc = exc.__cause__ or exc.__context__


class _WireErrors(grpc.aio.ServerInterceptor):
    """Bytes that are not the method's message get INVALID_ARGUMENT naming
    the method, not grpc's UNKNOWN "Unexpected DecodeError": async handlers
    (the analyzer's, which agents and anyone on the network reach) and sync
    ones (the agent's API, run on the pool)."""

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None or handler.request_deserializer is None:
            return handler
        for k in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
            behavior = getattr(handler, k)
            if behavior is not None:
                check = (_checked if inspect.iscoroutinefunction(behavior) or inspect.isasyncgenfunction(behavior)
                         else _checked_sync)
                return handler._replace(request_deserializer=_tolerant(handler.request_deserializer),
                                        **{k: check(behavior, details.method, k.startswith("stream"))})
        return handler


def _tolerant(deserialize):
    def parse(data: bytes):
        try:
            return deserialize(data)
        except DecodeError as exc:
            return _Undecodable(str(exc))
    return parse


def _checked(behavior, method: str, streams_in: bool):
    async def refuse(context, bad: _Undecodable):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                            f"{method}: the request is not a valid message ({bad.error})")

    def requests(source, context):
        async def gen():
            async for item in source:
                if isinstance(item, _Undecodable):
                    await refuse(context, item)
                yield item
        return gen()

    if inspect.isasyncgenfunction(behavior):
        async def agen(request, context):
            if streams_in:
                request = requests(request, context)
            elif isinstance(request, _Undecodable):
                await refuse(context, request)
            async for item in behavior(request, context):
                yield item
        return agen

    async def coro(request, context):
        if streams_in:
            request = requests(request, context)
        elif isinstance(request, _Undecodable):
            await refuse(context, request)
        return await behavior(request, context)
    return coro


def _checked_sync(behavior, method: str, streams_in: bool):
    """_checked for a sync handler: its context's abort raises, in the pool's thread."""
    def refuse(context, bad: _Undecodable):
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{method}: the request is not a valid message ({bad.error})")

    def requests(source, context):
        for item in source:
            if isinstance(item, _Undecodable):
                refuse(context, item)
            yield item

    def call(request, context):
        if streams_in:
            request = requests(request, context)
        elif isinstance(request, _Undecodable):
            refuse(context, request)
        return behavior(request, context)

    if inspect.isgeneratorfunction(behavior):           # grpc tells a sync stream of replies by its kind
        def gen(request, context):
            yield from call(request, context)
        return gen
    return call


# -- authentication ------------------------------------------------------------------------

class _AuthInterceptor(grpc.aio.ServerInterceptor):
    """Authenticates and authorizes every call before its handler runs, and
    hands the caller to the servicer through security.context.CALLER."""

    def __init__(self, authenticate: Authenticate):
        self._authenticate = authenticate

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None:
            return None
        kind = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
        for k in kind:
            behavior = getattr(handler, k)
            if behavior is not None:
                wrapped = _guard(behavior, details.method, self._authenticate, k.endswith("_stream"))
                return handler._replace(**{k: wrapped})
        return handler


def _guard(behavior, method: str, authenticate: Authenticate, streams_out: bool):
    """The handler wrapped: authenticate, refuse, or run it with CALLER set,
    and say how it ended to whoever asked (the audit log of operator
    actions: "allowed" alone would not say whether the capture happened).
    One wrapper per handler kind, because gRPC tells them apart by kind."""
    def enter(context, request, sync: bool):
        """The refusal, if any; the call's _Call; the context the handler gets."""
        caller, denial, done = authenticate(method, context.auth_context(),
                                            tuple(context.invocation_metadata() or ()))
        if denial:
            return denial, None, context
        if done is not None and sync:    # grpc.aio's context for sync handlers keeps no code: _Ending does
            context = _Ending(context)
        return None, _Call(method, CALLER.set(caller), done, context, request), context

    if inspect.isasyncgenfunction(behavior):
        async def agen(request, context):
            denial, call, context = enter(context, request, sync=False)
            if denial:
                await context.abort(*denial)
            with call:
                async for item in behavior(request, context):
                    yield item
        return agen
    if inspect.iscoroutinefunction(behavior):
        async def coro(request, context):
            denial, call, context = enter(context, request, sync=False)
            if denial:
                await context.abort(*denial)
            with call:
                return await behavior(request, context)
        return coro

    if streams_out:                    # a sync generator on the thread pool
        def gen(request, context):
            denial, call, context = enter(context, request, sync=True)
            if denial:
                context.abort(*denial)
            with call:
                yield from behavior(request, context)
        return gen

    def unary(request, context):
        denial, call, context = enter(context, request, sync=True)
        if denial:
            context.abort(*denial)
        with call:
            return behavior(request, context)
    return unary


class _Call:
    """An allowed call while its handler runs: CALLER set, and at its end
    `done` told how it ended and what its request named."""
    __slots__ = ("method", "token", "done", "context", "request")

    def __init__(self, method: str, token, done, context, request) -> None:
        self.method, self.token, self.done, self.context, self.request = method, token, done, context, request

    def __enter__(self) -> "_Call":
        return self

    def __exit__(self, _kind, error: BaseException | None, _tb) -> None:
        CALLER.reset(self.token)
        if self.done is not None:
            try:
                self.done(_ended(self.context, error), _acted_on(self.request))
            except Exception:   # the audit line must never change how the call ended
                structlog.get_logger("gpuscope.audit").exception("audit line failed", method=self.method)


def _acted_on(request) -> str:
    """What an operator action's request names (`pid=461 duration_ms=2000`),
    for its audit line: a message's scalar fields, redacted and cut short;
    nothing for a stream of requests or bytes that were no message."""
    if not hasattr(request, "ListFields"):
        return ""
    fields = " ".join(f"{f.name}={v}" for f, v in request.ListFields() if isinstance(v, (str, int, float)))
    return redact_command(fields)[:300]


class _Ending:
    """A sync handler's context that remembers the code the call ends with:
    grpc.aio's context for sync handlers has no code() (found in a trial:
    the agent's refused captures were audited as "failed")."""
    __slots__ = ("_context", "_code")

    def __init__(self, context):
        self._context, self._code = context, None

    def __getattr__(self, name):
        return getattr(self._context, name)

    def abort(self, code, details=""):
        self._code = code
        return self._context.abort(code, details)

    def set_code(self, code):
        self._code = code
        return self._context.set_code(code)

    def code(self):
        return self._code


def _ended(context, error: BaseException | None) -> str:
    """How a call ended: "ok", the status code its handler set or aborted
    with, "cancelled" when its caller went away, or "failed"."""
    try:
        code = context.code()
    except Exception:           # a context that keeps no code
        code = None
    if isinstance(code, grpc.StatusCode) and code != grpc.StatusCode.OK:
        return code.name
    if error is None:
        return "ok"
    if isinstance(error, (asyncio.CancelledError, GeneratorExit)):
        return "cancelled"
    return "failed"


# -- a busy port ---------------------------------------------------------------------------

def ensure_free(listen: str, flag: str = "--listen") -> None:
    """Raises ListenError when any address `listen` resolves to is taken.
    grpc binds every address of a name (`localhost`: 127.0.0.1 and ::1) and
    succeeds when one of them binds, so a second server could take ::1
    while the first holds 127.0.0.1; checking first also keeps grpc's own
    bind error off the terminal."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or None
    if not port.isdigit() or int(port) == 0:
        return
    try:
        addrs = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ListenError(f"cannot listen on {listen}: {exc.strerror}") from None
    for family, kind, proto, _, addr in addrs:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)    # as grpc: TIME_WAIT is no holder
            try:
                s.bind(addr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise ListenError(_busy_message(listen, f"{addr[0]} in use", flag)) from None
                if exc.errno != errno.EADDRNOTAVAIL:     # e.g. no IPv6 here: grpc skips it too
                    raise ListenError(f"cannot listen on {listen}: {exc.strerror}") from None


def _busy_message(listen: str, detail: str, flag: str = "--listen") -> str:
    port = listen.rpartition(":")[2]
    holder = port_holder(int(port)) if port.isdigit() and int(port) else None
    who = f"; held by {holder}" if holder else ""
    return (f"cannot listen on {listen}: the address is in use ({detail}){who}; "
            f"stop that process, or pass {flag} with another port")


def port_holder(port: int, proc: str = "/proc") -> str | None:
    """`pid 123 (gpuscope analyzer ...)` for a TCP socket listening on port,
    when /proc lets us see it (another user's process shows no fds)."""
    inodes = set()
    for name in ("net/tcp", "net/tcp6"):
        try:
            with open(os.path.join(proc, name)) as f:
                next(f, None)
                for line in f:
                    parts = line.split()
                    if len(parts) > 9 and parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(parts[9])
        except OSError:
            continue
    if not inodes:
        return None
    wanted = {f"socket:[{i}]" for i in inodes}
    for pid in filter(str.isdigit, os.listdir(proc)):
        if _fd_links(os.path.join(proc, pid, "fd")) & wanted:
            try:
                with open(os.path.join(proc, pid, "cmdline"), "rb") as f:
                    words = f.read(300).replace(b"\0", b" ").decode(errors="replace").split()
                # the program and its command, not its flags: their values can hold secrets that no
                # flag name gives away (a webhook URL's path)
                cmd = redact_command(" ".join(itertools.takewhile(lambda w: not w.startswith("-"), words)))
            except OSError:
                cmd = "?"
            return f"pid {pid} ({cmd})"
    return None


def _fd_links(fd_dir: str) -> set[str]:
    links = set()
    try:
        names = os.listdir(fd_dir)
    except OSError:          # gone, or another user's
        return links
    for fd in names:
        try:
            links.add(os.readlink(os.path.join(fd_dir, fd)))
        except OSError:      # closed meanwhile
            continue
    return links
