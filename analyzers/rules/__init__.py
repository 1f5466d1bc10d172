"""One module per verdict, each with VERDICT, ALTERNATIVES, `score(features)`
(arrays over many windows), `describe(window)` (the winner's words) and TRY
(what to try, shown by `gpuscope report` and listed in docs/verdicts.md).

Order matters only for exact ties: the first listed wins.
"""
from . import communication_bound, compute_bound, flags, host_bound, idle, launch_bound, memory_bound

RULES = (compute_bound, memory_bound, communication_bound, launch_bound, host_bound, idle)


def what_to_try(verdict: str, flag_names=()) -> list[str]:
    """Short advice for a verdict and its flags (each rule's TRY), the
    verdict's first."""
    by_verdict = {r.VERDICT: r.TRY for r in RULES}
    out = list(by_verdict.get(verdict, ()))
    for name in flag_names:
        out += flags.TRY.get(name.replace("_", "-"), ())
    return out
