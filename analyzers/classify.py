"""Classification of one window: every rule scores it, the best fit wins.

Confidence is the winner's score discounted by how close the runner-up came,
so a window between two verdicts says so.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .features import Window
from .rules import RULES, flags


@dataclass
class Classification:
    gpu: int
    start: float
    end: float
    verdict: str
    confidence: float
    summary: str
    evidence: dict[str, float]
    flags: list[str] = field(default_factory=list)
    alternatives: tuple[str, ...] = ()
    runner_up: str | None = None


def classify(w: Window) -> Classification:
    results = [r for r in (rule.evaluate(w) for rule in RULES) if r is not None]
    results.sort(key=lambda r: r.score, reverse=True)   # stable: ties keep rule order
    best = results[0]
    second = results[1] if len(results) > 1 else None
    runner = second.score if second else 0.0
    confidence = best.score * (1.0 - 0.5 * runner / best.score) if best.score > 0 else 0.0
    evidence = {k: round(v, 6) for k, v in w.features.items()}
    evidence["samples"] = float(w.samples)
    return Classification(
        gpu=w.gpu, start=w.start, end=w.end, verdict=best.verdict,
        confidence=round(min(max(confidence, 0.0), 1.0), 3), summary=best.summary,
        evidence=evidence, flags=flags.evaluate(w), alternatives=best.alternatives,
        runner_up=second.verdict if second and second.score > 0 else None)
