"""Base parameters: the identifiable combinations of the standard parameters.

Y (stacked over many random states) has rank r below its p columns: some standard parameters
have no effect on the actuator forces (their columns are zero: e.g. a translating body's first
moments and inertia), others act only in fixed linear combinations. QR with column pivoting on
the column-scaled stack picks r independent columns (the base columns, Y_1) and writes the
others as Y_2 = Y_1 beta. Then Y pi = Y_1 pi_base with pi_base = pi_1 + beta pi_2: each base
parameter is its standard parameter plus the listed multiples of the dependent ones.

A geometry slightly off an ideal one (a calibrated description: its Orthoglide platform turns
by a milliradian, a Delta's rods are not quite parallel) turns exact dependencies into near ones:
the base set would grow by combinations that no motion of the machine can tell apart from the
others. The rank tolerance (``RANK_RTOL``) leaves out columns nearly in the span of others; the
base columns' directions still below ``WEAK_RTOL`` (singular values of the scaled columns relative
to the largest: the shipped machines' smallest is 2e-4, a calibrated geometry's fall to 1e-5..1e-8)
are ``weak``, kept at the model's values by the fit (``estimate.fit``'s ``fixed``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg

from ..kinematics.mechanism import AssemblyError, Mechanism
from .regressor import Regressor

# relative to the largest diagonal of R (scaled columns): the shipped machines' are above 3e-3 or
# below 1e-14; a calibrated geometry's near dependencies fall in between (1e-4 kept them out of a
# hexapod's base set, whose regrouping coefficients were 2e5 with 1e-8)
RANK_RTOL = 1e-4
COEF_ATOL = 1e-9  # regrouping coefficients below this (relative) are printed as zero
WEAK_RTOL = 5e-5  # a direction of the scaled base columns below this singular value (relative) is weak
GREEDY_TOL = RANK_RTOL  # a unit column joins the base when this much of it is outside the span


@dataclass(frozen=True)
class BaseParameters:
    """The base set of a mechanism's regressor.

    ``base`` (r,): indices of the base columns in the standard order; ``beta`` (r, p): the
    map pi_base = beta pi (identity on the base columns); ``zero``: indices of columns with
    no effect; ``rank`` the numerical rank of the scaled stack and ``diag`` its |R_ii|;
    ``weak`` (k, r): rows c with c pi_base the weak combinations (unit vectors in the base
    parameters scaled by their columns' norms), none for the shipped machines."""
    names: tuple[str, ...]
    base: np.ndarray
    beta: np.ndarray
    zero: np.ndarray
    rank: int
    diag: np.ndarray
    states: int
    weak: np.ndarray | None = None

    @property
    def n_base(self) -> int:
        return len(self.base)

    def project(self, pi: np.ndarray) -> np.ndarray:
        """pi_base of standard parameters pi."""
        return self.beta @ pi

    def combination(self, i: int) -> list[tuple[float, str]]:
        """(coefficient, standard name) terms of base parameter i (its own column first)."""
        row = self.beta[i]
        big = max(1.0, np.abs(row).max())
        j0 = int(self.base[i])
        terms = [(1.0, self.names[j0])]
        terms += [(float(row[j]), self.names[j]) for j in np.flatnonzero(np.abs(row) > COEF_ATOL * big)
                  if j != j0]
        return terms

    def label(self, i: int) -> str:
        """``leg1.m + 0.25 platform.m - ...``"""
        out = ""
        for k, (c, n) in enumerate(self.combination(i)):
            if k == 0:
                out = n
            else:
                out += f" {'+' if c >= 0 else '-'} {abs(c):.6g} {n}"
        return out

    def regrouping(self) -> list[str]:
        """One line per base parameter, then the parameters that have no effect."""
        lines = [f"{i + 1:3d}  {self.label(i)}" for i in range(self.n_base)]
        if len(self.zero):
            lines.append("no effect on the actuator forces (not identifiable): "
                         + ", ".join(self.names[j] for j in self.zero))
        return lines


def random_states(mech: Mechanism, n: int, seed: int = 0, margin: float = 0.15,
                  max_tries: int | None = None):
    """n random (theta, theta_dot, theta_ddot) inside the ranges shrunk by ``margin`` of their
    width at each end, that assemble and are not singular (states that fail are drawn again)."""
    from ..reduction.exact import ExactModel

    rng = np.random.default_rng(seed)
    lo, hi = mech.ranges[:, 0], mech.ranges[:, 1]
    w = hi - lo
    exact = ExactModel(mech)
    th, tries = [], 0
    max_tries = max_tries or 20 * n
    while len(th) < n and tries < max_tries:
        tries += 1
        t = lo + w * (margin + (1 - 2 * margin) * rng.random(mech.n_act))
        try:
            cfg = exact.assembler.solve(t)
        except AssemblyError:
            exact.assembler.reset()
            continue
        if mech.singularity_measure(cfg, t) < mech.description.singular_threshold:
            continue
        th.append(t)
    if len(th) < n:
        raise AssemblyError(f"{mech.name}: only {len(th)} of {n} random states assemble")
    th = np.array(th)
    scale = w[None, :]
    return th, rng.normal(size=th.shape) * scale, 10 * rng.normal(size=th.shape) * scale


def base_parameters(mech: Mechanism, states: int | None = None, seed: int = 0,
                    reg: Regressor | None = None) -> BaseParameters:
    """QR with column pivoting of Y stacked at random states, columns scaled to unit norm."""
    reg = reg or Regressor(mech)
    p = reg.n_params
    states = states or max(40, 3 * p // mech.n_act)
    Y = reg.stack(*random_states(mech, states, seed)).reshape(-1, p)
    return base_of_stack(Y, reg.names, states)


def _priority(names) -> list[int]:
    """Column order for choosing base columns: masses, friction, first moments, inertias (so a
    base parameter is named after the most physical of the parameters it regroups)."""
    rank = {"m": 0, "viscous": 1, "coulomb": 1, "offset": 1, "mx": 2, "my": 2, "mz": 2,
            "Ixx": 3, "Iyy": 3, "Izz": 3}
    return sorted(range(len(names)), key=lambda j: (rank.get(names[j].rsplit(".", 1)[-1], 4), j))


def base_of_stack(Y: np.ndarray, names, states: int) -> BaseParameters:
    """The base set of a stacked regressor (rows: samples, columns: standard parameters).

    The numerical rank r comes from QR with column pivoting of the column-scaled stack; the r
    base columns are then taken greedily in ``_priority`` order (a column joins when its part
    outside the span of those already taken exceeds the rank tolerance), and the others are
    written in terms of them by least squares."""
    p = Y.shape[1]
    norms = np.linalg.norm(Y, axis=0)
    big = norms.max()
    zero = np.flatnonzero(norms <= 1e-12 * big)
    live = norms > 1e-12 * big
    Ys = Y / np.where(live, norms, 1.0)
    Ys[:, ~live] = 0.0
    _, R, _ = scipy.linalg.qr(Ys[:, live], mode="economic", pivoting=True)
    d = np.abs(np.diag(R))
    rank = int(np.sum(d > RANK_RTOL * d[0]))
    Q = np.zeros((Y.shape[0], 0))
    chosen = []
    for j in _priority(names):
        if not live[j] or len(chosen) == rank:
            continue
        r = Ys[:, j] - Q @ (Q.T @ Ys[:, j])
        r = r - Q @ (Q.T @ r)  # twice is enough (Kahan)
        nr = np.linalg.norm(r)
        if nr > GREEDY_TOL:
            Q = np.c_[Q, r / nr]
            chosen.append(j)
    b1 = np.array(sorted(chosen), dtype=int)
    if len(b1) != rank:
        raise ValueError(f"greedy base selection found {len(b1)} columns for rank {rank}")
    b2 = np.setdiff1d(np.flatnonzero(live), b1)
    beta = np.zeros((rank, p))
    beta[np.arange(rank), b1] = 1.0
    if len(b2):
        bs = np.linalg.lstsq(Ys[:, b1], Ys[:, b2], rcond=None)[0]  # scaled: Ys_2 = Ys_1 bs
        beta[:, b2] = bs * norms[b2][None, :] / norms[b1][:, None]  # unscaled: Y_2 = Y_1 beta_2
    _, sv, Vt = np.linalg.svd(Ys[:, b1], full_matrices=False)
    weak = Vt[sv < WEAK_RTOL * sv[0]] * norms[b1][None, :]
    return BaseParameters(tuple(names), b1, beta, zero, rank, d, states, weak)


__all__ = ["BaseParameters", "base_of_stack", "base_parameters", "random_states"]
