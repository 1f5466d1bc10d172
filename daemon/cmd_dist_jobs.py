"""`gpuscope jobs --fleet` and `gpuscope job J`: distributed jobs as the
analyzer groups their ranks across hosts (collectors/ranks.py), what their
GPUs do now, and the rank the others wait for (docs/jobs.md)."""
from __future__ import annotations

import sys
import time
from datetime import datetime, timezone

from gpuscope.collectors.human import percent, value as human_value

from . import clients
from .cliutil import UsageError, positive_duration, print_json
from .security_flags import client_security


def add_job_parser(sub, server_args) -> None:
    sp = sub.add_parser("job", help="one distributed job's ranks laid out with what their GPUs do and its straggler")
    sp.add_argument("job", help="the job as `gpuscope jobs --fleet` lists it, e.g. slurm:4242.0")
    sp.add_argument("--since", type=positive_duration, default=3600.0, metavar="DURATION",
                    help="ranks seen this recently (default 1h)")
    server_args(sp)
    sp.set_defaults(fn=cmd_job)


def _when(t: float | None) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M") if t else "—"


def _mix(shares: dict[str, float]) -> str:
    return ", ".join(f"{v} {percent(s)}" for v, s in sorted(shares.items(), key=lambda kv: -kv[1])) or "—"


def cmd_fleet_jobs(ns) -> int:
    rows = clients.dist_jobs(ns.server, time.time() - ns.since, security=client_security(ns))
    if ns.json:
        print_json({"jobs": rows})
        return 0
    if not rows:
        print("no distributed jobs seen: ranks are grouped from their launchers' environments (Slurm, MPI, "
              "torchrun, jax.distributed, Kubernetes Indexed Jobs, JobSet, LeaderWorkerSet) at each fleet check "
              "(--fleet-check-every, default 5m)")
        return 0
    print(f"{'JOB':<36} {'RANKS':>9} {'HOSTS':>5} {'GPUS':>5}  {'LAST SEEN':<16}  NOW")
    for j in rows:
        size = f"{j['ranks']}/{j['world_size']}" if j.get("world_size") else str(j["ranks"])
        print(f"{j['job'][:36]:<36} {size:>9} {len(j['hosts']):>5} {j['gpus']:>5}  {_when(j['last_seen']):<16}  "
              f"{_mix(j['verdicts_now'])}")
        for s in j["stragglers"]:
            print(f"{'':<36}   straggler {s['host']}/gpu{s['gpu']} ({s['id'][:8]})")
    return 0


def cmd_job(ns) -> int:
    if not ns.job.strip():       # the analyzer reads an empty job as every job
        raise UsageError("JOB: empty (`gpuscope jobs --fleet` lists the jobs seen)")
    rows = clients.dist_jobs(ns.server, time.time() - ns.since, ns.job, security=client_security(ns))
    if ns.json:
        print_json({"jobs": rows})
        return 0
    if not rows:
        print(f"no ranks of {ns.job!r} seen since {_when(time.time() - ns.since)} (`gpuscope jobs --fleet` lists "
              "the jobs seen)")
        return 1
    j = rows[0]
    size = f"{j['ranks']} of {j['world_size']} ranks" if j.get("world_size") else f"{j['ranks']} ranks"
    print(f"{j['job']}: {size} on {len(j['hosts'])} host{'s' if len(j['hosts']) != 1 else ''}, {j['gpus']} GPUs; "
          f"now {_mix(j['verdicts_now'])}")
    for s in j["stragglers"]:
        print(f"straggler ({s['id'][:8]}): {s['summary']}")
    print(f"{'RANK':>5}  {'HOST':<16} {'GPUS':<8} {'PID':>8}  {'NOW':<20} {'SM':>5} {'CLOCK':>9} {'POWER':>7}  SINCE")
    for r in j.get("rank_list", []):
        now = sorted({v or "—" for v in r["verdicts_now"].values()})
        m = r["means"]
        act = m.get("gpm_sm_util_ratio", m.get("util_gpu_ratio"))
        print(f"{r['rank']:>5}  {r['host'][:16]:<16} {','.join(map(str, r['gpus'])) or '—':<8} {r['pid']:>8}  "
              f"{', '.join(now)[:20]:<20} {percent(act) if act is not None else '—':>5} "
              f"{human_value('hertz', m.get('sm_clock_hertz')):>9} {human_value('watts', m.get('power_watts')):>7}  "
              f"{_when(r['start'])}" + ("  STRAGGLER" if r["straggler"] else ""))
    return 0


def cmd_capture_job(ns) -> int:
    """`gpuscope capture --job J`: every rank's agent traces the same window;
    waits for their reports and says who arrived last at each collective."""
    asked = clients.capture_job(ns.server, ns.job, ns.duration_ms, security=client_security(ns))
    sent = [r for r in asked["ranks"] if r["sent"]]
    if not ns.json:
        print(f"coordinated capture {asked['group']} of {ns.job}: {len(sent)} of {len(asked['ranks'])} ranks asked, "
              f"starting {datetime.fromtimestamp(asked['start_at'], timezone.utc).strftime('%H:%M:%S.%f')[:-3]} "
              f"UTC for {ns.duration_ms} ms")
        for r in asked["ranks"]:
            if not r["sent"]:
                print(f"  rank {r['rank']} on {r['host']}: its agent is not connected to the analyzer, not asked")
    if not sent:
        hosts = sorted({r["host"] for r in asked["ranks"]})
        if ns.json:
            print_json(dict(asked=asked, captures=[], collectives=0))
        print(f"gpuscope capture: none of the {len(asked['ranks'])} ranks of {ns.job} was asked: the agents of "
              f"{', '.join(hosts)} have no command stream open to this analyzer (an agent opens one when it runs "
              "with --analyzer pointing here); nothing was traced", file=sys.stderr)
        return 1
    deadline = asked["start_at"] + ns.duration_ms / 1e3 + (ns.timeout or 60.0)
    result = clients.job_skew(ns.server, asked["group"], security=client_security(ns))
    while len(result.get("captures", [])) < len(sent) and time.time() < deadline:
        time.sleep(1.0)
        result = clients.job_skew(ns.server, asked["group"], security=client_security(ns))
    result["asked"] = asked
    if ns.json:
        print_json(result)
    else:
        print_skew(result, len(sent))
    return 0 if result.get("captures") and all(c["status"].startswith("ok") for c in result["captures"]) else 1


def print_skew(result: dict, expected: int) -> None:
    caps = result.get("captures", [])
    if len(caps) < expected:
        print(f"{expected - len(caps)} of {expected} ranks did not report in time (`gpuscope captures` shows what "
              "did); judged on what came")
    print(f"{'RANK':>5}  {'HOST':<16} {'CAPTURE':<14} {'STATUS':<10} {'COLLECTIVES':>11} {'LAST':>6} {'WAITING':>9} "
          f"{'LATE BY':>9}")
    per = result.get("per_rank", {})
    for c in sorted(caps, key=lambda c: (not c["rank"].isdigit(), int(c["rank"]) if c["rank"].isdigit() else 0)):
        p = per.get(c["rank"], {})
        print(f"{c['rank']:>5}  {c['host'][:16]:<16} {c['id'][:14]:<14} {c['status'][:10]:<10} {c['collectives']:>11} "
              f"{percent(p.get('last_share')) if p else '—':>6} "
              f"{human_value('seconds', p.get('wait_seconds_mean')) if p else '—':>9} "
              f"{human_value('seconds', p.get('late_seconds_mean')) if p else '—':>9}")
        if c.get("error"):
            print(f"       {c['error'][:160]}")
    n = result.get("collectives", 0)
    if not n:
        print("no collective seen in every rank's trace: nothing to compare (a job between steps, or traces "
              "without collectives)")
        return
    sk = result["skew_seconds"]
    print(f"{n} collectives matched across ranks: arrival skew p50 {human_value('seconds', sk['p50'])}, "
          f"p90 {human_value('seconds', sk['p90'])}, max {human_value('seconds', sk['max'])}")
    s = result.get("straggler")
    if s:
        print(f"straggler from the traces: rank {s['rank']} on {s['host']}, last at {percent(s['last_share'])} of the "
              f"collectives, {human_value('seconds', s['arrives_late_by_seconds'])} after the first to arrive "
              "(median)")
    else:
        print("no rank arrives last at most collectives: no straggler in these traces")
