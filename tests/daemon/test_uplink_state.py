"""`gpuscope status` of an agent tells a network fault from an analyzer
that answers but cannot store (found in a trial: DISCONNECTED while the
analyzer's disk was full)."""
from gpuscope.daemon.cmd_oncall import _uplink_state


def test_an_analyzer_that_cannot_store_is_not_a_disconnection():
    full = "StatusCode.UNAVAILABLE: not stored, resend later: IO Error: No space left on device"
    assert _uplink_state(dict(uplink_connected=False, last_error=full)).startswith("connected, but the ANALYZER IS")
    gone = "StatusCode.UNAVAILABLE: failed to connect to all addresses"
    assert _uplink_state(dict(uplink_connected=False, last_error=gone)) == "DISCONNECTED"
    assert _uplink_state(dict(uplink_connected=True, last_error=full)) == "connected"
