"""The agent's own gRPC API as a client meets it: a real `gpuscope agent`
process, its --listen port, and whatever bytes arrive there."""
import subprocess
import sys
import time

import grpc
import pytest

from gpuscope.v1 import agent_pb2
from tests.conftest import SAMPLES, free_port

GPUSCOPE = [sys.executable, "-m", "gpuscope.daemon.cli"]


@pytest.fixture(scope="module")
def agent_target(fixture_dir):
    port = free_port()
    proc = subprocess.Popen(GPUSCOPE + ["agent", "--insecure", "--listen", f"127.0.0.1:{port}",
                                        "--source", f"replay:{SAMPLES}", "--interval", "0.2", "--duration", "120s"],
                            stderr=subprocess.PIPE, text=True)
    target = f"127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                with grpc.insecure_channel(target) as ch:
                    grpc.channel_ready_future(ch).result(timeout=1)
                break
            except grpc.FutureTimeoutError:
                assert proc.poll() is None, proc.communicate()[1]
                assert time.time() < deadline, "the agent's API never answered"
        yield target
    finally:
        proc.send_signal(2)
        proc.communicate(timeout=30)


@pytest.mark.parametrize("method", sorted(agent_pb2.DESCRIPTOR.services_by_name["Agent"].methods_by_name))
def test_bytes_that_are_no_message_are_invalid_argument_naming_the_method(agent_target, method):
    """Found by a tester: garbage on the agent's port came back UNKNOWN
    ("Unexpected error"), where the analyzer says INVALID_ARGUMENT."""
    with grpc.insecure_channel(agent_target) as ch:
        call = ch.unary_unary(f"/gpuscope.v1.Agent/{method}")       # raw bytes, no serializer
        with pytest.raises(grpc.RpcError) as err:
            call(b"\xff\xff\xff\xff garbage", timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.value.code(), err.value.details())
    assert f"/gpuscope.v1.Agent/{method}: the request is not a valid message" in err.value.details()


def test_a_valid_request_still_answers(agent_target):
    from gpuscope.v1 import agent_pb2_grpc
    with grpc.insecure_channel(agent_target) as ch:
        st = agent_pb2_grpc.AgentStub(ch).GetStatus(agent_pb2.AgentStatusRequest(), timeout=10)
    assert st.interval_seconds == pytest.approx(0.2)
