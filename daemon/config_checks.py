"""What start-up would refuse of the values a configuration gives, beyond
the flags' own types and ranges, found before anything starts: addresses
that are not HOST:PORT, a source of no known kind or a recording that is not
there, the DB's directory not writable (nor creatable), a capture directory
that cannot be made or is not the agent's own, TLS files and the tokens
file missing or unreadable. Each problem is returned with the key that gave
the value; nothing is created."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from gpuscope.security.auth import TokenStore
from gpuscope.security.tls import TlsConfigError, tls_files

from .safe_files import UnsafePath, open_root
from .serve import parse_hostport
from .sources import KINDS

# analyzers.object_store.parse_location, wired in by the command line (daemon's
# modules import no analyzer): what the fleet tier accepts as --publish
parse_location: Callable[[str], Any] | None = None

TLS_FILES = ("ca", "cert", "key")
ADDRESSES = ("listen", "analyzer", "metrics_listen", "oncall_listen")
_SOURCES = ("nvml", "dcgm", "auto")
_SOURCE_PREFIXES = ("dcgm:", "dcgm-exporter:", "replay:")


def creatable_dir(path: str | os.PathLike) -> str | None:
    """Why `path` cannot be (or be made) a directory this user writes in; None when it can."""
    p = Path(path).absolute()
    if p.exists():
        if not p.is_dir():
            return f"{p} is not a directory"
        return None if os.access(p, os.W_OK | os.X_OK) else f"{p} is not writable by this user"
    ancestor = next(a for a in p.parents if a.exists())
    if not ancestor.is_dir():
        return f"cannot create {p}: {ancestor} is not a directory"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"cannot create {p}: {ancestor} is not writable by this user"
    return None


def writable_file(path: str | os.PathLike) -> str | None:
    """Why a DuckDB file cannot be opened for writing at `path`: it writes
    its .wal beside the file, so the directory must be writable too."""
    p = Path(path).absolute()
    if p.is_dir():
        return f"{p} is a directory; give a file name"
    why = creatable_dir(p.parent)
    if why is None and p.exists() and not os.access(p, os.R_OK | os.W_OK):
        why = f"{p} is not writable by this user"
    return why


def _capture_dir(path: str) -> str | None:
    if not os.path.lexists(path):
        return creatable_dir(path)
    try:
        os.close(open_root(path, create=False))      # the rules the capture runner holds it to
    except UnsafePath as exc:
        return str(exc)
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    return creatable_dir(path)


def _readable_file(path: str) -> str | None:
    p = Path(path)
    if not p.is_file():
        return f"{p}: no such file" if not p.exists() else f"{p} is not a file"
    return None if os.access(p, os.R_OK) else f"{p} is not readable by this user"


def _source(spec: str) -> str | None:
    if spec in _SOURCES or (spec.startswith(_SOURCE_PREFIXES) and spec.partition(":")[2]):
        if spec.startswith("replay:"):
            return _readable_file(spec.removeprefix("replay:"))
        return None
    return f"{spec!r}, expected {KINDS}"


def problems(command: str, values: dict, configured: set[str]) -> list[tuple[str, str]]:
    """(key, what is wrong) for the values among `configured` (the keys the
    file or the environment set; flags keep their own checks, where they are
    used). `values`: key -> the effective value of every setting."""
    out = []
    for key in ADDRESSES:
        if key in configured and values.get(key):
            try:
                parse_hostport(values[key], key)
            except ValueError:
                out.append((key, f"{values[key]!r} is not HOST:PORT"))
    if "source" in configured and values.get("source"):
        why = _source(values["source"])
        if why:
            out.append(("source", why))
    if "db" in configured and values.get("db"):
        why = writable_file(values["db"])
        if why:
            out.append(("db", why))
    out += _publishing(values, configured)
    if "capture_dir" in configured and values.get("capture_dir"):
        why = _capture_dir(values["capture_dir"])
        if why:
            out.append(("capture_dir", why))
    if values.get("insecure"):
        return out                      # no TLS files, no tokens (their conflicts are said elsewhere)
    for key in TLS_FILES:
        if key in configured and values.get(key):
            why = _readable_file(values[key])
            if why:
                out.append((key, why))
    if "tls_dir" in configured and values.get("tls_dir"):
        out += _tls_dir(command, values)
    if "tokens" in configured and values.get("tokens"):
        try:
            TokenStore.load(values["tokens"])
        except (ValueError, OSError) as exc:
            out.append(("tokens", str(exc)))
    return out


def _publishing(values: dict, configured: set[str]) -> list[tuple[str, str]]:
    """The fleet tier's keys: a URL of a kind it writes (no credentials in
    it), a cluster beside it, directories this user can write. Remote storage
    is tried by the analyzer at start-up, not here: a check writes nothing."""
    out = []
    url = values.get("publish")
    if "publish" in configured and url and parse_location is not None:
        try:
            loc = parse_location(url)
        except ValueError as exc:
            out.append(("publish", str(exc)))
        else:
            why = creatable_dir(loc.root) if loc.scheme == "file" else None
            if why:
                out.append(("publish", why))
    if url and not values.get("cluster") and configured & {"publish", "cluster"}:
        out.append(("publish", "needs cluster too: every file is partitioned by cluster") if "cluster" not in
                   configured else ("cluster", "required with publish: every file is partitioned by cluster"))
    if values.get("cluster") and not url and "cluster" in configured:
        out.append(("cluster", "names what publish writes; give publish too"))
    if "publish_state" in configured and values.get("publish_state"):
        why = creatable_dir(values["publish_state"])
        if why:
            out.append(("publish_state", why))
    return out


def _tls_dir(command: str, values: dict) -> list[tuple[str, str]]:
    d = values["tls_dir"]
    if command == "up":               # `up` makes its CA and certificates there on first start
        why = creatable_dir(d)
        return [("tls_dir", why)] if why else []
    if not Path(d).is_dir():
        return [("tls_dir", f"{d}: no such directory (`gpuscope certs init DIR` makes one)")]
    try:
        tls_files(d, command, **{k: values.get(k) for k in TLS_FILES})
    except TlsConfigError as exc:
        return [("tls_dir", str(exc))]
    return []
