"""What `gpuscope jobs --fleet` and `gpuscope job J` show: distributed jobs
made of ranks across hosts (collectors/ranks.py), each rank with its GPUs
and what they are doing now, and the stragglers found (stragglers.py)."""
from __future__ import annotations

from collections import Counter

from . import programs as pg
from .store import Store


def list_jobs(store: Store, since: float, job: str = "", limit: int = 200,
              verdict_now: dict[tuple[str, int], str] | None = None,
              open_stragglers: list[dict] = ()) -> list[dict]:
    """Jobs with ranks seen since `since`, newest first: launcher, world
    size, ranks seen, hosts, GPUs, first and last seen, the verdicts their
    GPUs hold now (`verdict_now`: the analyzer's live state) and open
    straggler findings. With `job`: that job only, with its ranks."""
    verdict_now = verdict_now or {}
    by_job: dict[str, dict[str, dict]] = {}
    for row in store.dist_job_runs(since, job):
        r = pg.run_from_row(row)
        rank = r["attribution"].get("rank", "?")
        ranks = by_job.setdefault(row["dist_job"], {})
        if rank not in ranks:                  # newest first: a restarted rank is its newest process
            ranks[rank] = r
    stragglers: dict[str, list[dict]] = {}
    for f in open_stragglers:
        stragglers.setdefault(f["host"], []).append(f)
    out = []
    for name, ranks in by_job.items():
        runs = list(ranks.values())
        now = Counter(verdict_now.get((r["host"], g)) or "unknown" for r in runs for g in r["gpus"])
        gpus = sum(len(r["gpus"]) for r in runs)
        sizes = [int(r["attribution"]["world_size"]) for r in runs if r["attribution"].get("world_size", "").isdigit()]
        mine = [f for r in runs for f in stragglers.get(r["host"], ())
                if f.get("condition_key", "").startswith(f"straggler:{name}:") and f["gpu"] in r["gpus"]]
        entry = dict(job=name, launcher=name.split(":", 1)[0], world_size=max(sizes) if sizes else None,
                     ranks=len(runs), hosts=sorted({r["host"] for r in runs}), gpus=gpus,
                     first_seen=min(r["start"] for r in runs), last_seen=max(r["end"] for r in runs),
                     verdicts_now={v: n / gpus for v, n in now.items()} if gpus else {},
                     stragglers=[dict(id=f["id"], host=f["host"], gpu=f["gpu"], summary=f["summary"]) for f in mine])
        if job:
            entry["rank_list"] = [_rank_view(k, r, verdict_now, mine) for k, r in
                                  sorted(ranks.items(), key=lambda kv: (not kv[0].isdigit(), int(kv[0]) if kv[0].isdigit() else 0))]
        out.append(entry)
    out.sort(key=lambda e: -e["last_seen"])
    return out[:limit]


def _rank_view(rank: str, r: dict, verdict_now: dict, stragglers: list[dict]) -> dict:
    total = sum(r["verdicts"].values())
    return dict(rank=rank, host=r["host"], gpus=r["gpus"], pid=r["pid"], job=r["job"], start=r["start"], end=r["end"],
                verdicts_now={g: verdict_now.get((r["host"], g)) for g in r["gpus"]},
                verdicts={v: n / total for v, n in r["verdicts"].items()} if total else {},
                means={m: pg.mean(r, m) for m in ("gpm_sm_util_ratio", "util_gpu_ratio", "sm_clock_hertz", "power_watts")
                       if pg.mean(r, m) is not None},
                straggler=any(f["host"] == r["host"] and f["gpu"] in r["gpus"] for f in stragglers))
