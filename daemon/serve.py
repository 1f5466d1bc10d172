"""A gRPC server with the standard health service and graceful shutdown."""
from __future__ import annotations

from concurrent import futures
from typing import Callable, Iterable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

MAX_MESSAGE_BYTES = 256 * 1024 * 1024   # a capture's XSpace travels in one message


class ListenError(RuntimeError):
    pass


def parse_hostport(value: str, flag: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{flag}: {value!r} is not HOST:PORT")
    return value


def build_server(listen: str, register: Iterable[tuple[Callable, object, str]],
                 max_workers: int = 256) -> tuple[grpc.Server, int, health.HealthServicer]:
    """register: (add_XServicer_to_server, servicer, full service name).

    The sync server holds a thread per call in progress, and agents keep two
    calls open (Ingest, Commands), so an analyzer's max_workers bounds its
    agents at about half of it. Threads are created only as calls arrive."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc"),
                         options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                                  ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)],
                         maximum_concurrent_rpcs=max_workers)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for add, servicer, name in register:
        add(servicer, server)
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    try:
        port = server.add_insecure_port(listen)
    except RuntimeError as exc:
        raise ListenError(f"cannot listen on {listen}: {exc} (is the port in use?)") from exc
    if port == 0 and not listen.endswith(":0"):
        raise ListenError(f"cannot listen on {listen} (is the port in use?)")
    return server, port, health_servicer


def shutdown(server: grpc.Server, health_servicer: health.HealthServicer, grace_s: float = 2.0) -> None:
    health_servicer.enter_graceful_shutdown()
    server.stop(grace_s).wait(grace_s + 1)
