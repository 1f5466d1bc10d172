import json
import socket
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT.parent / "shared" / "fixtures" / "h200-run1"
SAMPLES = FIXTURE / "samples.csv"


@pytest.fixture(scope="session")
def fixture_dir() -> Path:
    if not SAMPLES.exists():
        pytest.fail(f"the real H200 recording is missing at {FIXTURE} (CI lays ../shared beside the checkout)")
    return FIXTURE


@pytest.fixture(scope="session")
def phases(fixture_dir) -> list[dict]:
    rows = [json.loads(line) for line in (fixture_dir / "phases.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if "start" in r]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
