"""`gpuscope report`: the story of one finding in the terminal (as it always
was), or, with --html/--png, pictures: of a time range (--since 2h), or of
a finding's context (its GPU, from before it started to after it ended).
The data comes from the analyzer over gRPC (Report, RangeReport); the
pictures are drawn here (daemon/report_html.py)."""
from __future__ import annotations

import contextlib
import os
import shlex
import sys
import tempfile
import time

from gpuscope.collectors import human

from . import clients
from .cliutil import UsageError, age, print_json
from .cmd_oncall import _time_range, _when, render_report
from .security_flags import client_security

DEFAULT_RANGE_S = 3600.0


def cmd_report(ns) -> int:
    ranged = ns.since is not None or ns.start is not None or ns.end is not None
    pictures = bool(ns.html or ns.png)
    if ns.finding_id and ranged:
        raise UsageError("give a finding id (its story and context) or a range (--since, --start, --end), not both")
    if ns.finding_id and (ns.host or ns.gpu is not None):
        raise UsageError("--host and --gpu choose the GPUs of a range; a finding id names its own GPU")
    if ns.context is not None and not ns.finding_id:
        raise UsageError("--context goes with a finding id: the seconds drawn around it")
    if not ns.finding_id and not ranged and not pictures:
        raise UsageError("give a FINDING_ID (its story; `gpuscope findings` lists them), or a range to draw: "
                         "--since 2h --html report.html (or --png timeline.png)")
    for path in (ns.html, ns.png):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise UsageError(f"{path}: no such directory to write it in")
    security = client_security(ns)
    if ns.finding_id and not pictures:
        rep = clients.report(ns.server, ns.finding_id, ns.context or 0.0, security=security)
        if ns.json:
            print_json(rep)
        else:
            print(render_report(rep))
        return 0
    steps = 2 + bool(ns.finding_id) + bool(ns.png) + 2 * bool(ns.html)     # asking, drawing or done, writing
    with _steps(enabled=not ns.json, total=steps) as step:
        story = None
        if ns.finding_id:
            step(f"asking {ns.server} for finding {ns.finding_id}")
            story = clients.report(ns.server, ns.finding_id, ns.context or 0.0, security=security)
            f, ctx = story["finding"], story["counters"]["context_seconds"]
            start, end = f["start"] - ctx, (f["end"] if f["end"] is not None else time.time()) + ctx
            end = min(end, time.time()) if f["end"] is None else end
            host, gpu = f["host"], f["gpu"]
        else:
            start, end = _time_range(ns)
            end = time.time() if end is None else end
            start = end - DEFAULT_RANGE_S if start is None else start
            if start >= end:
                raise UsageError(f"--start {_when(start)} is not before --end {_when(end)}")
            host, gpu = ns.host or "", ns.gpu
        step(f"asking {ns.server} for {_range_words(start, end, host, gpu)}")
        rep = clients.range_report(ns.server, start, end, host, gpu, max_points=ns.points or 0,
                                   max_gpus=ns.max_gpus or 0, security=security)
        if not rep["gpus"]:
            return _nothing(ns, rep, pictures)
        if not pictures:
            step("done")
            if ns.json:
                print_json(rep)
            else:
                print(render_range(rep))
            return 0
        try:
            import matplotlib  # noqa: F401  (only when there is something to draw)
        except ImportError:
            raise UsageError("--html/--png draw with matplotlib, which this installation lacks (the container "
                             "image leaves it out): run the report where `pip install gpuscope` put it, or build "
                             "the image with --build-arg EXTRAS=report") from None
        from . import report_html as rh
        step("drawing the timeline")
        fid = story["finding"]["id"] if story else None
        timeline = rh.timeline_png(rep, highlight=fid)
        wrote = {}
        if ns.png:
            step(f"writing {ns.png}")
            wrote["png"] = _write(ns.png, timeline[0])
        if ns.html:
            step("drawing the roofline")
            roofline = rh.roofline_png(rep)
            step(f"writing {ns.html}")
            title = (f"gpuscope report: finding {story['finding']['id']} ({story['finding']['verdict']} on "
                     f"{story['finding']['host']}/gpu{story['finding']['gpu']})" if story else
                     f"gpuscope report: {_range_words(start, end, host, gpu)}")
            page = rh.page(rep, title=title, story=render_report(story) if story else None, timeline=timeline,
                           roofline=roofline, command=_command(), highlight=fid)
            wrote["html"] = _write(ns.html, page.encode("utf-8"))
    if ns.json:
        print_json(dict(wrote={k: dict(path=os.path.abspath(p), bytes=n) for k, (p, n) in wrote.items()},
                        start=rep["start"], end=rep["end"], gpus=len(rep["gpus"]), findings=len(rep["findings"]),
                        captures=len(rep["captures"]), notes=rep["notes"]))
        return 0
    for kind, (path, n) in wrote.items():
        what = "open it in a browser (it needs no network)" if kind == "html" else "the timeline"
        print(f"wrote {path} ({human.iec(n)}): {what}")
    print(f"  {human.many(len(rep['gpus']), 'GPU')}, {human.many(len(rep['findings']), 'finding')}, "
          f"{human.many(len(rep['captures']), 'capture')}, {_when(rep['start'])} -> {_when(rep['end'])}")
    for note in rep["notes"]:
        print(f"  note: {note}")
    return 0


def _range_words(start: float, end: float, host: str, gpu: int | None) -> str:
    who = (f"host {host}" if host else "the fleet") + (f", GPU {gpu}" if gpu is not None else "")
    return f"{who}, {_when(start)} -> {_when(end)} ({age(end - start)})"


def _nothing(ns, rep: dict, pictures: bool) -> int:
    """No samples in the range: say so, and where the analyzer has some."""
    who = "".join(x for x in (f" of host {ns.host!r}" if ns.host else "",
                              f", GPU {ns.gpu}" if ns.gpu is not None else ""))
    ext = rep.get("extent")
    has = (f"its samples{who} run from {_when(ext['first'])} to {_when(ext['last'])}" if ext else
           f"it has no samples{who} at all")
    line = f"no samples{who} from {_when(rep['start'])} to {_when(rep['end'])}: nothing to draw ({has})"
    if ns.json:
        print_json(dict(rep, error=line))
        return 1 if pictures else 0
    print(line, file=sys.stderr if pictures else sys.stdout)
    return 1 if pictures else 0


def render_range(rep: dict) -> str:
    """The range in words, for a terminal: each GPU's time per verdict, and
    the findings."""
    lines = [f"{_range_words(rep['start'], rep['end'], rep.get('host') or '', rep.get('gpu'))}: "
             f"{human.many(len(rep['gpus']), 'GPU')}, {human.many(len(rep['findings']), 'finding')}, "
             f"{human.many(len(rep['captures']), 'capture')} (--html FILE or --png FILE for pictures)"]
    seconds: dict[tuple[str, int], dict[str, float]] = {}
    for r in rep["lanes"]["runs"]:
        per = seconds.setdefault((r["host"], r["gpu"]), {})
        per[r["verdict"]] = per.get(r["verdict"], 0.0) + r["end"] - r["start"]
    for g in rep["gpus"]:
        per = sorted(seconds.get((g["host"], g["gpu"]), {}).items(), key=lambda kv: -kv[1])
        lines.append(f"  {g['host']}/gpu{g['gpu']}: " + (", ".join(f"{v} {age(s)}" for v, s in per)
                                                         or "no window judged"))
    for f in rep["findings"]:
        lines.append(f"  {f['id']} {f['host']}/gpu{f['gpu']} {f['verdict']:<20} {_when(f['start'])} -> "
                     f"{_when(f['end'])}  {f.get('summary') or ''}")
    lines += [f"  note: {n}" for n in rep["notes"]]
    return "\n".join(lines)


def _write(path: str, data: bytes) -> tuple[str, int]:
    """Whole or not at all: a browser or a ticket never gets half a file.
    What the file system refuses is one line (found in a trial: tracebacks
    for a directory, a full disk, a path that cannot be written)."""
    if os.path.isdir(path):
        raise UsageError(f"{path} is a directory: give a file name (e.g. {os.path.join(path, 'report.html')})")
    directory = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".gpuscope-report-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise UsageError(f"{path}: cannot write there ({exc.strerror or exc}); give a path in a directory "
                         f"you can write") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return path, len(data)


def _command() -> str:
    return "gpuscope " + " ".join(shlex.quote(a) for a in sys.argv[1:])


@contextlib.contextmanager
def _steps(enabled: bool, total: int):
    """`step(words)` says what is being done now, on stderr, with a spinner
    and the steps done: on a terminal only (a script or a pipe gets nothing
    but the result), and gone when done."""
    from rich.console import Console

    console = Console(stderr=True)
    if not enabled or not console.is_terminal:
        yield lambda words: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        task = progress.add_task("starting", total=total)
        started = [False]

        def step(words: str) -> None:
            if started[0]:
                progress.advance(task)
            started[0] = True
            progress.update(task, description=words, refresh=True)     # shown now, however short the step
        yield step
