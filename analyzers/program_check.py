"""The fleet check of program runs (programs.py): each check adds what the
store received since the last one to the runs it covers, and judges the
runs still going against their programs' baselines.

A check covers samples up to `lag_s` before now, from where the last one
stopped (kept in the store's meta, so a restart goes on where it stopped);
samples that arrive later than that (an agent catching up after an outage)
do not reach its runs' signatures. Reading happens on the caller's cursor,
off the writer; `apply` writes the runs on the writer thread.
"""
from __future__ import annotations

import json

from gpuscope.collectors.records import ATTRIBUTION_FIELDS

from . import programs as pg
from .store import Store

CURSOR = "programs_checked_until"
FIRST_SPAN_S = 3600.0       # a store checked for the first time: its last hour


class ProgramCheck:
    def __init__(self, store: Store, config: pg.ProgramsConfig = pg.ProgramsConfig()):
        self.store = store
        self.config = config

    def collect(self, now: float) -> tuple[list[dict], float | None, dict[str, dict]]:
        """The runs the store's new samples touch, updated (not yet written),
        the check's new cursor (None: nothing new to cover), and what each
        run did over the check's span alone (run id -> {metric: mean},
        with `verdicts`: verdict -> windows), which job checks compare
        across ranks (stragglers.py)."""
        lo = self.store.meta_float(CURSOR)
        hi = now - self.config.lag_s
        if lo is None:
            lo = hi - FIRST_SPAN_S
        if hi <= lo:
            return [], None, {}
        runs = {(r["host"], r["pid"], r["command"]): pg.run_from_row(r)
                for r in reversed(self.store.program_runs(since=lo - self.config.run_gap_s))}
        touched: dict[tuple, dict] = {}
        for p in self.store.process_presence(lo, hi):
            key = (p["host"], int(p["pid"]), p["command"])
            run = runs.get(key)
            if run is None or p["first"] - run["end"] > self.config.run_gap_s:
                labels = {f: p[f] for f in ATTRIBUTION_FIELDS if p.get(f)}
                run = runs[key] = pg.new_run(p["host"], int(p["pid"]), p["command"], float(p["first"]), labels)
            pg.add_presence(run, [int(g) for g in p["gpus"]], float(p["first"]), float(p["last"]))
            run["updated"] = now
            touched[key] = run
        interval: dict[str, dict] = {}
        for s in self.store.process_signatures(lo, hi, tuple(pg.SIGNATURE)):
            run = touched.get((s["host"], int(s["pid"]), s["command"]))
            if run is None:
                continue
            sums = {m: (s.get(f"sum_{m}") or 0.0, int(s.get(f"n_{m}") or 0)) for m in pg.SIGNATURE}
            pg.add_signature(run, sums)
            verdicts = json.loads(s["verdicts"]) if s.get("verdicts") else {}
            pg.add_verdicts(run, verdicts)
            interval[run["id"]] = dict({m: v / n for m, (v, n) in sums.items() if n}, verdicts=verdicts)
        self._attach_captures(runs, touched, lo - self.config.run_gap_s)
        return list(touched.values()), hi, interval

    def _attach_captures(self, runs: dict[tuple, dict], touched: dict[tuple, dict], since: float) -> None:
        """Captures of a run's process (its pid, else its GPUs, within its span)."""
        by_host: dict[str, list[dict]] = {}
        for r in runs.values():
            by_host.setdefault(r["host"], []).append(r)
        for c in self.store.program_captures(since):
            program = json.loads(c["program"]) if isinstance(c["program"], str) else c["program"]
            gpus = set(json.loads(c["gpus"] or "[]"))
            start, end = c["start"], c["end"] or c["start"]
            for r in by_host.get(c["host"], ()):
                mine = r["pid"] == c["pid"] if c["pid"] is not None else bool(gpus & set(r["gpus"]))
                if mine and r["start"] - self.config.run_gap_s <= start and end <= r["end"] + self.config.run_gap_s:
                    ops = json.loads(c["top_ops"]) if isinstance(c["top_ops"], str) else (c["top_ops"] or [])
                    before = len(r["captures"])
                    pg.add_capture(r, c["id"], program, [o.get("op") or o.get("kernel") for o in ops
                                                         if isinstance(o, dict) and (o.get("op") or o.get("kernel"))])
                    if len(r["captures"]) != before:
                        touched[(r["host"], r["pid"], r["command"])] = r
                    break

    def judge(self, touched: list[dict], degraded: dict[tuple[str, int], list[dict]]) -> list[dict]:
        """Conditions (fleet_findings.py) of the runs that depart from their
        baselines, one per GPU each holds; `degraded`: open degraded
        findings by (host, gpu)."""
        judged = [r for r in touched if r["sampled_s"] >= self.config.min_run_s and (r["hlo_fp"] or r["command_fp"])]
        known = self._runs_of({f for r in judged for f in (r["hlo_fp"], r["command_fp"]) if f}, touched)
        found = []
        bases: dict[tuple, dict] = {}         # the ranks of a job share their earlier runs: one baseline
        for run in judged:
            same, earlier = self.earlier_runs(run, known)
            key = (same, tuple(r["id"] for r in earlier))
            base = bases.get(key) or bases.setdefault(key, pg.baseline(earlier, self.config))
            weak = [f for g in run["gpus"] for f in degraded.get((run["host"], g), ())]
            verdict = pg.judge(run, earlier, self.config, weak, same, base)
            if verdict is not None:
                found.extend(pg.condition(run, g, verdict) for g in run["gpus"])
        return found

    def _runs_of(self, fingerprints: set[str], touched: list[dict]) -> dict[str, list[dict]]:
        """fingerprint -> its runs: the store's newest, as this check left
        them where it touched them."""
        mine = {r["id"]: r for r in touched}
        out: dict[str, dict[str, dict]] = {f: {} for f in fingerprints}
        parsed: dict[str, dict] = {}
        for row in self.store.runs_of_programs(sorted(fingerprints), self.config.baseline_runs * 4):
            run = mine.get(row["id"]) or parsed.get(row["id"]) or parsed.setdefault(row["id"], pg.run_from_row(row))
            out[row["fingerprint"]][run["id"]] = run
        for r in touched:
            for f in (r["hlo_fp"], r["command_fp"]):
                if f in out:
                    out[f][r["id"]] = r
        return {f: list(runs.values()) for f, runs in out.items()}

    def earlier_runs(self, run: dict, known: dict[str, list[dict]]) -> tuple[str, list[dict]]:
        """The runs a run's baseline is made of (newest first), and what makes
        them its program's: its HLO's when enough earlier runs were captured
        with it, else its command line's (leaving out runs captured with
        another HLO), none of them a rank of its own launch (programs.siblings).
        `known`: fingerprint -> runs (_runs_of)."""
        def earlier(fp: str | None) -> list[dict]:
            return sorted((r for r in known.get(fp, ()) if r["start"] < run["start"] and r["id"] != run["id"]
                           and r["sampled_s"] >= self.config.min_run_s and not pg.siblings(run, r, self.config)),
                          key=lambda r: -r["start"])
        if run["hlo_fp"]:
            same = earlier(run["hlo_fp"])
            if len(same) >= self.config.min_runs:
                return "HLO", same[:self.config.baseline_runs]
        same = [r for r in earlier(run["command_fp"]) if run["hlo_fp"] is None or r["hlo_fp"] in (None, run["hlo_fp"])]
        return "command line", same[:self.config.baseline_runs]

    def apply(self, touched: list[dict], cursor: float | None) -> None:
        """On the writer thread: the runs and the cursor, in one transaction."""
        if cursor is None:
            return
        self.store.begin()
        try:
            self.store.upsert_program_runs([pg.run_row(r) for r in touched])
            self.store.set_meta(CURSOR, cursor)
            self.store.commit()
        except Exception:
            self.store.rollback()
            raise
