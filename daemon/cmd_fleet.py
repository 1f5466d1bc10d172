"""`gpuscope fleet`: fleet-wide questions over the Parquet the analyzers
publish (--publish; docs/fleet.md), answered here with DuckDB, no analyzer
asked: `fleet query top-jobs`, `fleet query hosts-changed`, `fleet sql`."""
from __future__ import annotations

import contextlib
import math
import os
import re
import time

from gpuscope.collectors import human

from .cliutil import VERDICTS, UsageError, positive_duration, positive_int, print_json

ENV_FROM = "GPUSCOPE_FLEET"


def add_fleet_parser(sub) -> None:
    sp = sub.add_parser("fleet", help="fleet-wide questions over the Parquet the analyzers publish (--publish)")
    fleet = sp.add_subparsers(dest="fleet_command", required=True)

    def common(p):
        p.add_argument("--from", dest="source", default=None, metavar="URL",
                       help=f"where the analyzers publish: a directory, s3://BUCKET/PREFIX or gs://BUCKET/PREFIX "
                            f"(default ${ENV_FROM})")
        p.add_argument("--cluster", default="", help="one cluster (default: all)")
        p.add_argument("--json", action="store_true", help="JSON output")

    def time_range(p, default: str | None):
        p.add_argument("--since", type=positive_duration, default=None,
                       help=f"from this long ago, e.g. 24h, 7d{f' (default {default})' if default else ''}")
        p.add_argument("--start", default=None, help="from this time: ISO 8601 (UTC unless it says +HH:MM) or Unix s")
        p.add_argument("--end", default=None, help="until this time (default now)")

    q = fleet.add_parser("query", help="named fleet-wide questions").add_subparsers(dest="question", required=True)
    p = q.add_parser("top-jobs", help="jobs (pods, Slurm jobs) with the most GPU-minutes in a bottleneck")
    common(p)
    time_range(p, "24h")
    p.add_argument("--verdict", action="append", choices=VERDICTS, default=None,
                   help="count minutes of this verdict (repeat; default every bottleneck: all but idle)")
    p.add_argument("--by", choices=("job", "pod", "slurm-job"), default="job",
                   help="rank jobs (a host's, default), Kubernetes pods or Slurm jobs")
    p.add_argument("--limit", type=positive_int, default=10, metavar="N", help="at most N rows (default 10)")
    p.set_defaults(fn=cmd_top_jobs)

    p = q.add_parser("hosts-changed", help="hosts that went VERDICT after a time (a driver roll-out, an upgrade)")
    common(p)
    p.add_argument("--after", required=True, help="the change: ISO 8601 (UTC unless it says +HH:MM) or Unix s")
    p.add_argument("--to", required=True, choices=VERDICTS, help="the verdict hosts went to")
    p.add_argument("--window", type=positive_duration, default=7 * 86400.0,
                   help="compare this long before with this long after (default 7d)")
    p.add_argument("--min-change", type=_share, default=0.25, metavar="SHARE",
                   help="the least growth of the verdict's share of judged GPU-minutes, 0-1 (default 0.25)")
    p.add_argument("--limit", type=positive_int, default=50, metavar="N", help="at most N hosts (default 50)")
    p.set_defaults(fn=cmd_hosts_changed)

    p = fleet.add_parser("sql", help="any SQL over the views rollups, findings and captures (docs/fleet.md)")
    p.add_argument("query", help='e.g. "SELECT cluster, count(DISTINCT host) FROM rollups GROUP BY ALL"')
    common(p)
    time_range(p, None)
    p.add_argument("--limit", type=positive_int, default=100, metavar="N",
                   help="rows printed (default 100; --json prints all)")
    p.set_defaults(fn=cmd_sql)


def _share(value: str) -> float:
    import argparse
    try:
        x = float(value)
    except ValueError:
        x = math.nan
    if not 0 <= x <= 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a share from 0 to 1 (0.25: 25 points)")
    return x


def _reader(ns, progress):
    from gpuscope.analyzers.fleet_query import FleetReader

    source = ns.source or os.environ.get(ENV_FROM)
    if not source:
        raise UsageError(f"where is the fleet tier? --from DIR, s3://BUCKET/PREFIX or gs://BUCKET/PREFIX "
                         f"(or ${ENV_FROM}); analyzers publish there with --publish")
    return FleetReader(source, progress=progress)


def _times(ns, default_since: float | None) -> tuple[float | None, float | None]:
    from gpuscope.analyzers.fleet_query import parse_time

    now = time.time()
    end = parse_time(ns.end, now) if ns.end else None
    if ns.since is not None and ns.start:
        raise UsageError("--since or --start, not both")
    start = parse_time(ns.start, now) if ns.start else None
    if start is None and (ns.since or default_since):
        start = (end or now) - (ns.since or default_since)
    if start is not None and end is not None and start >= end:
        raise UsageError(f"the range is empty: {_when(start)} is not before {_when(end)}")
    return start, end


@contextlib.contextmanager
def _progress(ns):
    """A spinner on stderr saying what is being listed and scanned, on a
    terminal only (a script's stderr stays clean)."""
    from rich.console import Console

    console = Console(stderr=True)
    if not console.is_terminal:
        yield lambda _text: None
        return
    started = time.monotonic()
    with console.status("fleet tier") as status:
        yield lambda text: status.update(f"{text} ({time.monotonic() - started:.1f} s)")


def _ask(ns, fn):
    from gpuscope.analyzers.fleet_query import NoFiles

    with _progress(ns) as progress:
        reader = _reader(ns, progress)
        try:
            return fn(reader), reader.url
        except NoFiles as exc:
            raise UsageError(str(exc)) from None
        finally:
            reader.close()


def cmd_top_jobs(ns) -> int:
    start, end = _times(ns, 86400.0)
    end = end or time.time()
    verdicts = ns.verdict or []
    rows, url = _ask(ns, lambda r: r.top_jobs(start, end, ns.by, verdicts, ns.cluster, ns.limit))
    if ns.json:
        print_json(dict(question="top-jobs", source=url, start=start, end=end, by=ns.by,
                        verdicts=verdicts or None, cluster=ns.cluster or None, rows=rows))
        return 0
    what = " or ".join(verdicts) if verdicts else "a bottleneck (any verdict but idle)"
    noun = {"job": "jobs", "pod": "pods", "slurm-job": "Slurm jobs"}[ns.by]
    print(f"{noun} with the most GPU-minutes {what}, {_when(start)} -> {_when(end)} UTC"
          + (f", cluster {ns.cluster}" if ns.cluster else "") + f" ({url})")
    if not rows:
        print(f"  none: no minute {what} has a {ns.by.replace('-', ' ')} in that range")
        return 0
    print(f"  {'#':>2} {noun.upper()[:-1]:<44} {'GPU-MIN':>9} {'GPUS':>5} {'HOSTS':>5}  {'MAIN VERDICT':<26} "
          f"{'UTIL':>5} {'SM':>5} {'TENSOR':>6} {'DRAM':>5}")
    for i, r in enumerate(rows, 1):
        share = r["verdicts"][0]["minutes"] / r["gpu_minutes"] if r["verdicts"] else 0
        main = f"{r['main_verdict']} ({share * 100:.0f} %)"
        print(f"  {i:>2} {_cut(r['group'], 44):<44} {r['gpu_minutes']:>9,} {r['gpus']:>5} {r['hosts']:>5}  "
              f"{main:<26} {human.percent(r['util_gpu_ratio']):>5} {human.percent(r['gpm_sm_util_ratio']):>5} "
              f"{human.percent(r['gpm_tensor_util_ratio']):>6} {human.percent(r['gpm_dram_bw_util_ratio']):>5}")
    print("  UTIL: NVML's utilisation; SM, TENSOR, DRAM: GPM activity (— without GPM); means over those minutes")
    return 0


def cmd_hosts_changed(ns) -> int:
    from gpuscope.analyzers.fleet_query import parse_time

    at = parse_time(ns.after)
    rows, url = _ask(ns, lambda r: r.hosts_changed(at, ns.to, ns.window, ns.cluster, ns.min_change, ns.limit))
    if ns.json:
        print_json(dict(question="hosts-changed", source=url, after=at, to=ns.to, window_seconds=ns.window,
                        min_change=ns.min_change, cluster=ns.cluster or None, rows=rows))
        return 0
    span = _span(ns.window)
    print(f"hosts whose share of {ns.to} GPU-minutes grew by {ns.min_change * 100:.0f} points or more after "
          f"{_when(at)} UTC ({span} before vs {span} after)" + (f", cluster {ns.cluster}" if ns.cluster else "")
          + f" ({url})")
    if not rows:
        print(f"  none: no host's {ns.to} share grew that much (--min-change to lower the bar)")
        return 0
    print(f"  {'CLUSTER':<12} {'HOST':<28} {'BEFORE':>6} {'AFTER':>6} {'CHANGE':>7}  {'MAIN VERDICT BEFORE -> AFTER':<44} "
          f"{'GPUS':>4}")
    for r in rows:
        verdicts = f"{r['before_verdict'] or '-'} -> {r['after_verdict'] or '-'}"
        print(f"  {_cut(r['cluster'], 12):<12} {_cut(r['host'], 28):<28} {human.percent(r['before_share']):>6} "
              f"{human.percent(r['after_share']):>6} {'+' + format(r['change'] * 100, '.0f'):>5} pt  "
              f"{verdicts:<44} {r['gpus']:>4}")
    return 0


def cmd_sql(ns) -> int:
    start, end = _times(ns, None)
    rows, url = _ask(ns, lambda r: r.sql(ns.query, start, end, ns.cluster))
    if ns.json:
        print_json(dict(source=url, rows=rows))
        return 0
    print(render_rows(rows[:ns.limit]))
    if len(rows) > ns.limit:
        print(f"... {ns.limit} of {len(rows):,} rows shown; --limit N for more, --json for all")
    return 0


def render_rows(rows: list[dict]) -> str:
    """Any rows as an aligned table; numbers right-aligned."""
    if not rows:
        return "(no rows)"
    names = list(rows[0])
    cells = [[_time_cell(r[n]) if _is_time(n) else _cell(r[n]) for n in names] for r in rows]
    widths = [min(60, max(len(n), *(len(c[i]) for c in cells))) for i, n in enumerate(names)]
    numeric = [all(isinstance(r[n], (int, float)) or r[n] is None for r in rows) for n in names]

    def line(values):
        return "  ".join((_cut(v, w).rjust(w) if num else _cut(v, w).ljust(w))
                         for v, w, num in zip(values, widths, numeric)).rstrip()
    return "\n".join([line(names)] + [line(c) for c in cells])


_TIME_COLUMN = re.compile(r"(?:^|\W)(?:t|start|end|minute|first_t|last_t)(?:$|\W)|_at$|_t$|_start$|_end$")


def _is_time(column: str) -> bool:
    """The tables' times are Unix seconds in columns named so (t, start, end,
    *_at), also inside an expression (`max(t)`): shown as dates, not as
    1,796,105,580 (found in a trial)."""
    return bool(_TIME_COLUMN.search(column))


def _time_cell(v) -> str:
    """In UTC, as the partitions' dates and --start/--end read them."""
    if isinstance(v, (int, float)) and 1e9 <= v < 1e10:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(v))
    return _cell(v)


def _cell(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1e6 and v.is_integer() else f"{v:.4g}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _cut(text: str, width: int) -> str:
    text = str(text)
    return text if len(text) <= width else text[:width - 1] + "…"


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(t))


def _span(seconds: float) -> str:
    for n, unit in ((86400, "d"), (3600, "h"), (60, "m")):
        if seconds % n == 0:
            return f"{seconds / n:g}{unit}"
    return f"{seconds:g}s"


__all__ = ["add_fleet_parser", "render_rows"]
