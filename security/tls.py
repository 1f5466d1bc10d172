"""TLS credentials for every gRPC link, from PEM files.

A TLS directory holds `ca.pem` (the CA that signs every gpuscope
certificate) and `NAME.pem` + `NAME.key` pairs: `analyzer` (the analyzer's
server certificate), `agent` (an agent's; it names its host) and `client`
(an on-call person's). `gpuscope certs` makes them (security.certs); any
PEM CA and certificates with the same subject layout work as well.

Clients describe what they present in one `ClientSecurity`; it makes sync
and asyncio channels, attaches a bearer token as per-call credentials (only
ever over TLS) and overrides the expected server name only when asked."""
from __future__ import annotations

import datetime as dt
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

AUTHORIZATION_KEY = "authorization"      # gRPC metadata keys are lower case
BEARER = "Bearer "

# What makes each file, for error messages.
_MAKERS = {
    "ca": "gpuscope certs init {dir}",
    "analyzer": "gpuscope certs init {dir}",
    "agent": "gpuscope certs agent {dir} --host HOST",
    "client": "gpuscope certs client {dir} --name NAME --role reader|operator",
}


class TlsConfigError(ValueError):
    """TLS material is missing, unreadable or inconsistent; the message names
    the file and what makes it."""


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    cert: Path
    key: Path

    def read(self) -> tuple[bytes, bytes, bytes]:
        """(ca, cert, key) PEM bytes, checked: each parses, the key belongs
        to the certificate, and the certificate has not expired."""
        ca, cert, key = (_read(p, what) for p, what in ((self.ca, "CA certificate"), (self.cert, "certificate"),
                                                        (self.key, "private key")))
        check_pair(cert, key, self.cert, self.key)
        try:
            x509.load_pem_x509_certificates(ca)
        except ValueError as exc:
            raise TlsConfigError(f"{self.ca}: not a PEM CA certificate ({exc})") from None
        return ca, cert, key


def _read(path: Path | str, what: str, maker: str | None = None) -> bytes:
    path = Path(path)
    hint = f"; make it with `{maker}`" if maker else ""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise TlsConfigError(f"{what} {path}: no such file{hint}") from None
    except IsADirectoryError:
        raise TlsConfigError(f"{what} {path}: is a directory, expected a PEM file") from None
    except PermissionError:
        raise TlsConfigError(f"{what} {path}: not readable by this user (uid {os.getuid()}); "
                             "fix its owner or mode") from None


def check_pair(cert_pem: bytes, key_pem: bytes, cert_path: Path | str = "certificate",
               key_path: Path | str = "key") -> x509.Certificate:
    """Parses a certificate and its key; raises TlsConfigError unless they
    match and the certificate is within its validity period."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as exc:
        raise TlsConfigError(f"{cert_path}: not a PEM certificate ({exc})") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise TlsConfigError(f"{key_path}: not an unencrypted PEM private key ({exc})") from None
    if key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo) != \
            cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo):
        raise TlsConfigError(f"{key_path} is not the key of {cert_path}")
    now = dt.datetime.now(dt.timezone.utc)
    if cert.not_valid_after_utc < now:
        raise TlsConfigError(f"{cert_path} expired on {cert.not_valid_after_utc:%Y-%m-%d}; make a new one "
                             "(`gpuscope certs ... --force`)")
    if cert.not_valid_before_utc > now + dt.timedelta(minutes=5):
        raise TlsConfigError(f"{cert_path} is not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC "
                             "(is this host's clock right?)")
    return cert


def common_name(cert_pem: bytes) -> str | None:
    """The subject CN of a PEM certificate (an agent's names its host, the
    one host the analyzer takes its batches for), or None."""
    try:
        cn = x509.load_pem_x509_certificate(cert_pem).subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    except ValueError:
        return None
    return str(cn[0].value) if cn else None


def tls_files(directory: str | os.PathLike | None, name: str, ca: str | os.PathLike | None = None,
              cert: str | os.PathLike | None = None, key: str | os.PathLike | None = None) -> TlsFiles:
    """DIR/ca.pem, DIR/NAME.pem, DIR/NAME.key, each replaceable by an
    explicit path (--ca/--cert/--key). Raises TlsConfigError naming a
    missing or unreadable file and the command that makes it."""
    d = Path(directory) if directory else None
    shown = str(d) if d else "DIR"
    paths = {}
    for slot, given, file_name, owner, what in (
            ("ca", ca, "ca.pem", "ca", "CA certificate"),
            ("cert", cert, f"{name}.pem", name, f"{name} certificate"),
            ("key", key, f"{name}.key", name, f"{name} key")):
        if given:
            path, maker = Path(given), None
        elif d is not None:
            path, maker = d / file_name, (_MAKERS[owner].format(dir=shown) if owner in _MAKERS else None)
        else:
            raise TlsConfigError(f"no --{slot} given and no --tls-dir to find {file_name} in")
        if not os.access(path, os.R_OK) or not path.is_file():
            _read(path, what, maker)      # raises with the reason
            raise TlsConfigError(f"{what} {path}: not a readable file")
        paths[slot] = path
    return TlsFiles(paths["ca"], paths["cert"], paths["key"])


def server_credentials(files: TlsFiles, require_client_cert: bool = True) -> grpc.ServerCredentials:
    """TLS for a server. With require_client_cert (mutual TLS) every peer
    must present a certificate signed by files.ca, and its subject reaches
    the servicer in `context.auth_context()`.

    grpc's Python API has no "ask for a certificate, accept its absence":
    without require_client_cert the server does not even request one, so
    callers can then authenticate only with bearer tokens."""
    ca, cert, key = files.read()
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca if require_client_cert else None,
                                       require_client_auth=require_client_cert)


def _bytes(value: str | os.PathLike | bytes | None, what: str) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return _read(Path(value), what)


def channel_credentials(ca: str | os.PathLike | bytes | None, cert: str | os.PathLike | bytes | None = None,
                        key: str | os.PathLike | bytes | None = None) -> grpc.ChannelCredentials:
    """TLS for a client: trust `ca` (None: the system's roots) and, for
    mutual TLS, present cert + key (paths or PEM bytes)."""
    if (cert is None) != (key is None):
        raise TlsConfigError("a client certificate needs its key and a key its certificate (--cert with --key)")
    ca_b, cert_b, key_b = _bytes(ca, "CA certificate"), _bytes(cert, "certificate"), _bytes(key, "private key")
    if cert_b is not None:
        check_pair(cert_b, key_b, cert if not isinstance(cert, bytes) else "certificate",
                   key if not isinstance(key, bytes) else "key")
    return grpc.ssl_channel_credentials(root_certificates=ca_b, private_key=key_b, certificate_chain=cert_b)


class _BearerToken(grpc.AuthMetadataPlugin):
    def __init__(self, token: str):
        self._metadata = ((AUTHORIZATION_KEY, BEARER + token),)

    def __call__(self, context, callback):
        callback(self._metadata, None)


def bearer_call_credentials(token: str) -> grpc.CallCredentials:
    return grpc.metadata_call_credentials(_BearerToken(token), name="gpuscope-bearer")


@dataclass(frozen=True)
class ClientSecurity:
    """What a client presents: the CA it trusts (None: the system's roots),
    its certificate and key (mutual TLS), a bearer token, or `insecure`
    (plain text; never with a token, a certificate or a CA).
    `server_name` overrides the name the server's certificate must carry
    (--tls-server-name), for addresses the certificate does not list."""
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    token: str | None = field(default=None, repr=False)
    insecure: bool = False
    server_name: str | None = None

    def __post_init__(self):
        if self.insecure and self.token:
            raise TlsConfigError("refusing to send a bearer token without TLS: drop --insecure (tokens are only "
                                 "sent over TLS), or unset GPUSCOPE_TOKEN / --token-file")
        if self.insecure and (self.ca or self.cert or self.key or self.server_name):
            raise TlsConfigError("--insecure cannot be combined with TLS files (--tls-dir, --ca, --cert, --key) "
                                 "or --tls-server-name")
        if bool(self.cert) != bool(self.key):
            raise TlsConfigError("a client certificate needs its key and a key its certificate (--cert with --key)")
        if self.token is not None and (not self.token or any(c in self.token for c in "\r\n\0 ")):
            raise TlsConfigError("the bearer token is empty or has whitespace in it")

    @property
    def mode(self) -> str:
        """'insecure', 'tls' (server authenticated) or 'mtls' (both)."""
        return "insecure" if self.insecure else ("mtls" if self.cert else "tls")

    def describe(self) -> str:
        if self.insecure:
            return "plain text (--insecure)"
        parts = [f"TLS trusting {self.ca or 'the system CAs'}"]
        if self.cert:
            parts.append(f"client certificate {self.cert}")
        if self.token:
            parts.append("a bearer token")
        return ", ".join(parts)

    def credentials(self) -> grpc.ChannelCredentials | None:
        """Channel credentials (TLS, plus the token per call); None when insecure.
        Files are read on each call, so a renewed certificate is picked up at
        the next connection."""
        if self.insecure:
            return None
        creds = channel_credentials(self.ca, self.cert, self.key)
        if self.token:
            creds = grpc.composite_channel_credentials(creds, bearer_call_credentials(self.token))
        return creds

    def _options(self, options: Sequence[tuple[str, object]]) -> list[tuple[str, object]]:
        opts = list(options)
        if self.server_name and not self.insecure:
            opts.append(("grpc.ssl_target_name_override", self.server_name))
        return opts

    def channel(self, target: str, options: Sequence[tuple[str, object]] = ()) -> grpc.Channel:
        creds = self.credentials()
        if creds is None:
            return grpc.insecure_channel(target, options=self._options(options))
        return grpc.secure_channel(target, creds, options=self._options(options))

    def aio_channel(self, target: str, options: Sequence[tuple[str, object]] = ()) -> "grpc.aio.Channel":
        creds = self.credentials()
        if creds is None:
            return grpc.aio.insecure_channel(target, options=self._options(options))
        return grpc.aio.secure_channel(target, creds, options=self._options(options))

    def channel_factory(self, options: Sequence[tuple[str, object]] = ()) -> Callable[[str], grpc.Channel]:
        """`target -> grpc.Channel`, for components that open their own
        channels (the uplink reconnects with a fresh one each time)."""
        return lambda target: self.channel(target, options)


INSECURE = ClientSecurity(insecure=True)


# -- helpers for servers and clients --------------------------------------------------------

def is_loopback(hostport: str) -> bool:
    """True when a listen address or target (HOST:PORT, [V6]:PORT, a bare
    host, unix:PATH) reaches this machine only: 127.0.0.0/8, ::1, localhost
    or a Unix socket. 0.0.0.0 and [::] are not."""
    import ipaddress

    if hostport.startswith(("unix:", "unix-abstract:")):
        return True
    if hostport.startswith("["):
        host = hostport[1:hostport.find("]")]
    elif hostport.count(":") == 1:
        host = hostport.partition(":")[0]
    else:
        host = hostport
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def broke_mid_call(exc: grpc.RpcError) -> bool:
    """The call was under way on a connection the server had accepted when
    that connection broke (gRPC says "Stream removed"): the server went away
    (kill -9, a restart), it did not refuse this client."""
    return (exc.code() == grpc.StatusCode.UNAVAILABLE
            and ((exc.details() or "").startswith("Stream removed")))


def closed_in_handshake(exc: grpc.RpcError) -> bool:
    """The server closed or reset the connection before it was established.
    A server refusing this client's TLS does that, and so does one that dies
    while the client connects: which it was, only whether it still listens
    tells (daemon/clients.py asks)."""
    details = (exc.details() or "") if exc.code() == grpc.StatusCode.UNAVAILABLE else ""
    return not broke_mid_call(exc) and ("Socket closed" in details or "Connection reset" in details
                                        or "handshake" in details.lower())


# security.auth.authorize's words for a caller whose role is not among the method's
_ROLE_REFUSAL = re.compile(r" has role \w+; \S+ needs ([\w ]+)$")
# ... and the analyzer's for an agent naming another host than its certificate's (service._own_host)
_OTHER_HOST = re.compile(r"this agent's certificate is for '([^']*)'")


def explain_failure(exc: grpc.RpcError, target: str, security: ClientSecurity,
                    established: bool = False) -> str | None:
    """One line naming the fix when a call failed on TLS or authentication;
    None for other failures. `security` is what the client presented;
    `established`: the server had accepted this stream (answered on it), so
    a closed connection is the server going away, not a refusal."""
    code = exc.code() if hasattr(exc, "code") else None
    details = (exc.details() if hasattr(exc, "details") else "") or ""
    if code == grpc.StatusCode.UNAVAILABLE and (established or broke_mid_call(exc)):
        return None
    if code == grpc.StatusCode.UNAUTHENTICATED:
        if security.insecure:
            return (f"the server at {target} requires authentication, which needs TLS: drop --insecure and pass "
                    f"--tls-dir DIR (a client certificate) or --token-file FILE ({details})")
        if security.token:       # a token, when sent, decides the caller: this one matched nothing
            return (f"the server at {target} refused the bearer token (unknown to it, or it was started "
                    f"without --tokens): check --token-file / GPUSCOPE_TOKEN ({details})")
        return (f"the server at {target} requires a client certificate or token: pass --tls-dir DIR (with "
                f"client.pem) or --cert/--key, or --token-file FILE / GPUSCOPE_TOKEN ({details})")
    if code == grpc.StatusCode.PERMISSION_DENIED:
        theirs = _OTHER_HOST.search(details)
        if theirs:
            return (f"the server at {target} refused this call: {details} (an agent's certificate speaks for its "
                    f"own host only: pass --host {theirs.group(1)}, or use that host's own agent certificate)")
        needs = _ROLE_REFUSAL.search(details)
        if not needs:
            return None        # not the caller's role (a capture target the agent may not touch): as said
        roles = needs.group(1).split(" or ")
        if "reader" in roles or "operator" in roles:
            role = "reader" if "reader" in roles else "operator"      # the least that allows it
            article = "an" if role == "operator" else "a"
            return (f"the server at {target} refused this call: {details} ({article} {role} certificate or token "
                    f"allows it: `gpuscope certs client DIR --name NAME --role {role}` or `gpuscope certs token "
                    f"--tokens FILE --name NAME --role {role}`)")
        return (f"the server at {target} refused this call: {details} (only a GPU host's agent certificate "
                "may make it: `gpuscope certs agent DIR --host HOST`, passed with --tls-dir or --cert/--key)")
    if code != grpc.StatusCode.UNAVAILABLE:
        return None
    if "Hostname Verification" in details or "hostname" in details.lower() and "verif" in details.lower():
        if security.server_name:
            return (f"the certificate of the server at {target} does not name {security.server_name}, the name "
                    "--tls-server-name asked for: pass one of the names it lists, or drop --tls-server-name")
        return (f"the certificate of the server at {target} does not name {target.rpartition(':')[0] or target}: "
                "connect by a name it lists, or pass --tls-server-name NAME (one of its names)")
    if "CERTIFICATE_VERIFY_FAILED" in details or "certificate verify failed" in details.lower():
        return (f"the certificate of the server at {target} is not signed by the CA this client trusts "
                f"({security.ca or 'the system CAs'}): pass the fleet's ca.pem with --ca or --tls-dir")
    if "WRONG_VERSION_NUMBER" in details:
        return (f"the server at {target} does not speak TLS (was it started with --insecure?): pass --insecure "
                "too (loopback only), or start it with --tls-dir")
    if closed_in_handshake(exc):
        if security.insecure:
            return (f"the server at {target} closed a plain-text connection; it probably requires TLS: drop "
                    "--insecure and pass --tls-dir DIR (or --ca/--cert/--key)")
        if security.mode == "tls" and not security.token:
            return (f"the server at {target} closed the TLS connection; it probably requires a client "
                    "certificate: pass --tls-dir DIR (with client.pem and client.key) or --cert/--key")
        if security.mode == "mtls":
            return (f"the server at {target} closed the TLS connection; it probably refused the client "
                    f"certificate {security.cert} (signed by another CA, or expired?)")
        return (f"the server at {target} closed the TLS connection; it probably requires a client "
                "certificate (mutual TLS): pass --tls-dir DIR or --cert/--key as well")
    return None
