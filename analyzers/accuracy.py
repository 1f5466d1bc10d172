"""Stated accuracy: how often the counters' verdict of a GPU agrees with the
verdict of a trace of it taken at the time.

Counters judge every window of every GPU; a trace (kernels, gaps, the host's
activity) judges the same GPU with far more evidence, a few times a day.
Every capture that lands with a trace verdict for a GPU the counters had
judged is one pair (store: verdict_pairs). Over a fleet the pairs say what
each counters verdict is worth: its precision (of the windows the counters
called X, the share the trace also called X), per verdict and per GPU
model. Launch- and host-bound are one family to the counters (each names
the other as its alternative), so agreement within the family is counted
apart, never as agreement.
"""
from __future__ import annotations

from .detector import family

MIN_PAIRS = 10       # below this a precision is shown with its count only, never alone


def summarize(rows: list[dict]) -> dict:
    """rows: (model, counters_verdict, trace_verdict, pairs) as Store.verdict_pairs
    returns them. The agreement matrix, overall and per counters verdict and
    per GPU model: pairs, agreed, same family (launch/host), precision."""
    matrix: dict[str, dict[str, int]] = {}
    per_verdict: dict[str, dict] = {}
    per_model: dict[str, dict] = {}
    total = {"pairs": 0, "agreed": 0, "same_family": 0}
    for r in rows:
        said, found, n = r["counters_verdict"], r["trace_verdict"], int(r["pairs"])
        matrix.setdefault(said, {})
        matrix[said][found] = matrix[said].get(found, 0) + n
        for bucket in (total, per_verdict.setdefault(said, {"pairs": 0, "agreed": 0, "same_family": 0}),
                       per_model.setdefault(r["model"] or "unknown", {"pairs": 0, "agreed": 0, "same_family": 0})):
            bucket["pairs"] += n
            bucket["agreed"] += n if said == found else 0
            bucket["same_family"] += n if said != found and family(said) == family(found) else 0
    for bucket in (total, *per_verdict.values(), *per_model.values()):
        bucket["precision"] = round(bucket["agreed"] / bucket["pairs"], 3) if bucket["pairs"] else None
        bucket["enough"] = bucket["pairs"] >= MIN_PAIRS
    return dict(overall=total, per_verdict=per_verdict, per_model=per_model, matrix=matrix, min_pairs=MIN_PAIRS)


def measured(rows: list[dict]) -> dict[str, dict]:
    """Each counters verdict's measured precision, where enough pairs exist:
    verdict -> {precision, pairs}."""
    return {v: dict(precision=b["precision"], pairs=b["pairs"])
            for v, b in summarize(rows)["per_verdict"].items() if b["enough"]}


def trust_words(verdict: str, known: dict[str, dict]) -> str:
    """' (counters' memory-bound measured right 92 % of 37 traces)', or ''."""
    p = known.get(verdict)
    return (f" (counters' {verdict} measured right {100 * p['precision']:.0f} % of {p['pairs']} traces)"
            if p else "")
