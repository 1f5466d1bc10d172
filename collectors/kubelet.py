"""Which Kubernetes pod holds each GPU, from the kubelet's pod-resources API
(v1, protos/gpuscope/k8s/podresources/v1/api.proto) on its Unix socket.

A client, never a server. `List` names, per pod and container, the devices
the device plugin gave it; GPUs are resource `nvidia.com/gpu`, whose device
ids are GPU UUIDs (`GPU-1b2c...`), or indexes (`0`, `1`) when the plugin runs
with DEVICE_ID_STRATEGY=index; a time-sliced GPU's replicas carry `::N`
after the UUID. `GetAllocatableResources` is asked once, to say how many GPUs
the kubelet knows and which kind of id it uses.

The answer is refreshed every `refresh_s` on a thread of its own: the
sampling tick only reads the last answer (a dict swapped whole), so a slow
or absent kubelet never holds a sample up. Each failure has its own status,
and the last good answer is kept only while the kubelet is merely
unreachable (a restart), not when the socket is gone or access is refused:
  absent             no socket at the path (not a Kubernetes node, or the
                     agent's pod lacks the hostPath mount)
  not a socket       something else is at the path (a file, a directory)
  permission denied  the socket refuses us (not root), or the kubelet does
  unimplemented      a kubelet without pod-resources v1 List
  unreachable        no answer in `timeout_s` (kubelet restarting)
"""
from __future__ import annotations

import os
import stat
import threading
import time
from dataclasses import dataclass
from typing import Callable

import grpc
import structlog

from gpuscope.k8s.podresources.v1 import api_pb2 as pr, api_pb2_grpc as pr_grpc

from .attribution import PodRef

log = structlog.get_logger("gpuscope.kubelet")

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
GPU_RESOURCES = ("nvidia.com/gpu",)
MAX_MESSAGE_BYTES = 16 << 20        # the kubelet's own limit for this API: a large node's List fits


@dataclass(frozen=True)
class KubeletConfig:
    socket: str = DEFAULT_SOCKET
    refresh_s: float = 30.0
    timeout_s: float = 2.0
    resources: tuple[str, ...] = GPU_RESOURCES


def device_key(device_id: str) -> str | None:
    """A device id as holders() looks it up: a GPU UUID in lower case without
    a time-slicing replica's `::N`, or `#N` for an index; None for what names
    no whole GPU we sample (a MIG instance's `MIG-...`)."""
    device_id = device_id.strip().split("::", 1)[0]
    if device_id.isdigit():
        return f"#{int(device_id)}"
    if device_id.upper().startswith("GPU-"):
        return device_id.lower()
    return None


class PodResources:
    """The kubelet client: `holders(uuid, index)` from the last answer."""

    def __init__(self, config: KubeletConfig = KubeletConfig(),
                 channel_factory: Callable[[str], grpc.Channel] | None = None,
                 clock: Callable[[], float] = time.time):
        self.config = config
        self._clock = clock
        self._factory = channel_factory or (lambda target: grpc.insecure_channel(target, options=(
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),)))
        self._channel: grpc.Channel | None = None
        self._by_device: dict[str, tuple[PodRef, ...]] = {}
        self.generation = 0
        self._state = "starting: the first answer is on its way"
        self._allocatable: str | None = None          # None: not asked yet
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()                 # one refresh at a time (the thread, a test's call)

    # -- what attribution asks ------------------------------------------------------------
    def holders(self, uuid: str, index: int) -> tuple[PodRef, ...]:
        by_device = self._by_device
        return by_device.get(uuid.lower()) or by_device.get(f"#{index}", ())

    def status(self) -> str:
        return self._state + (f"; {self._allocatable}" if self._allocatable else "")

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kubelet-pod-resources", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.config.timeout_s + 1)
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def _run(self) -> None:
        said = ""
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception as exc:  # top of a loop that must survive
                self._state = f"error: {type(exc).__name__}: {exc}"
                log.exception("kubelet pod-resources refresh failed", socket=self.config.socket)
            said = self._say(said)
            self._stop.wait(self.config.refresh_s)

    def _say(self, said: str) -> str:
        """Logs the state when its kind changes (the first answer at start-up
        included): absent from the default path is an ordinary host, not a
        fault; anything short of ok elsewhere is."""
        kind = self._state.split(":", 1)[0]
        if kind != said:
            quiet = kind == "ok" or (kind == "absent" and self.config.socket == DEFAULT_SOCKET)
            (log.info if quiet else log.warning)("kubelet pod-resources: " + self.status(),
                                                 socket=self.config.socket)
        return kind

    # -- one refresh -----------------------------------------------------------------------
    def refresh(self) -> None:
        """Asks the kubelet once (List; GetAllocatableResources the first
        time it answers) and swaps the answer in; the status says how it went."""
        with self._lock:
            path = self.config.socket
            if not os.path.exists(path):
                self._drop(f"absent: no kubelet socket at {path} (not a Kubernetes node, or the agent's pod "
                           f"lacks a hostPath mount of {os.path.dirname(path)}: docs/operations.md)")
                return
            mode = os.stat(path).st_mode
            if not stat.S_ISSOCK(mode):
                what = "a directory" if stat.S_ISDIR(mode) else "a regular file" if stat.S_ISREG(mode) else \
                    "not a socket"
                self._drop(f"not a socket: {path} is {what}; --kubelet-socket names the kubelet's pod-resources "
                           f"socket ({DEFAULT_SOCKET}), mounted into the agent's pod from the host")
                return
            if not os.access(path, os.R_OK | os.W_OK):
                self._drop(f"permission denied: {path} is not writable by this user (uid {os.getuid()}); run the "
                           f"agent as root, as the kubelet's socket is")
                return
            stub = pr_grpc.PodResourcesListerStub(self._channel_for(path))
            try:
                answer = stub.List(pr.ListPodResourcesRequest(), timeout=self.config.timeout_s)
            except grpc.RpcError as exc:
                self._failed("List", exc)
                return
            self._take(answer)
            if self._allocatable is None:
                self._ask_allocatable(stub)

    def _channel_for(self, path: str) -> grpc.Channel:
        if self._channel is None:
            self._channel = self._factory(f"unix://{os.path.abspath(path)}")
        return self._channel

    def _take(self, answer: pr.ListPodResourcesResponse) -> None:
        by_device: dict[str, list[PodRef]] = {}
        unmapped = 0
        for pod in answer.pod_resources:
            for c in pod.containers:
                for d in c.devices:
                    if d.resource_name not in self.config.resources:
                        continue
                    for dev in d.device_ids:
                        key = device_key(dev)
                        if key is None:
                            unmapped += 1
                            continue
                        ref = PodRef(pod.namespace, pod.name, c.name)
                        held = by_device.setdefault(key, [])
                        if ref not in held:
                            held.append(ref)
        frozen = {k: tuple(v) for k, v in by_device.items()}
        pods = {(r.namespace, r.pod) for v in frozen.values() for r in v}
        self._swap(frozen)
        self._state = (f"ok: {len(frozen)} GPUs held by {len(pods)} pods"
                       + (f"; {unmapped} device ids name no whole GPU (MIG instances), not attributed"
                          if unmapped else ""))

    def _ask_allocatable(self, stub) -> None:
        try:
            a = stub.GetAllocatableResources(pr.AllocatableResourcesRequest(), timeout=self.config.timeout_s)
        except grpc.RpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.UNIMPLEMENTED:
                self._allocatable = ("allocatable GPUs unknown (GetAllocatableResources unimplemented: the "
                                     "KubeletPodResourcesGetAllocatable feature gate is off)")
            elif code == grpc.StatusCode.PERMISSION_DENIED:
                self._allocatable = f"allocatable GPUs unknown (refused: {exc.details()})"
            return                                   # unreachable: asked again next time
        ids = [i for d in a.devices if d.resource_name in self.config.resources for i in d.device_ids]
        kinds = sorted({"index" if device_key(i) and device_key(i).startswith("#") else "UUID" for i in ids})
        self._allocatable = (f"{len(ids)} allocatable {'/'.join(self.config.resources)} "
                             f"(by {' and '.join(kinds) or 'no id'})")

    def _failed(self, call: str, exc: grpc.RpcError) -> None:
        code, details = exc.code(), exc.details() or ""
        if code == grpc.StatusCode.PERMISSION_DENIED or "permission denied" in details.lower():
            self._drop(f"permission denied: the kubelet refused {call}: {details}")
        elif code == grpc.StatusCode.UNIMPLEMENTED:
            self._drop(f"unimplemented: this kubelet does not serve pod-resources v1 {call} ({details}); pods are "
                       f"known by their cgroup's UID only")
        else:
            kept = (f"; pods as of {time.strftime('%H:%M:%S', time.localtime(self._answered))}"
                    if self._by_device else "")
            self._state = f"unreachable: {code.name}: {details}{kept}"

    def _drop(self, state: str) -> None:
        """A lasting failure: no pod is named from an answer we can no longer check."""
        self._swap({})
        self._state = state
        self._allocatable = None

    _answered = 0.0

    def _swap(self, by_device: dict[str, tuple[PodRef, ...]]) -> None:
        if by_device:
            self._answered = self._clock()
        if by_device != self._by_device:
            self._by_device = by_device
            self.generation += 1
