"""Whether task points are inside a machine's workspace, for millions of points a second: the
closed-form inverse kinematics of ``legik`` (positions only, no rates) compiled, each point's
actuator values against the ranges given and, with a reduced-dynamics tree, inside the tree's
domain (its root box and a leaf in the domain, as the loop's reference check wants it).

Units: task points m (world frame, the tool point's x, y, z; the machines whose tool only
translates), actuator values m or rad. A machine whose legs ``legik`` does not recognise is
checked point by point by Newton on the model's constraints (``TaskKinematics``, slow).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from pkrt.rt.core.errors import UserError
from pkrt.rt.core.tree import find_leaf

from .legik import LegKinematics, leg_kinematics
from .taskspace import TaskKinematics

INSIDE, NO_POSE, OUT_OF_RANGE, OUT_OF_DOMAIN = 0, 1, 2, 3


@njit(cache=True, _nrt=False, nogil=True)
def _solve(P, kind, A, v, a0, c, L, branch, G, b, l0, theta_ref, va, a_perp, vxa, a2, theta):
    """Actuator values of task points P (n, 3) into theta (n, s); NaN where a leg cannot reach
    (the same formulas as ``LegKinematics._arm`` and ``_leg``)."""
    n, s = P.shape[0], kind.shape[0]
    for k in range(n):
        for i in range(s):
            if kind[i] == 2:
                d0, d1, d2 = P[k, 0] + b[i, 0] - G[i, 0], P[k, 1] + b[i, 1] - G[i, 1], P[k, 2] + b[i, 2] - G[i, 2]
                theta[k, i] = math.sqrt(d0 * d0 + d1 * d1 + d2 * d2) - l0[i] + theta_ref[i]
                continue
            d0, d1, d2 = P[k, 0] + c[i, 0] - A[i, 0], P[k, 1] + c[i, 1] - A[i, 1], P[k, 2] + c[i, 2] - A[i, 2]
            dd = d0 * d0 + d1 * d1 + d2 * d2
            dv = d0 * v[i, 0] + d1 * v[i, 1] + d2 * v[i, 2]
            if kind[i] == 0:
                K = d0 * a_perp[i, 0] + d1 * a_perp[i, 1] + d2 * a_perp[i, 2]
                M = d0 * vxa[i, 0] + d1 * vxa[i, 1] + d2 * vxa[i, 2]
                N = 0.5 * (dd + a2[i] - L[i] * L[i]) - va[i] * dv
                q = N / math.hypot(K, M)
                if not -1.0 <= q <= 1.0:
                    theta[k, i] = math.nan
                    continue
                phi = math.atan2(M, K) + branch[i] * math.acos(q)
                theta[k, i] = (phi + math.pi) % (2 * math.pi) - math.pi + theta_ref[i]
            else:
                disc = dv * dv - dd + L[i] * L[i]
                theta[k, i] = dv + branch[i] * math.sqrt(disc) + theta_ref[i] if disc >= 0.0 else math.nan


@njit(cache=True, _nrt=False, nogil=True)
def _first_bad(theta, lo, hi):
    """(row, code, actuator) of the first row not finite or outside [lo, hi]; (-1, 0, -1)."""
    for k in range(theta.shape[0]):
        for i in range(theta.shape[1]):
            x = theta[k, i]
            if not math.isfinite(x):
                return k, NO_POSE, i
            if x < lo[i] - 1e-12 or x > hi[i] + 1e-12:
                return k, OUT_OF_RANGE, i
    return -1, INSIDE, -1


@njit(cache=True)
def _first_out_of_domain(T, theta, th):
    """The first row of theta outside the tree's root box or in a leaf out of its domain; -1."""
    for k in range(theta.shape[0]):
        leaf, status = find_leaf(T, theta[k], th)
        if status != 0:
            return k
    return -1


class Reach:
    """The workspace of one machine's tool point: ``first_outside(P)`` tells the first of task
    points P (n, 3) that the tool cannot reach with the actuators in ``ranges`` (s, 2) (default
    the model's) and, given ``tree_arrays`` (a tree's ``arrays``), inside the tree's domain;
    ``legs``: the machine's ``leg_kinematics`` if found already."""

    def __init__(self, kin: TaskKinematics, ranges: np.ndarray | None = None, tree_arrays=None, legs=None):
        self.kin, self.mech = kin, kin.mech
        if tuple(kin.tool.coordinates) != ("x", "y", "z"):
            raise UserError(f"{self.mech.name}: the workspace check needs a tool in x, y, z (its tool has "
                            f"{', '.join(kin.tool.coordinates)})")
        self.ranges = np.array(self.mech.ranges if ranges is None else ranges, float)
        self.tree = tree_arrays
        self.legs: LegKinematics | None = legs if legs is not None else leg_kinematics(kin)
        if self.legs is not None:
            g = self.legs
            va = np.einsum("ij,ij->i", g.v, g.a0)
            self._args = (g.kind.astype(np.int64), g.A, g.v, g.a0, g.c, g.L, g.branch, g.G, g.b, g.l0, g.theta_ref,
                          va, g.a0 - va[:, None] * g.v, np.cross(g.v, g.a0), np.einsum("ij,ij->i", g.a0, g.a0))

    def actuators(self, P: np.ndarray) -> np.ndarray:
        """Actuator values (n, s) at task points P (n, 3); NaN rows where the tool cannot be."""
        P = np.ascontiguousarray(P, float)
        theta = np.empty((len(P), self.mech.n_act))
        if self.legs is not None:
            _solve(P, *self._args, theta)
            return theta
        kin = self.kin
        for k, x in enumerate(P):  # no closed form: Newton from the last solution
            cfg, th, res = kin.solve_pose(x)
            theta[k] = th if res < kin.tol else np.nan
            if res < kin.tol:
                kin.cfg, kin.theta = cfg, th
        return theta

    def first_outside(self, P: np.ndarray) -> tuple[int, int, int, np.ndarray]:
        """(index, code, actuator, theta row) of the first point of P the machine cannot take
        (``NO_POSE``, ``OUT_OF_RANGE`` of that actuator, ``OUT_OF_DOMAIN``); (-1, INSIDE, -1,
        None) when every point is inside."""
        theta = self.actuators(P)
        k, code, i = _first_bad(theta, self.ranges[:, 0].copy(), self.ranges[:, 1].copy())
        if self.tree is not None:
            d = _first_out_of_domain(self.tree, theta[:k] if k >= 0 else theta, np.empty(theta.shape[1]))
            if d >= 0:
                return d, OUT_OF_DOMAIN, -1, theta[d]
        return (k, code, i, theta[k]) if k >= 0 else (-1, INSIDE, -1, None)

    def why(self, code: int, actuator: int, theta: np.ndarray, point: np.ndarray) -> str:
        """The one-line reason for ``first_outside``'s answer."""
        at = f"the tool at {np.round(point * 1e3, 4).tolist()} mm"
        if code == NO_POSE:
            return f"{at} is outside {self.mech.name}'s workspace (no pose of its legs reaches it)"
        if code == OUT_OF_RANGE:
            lo, hi = self.ranges[actuator]
            return (f"actuator {self.mech.actuator_names[actuator]} would be at {theta[actuator]:.6g} "
                    f"{self.mech.actuator_units[actuator]}, outside its range [{lo:g}, {hi:g}] ({at})")
        return (f"{at} puts the actuators at {np.round(theta, 6).tolist()}, outside the model's domain "
                f"(the controller's tree)")
