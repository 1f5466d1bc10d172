"""Where an on-call command asks, and with what: `--server` and the security
flags, else the environment, else the config file, else this host.

    --server  >  $GPUSCOPE_SERVER  >  `server` in the config file  >  127.0.0.1:9403

The config file is `$GPUSCOPE_CONFIG`, else `$XDG_CONFIG_HOME/gpuscope/config.toml`
(`~/.config/gpuscope/config.toml`). Its keys are the client flags' names:

    server = "analyzer.example.com"       # a bare host means port 9403
    tls_dir = "/etc/gpuscope/tls"         # or ca, cert, key
    token_file = "~/.config/gpuscope/token"
    tls_server_name = "analyzer"
    insecure = false

A flag beats the environment ($GPUSCOPE_TLS_DIR, $GPUSCOPE_TOKEN), which
beats the file. The file's tables ([agent], [analyzer], [up]) are the
servers' settings (daemon/config_file.py), left alone here. A bare HOST means the port of the service the command asks:
9403 for the analyzer (and `gpuscope up`), 9401 for an agent (`capture`,
`jobs`). gRPC would take `localhost` alone as port 443."""
from __future__ import annotations

import ipaddress
import os
import tomllib
from pathlib import Path

from .cliutil import UsageError

ENV_SERVER = "GPUSCOPE_SERVER"
ENV_CONFIG = "GPUSCOPE_CONFIG"
ANALYZER_PORT, AGENT_PORT = 9403, 9401
DEFAULT_SERVER = f"127.0.0.1:{ANALYZER_PORT}"
AGENT_COMMANDS = ("capture", "jobs")          # asked of an agent (or `up`, which is one too)
_STRINGS = ("server", "tls_dir", "ca", "cert", "key", "token_file", "tls_server_name")
_PATHS = ("tls_dir", "ca", "cert", "key", "token_file")
CLIENT_KEYS = ("insecure",) + _STRINGS
# The same file may hold the servers' settings, a table each
# (docs/configuration.md); on-call commands read the top-level keys only.
SERVER_TABLES = ("agent", "analyzer", "up")


def config_path() -> Path:
    given = os.environ.get(ENV_CONFIG)
    if given:
        return Path(given).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "gpuscope" / "config.toml"


def load_config(path: Path | None = None) -> dict:
    """The file's settings ({} when there is none); a file that is there but
    wrong is an error naming it, never ignored."""
    p = path or config_path()
    try:
        text = p.read_text()
    except FileNotFoundError:
        if os.environ.get(ENV_CONFIG) and path is None:
            raise UsageError(f"${ENV_CONFIG} {p}: no such file") from None
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"config {p}: cannot be read ({exc})") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"config {p}: not TOML ({exc})") from None
    out = {}
    for key, value in doc.items():
        if key in SERVER_TABLES and isinstance(value, dict):
            continue                       # the servers' settings (daemon/config_file.py), not ours
        if key not in CLIENT_KEYS:
            raise UsageError(f"config {p}: unknown key {key!r} (known: {', '.join(CLIENT_KEYS)})")
        try:
            out[key] = client_value(key, value)
        except ValueError as exc:
            raise UsageError(f"config {p}: {exc}") from None
    return out


def client_value(key: str, value):
    """One of the file's top-level keys, checked (ValueError saying what is
    wrong) and with ~ expanded in paths; `gpuscope config check` checks them
    this way too."""
    if key == "insecure":
        if not isinstance(value, bool):
            raise ValueError(f"insecure must be true or false, not {value!r}")
        return value
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{key} must be a non-empty string, not {value!r}")
    return str(Path(value).expanduser()) if key in _PATHS else value.strip()


def with_port(address: str, port: int, flag: str = "--server") -> str:
    """HOST:PORT as given; a bare host, name or IP address (v6 too) gets
    `port`. URLs are refused: gRPC addresses have no scheme. `flag`: the
    option a refusal names."""
    a = address.strip()
    if not a:
        raise UsageError(f"{flag}: empty address")
    if a.startswith(("unix:", "unix-abstract:")):
        return a
    if "://" in a:
        raise UsageError(f"{flag} {a}: a gRPC address is HOST[:PORT], without a scheme "
                         f"(e.g. {a.split('://', 1)[1].rstrip('/') or 'HOST'})")
    if a.startswith("["):
        return a if "]:" in a else f"{a}:{port}"
    try:
        ipaddress.IPv6Address(a)
        return f"[{a}]:{port}"
    except ValueError:
        pass
    host, sep, p = a.rpartition(":")
    if not sep:
        return f"{a}:{port}"
    if not p.isdecimal() or not 0 < int(p) < 65536 or not host:
        raise UsageError(f"{flag} {a}: expected HOST[:PORT] with a port from 1 to 65535")
    return a


def apply(ns) -> None:
    """Fills an on-call command's `server` and security flags in place, as
    the module docstring says."""
    cfg = load_config()
    port = AGENT_PORT if getattr(ns, "command", "") in AGENT_COMMANDS else ANALYZER_PORT
    server = ns.server or os.environ.get(ENV_SERVER) or cfg.get("server")
    # where each setting came from, for errors: a flag the caller never typed must not be blamed
    ns.origin = {"server": "--server" if ns.server else f"${ENV_SERVER}" if os.environ.get(ENV_SERVER)
                 else f"`server` in {config_path()}" if cfg.get("server") else "the default"}
    ns.server = with_port(server, port) if server else DEFAULT_SERVER
    explicit_tls = any(getattr(ns, k, None) for k in ("tls_dir", "ca", "cert", "key"))
    if getattr(ns, "insecure", False) or explicit_tls or os.environ.get("GPUSCOPE_TLS_DIR"):
        pass                              # the command line or the environment chose the TLS material
    elif cfg.get("insecure"):
        ns.insecure = True
    else:
        for k in ("tls_dir", "ca", "cert", "key"):
            if k in cfg:
                setattr(ns, k, cfg[k])
                ns.origin[k] = f"`{k}` in {config_path()}"
    if not getattr(ns, "token_file", None) and not os.environ.get("GPUSCOPE_TOKEN") and "token_file" in cfg:
        ns.token_file = cfg["token_file"]
    if not getattr(ns, "tls_server_name", None) and "tls_server_name" in cfg:
        ns.tls_server_name = cfg["tls_server_name"]
