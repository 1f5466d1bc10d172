"""Who is calling and what they may do. Pure functions the servers call:
`caller_from` names the caller from the TLS peer certificate or a bearer
token, `authorize` checks the method against the caller's role, and
`audit` writes one structured line per operator action.

Roles:
- `agent`: a GPU host's agent (its certificate's CN is the host); pushes
  samples, holds the command stream, reports captures, for its own host only.
- `reader`: on-call reads: status, findings, queries, watch, reports,
  captures, anomalies and decisions.
- `operator`: a reader who may also start captures (one agent's, or a
  job's on every rank) and see jobs' full command lines. The trigger
  policy has no RPC: it is the analyzer's configuration, changed on its
  host.

A certificate's role is its subject OU; a token's role is in the tokens
file, which keeps only SHA-256 hashes of the tokens."""
from __future__ import annotations

import functools
import hashlib
import hmac
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

import grpc
import structlog
from cryptography import x509
from cryptography.x509.oid import NameOID

from .tls import AUTHORIZATION_KEY, BEARER

ROLES = ("agent", "reader", "operator")
TOKEN_ROLES = ("reader", "operator")
TOKEN_PREFIX = "gps_"

audit_log = structlog.get_logger("gpuscope.audit")


class TokenFileError(ValueError):
    """The tokens file is unsafe or malformed; the message says how to fix it."""


@dataclass(frozen=True)
class Caller:
    name: str                # certificate CN or the token's name
    role: str                # one of ROLES
    host: str | None         # the host an agent speaks for; None for people
    via: str                 # "cert" or "token"

    def __str__(self) -> str:
        return f"{self.name} ({self.role}, {self.via})"


# -- the method table ------------------------------------------------------------------

_AGENT = frozenset({"agent"})
_READ = frozenset({"reader", "operator"})
_OPERATE = frozenset({"operator"})

METHOD_ROLES: dict[str, frozenset[str]] = {
    # agents, for their own host only (see authorize_host)
    "/gpuscope.v1.Analyzer/Ingest": _AGENT,
    "/gpuscope.v1.Analyzer/Push": _AGENT,
    "/gpuscope.v1.Analyzer/Commands": _AGENT,
    "/gpuscope.v1.Analyzer/ReportCapture": _AGENT,
    "/gpuscope.v1.Analyzer/UploadCapture": _AGENT,
    "/gpuscope.v1.Analyzer/ReportCalibration": _AGENT,
    # on-call reads (an agent may ask the analyzer's status)
    "/gpuscope.v1.Analyzer/GetStatus": _READ | _AGENT,
    "/gpuscope.v1.Analyzer/ListFindings": _READ,
    "/gpuscope.v1.Analyzer/QueryMetric": _READ,
    "/gpuscope.v1.Analyzer/ListCaptures": _READ,
    "/gpuscope.v1.Analyzer/Watch": _READ,
    "/gpuscope.v1.Analyzer/ListRecords": _READ,
    "/gpuscope.v1.Analyzer/Report": _READ,
    "/gpuscope.v1.Analyzer/RangeReport": _READ,
    "/gpuscope.v1.Analyzer/GetAccuracy": _READ,
    "/gpuscope.v1.Analyzer/ListDegraded": _READ,
    "/gpuscope.v1.Analyzer/Top": _READ,
    "/gpuscope.v1.Analyzer/ListCeilings": _READ,
    "/gpuscope.v1.Analyzer/ListPrograms": _READ,
    "/gpuscope.v1.Analyzer/ListDistJobs": _READ,
    "/gpuscope.v1.Analyzer/JobSkew": _READ,
    "/gpuscope.v1.Analyzer/CaptureJob": _OPERATE,     # traces every rank of a job
    # an agent's own API
    "/gpuscope.v1.Agent/GetStatus": _READ,
    "/gpuscope.v1.Agent/RecentSamples": _READ,
    "/gpuscope.v1.Agent/ListCaptures": _READ,
    "/gpuscope.v1.Agent/Capture": _OPERATE,
    "/gpuscope.v1.Agent/ListJobs": _OPERATE,       # jobs' full command lines
}

# Services open to anyone who completes the TLS handshake (load balancers, probes).
OPEN_SERVICES = frozenset({"grpc.health.v1.Health"})

# Methods whose every call is an operator action, audit-logged with the caller.
OPERATOR_ACTIONS = frozenset(m for m, roles in METHOD_ROLES.items() if roles == _OPERATE)


def _service(method: str) -> str:
    return method.lstrip("/").partition("/")[0]


def is_open(method: str) -> bool:
    return _service(method) in OPEN_SERVICES


def authorize(method: str, caller: Caller | None) -> tuple[grpc.StatusCode, str] | None:
    """None when `caller` may call `method` (a full name such as
    '/gpuscope.v1.Analyzer/Ingest'); else (status code, message). Fails
    closed: a method not in the table is refused."""
    if is_open(method):
        return None
    roles = METHOD_ROLES.get(method)
    if roles is None:
        return grpc.StatusCode.PERMISSION_DENIED, f"{method} is not a method this server authorizes"
    if caller is None:
        return (grpc.StatusCode.UNAUTHENTICATED,
                f"{method} needs a client certificate or a bearer token (role {' or '.join(sorted(roles))})")
    if caller.role not in roles:
        return (grpc.StatusCode.PERMISSION_DENIED,
                f"{caller.name} has role {caller.role}; {method} needs {' or '.join(sorted(roles))}")
    return None


def authorize_host(caller: Caller | None, host: str) -> tuple[grpc.StatusCode, str] | None:
    """An agent speaks only for its own host: None when `host` (the host a
    batch, hello or capture report names) is the caller's; else
    (PERMISSION_DENIED, message). Callers who are not agents are refused."""
    if caller is None:
        return grpc.StatusCode.UNAUTHENTICATED, "no caller"
    if caller.role != "agent" or caller.host is None:
        return grpc.StatusCode.PERMISSION_DENIED, f"{caller.name} ({caller.role}) is not an agent"
    if host != caller.host:
        return (grpc.StatusCode.PERMISSION_DENIED,
                f"agent {caller.host} may not speak for host {host!r} (its certificate names {caller.host})")
    return None


def sees_full_commands(caller: Caller | None) -> bool:
    """Only operators see jobs' full command lines; others see them redacted."""
    return caller is not None and caller.role == "operator"


# -- who is calling ------------------------------------------------------------------------

@functools.lru_cache(maxsize=4096)
def _cert_identity(pem: bytes) -> tuple[str, str] | None:
    """(CN, OU) of a PEM certificate; None when it has no CN or no known role."""
    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError:
        return None
    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    ous = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)]
    roles = [ou for ou in ous if ou in ROLES]
    if not cn or len(roles) != 1:     # none, or ambiguous
        return None
    return str(cn[0].value), roles[0]


def _first(auth_context: Mapping, key: str) -> bytes | None:
    values = auth_context.get(key) or ()
    for v in values:
        return v if isinstance(v, bytes) else str(v).encode()
    return None


def _bearer(metadata: Iterable | None) -> str | None:
    for item in metadata or ():
        key, value = (item.key, item.value) if hasattr(item, "key") else item
        if key.lower() == AUTHORIZATION_KEY:
            if isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            if value.startswith(BEARER):
                return value[len(BEARER):].strip()
            return ""          # an authorization header that is not a bearer token: refused
    return None


def caller_from(auth_context: Mapping[str, Iterable[bytes]], metadata: Iterable | None,
                tokens: "TokenStore | None") -> Caller | None:
    """The caller of one call, or None when it is not authenticated.

    auth_context is `grpc.ServicerContext.auth_context()`; metadata is
    `context.invocation_metadata()`. Only a TLS connection authenticates:
    a bearer token, when sent, must be valid and decides the caller (a
    token that does not match is refused, even with a certificate);
    otherwise the peer certificate (verified by the TLS handshake against
    the CA) names the caller by its CN and its role by its OU."""
    if _first(auth_context, "transport_security_type") != b"ssl":
        return None                           # plain text: no identity, and a token sent in clear is void
    token = _bearer(metadata)
    if token is not None:
        return tokens.lookup(token) if tokens is not None and token else None
    pem = _first(auth_context, "x509_pem_cert")
    if pem is None:
        return None
    ident = _cert_identity(pem)
    if ident is None:
        return None
    name, role = ident
    return Caller(name=name, role=role, host=name if role == "agent" else None, via="cert")


# -- tokens -----------------------------------------------------------------------------------

def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class TokenEntry:
    digest: bytes        # SHA-256 of the token
    role: str
    name: str


def _check_private(path: Path) -> os.stat_result:
    st = path.stat()
    if not stat.S_ISREG(st.st_mode):
        raise TokenFileError(f"tokens file {path}: not a regular file")
    if st.st_mode & 0o077:
        raise TokenFileError(f"tokens file {path} is accessible to group or others (mode "
                             f"{stat.S_IMODE(st.st_mode):04o}); run `chmod 600 {path}`")
    return st


class TokenStore:
    """Bearer tokens a server accepts: each line of the file is
    `SHA256HEX ROLE NAME` (# comments and blank lines allowed). The file
    must not be readable by group or others."""

    def __init__(self, entries: Iterable[TokenEntry] = ()):
        self._entries = tuple(entries)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "TokenStore":
        p = Path(path)
        try:
            _check_private(p)
            text = p.read_text()
        except FileNotFoundError:
            raise TokenFileError(f"tokens file {p}: no such file; make one with "
                                 f"`gpuscope certs token --tokens {p} --name NAME --role reader`") from None
        except PermissionError:
            raise TokenFileError(f"tokens file {p}: not readable by this user") from None
        entries = []
        for n, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split(None, 2)
            if len(parts) != 3:
                raise TokenFileError(f"{p}:{n}: expected `SHA256HEX ROLE NAME`")
            digest, role, name = parts
            if len(digest) != 64 or any(c not in "0123456789abcdefABCDEF" for c in digest):
                raise TokenFileError(f"{p}:{n}: {digest[:12]!r}... is not a SHA-256 hex digest "
                                     "(the file holds hashes, never tokens)")
            if role not in TOKEN_ROLES:
                raise TokenFileError(f"{p}:{n}: role {role!r}, expected one of {', '.join(TOKEN_ROLES)}")
            entries.append(TokenEntry(bytes.fromhex(digest), role, name))
        return cls(entries)

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, token: str) -> Caller | None:
        """The caller a token names, or None. Compares against every entry
        in constant time, so timing says nothing about near misses."""
        digest = hashlib.sha256(token.encode()).digest()
        found = None
        for e in self._entries:
            if hmac.compare_digest(digest, e.digest) and found is None:
                found = e
        return None if found is None else Caller(name=found.name, role=found.role, host=None, via="token")


def add_token(path: str | os.PathLike, name: str, role: str) -> str:
    """Makes a token for NAME with ROLE, appends its hash to the tokens file
    (made 0600 when new) and returns the token, which is stored nowhere."""
    if role not in TOKEN_ROLES:
        raise TokenFileError(f"--role: {role!r}, expected one of {', '.join(TOKEN_ROLES)}")
    if not name or not name.isprintable() or name != name.strip():
        raise TokenFileError(f"--name: {name!r} is not a usable name")
    p = Path(path)
    if p.exists():
        TokenStore.load(p)        # refuses a file that is unsafe or malformed
    else:
        p.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    token = new_token()
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as f:
        if f.tell() == 0:
            f.write("# gpuscope bearer tokens: SHA256HEX ROLE NAME (hashes only; `gpuscope certs token` adds)\n")
        f.write(f"{token_hash(token)} {role} {name}\n")
    return token


# -- audit --------------------------------------------------------------------------------------

def audit(caller: Caller | None, method: str, detail: Mapping | str | None = None, outcome: str = "ok") -> None:
    """One structured line on logger 'gpuscope.audit' per operator action,
    once it has ended: `outcome` is "ok", "denied", or how it failed (its
    status code's name, "cancelled", "failed")."""
    fields = dict(logger="gpuscope.audit", method=method, outcome=outcome,
                  caller=caller.name if caller else None, role=caller.role if caller else None,
                  caller_host=caller.host if caller else None, via=caller.via if caller else None)
    if isinstance(detail, Mapping):
        fields.update({k if k not in fields else f"detail_{k}": v for k, v in detail.items()})
    elif detail:
        fields["detail"] = detail
    audit_log.info("audit", **fields)
