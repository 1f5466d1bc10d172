"""The `gpuscope` command's entry point. Loading the CLI and building its
parser (gRPC, DuckDB, NumPy) takes most of a second, and a server goes on
importing until its own signal handlers are in. A Ctrl-C in that time must
not be lost or end in a traceback from inside an import: Python swallows a
KeyboardInterrupt raised in the import system's weakref callback, so start-up
notes the signal instead of raising it. A one-shot command then ends with 130,
as the shell expects; a server stops cleanly as soon as it has started."""
import signal
import sys

_interrupted = False


def _note(signum, frame) -> None:
    global _interrupted
    _interrupted = True


def interrupted() -> bool:
    """Whether Ctrl-C came during start-up (the servers' stop event starts set)."""
    return _interrupted


def resume_ctrl_c() -> None:
    """For a command that is not a server: Ctrl-C raises KeyboardInterrupt
    again from here on, and one already noted ends the command now."""
    if signal.getsignal(signal.SIGINT) is _note:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if _interrupted:
        sys.exit(130)


def run() -> None:
    signal.signal(signal.SIGINT, _note)
    try:
        from .cli import run as cli_run
    except KeyboardInterrupt:          # a handler other than ours was in place (embedding)
        sys.exit(130)
    cli_run()
