"""The on-call commands: queries of a running analyzer or agent over gRPC,
printed for people or, with --json, for scripts."""
from __future__ import annotations

import contextlib
import json
import time

from gpuscope.analyzers import accuracy
from gpuscope.collectors import catalogue as cat
from gpuscope.collectors import human
from gpuscope.v1 import NOT_STORED

from . import clients
from .cliutil import UsageError, age, print_json, seen, whose, whose_beside
from .cmd_offline import print_summary
from .security_flags import client_security


def _time_range(ns) -> tuple[float | None, float | None]:
    end = ns.end
    start = ns.start
    if ns.since is not None:
        start = (end or time.time()) - ns.since
    return start, end


def _nothing(ns, what: str, default_range: str = "") -> str:
    """One line for an answer with nothing in it: what was asked and, when a
    host or GPU was named that the analyzer has never heard of, which exist."""
    asked = []
    if getattr(ns, "host", ""):
        asked.append(f"host {ns.host!r}")
    if getattr(ns, "gpu", None) is not None:
        asked.append(f"GPU {ns.gpu}")
    if getattr(ns, "verdict", None):
        asked.append("verdict " + " or ".join(ns.verdict))
    if getattr(ns, "flag", None):
        asked.append("flag " + " and ".join(ns.flag))
    for flag, words in (("pod", "pod"), ("namespace", "namespace"), ("slurm_job", "Slurm job")):
        if getattr(ns, flag, ""):
            asked.append(f"{words} {getattr(ns, flag)}")
    line = f"no {what}" + (f" for {', '.join(asked)}" if asked else "")
    if getattr(ns, "since", None):
        line += f" in the last {_as_typed(ns.since)}"
    elif getattr(ns, "start", None) is not None or getattr(ns, "end", None) is not None:
        line += " in that time range"
    else:
        line += default_range
    return line + _known(ns)


def _as_typed(seconds: float) -> str:
    """A range as people type it: 1h, not 60m; 90m as 90m."""
    whole = next((f"{seconds / n:g}{u}" for n, u in ((86400, "d"), (3600, "h"), (60, "m")) if seconds % n == 0), None)
    return whole or age(seconds)


def _known(ns) -> str:
    host, gpu = getattr(ns, "host", ""), getattr(ns, "gpu", None)
    if not host and gpu is None:
        return ""
    try:
        gpus = clients.status(ns.server, "", 1000, security=client_security(ns)).get("gpus", [])
    except clients.ClientError:
        return ""
    hosts = sorted({g["host"] for g in gpus})
    if host and host not in hosts:
        shown = ", ".join(hosts[:8]) + (f" … ({len(hosts)} in all)" if len(hosts) > 8 else "")
        return f"; the analyzer knows no host {host!r} (hosts: {shown or 'none yet'})"
    mine = sorted({g.get("gpu", 0) for g in gpus if not host or g["host"] == host})
    if gpu is not None and gpu not in mine:
        return f"; {'host ' + repr(host) if host else 'the fleet'} has GPUs {', '.join(map(str, mine)) or 'none'}"
    return ""


def _uplink_state(s: dict) -> str:
    """Connected, or why not: an analyzer that answers but cannot store (its
    disk full) is not a network fault (found in a trial: DISCONNECTED sent
    on-call after the network)."""
    if s["uplink_connected"]:
        return "connected"
    if NOT_STORED in s.get("last_error", ""):
        return "connected, but the ANALYZER IS NOT STORING (its store fails; the agent resends)"
    return "DISCONNECTED"


def cmd_status(ns) -> int:
    s = clients.status(ns.server, ns.host, ns.limit, security=client_security(ns))
    if ns.json:
        print_json(s)
        return 0
    if s["kind"] == "agent":
        uplink = (f"uplink {_uplink_state(s)} to {s['analyzer']}"
                  if s["analyzer"] else "no analyzer (started without --analyzer)")
        print(f"agent {s['host']} ({s['source']}): {s['samples']} samples, {uplink}, "
              f"dropped {s['dropped_samples']}, unacked {s['unacked_samples']}")
        for d in s.get("devices", []):
            print(f"  gpu{d.get('gpu', 0)} {d.get('name', '')}{' LOST' if d.get('lost') else ''}"
                  + (f" — source: {d['source']}" if d.get("source") else ""))
        if s.get("attribution"):
            print("  whose jobs (attribution sources):")
            for source, state in sorted(s["attribution"].items()):
                print(f"    {source:<10} {state}")
        return 0
    stale = f" ({s.get('hosts_stale', 0)} stale)" if s.get("hosts_stale") else ""
    print(f"analyzer {s['version']}: {human.many(s['hosts'], 'host')}{stale}, "
          f"{human.many(s.get('samples_stored', 0), 'sample')} stored ({s['samples_committed']:,} since start), "
          f"{human.many(s['findings_open'], 'open finding')}, {human.many(s['anomalies'], 'anomaly', 'anomalies')} "
          f"since start, {human.many(s['captures_in_flight'], 'capture')} in flight, "
          f"{human.many(s['agents_connected'], 'agent')} on the command stream, analysis lag "
          f"{s.get('analysis_lag_seconds', 0):.0f} s, db {s['db_path']}")
    if s.get("store_error"):
        print(f"  STORE FAILING for {s.get('store_failing_seconds', 0):.0f} s: {s['store_error']} — nothing new is "
              f"stored; agents keep their batches and resend them (the analyzer's log says what to do)")
    if s.get("publish"):
        print(publish_line(s["publish"]))
    if s.get("gpus"):
        print(f"  {'HOST/GPU':<20} {'VERDICT':<20} {'CONF':>4} {'SEEN':<12} {'FLAGS':<18} SOURCE")
    for g in s.get("gpus", []):
        last = seen(g.get("stale", False), g.get("last_seen_age_seconds"))
        where = f"{g['host']}/gpu{g.get('gpu', 0)}"
        print(f"  {where:<20} {g.get('verdict') or '-':<20} {g.get('confidence', 0):>4.2f} "
              f"{last:<12} {','.join(g.get('flags', [])) + (' LOST' if g.get('lost') else ''):<18} "
              f"{g.get('source') or '-'}")
    shown, matching = len(s.get("gpus", [])), int(s.get("gpus_matching") or 0)
    if ns.host and not matching:
        print(f"  no GPUs of host {ns.host!r} (hosts are named as their agents send them)")
    elif shown < matching:
        print(f"  ... {shown} of {matching} GPUs shown; --host HOST for one host, --limit N for more")
    return 0


def publish_line(p: dict) -> str:
    """The fleet tier in one line: where, how far behind, and why."""
    line = (f"  fleet tier: cluster {p['cluster']} to {p['target']}, {age(p.get('lag_seconds') or 0)} behind, "
            f"{human.many(int(p.get('files_pending') or 0), 'file')} waiting to upload, "
            f"{int(p.get('files_uploaded') or 0):,} uploaded since start")
    if p.get("consecutive_failures"):
        line += (f"; STORAGE FAILING ({int(p['consecutive_failures'])} tries in a row, retried every pass; nothing "
                 f"is lost meanwhile): {p.get('last_error', '')[:200]}")
    elif p.get("last_error"):
        line += f"; last error: {p['last_error'][:200]}"
    return line


def cmd_findings(ns) -> int:
    start, end = _time_range(ns)
    rows = clients.findings(ns.server, ns.host or "", ns.gpu, ns.verdict, start, end, ns.open, ns.limit,
                           flags=ns.flag, pod=ns.pod, namespace=ns.namespace, slurm_job=ns.slurm_job,
                           kinds=ns.kind, security=client_security(ns))
    measured = _measured_precision(ns, rows)
    for f in rows:
        if f["counters_verdict"] in measured:
            f["counters_precision"] = measured[f["counters_verdict"]]
    if ns.json:
        print_json({"findings": rows})
        return 0
    if not rows:
        print(_nothing(ns, "open findings" if ns.open else "findings"))
        return 0
    print(f"{human.many(len(rows), 'open finding' if ns.open else 'finding')}, times in {time.strftime('%Z')}; "
          f"`gpuscope report ID` tells one's story")
    for f in rows:
        trust = accuracy.trust_words(f["counters_verdict"], measured)
        flags = f" [{', '.join(x.replace('_', '-') for x in f['flags'])}]" if f["flags"] else ""
        owner = whose_beside(f["job"], f.get("attribution"))
        if f.get("kind", "bottleneck") == "bottleneck":
            said = (f"job {f['job'] or '(no process seen)'}" + (f" — {owner}" if owner else "")
                    + (f"; counters from {f['source']}" if f.get("source") else ""))
        else:       # a fleet check's: what it was set against, and how many checks found it
            said = (f"{f['source'] or 'fleet check'}; found by {human.many(f['windows'], 'check')}"
                    + (f"; job {f['job']}" if f["job"] else ""))
        print(f"{f['id']} {f['host']}/gpu{f['gpu']} {f['verdict']:<20} {_when(f['start'])} -> {_when(f['end'])} "
              f"conf {f['confidence']:.2f}{trust}{flags}\n    {said}\n    {f['summary']}")
    return 0


def cmd_top(ns) -> int:
    """The fleet's worst GPUs (or jobs) over a range, and what holds them now;
    --watch redraws like top(1)."""
    if ns.since is None and ns.start is None:
        ns.since = 3600.0
    if ns.watch:
        return _watch_top(ns)
    r = _ask_top(ns)
    if ns.json:
        print_json(r)
    else:
        print(render_top(r, ns))
    return 0


def _ask_top(ns) -> dict:
    start, end = _time_range(ns)
    return clients.top(ns.server, start, end, ns.host or "", ns.by, ns.limit, security=client_security(ns))


def _watch_top(ns) -> int:
    """Redraws in the terminal's alternate screen, lines cut (not wrapped) at
    its width, as top(1) does; a lost server is said on the screen and asked
    again. Without a terminal, or with --json, each frame is printed after
    the last (top -b)."""
    from rich.console import Console, Group
    from rich.live import Live
    from rich.text import Text

    console = Console(highlight=False)
    batch = ns.json or not console.is_terminal
    last, err = None, ""
    try:
        with (contextlib.nullcontext() if batch else Live(console=console, screen=True, auto_refresh=False)) as live:
            while True:
                try:
                    last, err = _ask_top(ns), ""
                except clients.ClientError as exc:
                    if last is None and batch:
                        raise
                    err = f"{exc}; asking again in {ns.watch:g} s"
                if ns.json:
                    print_json(last)
                elif batch:
                    print(render_top(last, ns) + "\n", flush=True)
                else:
                    table = Text(render_top(last, ns) + "\n\n" if last is not None else "", no_wrap=True,
                                 overflow="ellipsis")
                    foot = err or f"as of {time.strftime('%H:%M:%S')}, every {ns.watch:g} s; Ctrl-C to stop"
                    live.update(Group(table, Text(foot)), refresh=True)    # an error is read whole: wrapped
                time.sleep(ns.watch)
    except KeyboardInterrupt:          # how one leaves a watch: not an error
        return 0


def render_top(r: dict, ns) -> str:
    """Three lines a row: the ranking (TIME in any bottleneck, VERDICT the
    one that held most of it, ID its longest finding, NOW what is open on it
    now), then whose job it is with the time per verdict, then the evidence."""
    span = r["end"] - r["start"]
    whole = f"last {_as_typed(round(span))}" if abs(r["end"] - time.time()) < 60 else \
        f"{_when(r['start'])} -> {_when(r['end'])}"
    by = r["by"]
    things = {"job": "jobs", "pod": "pods", "slurm-job": "Slurm jobs"}.get(by, "GPUs")
    head = (f"most bottlenecked {things}{' of ' + ns.host if ns.host else ''}, {whole}: "
            f"TIME in any bottleneck (idle is none), VERDICT the one that held most of it")
    if not r["rows"]:
        why = ("" if by in ("gpu", "job") else
               f"; no bottlenecked GPU's job names a {things[:-1]} (pods come from the kubelet's socket or "
               "dcgm-exporter's pod labels, Slurm jobs from the job's cgroup or environment)")
        return head + "\n" + _nothing(ns, "bottlenecks") + why + _conditions_lines(r)
    who = {"job": "JOB", "pod": "POD", "slurm-job": "SLURM JOB"}.get(by, "GPU")
    spent = "TIME" if by == "gpu" else "GPU-TIME"        # a group's time is summed over its GPUs
    lines = [head, "", f"{who:<24} {'VERDICT':<20} {spent:>8} {'SHARE':>5}  {'ID':<8}  NOW"]
    for x in r["rows"]:
        if x.get("stale"):
            now = f"stale, {seen(True, x.get('last_seen_age_s'))[6:]} silent"
        elif x["now_verdict"]:
            now = f"{x['now_verdict']} {age(time.time() - x['now_since'])}"
        else:
            now = "nothing open"
        a = x.get("attribution") or {}
        name = {"gpu": f"{x['host']}/gpu{x['gpu']}", "job": f"{x['host']}: {x['job'] or 'no process'}",
                "pod": f"{a.get('namespace', '?')}/{a.get('pod', '?')}", "slurm-job": a.get("slurm_job", "-")}[by]
        lines.append(f"{_fit(name, 24):<24} {x['verdict']:<20} {age(x['bottleneck_seconds']):>8} "
                     f"{human.percent(x['share']):>5}  {x['finding_id'][:8]:<8}  {now}")
        split = ", ".join(f"{v['verdict']} {age(v['seconds'])}" for v in x.get("verdicts") or ()) \
            if len(x.get("verdicts") or ()) > 1 else ""
        owner = whose(a) if by in ("gpu", "job") else ""
        held = (f"job {x['job']}" if x["job"] else "no process seen on it") if by == "gpu" else \
            f"{human.many(x['gpus'], 'GPU')}" + (f" of {x['host']}" if by == "job" else "")
        lines.append(f"    {held}" + (f" — {owner}" if owner else "") + (f"; {split}" if split else ""))
        lines.append(f"    {x['summary']}" + (f" [{', '.join(f.replace('_', '-') for f in x['flags'])}]"
                                               if x["flags"] else ""))
        if x.get("conditions"):
            lines.append(f"    also open: {'; '.join(x['conditions'])}")
    return "\n".join(lines) + _conditions_lines(r)


def _conditions_lines(r: dict) -> str:
    """Open degraded, regression and straggler findings: a GPU under its
    peers need not be busy, so they are listed whether or not it ranks above."""
    rows = r.get("conditions") or []
    if not rows:
        return ""
    kinds = " ".join(f"--kind {k}" for k in sorted({f["kind"] for f in rows}))
    lines = ["", f"open now, not bottlenecks ({human.many(len(rows), 'finding')}; "
                 f"`gpuscope findings {kinds} --open` lists all):"]
    for f in rows:
        lines.append(f"  {f['host']}/gpu{f['gpu']:<3} {f['kind']:<10} {', '.join(f['flags']):<8} "
                     f"{f['id'][:8]}  {f['summary']}")
    return "\n".join(lines)


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _measured_precision(ns, rows: list[dict]) -> dict[str, dict]:
    """Each counters verdict's precision against traces, where enough pairs
    exist (gpuscope accuracy); {} from an analyzer that does not keep them."""
    if not rows:
        return {}
    try:
        return accuracy.measured(clients.accuracy(ns.server, host=ns.host or "", security=client_security(ns)))
    except clients.ClientError:        # an older analyzer, or a caller without the role: findings alone
        return {}


def cmd_query(ns) -> int:
    m = cat.find(ns.metric)
    if m is None:
        raise UsageError(f"--metric: unknown {ns.metric!r}; `gpuscope metrics` lists them")
    ns.metric = m.name                  # a dashboard's name (sm_active_ratio) asks for the catalogue's
    start, end = _time_range(ns)
    end = end or time.time()
    start = start if start is not None else end - 3600
    r = clients.query(ns.server, ns.metric, ns.host or "", ns.gpu, start, end, ns.aggregate, ns.step or 0,
                      raw=ns.raw, group_by=ns.group_by or "", security=client_security(ns))
    if ns.json:
        print_json(r)
        return 0
    if not r["series"]:
        grouped = f" held by a {ns.group_by.replace('-', ' ')}" if ns.group_by else ""
        print(_nothing(ns, f"{ns.metric} samples{grouped}", " in the last hour (--since for longer)"))
    for s in r["series"]:
        if ns.group_by:
            gpus = human.many(s["gpus"], "GPU")
            where = {"job": f"job {s['group']}", "pod": f"pod {s['group']}",
                     "slurm-job": f"slurm job {s['group']}"}[ns.group_by] + f" ({gpus})"
        else:
            where = f"{s['host']}/gpu{s['gpu']}"
        if r["aggregate"] == "series":
            print(f"{where} {r['metric']}{' per second' if r['rate'] else ''}, {len(s['points'])} points:")
            for t, v in s["points"]:
                print(f"  {_when(t)} {human.value(r['unit'], v)}")
        else:
            print(f"{where} {r['aggregate']}({r['metric']}) = {human.value(r['unit'], s['value'])} "
                  f"over {s['samples']:,} samples")
    return 0


def cmd_capture(ns) -> int:
    from gpuscope.analyzers.trace_analysis import summarize
    from gpuscope.collectors.trace_files import parse_trace

    if ns.duration_ms <= 0:
        raise UsageError(f"--duration-ms: must be > 0, got {ns.duration_ms}")
    for flag, value in (("--job", ns.job), ("--jax", ns.jax), ("--serving", ns.serving)):
        if value is not None and not value.strip():
            raise UsageError(f"{flag}: empty (`gpuscope jobs{' --fleet' if flag == '--job' else ''}` lists "
                             f"{'the distributed jobs' if flag == '--job' else 'the jobs an agent can trace'})")
    if ns.job is not None:
        from .cmd_dist_jobs import cmd_capture_job
        return cmd_capture_job(ns)
    if ns.timeout is not None and ns.timeout < ns.duration_ms / 1e3 + 10:
        raise UsageError(f"--timeout {ns.timeout:g}: must leave the {ns.duration_ms / 1e3:g} s capture 10 s or "
                         f"more to start, stop and answer")
    if ns.jax and "://" in ns.jax:
        raise UsageError(f"--jax {ns.jax}: takes the HOST:PORT of a JAX profiler server; for a serving engine's "
                         f"URL use --serving {ns.jax}")
    if ns.serving is not None and not ns.serving.startswith(("http://", "https://")):
        raise UsageError(f"--serving {ns.serving}: expected the engine's base URL, http://HOST:PORT")
    record, xspace = clients.capture(ns.server, ns.jax or ns.serving, ns.pid, ns.duration_ms,
                                     security=client_security(ns), timeout_s=ns.timeout)
    summary = summarize(parse_trace(xspace, record["path"])) if xspace else None
    if summary and summary.get("span_seconds", 0) > 2 * record["duration_ms"] / 1e3 + 1:
        # the session ran past what was asked: the engine was stalled, or slow to stop
        summary["warnings"].append(f"the trace covers {summary['span_seconds']:.1f} s, "
                                   f"{summary['span_seconds'] / (record['duration_ms'] / 1e3):.0f}x the "
                                   f"{record['duration_ms'] / 1e3:g} s asked: the job was stalled or slow to stop")
    if ns.json:
        out = dict(summary) if summary else dict(verdict=None, summary=f"capture {record['status']}: {record['error']}")
        out["capture"] = record
        print_json(out)
    else:
        print(f"capture {record['id']}: {record['status']} ({record['target']}, {record['duration_ms']} ms) "
              f"-> {record['path'] or '-'} on {record['host']}")
        if record["error"]:
            print(f"  error: {record['error']}")
        if summary:
            print_summary(summary)
    return 0 if record["status"].startswith("ok") else 1


def cmd_captures(ns) -> int:
    rows = clients.captures(ns.server, security=client_security(ns))
    if ns.json:
        print_json({"captures": rows})
        return 0
    if not rows:
        print("no captures")
        return 0
    print(f"{'ID':<12} {'STARTED':<19} {'HOST':<16} {'STATUS':<10} {'VERDICT':<20} {'SIZE':>9}  TARGET / JOB")
    for r in rows:
        print(f"{r['id']:<12} {_when(r['start']):<19} {r['host'][:16]:<16} {r['status']:<10} "
              f"{r.get('verdict') or ('(not judged)' if r['status'].startswith('ok') else '-'):<20} "
              f"{human.iec(r['size_bytes']):>9}  {r['target']} {r['job'][:40]}")
        if r.get("error"):
            print(f"    {r['error']}")
    return 0


def cmd_jobs(ns) -> int:
    rows = clients.jobs(ns.server, security=client_security(ns))
    if ns.json:
        print_json({"jobs": rows})
        return 0
    if not rows:
        print("no JAX profiler servers or serving engines (vLLM, SGLang, TensorRT-LLM) on this host's GPUs")
        return 0
    print(f"{'KIND':<8} {'PID':>7}  {'ADDRESS':<24} {'GPUS':<8} {'FOUND BY':<24} COMMAND / TRACES")
    for j in rows:
        where = j["command"] or (f"traces in {j['trace_dir']}" if j.get("trace_dir") else "-")
        print(f"{j.get('kind', 'jax'):<8} {j['pid'] or '-':>7}  {j['address']:<24} "
              f"{','.join(map(str, j['gpus'])) or '-':<8} {j['found_by'][:24]:<24} {where[:80]}")
        owner = whose(j.get("attribution"))
        if owner:
            print(f"{'':<8} {'':>7}  whose: {owner}")
    return 0


def _event_line(e: dict) -> str:
    r = e["record"]
    when = time.strftime("%H:%M:%S", time.localtime(e["t"])) if e["t"] else "--:--:--"
    where = f"{e['host']}/gpu{e['gpu']}"
    job = f" (job {r['job']})" if r.get("job") else ""
    if e["kind"] == "finding":
        state = "closed" if r.get("end") else "opened"
        owner = whose(r.get("attribution"))
        return (f"{when} finding  {where} {state} {r['verdict']} {r['id'][:8]} (conf {r['confidence']:.2f}){job}"
                + (f" [{owner}]" if owner else "") + f": {r['summary']}")
    if e["kind"] == "anomaly":
        about = f" finding {r['finding_id'][:8]}" if r.get("finding_id") else ""
        return f"{when} anomaly  {where} {','.join(r['kinds'])}{about}{job}: {r['reason']}"
    if e["kind"] == "decision":
        return f"{when} decision {where} {r['action']} [{r['status']}]{job} {r['reason']}"
    return (f"{when} capture  {where} {r.get('kind')} {r['status']} verdict {r.get('verdict') or '-'} "
            f"{r.get('path') or ''} {r.get('error') or ''}")


BACKLOG_S = 300.0          # `watch` starts with the anomalies of the last 5 minutes


def cmd_watch(ns) -> int:
    """Open findings and the last minutes' anomalies first (in JSON, with
    "backlog": true), then every event as it happens."""
    security = client_security(ns)

    def show(e: dict) -> None:
        print(json.dumps(e, default=str) if ns.json else _event_line(e), flush=True)

    def backlog() -> None:
        kinds = set(ns.kind or ("finding", "anomaly", "decision", "capture"))
        if not ns.json:
            asked = ", ".join(sorted(kinds)) + (f" of host {ns.host!r}" if ns.host else "") + (
                f", GPU {ns.gpu}" if ns.gpu is not None else "")
            print(f"watching {ns.server}: {asked}, as they happen, times in {time.strftime('%Z')} (Ctrl-C to stop)",
                  flush=True)
        old = []
        if "finding" in kinds:
            old += [dict(kind="finding", t=f["start"], host=f["host"], gpu=f["gpu"], verdict=f["verdict"], record=f)
                    for f in clients.findings(ns.server, ns.host or "", ns.gpu, ns.verdict, open_only=True,
                                              security=security)]
        if "anomaly" in kinds:
            old += [dict(kind="anomaly", t=a["t"], host=a["host"], gpu=a["gpu"], verdict=None, record=a)
                    for a in clients.records(ns.server, "anomalies", ns.host or "", time.time() - BACKLOG_S, 200,
                                             security=security) if ns.gpu is None or a["gpu"] == ns.gpu]
        if not ns.json:
            print(f"now: {human.many(sum(e['kind'] == 'finding' for e in old), 'open finding')}, "
                  f"{human.many(sum(e['kind'] == 'anomaly' for e in old), 'anomaly', 'anomalies')} in the last "
                  f"{BACKLOG_S / 60:.0f} min (the anomalies first, oldest first; the open findings last, "
                  f"above the live events)", flush=True)
        # the open findings last, next to where live events start: on a fleet a screen of anomalies would
        # scroll them away
        for e in sorted(old, key=lambda e: (e["kind"] == "finding", e["t"] or 0)):
            show({**e, "backlog": True} if ns.json else e)
        if not ns.json:
            print("--- live ---", flush=True)
    try:
        while True:
            try:
                for e in clients.watch(ns.server, ns.host or "", ns.gpu, ns.verdict or (), ns.kind or (),
                                       security=security, on_open=backlog):
                    show(e)
                return 0
            except clients.ConnectionLost as exc:
                # like top --watch: a restart of the analyzer is not the end of the watch
                _say_lost(ns, exc)
                _reconnect(ns, security)
    except KeyboardInterrupt:
        return 0


RECONNECT_S = 2.0


def _say_lost(ns, exc: Exception) -> None:
    if ns.json:
        print(json.dumps(dict(kind="connection", t=time.time(), lost=True, error=str(exc))), flush=True)
    else:
        print(f"--- {exc}; asking again every {RECONNECT_S:g} s (Ctrl-C to stop) ---", flush=True)


def _reconnect(ns, security) -> None:
    """Back when the analyzer answers again; the watch then starts over
    with the current state, so nothing that happened meanwhile is missed."""
    while True:
        time.sleep(RECONNECT_S)
        try:
            clients.status(ns.server, security=security)
            return
        except clients.ClientError:
            continue


def cmd_records(ns) -> int:
    since = time.time() - ns.since if ns.since else 0.0
    rows = clients.records(ns.server, ns.command, ns.host or "", since, ns.limit, security=client_security(ns))
    if ns.json:
        print_json({ns.command: rows})
        return 0
    if not rows:
        print(_nothing(ns, ns.command))
    kind = "anomaly" if ns.command == "anomalies" else "decision"
    for r in rows:
        print(_event_line(dict(kind=kind, t=r["t"], host=r["host"], gpu=r["gpu"], record=r)))
    return 0


def _when(t: float | None, today: float | None = None) -> str:
    """A local time: the clock alone today, with the date and zone before."""
    if not t:
        return "open"
    day = time.strftime("%Y-%m-%d", time.localtime(t))
    if day == time.strftime("%Y-%m-%d", time.localtime(today or time.time())):
        return time.strftime("%H:%M:%S", time.localtime(t))
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(t))


def _moved(ch: dict) -> str:
    """How much a number moved, relative to where it was: `16× more`,
    `3.2× less`, `+24 %`, `to 0`."""
    factor = ch["during"] / ch["before"] if ch["before"] else None
    if factor is None:
        return "from 0"
    if factor == 0:
        return "to 0"
    if factor >= 2:
        return f"{_times(factor)} more"
    if 0 < factor <= 0.5:
        return f"{_times(1 / factor)} less"
    return f"{(factor - 1) * 100:+.0f} %"


def _times(x: float) -> str:
    """`16.1×`, `891×`, `1,490×`: never an exponent."""
    return f"{x:,.0f}×" if x >= 100 else f"{x:.3g}×"


def _said(metric: str, v: float | None) -> str:
    m = cat.BY_NAME.get(metric)
    return human.value(m.unit, v) if m is not None else ("—" if v is None else f"{v:.3g}")


def render_report(rep: dict) -> str:
    f, c, v = rep["finding"], rep["counters"], rep["verdict"]
    trace = f"trace said {v['trace']}" if v["trace"] else "no trace judged it"
    by = f"{v['by']} from {f['source']}" if v["by"] == "counters" and f.get("source") else v["by"]
    lines = [f"finding {f['id']}: {f['host']}/gpu{f['gpu']} {v['decided']} (decided by {by}; counters said "
             f"{v['counters']}, {trace})",
             f"  {_when(f['start'])} -> {_when(f['end'])}, {human.many(f['windows'], 'window')}, confidence "
             f"{f['confidence']:.2f}, job {f['job'] or '-'}" + (
                 f" — {whose_beside(f['job'], f.get('attribution'))}"
                 if whose_beside(f["job"], f.get("attribution")) else ""),
             f"  {f['summary']}"]
    if f.get("flags"):
        lines.append(f"  flags: {', '.join(x.replace('_', '-') for x in f['flags'])}")
    lines += ["", f"counters (means; before/after = {c['context_seconds']:.0f} s around the episode):",
              f"  {'metric':<32} {'before':>12} {'during':>12} {'after':>12}"]
    for m in [k for k in c["during"] if k != "samples"]:
        vals = [c[w].get(m) if c[w] else None for w in ("before", "during", "after")]
        if any(x is not None for x in vals):
            lines.append(f"  {m:<32} " + " ".join(f"{_said(m, x):>12}" for x in vals))
    lines += ["", "what changed against the job's baseline (before; the 6 that moved most, then clocks, power "
                  "and temperature):"]
    lines += [f"  {ch['metric']}: {_said(ch['metric'], ch['before'])} -> {_said(ch['metric'], ch['during'])} "
              f"({_moved(ch)})"
              for ch in rep["changes"]] or ["  nothing moved by 10 % or more"]
    if rep.get("what_to_try"):
        lines += ["", f"what to try ({v['decided']}{''.join(', ' + x.replace('_', '-') for x in f.get('flags') or ())}):"]
        lines += [f"  - {t}" for t in rep["what_to_try"]]
    lines += ["", f"captures: {len(rep['captures'])}"]
    for cap in rep["captures"]:
        t = cap.get("trace_summary") or {}
        lines.append(f"  {cap['id']} {cap.get('kind')} {cap['status']} {cap['path'] or ''}")
        if t:
            lines.append(f"    trace: {t.get('verdict')} — {t.get('summary')}")
            for op in (t.get("top_ops") or [])[:3]:
                lines.append(f"      {human.value('ratio', op.get('time_fraction')):>6}  {op.get('op') or '-'}  "
                             f"{op.get('kernel', '')}")
    lines += ["", f"anomalies: {len(rep['anomalies'])}"]
    lines += [f"  {_when(a['t'])} {','.join(a['kinds'])}: {a['reason']}" for a in rep["anomalies"]]
    lines += [f"decisions: {len(rep['decisions'])}"]
    lines += [f"  {_when(d['t'])} {d['action']} [{d['status']}] {d['reason']}" for d in rep["decisions"]]
    return "\n".join(lines)
