"""The command line's security flags, in one place: how a client command's
flags become a `ClientSecurity`, and how `up`, `agent` and `analyzer` find
their TLS files and tokens.

Client commands (status, findings, ... jobs) look for TLS material in
--tls-dir, else $GPUSCOPE_TLS_DIR, else the default state directory's
`tls/` (the one `gpuscope up` provisions) when it exists: `ca.pem` always,
and `client.pem` + `client.key` when present. --ca/--cert/--key replace
single files. A token comes from --token-file or $GPUSCOPE_TOKEN and is only
ever sent over TLS. With no TLS material at all a client uses TLS with the
system's CAs; plain text only ever with --insecure (to a server started
with --insecure, which listens on loopback only)."""
from __future__ import annotations

import argparse
import os
import stat
from pathlib import Path

from gpuscope.security.auth import TokenStore
from gpuscope.security.tls import ClientSecurity, TlsConfigError, TlsFiles, common_name, tls_files

from .cliutil import UsageError, default_db

ENV_TLS_DIR = "GPUSCOPE_TLS_DIR"
ENV_TOKEN = "GPUSCOPE_TOKEN"
CLIENT_CERT_NAME = "client"


def default_tls_dir() -> str:
    """The state directory's tls/, beside the default DB: what `gpuscope up` provisions."""
    return os.path.join(os.path.dirname(default_db()), "tls")


# -- flags ------------------------------------------------------------------------------------

def add_server_flags(sp: argparse.ArgumentParser, tls_dir_default_help: str, agent_links: bool = False) -> None:
    """--tls-dir, --ca/--cert/--key, --tokens, --insecure (and, for processes
    that hold an agent's links to an analyzer, --tls-server-name)."""
    g = sp.add_argument_group("security")
    g.add_argument("--tls-dir", default=None, metavar="DIR",
                   help=f"ca.pem and this process's NAME.pem/NAME.key ({tls_dir_default_help}; "
                        "`gpuscope certs` makes them)")
    g.add_argument("--ca", default=None, metavar="FILE", help="CA certificate (default: DIR/ca.pem)")
    g.add_argument("--cert", default=None, metavar="FILE", help="this process's certificate (default: DIR/NAME.pem)")
    g.add_argument("--key", default=None, metavar="FILE", help="its private key (default: DIR/NAME.key)")
    g.add_argument("--tokens", default=None, metavar="FILE",
                   help="bearer tokens accepted from on-call callers (SHA-256 hashes; `gpuscope certs token`)")
    g.add_argument("--insecure", action="store_true",
                   help="no TLS and no authentication; only on a loopback --listen address")
    if agent_links:
        g.add_argument("--tls-server-name", default=None, metavar="NAME",
                       help="name the analyzer's certificate must carry, when its address (--analyzer, --send) "
                            "is one the certificate does not list")


def add_client_flags(sp: argparse.ArgumentParser) -> None:
    """--tls-dir, --ca/--cert/--key, --token-file, --tls-server-name, --insecure."""
    g = sp.add_argument_group("security")
    g.add_argument("--tls-dir", default=None, metavar="DIR",
                   help=f"ca.pem and, for mutual TLS, client.pem/client.key (default: ${ENV_TLS_DIR}, else "
                        f"{default_tls_dir()} if it exists)")
    g.add_argument("--ca", default=None, metavar="FILE", help="CA certificate to trust (default: DIR/ca.pem)")
    g.add_argument("--cert", default=None, metavar="FILE", help="client certificate (default: DIR/client.pem)")
    g.add_argument("--key", default=None, metavar="FILE", help="client key (default: DIR/client.key)")
    g.add_argument("--token-file", default=None, metavar="FILE",
                   help=f"a bearer token (default: ${ENV_TOKEN}); sent only over TLS")
    g.add_argument("--tls-server-name", default=None, metavar="NAME",
                   help="name the server's certificate must carry, when --server is an address it does not list")
    g.add_argument("--insecure", action="store_true", help="plain text to a server started with --insecure")


# -- clients ------------------------------------------------------------------------------------

def _read_token_file(path: str) -> str:
    p = Path(path)
    try:
        st = p.stat()
        if st.st_mode & 0o077:
            raise UsageError(f"--token-file {p} is accessible to group or others (mode "
                             f"{stat.S_IMODE(st.st_mode):04o}); run `chmod 600 {p}`")
        token = p.read_text().strip()
    except FileNotFoundError:
        raise UsageError(f"--token-file {p}: no such file") from None
    except PermissionError:
        raise UsageError(f"--token-file {p}: not readable by this user") from None
    if not token:
        raise UsageError(f"--token-file {p} is empty")
    return token


def _given(ns, name):
    return getattr(ns, name, None)


def client_security(ns) -> ClientSecurity:
    """The ClientSecurity an on-call command's flags (and environment) ask for."""
    token_file = _given(ns, "token_file")
    token = _read_token_file(token_file) if token_file else (os.environ.get(ENV_TOKEN) or "").strip() or None
    explicit_files = [f for f in ("ca", "cert", "key", "tls_dir") if _given(ns, f)]
    if _given(ns, "insecure"):
        if explicit_files:
            raise UsageError("--insecure cannot be combined with " + ", ".join(f"--{f.replace('_', '-')}"
                                                                               for f in explicit_files))
        if token:
            raise UsageError("refusing to send a bearer token in plain text: drop --insecure, or drop "
                             f"--token-file / unset {ENV_TOKEN}")
        return ClientSecurity(insecure=True)
    tls_dir = _given(ns, "tls_dir") or os.environ.get(ENV_TLS_DIR) or None
    if tls_dir is not None:
        if not Path(tls_dir).is_dir():
            src = (f"--tls-dir {tls_dir}" if _given(ns, "tls_dir") else f"${ENV_TLS_DIR} {tls_dir}")
            if _given(ns, "tls_dir") and getattr(ns, "origin", {}).get("tls_dir"):
                src = f"{tls_dir} ({ns.origin['tls_dir']})"
            raise UsageError(f"{src}: no such directory (`gpuscope certs init DIR` makes one; "
                             "`gpuscope up` makes <state dir>/tls)")
    elif Path(default_tls_dir()).is_dir():
        tls_dir = default_tls_dir()
    ca, cert, key = _given(ns, "ca"), _given(ns, "cert"), _given(ns, "key")
    if bool(cert) != bool(key):
        raise UsageError("--cert and --key go together")
    if tls_dir is not None:
        d = Path(tls_dir)
        if ca is None:
            if not (d / "ca.pem").is_file():
                raise TlsConfigError(f"CA certificate {d / 'ca.pem'}: no such file; make it with "
                                     f"`gpuscope certs init {d}` (or copy the fleet's ca.pem there)")
            ca = str(d / "ca.pem")
        if cert is None and (d / f"{CLIENT_CERT_NAME}.pem").exists() and (d / f"{CLIENT_CERT_NAME}.key").exists():
            files = tls_files(d, CLIENT_CERT_NAME, ca=ca)
            cert, key = str(files.cert), str(files.key)
    return ClientSecurity(ca=ca, cert=cert, key=key, token=token, server_name=_given(ns, "tls_server_name"))


# -- servers (`up`, `agent`, `analyzer`) -----------------------------------------------------------

def server_tls_dir(ns) -> str | None:
    """--tls-dir, or for `up` the `tls/` beside --db (which `up` provisions)."""
    if _given(ns, "tls_dir"):
        return ns.tls_dir
    if _given(ns, "command") == "up":
        return os.path.join(os.path.dirname(os.path.abspath(ns.db)), "tls")
    return None


def server_tls_files(ns, name: str) -> TlsFiles | None:
    """The TLS files of a server process (NAME: 'analyzer' or 'agent'); None
    with --insecure. Raises UsageError when neither is given."""
    explicit = [f for f in ("ca", "cert", "key", "tls_dir") if _given(ns, f)]
    if _given(ns, "insecure"):
        if explicit:
            raise UsageError("--insecure cannot be combined with " + ", ".join(f"--{f.replace('_', '-')}"
                                                                               for f in explicit))
        return None
    d = server_tls_dir(ns)
    if d is None and not (_given(ns, "ca") and _given(ns, "cert") and _given(ns, "key")):
        raise UsageError(f"gpuscope {_given(ns, 'command') or name} needs TLS: pass --tls-dir DIR (make one with "
                         f"`gpuscope certs init DIR`) or --ca/--cert/--key, or --insecure on a loopback address")
    return tls_files(d, name, ca=_given(ns, "ca"), cert=_given(ns, "cert"), key=_given(ns, "key"))


def server_tokens(ns) -> TokenStore | None:
    """The tokens a server accepts (--tokens), or None."""
    path = _given(ns, "tokens")
    if not path:
        return None
    if _given(ns, "insecure"):
        raise UsageError("--tokens needs TLS: tokens are never accepted in plain text (drop --insecure)")
    return TokenStore.load(path)


def agent_security(ns, server_name: str | None = None) -> ClientSecurity:
    """What an agent presents on its links to the analyzer (ingest, commands,
    capture reports): the CA and its `agent` certificate (mutual TLS), or
    plain text with --insecure. `server_name` overrides --tls-server-name
    (`up` passes "localhost" for its in-process link)."""
    files = server_tls_files(ns, "agent")
    if files is None:
        return ClientSecurity(insecure=True)
    if _given(ns, "command") == "up" and (_given(ns, "cert") or _given(ns, "key")):
        # `up`'s --cert/--key are the analyzer's; its in-process agent keeps DIR/agent.pem
        files = tls_files(server_tls_dir(ns), "agent", ca=_given(ns, "ca"))
    return ClientSecurity(ca=str(files.ca), cert=str(files.cert), key=str(files.key),
                          server_name=server_name or _given(ns, "tls_server_name"))


def agent_host(host: str, given: bool, links: ClientSecurity) -> tuple[str, str | None]:
    """The host an agent reports, and a line to say when its certificate
    chose it. With mutual TLS the analyzer takes batches only for the host
    the agent's certificate names (its CN): without --host that name is
    used; a --host that differs is refused (UsageError, exit status 2), or
    every batch would be."""
    if not links.cert:
        return host, None
    try:
        cn = common_name(Path(links.cert).read_bytes())
    except OSError:                  # unreadable: the TLS set-up says so itself
        return host, None
    if cn is None or cn == host:
        return host, None
    if not given:
        return cn, f"agent: host {cn}, as its certificate {links.cert} names it (no --host given)"
    raise UsageError(f"--host {host}: the agent's certificate {links.cert} names host {cn}, and the analyzer takes "
                     f"batches only for that host; pass --host {cn}, or make a certificate for {host} "
                     f"(`gpuscope certs agent PKI --host {host}`)", exit_status=2)
