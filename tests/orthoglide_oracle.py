"""The Orthoglide's closed forms (shared/reference-models.md), kept as test oracles: the
inverse and forward kinematics and the demo as it was planned before the demo became the
configuration's ``[demo]`` table planned from the model (``pkrt.models.kinematics.taskspace.plan_demo``)."""

from __future__ import annotations

import numpy as np

from pkrt.rt.core.errors import UserError
from pkrt.rt.core.plan import Planned, cartesian_path, circle_basis, concatenate, plan_moves


def orthoglide_ik(P: np.ndarray, Pd: np.ndarray, Pdd: np.ndarray, L: float):
    """theta_i = P_i + sqrt(L^2 - sum_{j != i} P_j^2) - L, with exact first and second
    derivatives. P, Pd, Pdd: (n, 3) platform position (m), velocity, acceleration."""
    th = np.empty_like(P)
    thd = np.empty_like(P)
    thdd = np.empty_like(P)
    for i in range(3):
        o = [j for j in range(3) if j != i]
        S2 = L * L - np.sum(P[:, o] ** 2, axis=1)
        if np.any(S2 <= 0):
            raise UserError("Cartesian path leaves the Orthoglide's reachable space")
        S = np.sqrt(S2)
        g = np.sum(P[:, o] * Pd[:, o], axis=1)
        gd = np.sum(Pd[:, o] ** 2 + P[:, o] * Pdd[:, o], axis=1)
        th[:, i] = P[:, i] + S - L
        thd[:, i] = Pd[:, i] - g / S
        thdd[:, i] = Pdd[:, i] - gd / S - g * g / S**3
    return th, thd, thdd


def orthoglide_fk(theta: np.ndarray, L: float, iters: int = 30) -> np.ndarray:
    """Platform position P (m) for actuator positions theta (3,), working branch (Newton on
    the closed-form inverse kinematics from P = 0)."""
    P = np.zeros(3)
    for _ in range(iters):
        z = np.zeros((1, 3))
        th, _, _ = orthoglide_ik(P[None], z, z, L)
        r = th[0] - theta
        if np.max(np.abs(r)) < 1e-14:
            break
        J = np.eye(3)
        for i in range(3):
            S = np.sqrt(L * L - sum(P[j] ** 2 for j in range(3) if j != i))
            for j in range(3):
                if j != i:
                    J[i, j] = -P[j] / S
        P = P - np.linalg.solve(J, r)
    return P


def orthoglide_demo(rate_hz: float, L: float = 0.31, home=(-0.1, -0.1, -0.1),
                    corner_lo: float = -0.22, corner_hi: float = 0.02,
                    diameter: float = 0.1, speed: float = 0.5) -> Planned:
    """The Orthoglide demo: quintic moves between workspace corners, then a Cartesian circle
    (``diameter`` m, ``speed`` m/s peak) around the home point, and back home."""
    home = np.asarray(home, float)
    corners = np.array([home, [corner_lo] * 3, [corner_hi, corner_lo, corner_lo],
                        [corner_hi, corner_hi, corner_lo], [corner_lo, corner_hi, corner_hi],
                        [corner_hi] * 3, home])
    moves = plan_moves(corners, [0.5] * (len(corners) - 1), rate_hz, dwell=0.1)
    Ph = orthoglide_fk(home, L)
    start = Ph + diameter / 2 * circle_basis((1, 1, 1))[0]
    P1, Pd1, Pdd1 = cartesian_path("line", rate_hz, start=Ph, end=start, duration=0.3)
    P2, Pd2, Pdd2 = cartesian_path("circle", rate_hz, centre=Ph, diameter=diameter, normal=(1, 1, 1),
                                   speed=speed, ramp=0.25, laps=1.5)
    P3, Pd3, Pdd3 = cartesian_path("line", rate_hz, start=P2[-1], end=Ph, duration=0.3)
    pieces = [moves]
    for P, Pd, Pdd in ((P1, Pd1, Pdd1), (P2, Pd2, Pdd2), (P3, Pd3, Pdd3)):
        th, thd, thdd = orthoglide_ik(P, Pd, Pdd, L)
        pieces.append(Planned(rate_hz, th, thd, thdd))
    return concatenate(pieces, {"kind": "orthoglide-demo", "circle_diameter_m": diameter,
                                "circle_peak_speed_m_s": speed, "corners": corners.tolist()})


