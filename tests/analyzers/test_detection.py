"""Detection latency on the real recording through the live path: each
bottleneck phase becomes an open finding within two windows of its onset."""
import pytest

from tests.live_replay import replay_findings
from gpuscope.collectors.recording import read_recording
from tests.analyzers.test_classify_fixture import EXPECTED
from tests.conftest import SAMPLES


@pytest.mark.parametrize("window_s", [1.0, 2.0])
def test_open_within_two_windows_of_onset(fixture_dir, phases, window_s):
    events = replay_findings(read_recording(SAMPLES), window_s)
    for p in phases:
        want = EXPECTED[p["phase"]]
        if want == {"idle"}:
            continue
        deadline = p["start"] + 2 * window_s + 1.0     # +1: one batch of transport
        # An open finding of the phase's verdict, known to the analyzer by the deadline
        # (a new one, or one that continues because the previous phase had the same verdict).
        known = [e for e in events if e["verdict"] in want and e["end"] is None
                 and p["start"] <= e["seen_at"] <= deadline]
        assert known, (p["phase"], [(e["verdict"], e["seen_at"] - p["start"]) for e in events
                                    if p["start"] <= e["seen_at"] <= p["end"]][:6])


def test_findings_are_episodes_not_rows_per_window(fixture_dir):
    events = replay_findings(read_recording(SAMPLES), 1.0)
    opened = {e["id"] for e in events}
    assert 6 <= len(opened) <= 20          # ~7 bottleneck phases and a few transitions, not ~90 windows
