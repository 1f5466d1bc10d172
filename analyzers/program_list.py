"""What `gpuscope programs` shows: each program with its runs, hosts and
baseline, or one program's runs, each against that baseline."""
from __future__ import annotations

from . import programs as pg
from .fingerprints import COMMAND, command_fingerprint
from .store import Store


def list_programs(store: Store, since: float, host: str = "", fingerprint: str = "", limit: int = 200,
                  open_regressions: list[dict] = (), config: pg.ProgramsConfig = pg.ProgramsConfig()) -> list[dict]:
    """Programs with runs ending at or after `since` (newest first), each
    with its baseline figures (medians of its runs long enough to judge,
    but those with open regressions) and its open regression findings. With `fingerprint`: that program
    only, with its runs (newest first, at most `limit`)."""
    regressed: dict[str, list[str]] = {}         # run id -> its open regression findings
    for f in open_regressions:
        key = (f.get("condition_key") or "").split(":")
        if len(key) == 3:
            regressed.setdefault(key[1], []).append(f["id"])
    if fingerprint:
        runs = [pg.run_from_row(r) for r in store.program_runs(since=since, host=host, fingerprints=[fingerprint],
                                                                limit=limit)]
        runs = [r for r in runs if (r["hlo_fp"] or r["command_fp"]) == fingerprint
                or r["command_fp"] == fingerprint]
        if not runs:
            return []
        rows = [p for p in store.programs(since, host) if p["fingerprint"] == (runs[0]["hlo_fp"] or fingerprint)]
        program = _with_kind(rows[0]) if rows else dict(fingerprint=fingerprint, runs=len(runs))
        program.update(_baseline(runs, regressed, config), runs_shown=[_run_view(r, regressed) for r in runs])
        return [program]
    out = []
    for p in map(_with_kind, store.programs(since, host, limit)):
        runs = [pg.run_from_row(r) for r in store.program_runs(since=since, host=host,
                                                                fingerprints=[p["fingerprint"]], limit=200)]
        runs = [r for r in runs if (r["hlo_fp"] or r["command_fp"]) == p["fingerprint"]]
        p.update(_baseline(runs, regressed, config))
        p["open_regressions"] = sum(len(regressed.get(r["id"], ())) for r in runs)
        out.append(p)
    return out


def _with_kind(p: dict) -> dict:
    """The store knows a program as HLO or command line; a command line's
    fingerprint says whether it is a serving engine's (fingerprints.py)."""
    if p.get("kind") == COMMAND:
        fp = command_fingerprint(p.get("command") or "")
        if fp is not None and fp.value == p.get("fingerprint"):
            p["kind"] = fp.kind
    return p


def _baseline(runs: list[dict], regressed: dict[str, list[str]], config: pg.ProgramsConfig) -> dict:
    """The program's figures now: of its runs that depart from none (a
    regressing run is not what the program usually does)."""
    base = pg.baseline([r for r in runs if r["id"] not in regressed], config)
    return dict(baseline_runs=base["runs"], baseline={m: s.median for m, s in base["metrics"].items()},
                baseline_step_seconds=base["step"].median if base["step"] else None,
                baseline_verdict=base["verdict"], baseline_top_ops=base["top_ops"])


def _run_view(r: dict, regressed: dict[str, list[str]]) -> dict:
    total = sum(r["verdicts"].values())
    return dict(id=r["id"], host=r["host"], gpus=r["gpus"], pid=r["pid"], job=r["job"], start=r["start"],
                end=r["end"], sampled_s=r["sampled_s"], step_seconds=r["step_seconds"],
                hlo_fp=r["hlo_fp"], command_fp=r["command_fp"],
                means={m: pg.mean(r, m) for m in pg.SIGNATURE if pg.mean(r, m) is not None},
                verdicts={v: n / total for v, n in r["verdicts"].items()} if total else {},
                top_ops=r["top_ops"], captures=r["captures"], regressions=regressed.get(r["id"], []))
