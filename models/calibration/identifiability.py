"""The identifiable (base) parameters of a calibration: which geometric parameters, with the
instrument's pose, the tool's measurements can tell apart, and for every other one why not.

The identification Jacobian, stacked over many poses spread over the workspace, has its columns
scaled to unit norm (metres, radians and scales made comparable, as ranks must be judged on
scaled columns). Pivoted QR (column pivoting, scipy) runs class by class in a fixed order of
preference, each class on what the classes before it leave unexplained: the instrument's pose
(always estimated), actuator offsets, actuator scales, the tool, joint points, joint frames. A
column whose part not explained by the kept ones is below ``tol`` of its norm is dependent: the
report names the kept parameters it acts like (a joint's point along its own sliding axis acts
as the actuator's offset; a shift of the whole machine is absorbed by the instrument's frame).
A column of (numerically) zero norm does not move the tool at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg

TOL = 1e-6  # a column is dependent when less than this fraction of its norm is new
ZERO = 1e-12  # relative to the largest column: the parameter does not move the tool


@dataclass(frozen=True)
class BaseSet:
    """``base``: indices of the identifiable parameters (in the order chosen); ``dependent``:
    (index, reason) of the others; ``K`` (n_base, n_all): the change of the base parameters
    that acts like a change of all parameters (identity on the base columns)."""
    names: list[str]
    base: np.ndarray
    dependent: list[tuple[int, str]]
    K: np.ndarray
    new_fraction: np.ndarray  # per base parameter: the fraction of its column that was new

    @property
    def n_base(self) -> int:
        return len(self.base)

    def project(self, change: np.ndarray) -> np.ndarray:
        """The base parameters' change that acts (to first order) like ``change`` of all."""
        return self.K @ change


def base_set(J: np.ndarray, names: list[str], classes: list[np.ndarray], tol: float = TOL,
             instrument: set[int] | None = None) -> BaseSet:
    """The base set of a stacked Jacobian ``J`` (rows, n_all) whose parameters are split into
    ``classes`` (index arrays, in order of preference); ``instrument``: the indices of the
    instrument's pose (for the reasons)."""
    norms = np.linalg.norm(J, axis=0)
    zero = norms <= ZERO * max(norms.max(), 1e-300)
    S = J / np.where(zero, 1.0, norms)
    kept: list[int] = []
    fractions: list[float] = []
    Q = np.zeros((J.shape[0], 0))
    for cls in classes:
        cols = [int(c) for c in cls if not zero[c]]
        if not cols:
            continue
        A = S[:, cols] - Q @ (Q.T @ S[:, cols])
        A -= Q @ (Q.T @ A)  # again: orthogonal to the kept directions to rounding
        q, r, piv = scipy.linalg.qr(A, mode="economic", pivoting=True)
        d = np.abs(np.diag(r))
        rank = int(np.sum(d > tol))
        kept += [cols[p] for p in piv[:rank]]
        fractions += d[:rank].tolist()
        Q = np.hstack([Q, q[:, :rank]])
    base = np.array(kept, dtype=int)
    # every column as a combination of the kept ones (scaled, then in the parameters' units)
    coef = np.linalg.lstsq(S[:, base], S, rcond=None)[0]  # (n_base, n_all)
    K = coef * np.where(zero, 0.0, norms)[None, :] / norms[base][:, None]
    K[:, base] = np.eye(len(base))
    inst = instrument or set()
    dependent = []
    for j in range(J.shape[1]):
        if j in set(kept):
            continue
        dependent.append((j, "does not move the tool" if zero[j] else _reason(coef[:, j], base, names, inst)))
    return BaseSet(list(names), base, dependent, K, np.array(fractions))


def _reason(c: np.ndarray, base: np.ndarray, names: list[str], instrument: set[int]) -> str:
    """Why a dependent column is: the kept parameters it acts like (largest weights first)."""
    order = np.argsort(-np.abs(c))
    big = [i for i in order if abs(c[i]) >= 0.05 * abs(c[order[0]])]
    terms = ", ".join(f"{names[base[i]]} ({c[i]:+.3g})" for i in big[:4]) + (", ..." if len(big) > 4 else "")
    if all(base[i] in instrument for i in big):
        return f"a motion of the whole machine: the instrument's frame absorbs it ({terms})"
    return f"acts on the tool as a combination of {terms}"
