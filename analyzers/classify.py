"""Classification of windows: every rule scores them, the best fit wins.

Confidence is the winner's score discounted by how close the runner-up came,
so a window between two verdicts says so. Rules score all windows of a call
at once (arrays over windows); only each winner's words are per window.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .features import FEATURE_INDEX, FEATURES, Window
from .rules import RULES, flags, transitional
from .rules.common import activity, starved
from .serving import serving_words


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
    activity: float | None = None       # the detector's signals (rules.common), NaN-free
    starved: float | None = None


class FeatureSet:
    """Windows' features as arrays over the windows (NaN = unknown): what
    rules score."""

    def __init__(self, matrix: np.ndarray):
        self.matrix = matrix

    @classmethod
    def of(cls, windows: Sequence[Window]) -> "FeatureSet":
        m = np.full((len(windows), len(FEATURES)), np.nan)
        for k, w in enumerate(windows):
            for name, v in w.features.items():
                i = FEATURE_INDEX.get(name)
                if i is not None:
                    m[k, i] = v
        return cls(m)

    @classmethod
    def from_evidence(cls, evidence: dict[str, float]) -> "FeatureSet":
        return cls.of([Window(0, 0.0, 0.0, 0, evidence)])

    def get(self, name: str) -> np.ndarray:
        return self.matrix[:, FEATURE_INDEX[name]]


def classify(w: Window) -> Classification:
    return classify_many([w])[0]


def classify_many(windows: Sequence[Window], matrix: np.ndarray | None = None) -> list[Classification]:
    """Classifies windows together; `matrix` (windows x FEATURES, NaN =
    unknown) when the caller has it, else built from the windows."""
    if not windows:
        return []
    f = FeatureSet(matrix) if matrix is not None else FeatureSet.of(windows)
    scores = np.column_stack([rule.score(f) for rule in RULES])
    ranked = np.argsort(-np.nan_to_num(scores, nan=-np.inf), axis=1, kind="stable")  # ties keep rule order
    rows = np.arange(len(windows))
    best_i, second_i = ranked[:, 0], ranked[:, 1]
    best, second = scores[rows, best_i], scores[rows, second_i]
    runner = np.nan_to_num(second, nan=0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        confidence = np.where(best > 0, best * (1.0 - 0.5 * runner / best), 0.0)
    mixed = transitional.evaluate(f)
    confidence = np.where(mixed, np.minimum(confidence, transitional.CONFIDENCE), confidence)
    confidence = [round(c, 3) for c in np.clip(confidence, 0.0, 1.0).tolist()]   # Python's: correctly rounded
    mixed = mixed.tolist()
    has_runner = (np.nan_to_num(second, nan=0.0) > 0).tolist()
    flagged = [(name, on.tolist()) for name, on in flags.evaluate(f)] + [(transitional.TRANSITIONAL, mixed)]
    act = activity(f).tolist()
    starv = starved(f).tolist()
    out = []
    for k, w in enumerate(windows):
        rule, runner_rule = RULES[best_i[k]], RULES[second_i[k]]
        evidence = dict(w.rounded())
        evidence["samples"] = float(w.samples)
        out.append(Classification(
            gpu=w.gpu, start=w.start, end=w.end, verdict=rule.VERDICT, confidence=confidence[k],
            summary=rule.describe(w) + (_shift_words(w) if mixed[k] else "") + serving_words(w.get),
            evidence=evidence, flags=[name for name, on in flagged if on[k]],
            alternatives=rule.ALTERNATIVES, runner_up=runner_rule.VERDICT if has_runner[k] else None,
            activity=None if act[k] != act[k] else act[k], starved=starv[k]))
    return out


def _shift_words(w: Window) -> str:
    return (f"; transitional: GPU activity moved {100 * (w.get('activity_shift_ratio') or 0):.0f} points "
            "inside the window, which straddles a change of regime")
