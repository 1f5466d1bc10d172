"""A coordinated capture's commands: every rank of a job asked to trace the
same window (docs/jobs.md). Whoever asks (an operator's `capture --job`, a
straggler finding) sends them through the command hub; the agents start at
`start_at` on the analyzer's clock, corrected by how far theirs differs
(daemon/agent.py, local_start)."""
from __future__ import annotations

import time
import uuid

from gpuscope.v1 import analyzer_pb2 as apb

from .rank_skew import COORDINATED

MAX_DURATION_MS = 60_000      # as an agent's own capture (daemon/captures.py)


def send(hub, job: str, ranks: list[dict], duration_ms: int, lead_s: float) -> tuple[str, float, list[dict]]:
    """Sends each rank (job_ranks' rows) its command through `hub`:
    (group, start_at, [the rank with its command id and whether it was sent:
    False when its agent is not connected])."""
    group = uuid.uuid4().hex[:8]
    start_at = time.time() + lead_s
    out = []
    for r in ranks:
        cmd = apb.Command(id=f"{COORDINATED}{group}-r{r['rank']}", gpu=r["gpus"][0] if r["gpus"] else 0,
                          pid=r["pid"], kind="capture", duration_ms=duration_ms,
                          reason=f"coordinated capture {group} of {job[:200]}", start_at=start_at,
                          sent_at=time.time())
        out.append(dict(r, command=cmd.id, sent=hub.send(r["host"], cmd)))
    return group, start_at, out
