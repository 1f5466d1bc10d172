"""`gpuscope jobs --fleet` and `gpuscope job J`: distributed jobs as the
analyzer groups their ranks across hosts (collectors/ranks.py), what their
GPUs do now, and the rank the others wait for (docs/jobs.md)."""
from __future__ import annotations

import time
from datetime import datetime, timezone

from gpuscope.collectors.human import percent, value as human_value

from . import clients
from .cliutil import positive_duration, print_json
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
