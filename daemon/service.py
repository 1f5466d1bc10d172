"""gRPC servicer of the agent's own API: status and recent samples."""
from __future__ import annotations

import math
import resource

from gpuscope.v1 import agent_pb2 as apb, agent_pb2_grpc

import grpc

from gpuscope.security.auth import sees_full_commands
from gpuscope.security.context import current_caller
from gpuscope.security.redact import command_label

from .agent import Agent, TargetNotAllowed
from .convert import attribution_pb, capture_pb, device_pb, encode_batch

DEFAULT_CAPTURE_MS = 2000


def _reader_only() -> bool:
    """Command lines (redacted already) are shown in full to operators, and
    on an insecure loopback server, where there is no caller to tell apart."""
    caller = current_caller()
    return caller is not None and not sees_full_commands(caller)


ANSWER_MARGIN_S = 5.0     # a capture answers this long before its caller's deadline


class AgentServicer(agent_pb2_grpc.AgentServicer):
    def __init__(self, agent: Agent, analyzer_target: str = ""):
        self.agent = agent
        self.analyzer_target = analyzer_target

    def GetStatus(self, request, context):
        s = self.agent.status()
        up = s["uplink"]
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return apb.AgentStatus(
            host=s["host"], boot_id=s["boot_id"], source=s["source"], interval_seconds=s["interval_s"],
            ticks=s["ticks"], samples=s["samples"], dropped_samples=up.get("dropped_samples", 0),
            batches_sent=up.get("batches_sent", 0), batches_acked=up.get("batches_acked", 0),
            batches_rejected=up.get("batches_rejected", 0), unacked_samples=up.get("unacked_samples", 0),
            uplink_connected=up.get("connected", False), analyzer=self.analyzer_target,
            devices=[device_pb(d) for d in s["devices"]], cpu_seconds=ru.ru_utime + ru.ru_stime,
            tick_overruns=s["tick_overruns"], last_error=up.get("last_error") or s["last_error"],
            source_errors=s["errors"], attribution=s["attribution"])

    def RecentSamples(self, request, context):
        if not math.isfinite(request.seconds) or request.seconds < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"seconds: {request.seconds!r}; give the newest seconds of the ring, or 0 for all of it")
        devices = self.agent.devices()
        if request.HasField("gpu") and request.gpu not in {d.gpu for d in devices}:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"gpu: {request.gpu}; this host's GPUs are "
                          f"{', '.join(str(d.gpu) for d in devices) or 'none'}")
        samples = self.agent.recent(request.seconds, request.gpu if request.HasField("gpu") else None)
        batch = encode_batch(self.agent.config.host, self.agent.boot_id, 0, samples, devices)
        if _reader_only():
            for p in batch.processes:
                p.command = command_label(p.command)
        return batch

    def Capture(self, request, context):
        target = request.WhichOneof("target")
        if target is None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "target: give jax_address (HOST:PORT) or pid")
        try:
            remaining = context.time_remaining()
            rec, data = self.agent.capture(request.duration_ms or DEFAULT_CAPTURE_MS,
                                           address=request.jax_address, pid=request.pid if target == "pid" else None,
                                           trigger=request.trigger or "on-call",
                                           budget_s=remaining - ANSWER_MARGIN_S if remaining is not None else None)
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"duration_ms: {exc}")
        except LookupError as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except TargetNotAllowed as exc:     # an address the agent does not know: never contacted
            context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        return apb.CaptureReply(record=capture_pb(rec), xspace=data)

    def ListCaptures(self, request, context):
        runner = self.agent.captures
        replies = [capture_pb(r) for r in (runner.records if runner else [])]
        if _reader_only():
            for c in replies:
                c.job = command_label(c.job)
        return apb.ListCapturesReply(captures=replies)

    def ListJobs(self, request, context):
        owners = self.agent.owners()
        return apb.ListJobsReply(jobs=[apb.Job(pid=j.pid or 0, address=j.address, gpus=j.gpus, command=j.command,
                                               found_by=j.found_by, kind=j.kind, trace_dir=j.trace_dir,
                                               attribution=attribution_pb(owners[j.pid]) if j.pid in owners else None)
                                       for j in self.agent.jobs()])
