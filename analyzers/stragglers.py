"""The straggler of a distributed job: the rank the others wait for
(docs/jobs.md).

In a job whose ranks meet in collectives every step, one slow rank makes
all the others wait in their all-reduce: their GPUs read communication-bound
or idle, while the slow rank's reads what holds it (compute-bound on a
throttled GPU, host-bound behind a slow data loader). Judged alone, every
GPU but one looks like a network problem; judged as a job, the one is the
cause.

Each fleet check looks at every job with at least `min_ranks` ranks seen in
its span (ranks: program runs whose launcher named a job, ranks.py). A rank's
verdict is the one most of its windows had over the span (at least
`majority`), its activity the mean SM activity (NVML utilisation without
GPM). A job has a straggler when
- most of its ranks (at least `waiting_share`) are waiting: communication-bound
  or idle, and
- one or a few (at most `max_share` of the ranks, at least one) are not:
  those are the stragglers; or, when every rank waits, the ranks whose
  activity is above the others' median by `max_z` robust deviations and by
  `busier_by` (the one still computing while the rest wait) are.
What each straggler's own counters say is named as the likely cause: its
verdict, its SM clock against the job's median, its power, and a degraded
finding of its GPU.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from gpuscope.collectors.human import percent, value as human_value

from .degraded import MAD_TO_SIGMA
from .programs import majority_verdict

WAITING = ("communication-bound", "idle")


@dataclass(frozen=True)
class StragglerConfig:
    min_ranks: int = 4
    waiting_share: float = 0.6
    max_share: float = 0.25
    majority: float = 0.5
    max_z: float = 3.5
    busier_by: float = 0.15         # ... and SM activity this much (absolute) over the job's median
    slow_clock: float = 0.05        # a clock this far under the job's median is named


def _activity(m: dict) -> float | None:
    return m.get("gpm_sm_util_ratio", m.get("util_gpu_ratio"))


def find_stragglers(runs: list[dict], interval: dict[str, dict], config: StragglerConfig = StragglerConfig(),
                    degraded: dict[tuple[str, int], list[dict]] | None = None) -> list[dict]:
    """Conditions (fleet_findings.py) for the straggling ranks' GPUs.
    `runs`: the check's touched runs; `interval`: run id -> its span's means
    and verdicts (program_check.collect)."""
    newest: dict[tuple[str, str], dict] = {}
    for r in runs:
        a = r.get("attribution") or {}
        job = a.get("dist_job")
        if job and r["id"] in interval:
            # a restarted rank is its newest process: the one before would count as another rank (a
            # 4-rank job read "5 ranks seen", and a 3-rank job with one restart was judged at all)
            key = (job, a.get("rank", f"pid {r['pid']}"))
            if key not in newest or (r["start"], r["end"]) > (newest[key]["start"], newest[key]["end"]):
                newest[key] = r
    jobs: dict[str, list[dict]] = {}
    for (job, _), r in newest.items():
        jobs.setdefault(job, []).append(r)
    found = []
    for job, ranks in sorted(jobs.items()):
        if len(ranks) < config.min_ranks:
            continue
        found += _judge_job(job, ranks, interval, config, degraded or {})
    return found


def _judge_job(job: str, ranks: list[dict], interval: dict[str, dict], config: StragglerConfig,
               degraded: dict[tuple[str, int], list[dict]]) -> list[dict]:
    verdict = {r["id"]: majority_verdict(interval[r["id"]]["verdicts"], config.majority) for r in ranks}
    judged = [r for r in ranks if verdict[r["id"]]]
    if len(judged) < config.min_ranks:
        return []
    waiting = [r for r in judged if verdict[r["id"]] in WAITING]
    if len(waiting) < config.waiting_share * len(judged):
        return []
    busy = [r for r in judged if verdict[r["id"]] not in WAITING]
    how = "not waiting"
    if not busy:
        busy, how = _busier(judged, interval, config), "busier"
    if not busy or len(busy) > max(1, int(config.max_share * len(judged))):
        return []
    median = {m: _median([interval[r["id"]].get(m) for r in judged])
              for m in ("sm_clock_hertz", "power_watts", "gpm_sm_util_ratio", "util_gpu_ratio")}
    hosts = len({r["host"] for r in ranks})
    out = []
    for r in busy:
        mine = interval[r["id"]]
        rank, world = (r.get("attribution") or {}).get("rank", "?"), (r.get("attribution") or {}).get("world_size")
        causes, evidence = [], {"ranks_seen": float(len(ranks)), "ranks_waiting": float(len(waiting))}
        if rank.isdigit():
            evidence["rank"] = float(rank)
        act, med_act = _activity(mine), _activity(median)
        if act is not None and med_act is not None:
            evidence.update(activity_ratio=act, job_median_activity_ratio=med_act)
        clock, med_clock = mine.get("sm_clock_hertz"), median["sm_clock_hertz"]
        if clock and med_clock:
            evidence.update(sm_clock_hertz=clock, job_median_sm_clock_hertz=med_clock)
            if clock < med_clock * (1 - config.slow_clock):
                causes.append(f"SM clock {human_value('hertz', clock)} vs the job's {human_value('hertz', med_clock)}")
        if mine.get("power_watts") and median["power_watts"]:
            evidence.update(power_watts=mine["power_watts"], job_median_power_watts=median["power_watts"])
        v = verdict[r["id"]]
        if v == "host-bound":
            causes.insert(0, "its host keeps its GPU waiting (data loading, Python, CPU contention)")
        for g in r["gpus"]:
            for f in degraded.get((r["host"], g), ()):
                causes.append(f"gpu {g} is degraded: {f['summary']}")
        waited = (f"{len(waiting)} of {len(judged)} ranks wait "
                  f"({', '.join(sorted({verdict[w['id']] for w in waiting}))})")
        said = (f"{v}, while {waited}" if how == "not waiting" else
                f"{percent(act)} SM activity against the job's {percent(med_act)}, while {waited}")
        summary = (f"rank {rank}{f' of {world}' if world else ''} of {job} ({len(ranks)} ranks seen on {hosts} "
                   f"host{'s' if hosts != 1 else ''}) is the straggler on {r['host']}: {said}"
                   + (f"; likely cause: {'; '.join(causes)}" if causes else ""))
        confidence = min(1.0, len(waiting) / len(judged))
        for g in r["gpus"]:
            out.append(dict(key=f"straggler:{job}:{r['host']}:{g}", host=r["host"], gpu=g,
                            job=f"{job} rank {rank}", attribution=r.get("attribution") or {}, summary=summary,
                            evidence={k: float(x) for k, x in evidence.items() if x is not None},
                            flags=[v] if v else [], confidence=round(confidence, 3), source=f"job {job}"))
    return out


def _busier(ranks: list[dict], interval: dict[str, dict], config: StragglerConfig) -> list[dict]:
    """Ranks whose activity is `max_z` robust deviations over the others' and
    `busier_by` over their median: noise among 64 waiting ranks makes a few
    3.5-sigma ranks in a thousand jobs; a rank still computing is far busier."""
    values = {r["id"]: _activity(interval[r["id"]]) for r in ranks}
    known = [v for v in values.values() if v is not None]
    if len(known) < config.min_ranks:
        return []
    med = statistics.median(known)
    scale = max(statistics.median(abs(v - med) for v in known) * MAD_TO_SIGMA, 0.02)
    return [r for r in ranks if values[r["id"]] is not None and (values[r["id"]] - med) / scale >= config.max_z
            and values[r["id"]] - med >= config.busier_by]


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


_ALWAYS = ("trace every rank over one window (`gpuscope capture --job JOB`; the finding opened one already, under "
           "decisions) and read who arrives last at each collective and by how much; then set the straggler's step "
           "beside a waiting rank's: the part of the straggler's step the others spend in their collective is the "
           "cause",)
# a straggler's verdict -> what its report tells the on-call to try first
WHAT_TO_TRY = {
    "host-bound": ("the rank's host starves its GPU: its data loader (workers, storage, decoding), CPU pinning and "
                   "other tenants of its cores; `top -p PID` and the job's input pipeline on that host",),
    "compute-bound": ("its GPU does the same work slower: `nvidia-smi -q -d PERFORMANCE,CLOCK` for clock event "
                      "reasons (power brake, thermal slowdown), and `gpuscope degraded` against its peers",),
    "memory-bound": ("its GPU's memory is slower or its share of the work is larger: `gpuscope degraded` (HBM "
                     "ceiling), and whether the job gives this rank more data (uneven sharding, a longer sequence)",),
    "launch-bound": ("its host launches kernels slower: CPU frequency, contention on its cores, a debug or "
                     "profiling hook left on in this rank only",),
}


def what_to_try(flag: str, job: str = "") -> list[str]:
    """A straggler's advice: its verdict's, then tracing its job (`job`: the
    distributed job, put in the command when known)."""
    always = [t.replace("--job JOB", f"--job {job}") if job else t for t in _ALWAYS]
    return list(WHAT_TO_TRY.get(flag, ())) + always
