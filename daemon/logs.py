"""structlog set-up: JSON lines when stderr is not a terminal (journald,
Kubernetes), readable key=value on a terminal. Libraries that log through
the standard `logging` (APScheduler, gRPC's Python side) come out in the
same form: a plain-text warning inside a JSON log breaks its parsers."""
from __future__ import annotations

import logging
import sys

import structlog


_JSON = False


class LossyStream:
    """A log stream whose writes never raise. A daemon whose log reader went
    away (`| head`, a closed pipe, a full disk) keeps running and drops its
    lines: found in a trial, the analyzer's first log line after the pipe
    closed raised in its shutdown path, which then never stopped the
    analysis process, and nothing but kill -9 ended it."""

    def __init__(self, out):
        self._out = out

    def write(self, text: str) -> int:
        try:
            return self._out.write(text)
        except (OSError, ValueError):        # EPIPE, ENOSPC, EIO; ValueError: the file was closed
            return len(text)

    def flush(self) -> None:
        try:
            self._out.flush()
        except (OSError, ValueError):
            pass

    def isatty(self) -> bool:
        try:
            return self._out.isatty()
        except (OSError, ValueError):
            return False


def configure(level: str = "info", json_logs: bool | None = None, file=None) -> None:
    """`file`: where logs go instead of stderr (the live view's terminal)."""
    global _JSON
    out = LossyStream(file or sys.stderr)
    if json_logs is None:
        json_logs = not out.isatty()
    _JSON = json_logs
    renderer = structlog.processors.JSONRenderer() if json_logs else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, structlog.processors.add_log_level,
                    structlog.processors.TimeStamper(fmt="iso", utc=True),
                    structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper(), logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=True)
    handler = logging.StreamHandler(out)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        foreign_pre_chain=[structlog.stdlib.add_log_level, structlog.stdlib.add_logger_name,
                           structlog.processors.TimeStamper(fmt="iso", utc=True)]))
    root = logging.getLogger()
    root.handlers = [handler]
    # libraries speak at warning and above, as Python's last-resort handler let them (debug: everything)
    root.setLevel(logging.DEBUG if level == "debug" else max(logging.WARNING, getattr(logging, level.upper(), 20)))
    # a periodic job that ran late or overlapped (a loaded host) is coalesced into the next run; said
    # once per run it was 149 lines in 16 minutes of a trial, none of them anything to act on
    logging.getLogger("apscheduler").setLevel(logging.ERROR)


def say(text: str, level: str = "info", **fields) -> None:
    """What a server tells the person who started it (a fallback taken, where
    it listens, that it stopped): a line on a terminal, a log event in JSON
    mode, so a JSON log stays JSON."""
    if _JSON:
        getattr(structlog.get_logger("gpuscope"), level)(text, **fields)
    else:
        print(f"gpuscope: {text}", file=LossyStream(sys.stderr), flush=True)
