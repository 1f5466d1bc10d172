"""The `gpuscope` command's entry point. Loading the CLI and building its
parser (gRPC, DuckDB, NumPy) takes most of a second; Ctrl-C in that second
ends the command quietly with 130, as the shell expects, not with a
traceback from inside an import."""
import sys


def run() -> None:
    try:
        from .cli import run as cli_run
        cli_run()
    except KeyboardInterrupt:
        sys.exit(130)
