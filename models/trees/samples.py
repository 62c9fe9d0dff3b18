"""Exact-model samples of a build, keyed by exact rational unit coordinates of the root box
(neighbouring boxes and grid cells share them; each is computed once)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from ..kinematics.mechanism import Mechanism
from ..reduction.exact import output_layout
from .outputs import output_scale
from .sampling import SampleEvaluator

Point = tuple[Fraction, ...]


def to_theta(x: Fraction, lo: float, hi: float) -> float:
    """Unit coordinate -> actuator value (exact at the ends)."""
    if x == 0:
        return lo
    if x == 1:
        return hi
    return lo + (hi - lo) * float(x)


class Samples:
    """Exact-model samples keyed by exact unit coordinates, computed once each."""

    def __init__(self, mech: Mechanism, ev: SampleEvaluator, lo: np.ndarray, hi: np.ndarray):
        self.mech = mech
        self.ev = ev
        self.lo, self.hi = lo.copy(), hi.copy()  # the tree's root box
        self.f: dict[Point, np.ndarray] = {}
        self.sing: dict[Point, float] = {}

    def theta(self, p: Point) -> np.ndarray:
        return np.array([to_theta(x, self.lo[d], self.hi[d]) for d, x in enumerate(p)])

    def ensure(self, pts) -> None:
        new = sorted(set(p for p in pts if p not in self.f))  # lexicographic: coherent walks
        if not new:
            return
        F, sing = self.ev.evaluate(np.array([self.theta(p) for p in new]))
        for p, f, g in zip(new, F, sing):
            self.f[p], self.sing[p] = f, float(g)

    def scale(self, threshold: float) -> np.ndarray:
        """Output scales over the in-domain samples (``outputs.output_scale``)."""
        n_out = len(output_layout(self.mech.n_act))
        F = np.array([f for p, f in self.f.items() if self.sing[p] >= threshold]).reshape(-1, n_out)
        return output_scale(F, self.mech.n_act)
