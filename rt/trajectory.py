"""Reference trajectories, planned once before the loop starts.

Every trajectory is sampled at the loop rate into arrays ``pos``, ``vel``, ``acc`` of shape
(n, s) (actuator units: m or rad and their derivatives), so a cycle only indexes them.
Kinds: joint-space quintic point-to-point moves, Cartesian lines and circles for the
Orthoglide (closed-form inverse kinematics), and CSV files resampled to the loop rate. The
``Planned`` type and the path maths shared with the offline planners live in ``plan`` (core).
"""

from __future__ import annotations

import numpy as np

from .errors import UserError
from .plan import Planned, circle_basis, concatenate, quintic_profile, read_csv_samples


def quintic_duration(delta: np.ndarray, vmax: np.ndarray, amax: np.ndarray) -> float:
    """Shortest quintic move time meeting per-axis velocity and acceleration limits."""
    d = np.abs(delta)
    t_v = 1.875 * d / vmax
    t_a = np.sqrt(5.7735026919 * d / amax)  # peak |s''| of the quintic is 10/sqrt(3)
    return float(max(np.max(t_v), np.max(t_a), 1e-3))


def plan_moves(points: np.ndarray, durations, rate_hz: float, dwell: float = 0.0) -> Planned:
    """Quintic point-to-point moves through ``points`` (k, s) with given durations (s)."""
    pos, vel, acc = [points[:1]], [np.zeros((1, points.shape[1]))], [np.zeros((1, points.shape[1]))]
    for a, b, T in zip(points[:-1], points[1:], durations):
        n = max(int(round(T * rate_hz)), 1)
        tau = np.arange(1, n + 1) / n
        s, ds, dds = quintic_profile(tau)
        d = b - a
        pos.append(a + s[:, None] * d)
        vel.append(ds[:, None] * d / T)
        acc.append(dds[:, None] * d / T**2)
        if dwell > 0:
            m = int(round(dwell * rate_hz))
            pos.append(np.repeat(b[None], m, 0))
            vel.append(np.zeros((m, len(b))))
            acc.append(np.zeros((m, len(b))))
    return Planned(rate_hz, np.vstack(pos), np.vstack(vel), np.vstack(acc),
                   {"kind": "moves", "points": points.tolist()})


# -- Orthoglide Cartesian kinematics (shared/reference-models.md) ---------------------------

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


def cartesian_path(kind: str, rate_hz: float, **kw):
    """Platform path samples (P, Pd, Pdd), each (n, 3).

    ``line``: from ``start`` to ``end`` (m) in ``duration`` s with a quintic profile.
    ``circle``: ``centre`` (m), ``diameter`` (m), ``normal`` (unit), ``speed`` peak (m/s),
    ``laps``; speed ramps up and down with quintic profiles over ``ramp`` s.
    """
    if kind == "line":
        a, b, T = np.asarray(kw["start"], float), np.asarray(kw["end"], float), float(kw["duration"])
        n = max(int(round(T * rate_hz)), 1)
        s, ds, dds = quintic_profile(np.arange(0, n + 1) / n)
        d = b - a
        return a + s[:, None] * d, ds[:, None] * d / T, dds[:, None] * d / T**2
    if kind == "circle":
        c = np.asarray(kw["centre"], float)
        r = 0.5 * float(kw["diameter"])
        e1, e2 = circle_basis(kw.get("normal", (0, 0, 1)))
        v, ramp, laps = float(kw["speed"]), float(kw.get("ramp", 0.3)), float(kw.get("laps", 1.0))
        L_arc = 2 * np.pi * r * laps
        # arc length: quintic ramp to v over `ramp` s (distance v ramp / 2 each), cruise, ramp down
        cruise = (L_arc - v * ramp) / v
        if cruise < 0:
            raise UserError("circle too short for its speed ramp")
        T = 2 * ramp + cruise
        t = np.arange(0, int(round(T * rate_hz)) + 1) / rate_hz
        sd = np.empty_like(t)
        sdd = np.empty_like(t)
        sarc = np.empty_like(t)
        for k, tk in enumerate(t):
            if tk < ramp:
                p, dp, ddp = quintic_profile(np.array([tk / ramp]))
                sarc[k] = v * ramp * _quintic_integral(tk / ramp)
                sd[k], sdd[k] = v * p[0], v * dp[0] / ramp
            elif tk < ramp + cruise:
                sarc[k] = v * ramp / 2 + v * (tk - ramp)
                sd[k], sdd[k] = v, 0.0
            else:
                u = min((tk - ramp - cruise) / ramp, 1.0)
                p, dp, ddp = quintic_profile(np.array([u]))
                sarc[k] = v * ramp / 2 + v * cruise + v * ramp * (u - _quintic_integral(u))
                sd[k], sdd[k] = v * (1 - p[0]), -v * dp[0] / ramp
        phi = sarc / r
        cs, sn = np.cos(phi), np.sin(phi)
        # start on the circle at c + r e1 (phi = 0)
        P = c + r * (cs[:, None] * e1 + sn[:, None] * e2)
        dP = (-sn[:, None] * e1 + cs[:, None] * e2)
        Pd = dP * sd[:, None]
        Pdd = dP * sdd[:, None] - (cs[:, None] * e1 + sn[:, None] * e2) * (sd**2 / r)[:, None]
        return P, Pd, Pdd
    raise UserError(f"unknown Cartesian path kind '{kind}'")


def _quintic_integral(u: float) -> float:
    """Integral of the quintic profile s(x) from 0 to u."""
    return 2.5 * u**4 - 3 * u**5 + u**6


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


def load_trajectory_csv(path: str, rate_hz: float, axes: list[str],
                        cartesian_ik=None) -> Planned:
    """A CSV with a header: ``t`` then one column per actuator (named as the model's
    actuators) or per Cartesian axis (``x,y,z``, needs ``cartesian_ik``). Resampled to the
    loop rate by a cubic spline (velocities and accelerations from the spline)."""
    head, P, Pd, Pdd = read_csv_samples(path, rate_hz, [list(axes), ["x", "y", "z"]])
    desc = {"kind": "csv", "path": str(path), "columns": head}
    if head[1:] == ["x", "y", "z"] and head[1:] != list(axes):
        if cartesian_ik is None:
            raise UserError(f"{path}: Cartesian columns x,y,z need a machine with Cartesian kinematics")
        th, thd, thdd = cartesian_ik(P, Pd, Pdd)
        return Planned(rate_hz, th, thd, thdd, desc)
    return Planned(rate_hz, P, Pd, Pdd, desc)


def validate(plan: Planned, lo: np.ndarray, hi: np.ndarray, vmax: np.ndarray, amax: np.ndarray,
             axes: list[str], in_domain=None) -> None:
    """Refuse a reference outside the actuator ranges, the model's domain or the velocity and
    acceleration limits, naming the time and axis at fault."""
    checks = [("below its lower limit", plan.pos < lo - 1e-12, lo),
              ("above its upper limit", plan.pos > hi + 1e-12, hi),
              ("exceeds the velocity limit", np.abs(plan.vel) > vmax * (1 + 1e-9), vmax),
              ("exceeds the acceleration limit", np.abs(plan.acc) > amax * (1 + 1e-9), amax)]
    for what, bad, lim in checks:
        if np.any(bad):
            k, i = np.argwhere(bad)[0]
            val = (plan.pos if "limit" in what and "velocity" not in what and "acceleration" not in what
                   else plan.vel if "velocity" in what else plan.acc)[k, i]
            raise UserError(f"trajectory refused: at t = {k / plan.rate_hz:.4f} s axis {axes[i]} {what} "
                            f"({val:.6g} vs {lim[i]:.6g})")
    if not np.all(np.isfinite(plan.pos)):
        raise UserError("trajectory refused: non-finite values")
    if in_domain is not None:
        ok = in_domain(plan.pos)
        if not np.all(ok):
            k = int(np.argmin(ok))
            raise UserError(f"trajectory refused: at t = {k / plan.rate_hz:.4f} s the position "
                            f"{np.round(plan.pos[k], 6).tolist()} is outside the model's domain")
