"""`gpuscope certs`: a CA and certificates for a trial or a small fleet, and
bearer tokens for on-call callers. Real fleets may use their own PKI: any CA
whose certificates carry the role in the subject OU (docs/security.md)."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from gpuscope.security import certs
from gpuscope.security.auth import add_token

from .cliutil import print_json


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d", time.localtime(t))


def _print_issued(what: str, issued: certs.Issued) -> None:
    sans = ", ".join([*issued.dns, *issued.ips])
    print(f"{what}: {issued.cert} (key {issued.key}, 0600), CN={issued.common_name} OU={issued.role}"
          f"{f', names {sans}' if sans else ''}, valid until {_when(issued.not_after)}")
    for extra in issued.extra:
        print(f"  also wrote {extra}")


def cmd_certs_init(ns) -> int:
    d = Path(ns.dir)
    out = []
    if (d / certs.CA_FILE).exists() and (d / certs.CA_KEY_FILE).exists():
        certs.load_ca(d)       # checks it is usable
        ca = None
    else:
        ca = certs.create_ca(d, days=ns.days)
        out.append(dict(kind="ca", **ca.as_dict()))
    server = certs.issue_server(d, dns=ns.name or (), ips=ns.ip or (), days=ns.days, force=ns.force)
    out.append(dict(kind="analyzer", **server.as_dict()))
    if ns.json:
        print_json({"dir": str(d), "issued": out})
        return 0
    if ca is not None:
        _print_issued("CA", ca)
    else:
        print(f"CA: kept {d / certs.CA_FILE}")
    _print_issued("analyzer", server)
    print(f"next: `gpuscope analyzer --tls-dir {d} --listen 0.0.0.0:9403`; for each GPU host "
          f"`gpuscope certs agent {d} --host HOST --out {d}/HOST`; for people "
          f"`gpuscope certs client {d} --name NAME --role reader|operator`")
    return 0


def cmd_certs_agent(ns) -> int:
    issued = certs.issue_agent(ns.dir, ns.host, dns=ns.name or (), ips=ns.ip or (), days=ns.days,
                               force=ns.force, out=ns.out)
    return _report(ns, "agent", f"agent {ns.host}", issued,
                   f"next: copy {issued.cert.parent} (ca.pem, agent.pem, agent.key) to {ns.host}, then "
                   f"`gpuscope agent --tls-dir DIR --analyzer ANALYZER:9403`")


def cmd_certs_client(ns) -> int:
    issued = certs.issue_client(ns.dir, ns.name, ns.role, days=ns.days, force=ns.force, out=ns.out)
    return _report(ns, "client", f"{ns.role} {ns.name}", issued,
                   f"next: `gpuscope status --server ANALYZER:9403 --tls-dir {issued.cert.parent}` "
                   f"(or GPUSCOPE_TLS_DIR={issued.cert.parent})")


def _report(ns, kind: str, title: str, issued, next_step: str) -> int:
    if ns.json:
        print_json(dict(kind=kind, **issued.as_dict()))
    else:
        _print_issued(title, issued)
        print(next_step)
    return 0


def cmd_certs_token(ns) -> int:
    token = add_token(ns.tokens, ns.name, ns.role)
    if ns.json:
        print_json(dict(name=ns.name, role=ns.role, tokens_file=str(ns.tokens), token=token))
        return 0
    print(token)
    print(f"(shown once; {ns.tokens} keeps only its SHA-256. Give it to {ns.name} to put in a 0600 file for "
          f"--token-file, or in GPUSCOPE_TOKEN; the server reads --tokens {ns.tokens} at start-up)",
          file=sys.stderr)
    return 0


def add_certs_parser(sub) -> None:
    sp = sub.add_parser("certs", help="a CA, certificates and tokens for a secure trial or small fleet")
    certs_sub = sp.add_subparsers(dest="certs_command", required=True)

    def common(p, out: bool = True):
        p.add_argument("dir", help="the CA's directory (ca.pem, ca.key)")
        p.add_argument("--days", type=int, default=certs.DEFAULT_DAYS, help="validity (default 365)")
        p.add_argument("--force", action="store_true", help="replace an existing certificate and key")
        if out:
            p.add_argument("--out", default=None, metavar="DIR",
                           help="write the certificate, key and a copy of ca.pem here (default: DIR)")
        p.add_argument("--json", action="store_true")

    p = certs_sub.add_parser("init", help="a CA (kept if DIR has one) and the analyzer's server certificate")
    common(p, out=False)
    p.add_argument("--name", action="append", metavar="DNS",
                   help="a DNS name agents and people reach the analyzer by (repeat; default: localhost and "
                        "this host's name, with 127.0.0.1 and ::1)")
    p.add_argument("--ip", action="append", metavar="IP", help="an IP address the analyzer is reached at (repeat)")
    p.set_defaults(fn=cmd_certs_init)

    p = certs_sub.add_parser("agent", help="an agent's certificate: CN and DNS name are its host, role agent")
    common(p)
    p.add_argument("--host", required=True, help="the GPU host's name, as its agent reports it (--host)")
    p.add_argument("--name", action="append", metavar="DNS", help="another DNS name of the host (repeat)")
    p.add_argument("--ip", action="append", metavar="IP", help="an IP address of the host (repeat)")
    p.set_defaults(fn=cmd_certs_agent)

    p = certs_sub.add_parser("client", help="an on-call person's certificate with role reader or operator")
    common(p)
    p.add_argument("--name", required=True, help="who (shown in the audit log)")
    p.add_argument("--role", required=True, choices=list(certs.CLIENT_ROLES))
    p.set_defaults(fn=cmd_certs_client)

    p = certs_sub.add_parser("token", help="a bearer token for an on-call caller; prints it once, stores its hash")
    p.add_argument("--tokens", required=True, metavar="FILE", help="the tokens file servers read with --tokens")
    p.add_argument("--name", required=True, help="who (shown in the audit log)")
    p.add_argument("--role", required=True, choices=list(certs.CLIENT_ROLES))
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_certs_token)
