"""The kubelet client against a real gRPC server on a Unix socket, serving
the pod-resources v1 API from the stubs generated from the kubelet's own
api.proto: GPUs by UUID (with time-slicing replicas) and by index, MIG
instances, the socket absent, the kubelet answering PERMISSION_DENIED or
UNIMPLEMENTED, and a kubelet that goes away and comes back."""
from __future__ import annotations

from concurrent import futures

import grpc
import pytest

from gpuscope.collectors.attribution import PodRef
from gpuscope.collectors.kubelet import KubeletConfig, PodResources, device_key
from gpuscope.k8s.podresources.v1 import api_pb2 as pr, api_pb2_grpc as pr_grpc

UUID0, UUID1 = "GPU-1b2c3d4e-0000-1111-2222-333344445555", "GPU-9f8e7d6c-0000-1111-2222-333344445555"


def pod(namespace, name, *containers):
    """containers: (name, resource, [device ids])."""
    return pr.PodResources(namespace=namespace, name=name, containers=[
        pr.ContainerResources(name=c, devices=[pr.ContainerDevices(resource_name=res, device_ids=ids)])
        for c, res, ids in containers])


class Kubelet(pr_grpc.PodResourcesListerServicer):
    def __init__(self):
        self.pods: list[pr.PodResources] = []
        self.allocatable: list[str] = []
        self.refuse: grpc.StatusCode | None = None       # List answers this instead
        self.no_allocatable = False
        self.lists = self.allocatable_calls = 0

    def List(self, request, context):
        self.lists += 1
        if self.refuse is not None:
            context.abort(self.refuse, "pod resources API refused by the test kubelet")
        return pr.ListPodResourcesResponse(pod_resources=self.pods)

    def GetAllocatableResources(self, request, context):
        self.allocatable_calls += 1
        if self.no_allocatable:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "feature gate KubeletPodResourcesGetAllocatable disabled")
        return pr.AllocatableResourcesResponse(devices=[
            pr.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=self.allocatable)])


@pytest.fixture
def kubelet(tmp_path):
    path = tmp_path / "kubelet.sock"
    servicer = Kubelet()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pr_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix://{path}")
    server.start()
    servicer.path = str(path)
    yield servicer
    server.stop(grace=None)


def client(path: str, **kw) -> PodResources:
    return PodResources(KubeletConfig(socket=path, timeout_s=2.0, **kw))


def test_gpus_by_uuid_name_their_pod_and_container(kubelet):
    kubelet.pods = [pod("ml", "trainer-0", ("main", "nvidia.com/gpu", [UUID0]), ("sidecar", "cpu", [])),
                    pod("serving", "llama", ("engine", "nvidia.com/gpu", [UUID1.lower()]))]
    kubelet.allocatable = [UUID0, UUID1]
    k = client(kubelet.path)
    try:
        k.refresh()
        assert k.holders(UUID0, 5) == (PodRef("ml", "trainer-0", "main"),)
        assert k.holders(UUID1, 1) == (PodRef("serving", "llama", "engine"),)
        assert k.holders("GPU-other", 3) == ()
        assert k.status() == "ok: 2 GPUs held by 2 pods; 2 allocatable nvidia.com/gpu (by UUID)"
        g = k.generation
        k.refresh()
        assert k.generation == g and kubelet.allocatable_calls == 1     # the same answer changes nothing
    finally:
        k.close()


def test_gpus_by_index_time_slicing_and_mig(kubelet):
    kubelet.pods = [pod("ml", "a", ("c", "nvidia.com/gpu", ["0", "1"])),
                    pod("ml", "b", ("c", "nvidia.com/gpu", [f"{UUID1}::0"])),
                    pod("ml", "d", ("c", "nvidia.com/gpu", [f"{UUID1}::1"])),
                    pod("ml", "m", ("c", "nvidia.com/gpu", ["MIG-5c8a0000-1111-2222-3333-444455556666"]))]
    kubelet.allocatable = ["0", "1"]
    k = client(kubelet.path)
    try:
        k.refresh()
        assert k.holders(UUID0, 1) == (PodRef("ml", "a", "c"),)                  # by index
        assert k.holders(UUID1, 7) == (PodRef("ml", "b", "c"), PodRef("ml", "d", "c"))   # replicas of one GPU
        assert "1 device ids name no whole GPU (MIG instances)" in k.status()
        assert "by index" in k.status()
    finally:
        k.close()
    assert device_key(" 3 ") == "#3" and device_key("gpu-ABC::2") == "gpu-abc" and device_key("weird") is None


def test_socket_absent(tmp_path):
    k = client(str(tmp_path / "nope.sock"))
    k.refresh()
    assert k.status().startswith(f"absent: no kubelet socket at {tmp_path / 'nope.sock'}")
    assert "hostPath" in k.status() and k.holders(UUID0, 0) == ()


@pytest.mark.parametrize("make,what", [(lambda p: p.write_text("x"), "a regular file"),
                                       (lambda p: p.mkdir(), "a directory")])
def test_something_other_than_a_socket_is_said(tmp_path, make, what):
    """Found in a trial: a regular file at the path gave gRPC's raw 'failed
    to connect to all addresses' as the status."""
    make(tmp_path / "kubelet.sock")
    k = client(str(tmp_path / "kubelet.sock"))
    k.refresh()
    assert k.status().startswith(f"not a socket: {tmp_path / 'kubelet.sock'} is {what}; --kubelet-socket")


def test_the_state_is_logged_when_it_changes_start_up_included(tmp_path, kubelet):
    from structlog.testing import capture_logs
    k = PodResources(KubeletConfig(socket=str(tmp_path / "nope.sock"), refresh_s=0.05))
    with capture_logs() as logs:
        k.start()
        import time
        time.sleep(0.3)
        k.close()
    said = [e for e in logs if e["event"].startswith("kubelet pod-resources: ")]
    assert len(said) == 1 and said[0]["log_level"] == "warning" and "absent: no kubelet socket" in said[0]["event"]
    kubelet.pods = [pod("ml", "a", ("c", "nvidia.com/gpu", [UUID0]))]
    k = PodResources(KubeletConfig(socket=kubelet.path, refresh_s=0.05))
    with capture_logs() as logs:
        k.start()
        time.sleep(0.3)
        k.close()
    said = [e for e in logs if e["event"].startswith("kubelet pod-resources: ")]
    assert len(said) == 1 and said[0]["log_level"] == "info" and "ok: 1 GPUs held by 1 pods" in said[0]["event"]


@pytest.mark.parametrize("code,word", [(grpc.StatusCode.PERMISSION_DENIED, "permission denied: the kubelet refused List"),
                                       (grpc.StatusCode.UNIMPLEMENTED, "unimplemented: this kubelet does not serve")])
def test_the_kubelet_refusing_drops_what_it_said_before(kubelet, code, word):
    kubelet.pods = [pod("ml", "a", ("c", "nvidia.com/gpu", [UUID0]))]
    k = client(kubelet.path)
    try:
        k.refresh()
        assert k.holders(UUID0, 0)
        kubelet.refuse = code
        g = k.generation
        k.refresh()
        assert k.status().startswith(word) and k.holders(UUID0, 0) == () and k.generation == g + 1
    finally:
        k.close()


def test_getallocatable_unimplemented_leaves_list_working(kubelet):
    kubelet.pods = [pod("ml", "a", ("c", "nvidia.com/gpu", [UUID0]))]
    kubelet.no_allocatable = True
    k = client(kubelet.path)
    try:
        k.refresh()
        assert k.holders(UUID0, 0) == (PodRef("ml", "a", "c"),)
        assert "allocatable GPUs unknown (GetAllocatableResources unimplemented" in k.status()
    finally:
        k.close()


def test_an_unreachable_kubelet_keeps_the_last_answer_and_says_so(tmp_path):
    path = tmp_path / "kubelet.sock"
    servicer = Kubelet()
    servicer.pods = [pod("ml", "a", ("c", "nvidia.com/gpu", [UUID0]))]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pr_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix://{path}")
    server.start()
    k = client(str(path))
    k.config = KubeletConfig(socket=str(path), timeout_s=0.5)
    try:
        k.refresh()
        server.stop(grace=None).wait()
        import socket
        stale = socket.socket(socket.AF_UNIX)      # a restarting kubelet's stale socket: there, nobody answers
        stale.bind(str(path))
        stale.close()
        k.refresh()
        assert k.status().startswith("unreachable: ") and "pods as of" in k.status()
        assert k.holders(UUID0, 0) == (PodRef("ml", "a", "c"),)
    finally:
        k.close()


def test_the_background_refresh_never_blocks_and_stops(kubelet):
    import time
    kubelet.pods = [pod("ml", "a", ("c", "nvidia.com/gpu", [UUID0]))]
    k = PodResources(KubeletConfig(socket=kubelet.path, refresh_s=0.05, timeout_s=1.0))
    k.start()
    try:
        deadline = time.monotonic() + 10
        while not k.holders(UUID0, 0) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert k.holders(UUID0, 0) and kubelet.lists >= 1
    finally:
        t = time.monotonic()
        k.close()
        assert time.monotonic() - t < 3
