"""One module per verdict, each with VERDICT, ALTERNATIVES, `score(features)`
(arrays over many windows) and `describe(window)` (the winner's words).

Order matters only for exact ties: the first listed wins.
"""
from . import communication_bound, compute_bound, host_bound, idle, launch_bound, memory_bound

RULES = (compute_bound, memory_bound, communication_bound, launch_bound, host_bound, idle)
