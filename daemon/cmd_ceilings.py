"""`gpuscope ceilings`: each GPU's measured ceilings as the analyzer holds
them (`gpuscope calibrate --send`), against its datasheet."""
from __future__ import annotations

from datetime import datetime, timezone

from gpuscope.analyzers.roofline import datasheet_peaks
from gpuscope.collectors.human import percent, si

from . import clients
from .cliutil import print_json
from .security_flags import client_security

# (column, measurement, unit shown, the datasheet figure it is read against: 0 flops, 1 bytes)
_COLUMNS = (("HBM", ("hbm_triad", "hbm_copy"), "B/s", 1), ("BF16 MATMUL", ("matmul_bf16",), "FLOP/s", 0),
            ("LAUNCH", ("launch_roundtrip",), "s", None), ("H2D", ("h2d",), "B/s", None),
            ("D2H", ("d2h",), "B/s", None))


def add_ceilings_parser(sub, server_args) -> None:
    sp = sub.add_parser("ceilings", help="each GPU's measured ceilings (gpuscope calibrate --send) against its "
                                         "datasheet")
    sp.add_argument("--host", default="", help="only this host's GPUs")
    sp.add_argument("--model", default="", help="only GPUs whose name contains this, e.g. H200")
    sp.add_argument("--uuid", default="", help="only this GPU")
    sp.add_argument("--history", action="store_true", help="every calibration, not only each GPU's newest")
    server_args(sp)
    sp.set_defaults(fn=cmd_ceilings)


def cmd_ceilings(ns) -> int:
    rows = clients.ceilings(ns.server, ns.host, ns.model, ns.uuid, ns.history, security=client_security(ns))
    if ns.json:
        print_json({"calibrations": rows})
        return 0
    if not rows:
        asked = " ".join(f"--{k} {v}" for k, v in (("host", ns.host), ("model", ns.model), ("uuid", ns.uuid)) if v)
        print(f"no calibration matches {asked}" if asked else
              "no calibrations stored (run `gpuscope calibrate --send ANALYZER` on a GPU host)")
        return 0
    print(f"{'HOST':<16} {'GPU':>3} {'MODEL':<22} " + " ".join(f"{c[0]:>20}" for c in _COLUMNS) + "  MEASURED")
    for r in rows:
        print(render_row(r))
    parts = sorted({sheet[0] for r in rows if (sheet := datasheet_peaks(r.get("model")))})
    if parts:
        print(f"(x%: of NVIDIA's datasheet figure for the {', '.join(parts)}; no % where the part is not in it)")
    return 0


def render_row(r: dict) -> str:
    sheet = datasheet_peaks(r.get("model"))
    cells = []
    for _, names, unit, against in _COLUMNS:
        values = [r["ceilings"][n]["value"] for n in names if (r["ceilings"].get(n) or {}).get("value")]
        if not values:
            cells.append(f"{'—':>20}")
            continue
        v = max(values)
        ref = None if sheet is None or against is None else (sheet[1].flops_per_s, sheet[1].bytes_per_s)[against]
        cells.append(f"{si(v, unit) + (f' ({percent(v / ref)})' if ref else ''):>20}")
    when = datetime.fromtimestamp(r["started_at"], timezone.utc).strftime("%Y-%m-%d %H:%M")
    marks = [m for m, on in (("quick", r.get("quick")), ("forced", r.get("forced")),
                             (f"{r.get('platform')}, not a GPU", r.get("platform") == "cpu")) if on]
    return (f"{r['host'][:16]:<16} {r['gpu']:>3} {(r.get('model') or '?')[:22]:<22} " + " ".join(cells)
            + f"  {when}" + (f" ({', '.join(marks)})" if marks else ""))
