"""Commands that need no server: classify a recording, summarize a trace,
list the metric catalogue."""
from __future__ import annotations

import sys
import time

from gpuscope.collectors import catalogue as cat
from gpuscope.collectors import human
from gpuscope.collectors.human import many
from gpuscope.collectors.recording import read_recording

from gpuscope.collectors.xspace_reader import TraceError

from .cliutil import UsageError, print_json


def cmd_classify(ns) -> int:
    from gpuscope.analyzers.offline import classify_recording

    rec = read_recording(ns.file)
    for warning in rec.warnings:
        print(f"gpuscope classify: {warning}", file=sys.stderr)
    skipped: list[tuple[int, float, float]] = []
    try:
        results = classify_recording(rec, ns.window, skipped)
    except ValueError as exc:
        raise UsageError(f"--window: {exc}") from None
    windows = [dict(gpu=c.gpu, start=c.start, end=c.end, verdict=c.verdict, confidence=c.confidence,
                    evidence=c.evidence, flags=c.flags, summary=c.summary,
                    alternatives=list(c.alternatives)) for c in results]
    unread = [dict(gpu=g, start=s, end=e) for g, s, e in skipped]
    if ns.json:
        print_json({"windows": windows, "window_seconds": ns.window, "unjudged": unread,
                    "ignored_columns": rec.ignored_columns})
        return 0
    rows = [(w["gpu"], w["start"], f"{w['verdict']:<20} {w['confidence']:.2f} {','.join(w['flags'])}  "
                                   f"{w['summary']}") for w in windows]
    rows += [(u["gpu"], u["start"], f"{'-':<20} {'':>4}  no activity reading in this window (util_gpu and "
                                    f"SM activity missing or [N/A]): not judged") for u in unread]
    if not rows:
        print(f"{ns.file}: no windows (the recording holds no samples)")
    for gpu, start, text in sorted(rows, key=lambda r: (r[1], r[0])):
        print(f"gpu{gpu} {time.strftime('%H:%M:%S', time.localtime(start))} {text}")
    if unread:
        print(f"{len(unread)} of {many(len(rows), 'window')} not judged: no activity reading in them",
              file=sys.stderr)
    if rec.ignored_columns:
        print(f"columns not read: {', '.join(rec.ignored_columns)} (docs/recordings.md lists those gpuscope reads)",
              file=sys.stderr)
    return 0


_CAUSE_WORDS = dict(dispatch="dispatching", host_work="other host work", host_transfer="host transfers",
                    device_wait="waiting on the device", waiting_for_work="waiting for work",
                    unattributed="unattributed")


def cmd_trace_summarize(ns) -> int:
    from gpuscope.analyzers.trace_analysis import summarize
    from gpuscope.collectors.trace_files import XSPACE, load_trace, profiles_at

    found = profiles_at(ns.path)
    if ns.all:
        return _summarize_each(ns.path, found, ns.json)
    first = found[0]
    if len(found) > 1:          # never silent about the others (a vLLM trace dir holds every session's)
        print(f"gpuscope trace summarize: {ns.path} holds {_traces(found)}; summarizing {first.path}, the "
              f"newest session's {'XSpace' if first.path.name.endswith(XSPACE) else 'largest'}"
              f"{_not_read(first)} (name a file to read another, or --all; --json lists them)", file=sys.stderr)
    elif first.same:
        print(f"gpuscope trace summarize: summarizing {first.path}{_not_read(first)}", file=sys.stderr)
    summary = summarize(load_trace(first.path))
    if len(found) > 1 and summary["verdict"] is None and not summary.get("host_steps"):
        # a serving engine's newest session may hold only its API server's trace (the worker died)
        print(f"gpuscope trace summarize: {first.path.name} holds no GPU activity and no engine steps (an API "
              f"server's trace, or a session whose worker wrote nothing?); --all reads every trace", file=sys.stderr)
    if ns.json:
        print_json({**summary, "traces_found": [str(p.path) for p in found],
                    "not_read": [str(f) for f in first.same]})
        return 0
    print_summary(summary)
    return 0


def _traces(found) -> str:
    """`6 traces`, and when a profiler wrote several files a trace, that they count once."""
    files = sum(1 + len(p.same) for p in found)
    return many(len(found), "trace") + (f" (one a profiling session and host; {files} files)"
                                        if files > len(found) else "")


def _not_read(profile) -> str:
    """What the profiler also wrote for this session and host, said as not read."""
    if not profile.same:
        return ""
    return f" (its {' and '.join(f.name for f in profile.same)} hold the same session in less detail: not read)"


def _summarize_each(path, found, as_json: bool) -> int:
    """--all: every trace (a session and host) once, from its best file, in
    the order `profiles_at` gives (newest session first); one that cannot be
    read is said and the others still are."""
    from gpuscope.analyzers.trace_analysis import summarize
    from gpuscope.collectors.trace_files import load_trace

    if any(p.same for p in found):
        print(f"gpuscope trace summarize: {path} holds {_traces(found)}; each is read once, from its XSpace "
              f"where it has one", file=sys.stderr)
    out, failed = [], 0
    for profile in found:
        try:
            summary = summarize(load_trace(profile.path))
        except TraceError as exc:
            failed += 1
            also = f" (the same session is in {', '.join(str(f) for f in profile.same)})" if profile.same else ""
            out.append({"source": str(profile.path), "error": str(exc) + also})
            if not as_json:
                print(f"{profile.path}: cannot be read: {exc}{also}\n")
            continue
        out.append(summary)
        if not as_json:
            print_summary(summary)
            print()
    if as_json:
        print_json({"traces": out})
    return 1 if failed == len(found) else 0


def _ratio(x: float | None) -> str:
    return human.value("ratio", x)


def print_summary(summary: dict) -> None:
    print(f"{summary['source']} ({summary['format']}, {summary['span_seconds'] * 1e3:.0f} ms)")
    devices = summary.get("devices") or []
    which = f" for {summary['device']}" if len(devices) > 1 and summary.get("device") else ""
    print(f"verdict{which}: {summary['verdict'] or 'none'} (confidence {summary['confidence']:.2f}, "
          f"decided by the trace)")
    print(f"  {summary['summary']}")
    t = summary.get("timing")
    if t:
        causes = ", ".join(f"{_CAUSE_WORDS[k]} {_ratio(v)}" for k, v in t["idle_causes"].items() if v >= 0.0005)
        print(f"  shares of the {t['span_seconds'] * 1e3:,.0f} ms span"
              + (f" (profiler start/stop left out: {t['excluded']['profiler_seconds'] * 1e3:,.0f} ms)"
                 if t["excluded"]["profiler_seconds"] else "")
              + f": GPU busy {_ratio(t['busy_fraction'])}" + (f"; GPU idle while {causes}" if causes else ""))
        for a in t["host_during_idle"][:3]:
            name = a["name"] if len(a["name"]) <= 60 else a["name"][:59] + "…"
            print(f"  {_ratio(a['idle_fraction']):>6} of GPU-idle time the host was in {name} ({a['category']})")
    steps = summary.get("host_steps")
    if steps:
        d = steps["duration_ms"]
        parts = ", ".join(f"{words} {_ratio(steps[key]) if steps[key] is not None else 'not in this trace'}"
                          for key, words in (("model_execution_fraction", "model execution"),
                                             ("scheduling_fraction", "scheduling"),
                                             ("sampling_fraction", "sampling"), ("other_fraction", "other")))
        print(f"  {steps['steps']} engine steps on the host, {d['mean']:.2f} ms mean (p50 {d['p50']:.2f}, "
              f"p99 {d['p99']:.2f}): {parts}")
    for op in summary.get("top_ops", [])[:5]:
        bound = f"{op.get('bound') or 'unknown'} ({op.get('bound_source', '?')})"
        print(f"  {_ratio(op['time_fraction']):>6}  {op['count']:6d}x  {(op['op'] or '-')[:32]:<32} "
              f"{op['kernel'][:40]:<40} {bound}")
    for d in devices:
        if len(devices) > 1 and d["device"] != summary.get("device"):
            print(f"  {d['device']}: {d['verdict']} ({d['confidence']:.2f}) {d['summary'][:160]}")
    for w in summary["warnings"]:
        if w.partition(": ")[2] not in summary["summary"]:     # said once: the summary may say it already
            print(f"  note: {w}")


def cmd_metrics(ns) -> int:
    rows = [dict(name=m.name, unit=m.unit, kind=m.kind.value, help=m.help, raw_unit=m.raw_unit,
                 slow=m.slow, prometheus=cat.prometheus_name(m) + ("_total" if m.kind is cat.Kind.COUNTER else ""))
            for m in cat.METRICS]
    if ns.json:
        print_json({"metrics": rows})
    else:
        # both names: `gpuscope query --metric` takes either
        print(f"{'NAME':<38} {'ON /metrics':<56} {'UNIT':<8} {'KIND':<8} HELP")
        for r in rows:
            print(f"{r['name']:<38} {r['prometheus']:<56} {r['unit']:<8} {r['kind']:<8} {r['help']}")
    return 0
