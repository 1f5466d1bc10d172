"""Certificates for a trial or a small fleet: a CA, the analyzer's server
certificate, one certificate per agent (naming its host) and client
certificates for on-call people. ECDSA P-256, one year by default.

Files follow one layout, the one `security.tls.tls_files` reads:
`DIR/ca.pem` (+ `DIR/ca.key`, only where certificates are made),
`DIR/NAME.pem` and `DIR/NAME.key` with NAME `analyzer`, `agent` or `client`.
The role of a certificate is its subject OU: `agent`, `reader` or `operator`
(the analyzer's own certificate says `server`, which is no caller role).
Keys are written 0600 in directories made 0700, and an existing key is never
replaced unless asked (`force=True`, `--force`)."""
from __future__ import annotations

import datetime as dt
import getpass
import ipaddress
import os
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_DAYS = 365
CLIENT_ROLES = ("reader", "operator")
SERVER_OU = "server"
ORGANIZATION = "gpuscope"
RENEW_BEFORE = dt.timedelta(days=7)      # ensure_local_pki re-issues a leaf this close to expiry

CA_FILE, CA_KEY_FILE = "ca.pem", "ca.key"
ANALYZER_NAME, AGENT_NAME, CLIENT_NAME = "analyzer", "agent", "client"


class CertError(ValueError):
    """A certificate could not be made or read; the message says what to do."""


@dataclass(frozen=True)
class Issued:
    """One certificate written to disk."""
    cert: Path
    key: Path
    common_name: str
    role: str
    dns: tuple[str, ...] = ()
    ips: tuple[str, ...] = ()
    not_after: float = 0.0
    fingerprint_sha256: str = ""
    extra: tuple[Path, ...] = field(default=())   # other files written (the CA certificate beside a leaf)

    def as_dict(self) -> dict:
        return dict(cert=str(self.cert), key=str(self.key), common_name=self.common_name, role=self.role,
                    dns=list(self.dns), ips=list(self.ips), not_after=self.not_after,
                    fingerprint_sha256=self.fingerprint_sha256, also_written=[str(p) for p in self.extra])


# -- files ------------------------------------------------------------------------

def _make_dir(path: Path) -> None:
    if not path.exists():
        path.mkdir(mode=0o700, parents=True)
        os.chmod(path, 0o700)      # mkdir's mode is masked by the umask
    elif not path.is_dir():
        raise CertError(f"{path} is not a directory")


def _write(path: Path, data: bytes, mode: int, force: bool) -> None:
    """Writes through a temporary file and a rename, so that a reader never
    sees half a key and an existing key is replaced only when forced."""
    if path.exists() and not force:
        raise CertError(f"{path} exists; not replacing it (pass --force to make a new one)")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _read_cert(path: Path) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except FileNotFoundError:
        raise CertError(f"{path}: no such file") from None
    except PermissionError:
        raise CertError(f"{path}: not readable by this user") from None
    except ValueError as exc:
        raise CertError(f"{path}: not a PEM certificate ({exc})") from None


def load_ca(directory: str | os.PathLike) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    d = Path(directory)
    cert_path, key_path = d / CA_FILE, d / CA_KEY_FILE
    if not cert_path.exists() or not key_path.exists():
        raise CertError(f"no CA in {d} (need {CA_FILE} and {CA_KEY_FILE}); make one with `gpuscope certs init {d}`")
    cert = _read_cert(cert_path)
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (ValueError, TypeError) as exc:
        raise CertError(f"{key_path}: not an unencrypted PEM private key ({exc})") from None
    except PermissionError:
        raise CertError(f"{key_path}: not readable by this user") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CertError(f"{key_path}: expected an EC key")
    if key.public_key().public_numbers() != cert.public_key().public_numbers():
        raise CertError(f"{key_path} does not belong to {cert_path}")
    return cert, key


# -- building -----------------------------------------------------------------------

def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _name(common_name: str, role: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION),
                      x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _check_days(days: int) -> None:
    if not 1 <= days <= 3650:
        raise CertError(f"--days: {days}, expected 1 to 3650")


def _fingerprint(cert: x509.Certificate) -> str:
    return cert.fingerprint(hashes.SHA256()).hex()


def _parse_ips(ips: Iterable[str]) -> list[ipaddress._BaseAddress]:
    out = []
    for ip in ips:
        try:
            out.append(ipaddress.ip_address(ip))
        except ValueError:
            raise CertError(f"--ip: {ip!r} is not an IP address") from None
    return out


def create_ca(directory: str | os.PathLike, common_name: str = "gpuscope CA", days: int = DEFAULT_DAYS,
              force: bool = False) -> Issued:
    """A self-signed CA (ECDSA P-256) in DIR/ca.pem and DIR/ca.key."""
    _check_days(days)
    d = Path(directory)
    _make_dir(d)
    if (d / CA_KEY_FILE).exists() and not force:
        raise CertError(f"{d / CA_KEY_FILE} exists; not replacing the CA (pass --force to make a new one; "
                        "every certificate it signed stops working)")
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    subject = _name(common_name, "ca")
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(ski, critical=False)
            .sign(key, hashes.SHA256()))
    _write(d / CA_KEY_FILE, _key_pem(key), 0o600, force=True)
    _write(d / CA_FILE, cert.public_bytes(serialization.Encoding.PEM), 0o644, force=True)
    return Issued(d / CA_FILE, d / CA_KEY_FILE, common_name, "ca", not_after=cert.not_valid_after_utc.timestamp(),
                  fingerprint_sha256=_fingerprint(cert))


def _issue(ca_dir: Path, out_dir: Path, file_name: str, common_name: str, role: str, dns: Iterable[str],
           ips: Iterable[str], server: bool, client: bool, days: int, force: bool) -> Issued:
    _check_days(days)
    if not common_name or any(c in common_name for c in "/\\\n\r\0"):
        raise CertError(f"{common_name!r} is not a usable name")
    ca_cert, ca_key = load_ca(ca_dir)
    _make_dir(out_dir)
    key_path, cert_path = out_dir / f"{file_name}.key", out_dir / f"{file_name}.pem"
    if key_path.exists() and not force:
        elsewhere = ", or --out DIR to write elsewhere" if client else ""
        raise CertError(f"{key_path} exists; not replacing it (pass --force to make a new one{elsewhere})")
    dns = list(dict.fromkeys(n for n in dns if n))
    ip_objs = _parse_ips(dict.fromkeys(ips))
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    not_after = min(now + dt.timedelta(days=days), ca_cert.not_valid_after_utc)
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + ([ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
    builder = (x509.CertificateBuilder().subject_name(_name(common_name, role)).issuer_name(ca_cert.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(not_after)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False,
                                            content_commitment=False, key_encipherment=False,
                                            data_encipherment=False, key_agreement=True, encipher_only=False,
                                            decipher_only=False), critical=True)
               .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                              critical=False))
    sans = [x509.DNSName(n) for n in dns] + [x509.IPAddress(ip) for ip in ip_objs]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    _write(key_path, _key_pem(key), 0o600, force=True)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644, force=True)
    extra: tuple[Path, ...] = ()
    if out_dir.resolve() != ca_dir.resolve():     # a directory to copy to the host as it is
        shutil.copyfile(ca_dir / CA_FILE, out_dir / CA_FILE)
        os.chmod(out_dir / CA_FILE, 0o644)
        extra = (out_dir / CA_FILE,)
    return Issued(cert_path, key_path, common_name, role, tuple(dns), tuple(str(i) for i in ip_objs),
                  not_after.timestamp(), _fingerprint(cert), extra)


LOOPBACK_DNS = ("localhost",)
LOOPBACK_IPS = ("127.0.0.1", "::1")


def default_server_names() -> list[str]:
    names = ["localhost", socket.gethostname()]
    fqdn = socket.getfqdn()
    if fqdn and fqdn not in names and "." in fqdn:
        names.append(fqdn)
    return names


def issue_server(ca_dir: str | os.PathLike, dns: Iterable[str] = (), ips: Iterable[str] = (),
                 name: str = ANALYZER_NAME, days: int = DEFAULT_DAYS, force: bool = False,
                 out: str | os.PathLike | None = None) -> Issued:
    """The analyzer's server certificate, DIR/analyzer.pem. SANs: the DNS
    names and IPs given; with none given, localhost, 127.0.0.1, ::1 and this
    host's name."""
    dns, ips = list(dns), list(ips)
    if not dns and not ips:
        dns, ips = default_server_names(), list(LOOPBACK_IPS)
    return _issue(Path(ca_dir), Path(out or ca_dir), name, dns[0] if dns else ips[0], SERVER_OU, dns, ips,
                  server=True, client=False, days=days, force=force)


def issue_agent(ca_dir: str | os.PathLike, host: str, dns: Iterable[str] = (), ips: Iterable[str] = (),
                days: int = DEFAULT_DAYS, force: bool = False, out: str | os.PathLike | None = None,
                loopback: bool = True) -> Issued:
    """An agent's certificate, DIR/agent.pem: CN and first DNS SAN are the
    host, role `agent`. It authenticates the agent to the analyzer (client)
    and serves the agent's own API (server); `loopback` adds localhost,
    127.0.0.1 and ::1 so that API verifies on its default 127.0.0.1 address."""
    if not host:
        raise CertError("--host: the agent's host name is required")
    names = [host, *dns, *(LOOPBACK_DNS if loopback else ())]
    return _issue(Path(ca_dir), Path(out or ca_dir), AGENT_NAME, host, "agent", names,
                  [*ips, *(LOOPBACK_IPS if loopback else ())], server=True, client=True, days=days, force=force)


def issue_client(ca_dir: str | os.PathLike, name: str, role: str, days: int = DEFAULT_DAYS, force: bool = False,
                 out: str | os.PathLike | None = None) -> Issued:
    """An on-call person's certificate, DIR/client.pem: CN the name, OU the role."""
    if role not in CLIENT_ROLES:
        raise CertError(f"--role: {role!r}, expected one of {', '.join(CLIENT_ROLES)}")
    return _issue(Path(ca_dir), Path(out or ca_dir), CLIENT_NAME, name, role, (), (),
                  server=False, client=True, days=days, force=force)


# -- the single-host demo --------------------------------------------------------------

def _leaf_ok(directory: Path, file_name: str, ca_cert: x509.Certificate, common_name: str | None) -> bool:
    cert_path, key_path = directory / f"{file_name}.pem", directory / f"{file_name}.key"
    if not cert_path.exists() or not key_path.exists():
        return False
    try:
        cert = _read_cert(cert_path)
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        cert.verify_directly_issued_by(ca_cert)
    except (CertError, ValueError, TypeError, PermissionError):
        return False
    if key.public_key().public_numbers() != cert.public_key().public_numbers():
        return False
    if cert.not_valid_after_utc - RENEW_BEFORE < _now():
        return False
    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return common_name is None or (bool(cn) and cn[0].value == common_name)


def ensure_local_pki(directory: str | os.PathLike, host: str) -> dict:
    """Makes, once, what a single host needs to run secure with no flags: a
    CA, the `analyzer` server certificate (localhost, 127.0.0.1, ::1, this
    host's name), the `agent` certificate for HOST and a `client`
    certificate with role operator for the local user. Certificates that are
    valid, signed by the CA and not about to expire are kept; missing,
    mismatched or expiring ones are made again (this directory is the local
    PKI's own). Returns {"dir": ..., "created": [file names]}."""
    d = Path(directory)
    created: list[str] = []
    ca_ok = (d / CA_FILE).exists() and (d / CA_KEY_FILE).exists()
    if ca_ok:
        ca_cert, _ = load_ca(d)
        ca_ok = ca_cert.not_valid_after_utc - RENEW_BEFORE > _now()
    if not ca_ok:
        create_ca(d, common_name=f"gpuscope local CA ({host})", force=True)
        created.append(CA_FILE)
    ca_cert, _ = load_ca(d)
    if not _leaf_ok(d, ANALYZER_NAME, ca_cert, None):
        issue_server(d, force=True)
        created.append(f"{ANALYZER_NAME}.pem")
    if not _leaf_ok(d, AGENT_NAME, ca_cert, host):
        issue_agent(d, host, force=True)
        created.append(f"{AGENT_NAME}.pem")
    if not _leaf_ok(d, CLIENT_NAME, ca_cert, None):
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = "local"
        issue_client(d, f"{user}@{host}", "operator", force=True)
        created.append(f"{CLIENT_NAME}.pem")
    return {"dir": str(d), "created": created}
