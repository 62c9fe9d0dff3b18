"""Constraint primitives and their numba kernels (absolute coordinates).

Every moving body b has a position x_b (its centre of mass, world frame, m) and a rotation
R_b (body to world). Velocities are the world-frame linear velocity v_b (m/s) and angular
velocity w_b (rad/s); a virtual displacement is (dx_b, dpsi_b) with R_b <- exp(dpsi_b) R_b.
Column block of body b in a Jacobian: 6 b .. 6 b + 5 = (dx, dpsi). Body index -1 is ground.

Joints (see ``joints.py``) are stacks of four primitives. Each primitive row stores, in
``prim_i``: type, body 1, body 2, actuator index (-1 if none); and in ``prim_f``: p1 (point in
body 1), p2 (point in body 2), a1 (vector in body 1), b2 (vector in body 2), u1, v1 (vectors in
body 1, for ANGLE), c0 (offset), all in body frames centred on the centre of mass.

- POINT (3 rows): x1 + R1 p1 - x2 - R2 p2 = 0
- PERP  (1 row):  (R1 a1) . (R2 b2) - c0 = 0
- DIST  (1 row):  ((x2 + R2 p2) - (x1 + R1 p1)) . (R1 a1) - c0 - theta_k = 0
- ANGLE (1 row):  (R2 b2) . R1 (-sin(theta_k + c0) u1 + cos(theta_k + c0) v1) = 0,
  i.e. sin(alpha - theta_k - c0) = 0 with alpha the angle of b2 from u1 about a1.

The drift gamma is the part of the second time derivative of the constraints that does not
involve accelerations: Phi_q qdd + Phi_theta thetadd + gamma = 0. It is analytic (no finite
differences).
"""

from __future__ import annotations

import numpy as np
from numba import njit

POINT, PERP, DIST, ANGLE = 0, 1, 2, 3
ROWS = (3, 1, 1, 1)
NF = 19  # floats per primitive

# prim_f column offsets
P1, P2, A1, B2, U1, V1, C0 = 0, 3, 6, 9, 12, 15, 18


@njit(cache=True)
def _cross(a, b):
    return np.array([a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]])


@njit(cache=True)
def _rot(R, b, v):
    """R[b] @ v, or v itself for ground (b = -1)."""
    if b < 0:
        return v.copy()
    return R[b] @ v


@njit(cache=True)
def _pos(X, b):
    if b < 0:
        return np.zeros(3)
    return X[b].copy()


@njit(cache=True)
def _vel(V, b):
    if b < 0:
        return np.zeros(3)
    return V[b].copy()


@njit(cache=True)
def evaluate(prim_i, prim_f, X, R, theta, phi, jac, jac_theta):
    """Residuals phi (m), Jacobian jac (rows x 6 nb) and d phi / d theta (rows x s).

    jac and jac_theta are overwritten in full.
    """
    jac[:, :] = 0.0
    jac_theta[:, :] = 0.0
    row = 0
    for k in range(prim_i.shape[0]):
        t = prim_i[k, 0]
        b1 = prim_i[k, 1]
        b2 = prim_i[k, 2]
        act = prim_i[k, 3]
        f = prim_f[k]
        c1 = 6 * b1
        c2 = 6 * b2
        if t == POINT:
            r1 = _rot(R, b1, f[P1:P1 + 3])
            r2 = _rot(R, b2, f[P2:P2 + 3])
            d = _pos(X, b1) + r1 - _pos(X, b2) - r2
            for i in range(3):
                phi[row + i] = d[i]
            # d/dt (R r) = w x r = -[r]x w
            if b1 >= 0:
                for i in range(3):
                    jac[row + i, c1 + i] = 1.0
                jac[row + 0, c1 + 4] = r1[2]
                jac[row + 0, c1 + 5] = -r1[1]
                jac[row + 1, c1 + 3] = -r1[2]
                jac[row + 1, c1 + 5] = r1[0]
                jac[row + 2, c1 + 3] = r1[1]
                jac[row + 2, c1 + 4] = -r1[0]
            if b2 >= 0:
                for i in range(3):
                    jac[row + i, c2 + i] = -1.0
                jac[row + 0, c2 + 4] = -r2[2]
                jac[row + 0, c2 + 5] = r2[1]
                jac[row + 1, c2 + 3] = r2[2]
                jac[row + 1, c2 + 5] = -r2[0]
                jac[row + 2, c2 + 3] = -r2[1]
                jac[row + 2, c2 + 4] = r2[0]
            row += 3
        elif t == PERP:
            u = _rot(R, b1, f[A1:A1 + 3])
            w = _rot(R, b2, f[B2:B2 + 3])
            phi[row] = u @ w - f[C0]
            uw = _cross(u, w)
            if b1 >= 0:
                for i in range(3):
                    jac[row, c1 + 3 + i] = uw[i]
            if b2 >= 0:
                for i in range(3):
                    jac[row, c2 + 3 + i] = -uw[i]
            row += 1
        elif t == DIST:
            r1 = _rot(R, b1, f[P1:P1 + 3])
            r2 = _rot(R, b2, f[P2:P2 + 3])
            a = _rot(R, b1, f[A1:A1 + 3])
            d = _pos(X, b2) + r2 - _pos(X, b1) - r1
            phi[row] = d @ a - f[C0]
            if act >= 0:
                phi[row] -= theta[act]
                jac_theta[row, act] = -1.0
            # phi_dot = (v2 + w2 x r2 - v1 - w1 x r1) . a + d . (w1 x a)
            if b2 >= 0:
                ra = _cross(r2, a)
                for i in range(3):
                    jac[row, c2 + i] = a[i]
                    jac[row, c2 + 3 + i] = ra[i]
            if b1 >= 0:
                ra = _cross(r1, a)
                ad = _cross(a, d)
                for i in range(3):
                    jac[row, c1 + i] = -a[i]
                    jac[row, c1 + 3 + i] = -ra[i] + ad[i]
            row += 1
        else:  # ANGLE
            ang = theta[act] + f[C0]
            u = _rot(R, b2, f[B2:B2 + 3])
            wl = -np.sin(ang) * f[U1:U1 + 3] + np.cos(ang) * f[V1:V1 + 3]
            wd = -np.cos(ang) * f[U1:U1 + 3] - np.sin(ang) * f[V1:V1 + 3]
            w = _rot(R, b1, wl)
            phi[row] = u @ w
            jac_theta[row, act] = u @ _rot(R, b1, wd)
            uw = _cross(u, w)
            if b2 >= 0:
                for i in range(3):
                    jac[row, c2 + 3 + i] = uw[i]
            if b1 >= 0:
                for i in range(3):
                    jac[row, c1 + 3 + i] = -uw[i]
            row += 1


@njit(cache=True)
def drift(prim_i, prim_f, X, R, V, W, theta, theta_dot, gamma):
    """Acceleration drift gamma (rows): Phi_q qdd + Phi_theta thetadd + gamma = 0."""
    row = 0
    for k in range(prim_i.shape[0]):
        t = prim_i[k, 0]
        b1 = prim_i[k, 1]
        b2 = prim_i[k, 2]
        act = prim_i[k, 3]
        f = prim_f[k]
        w1 = _vel(W, b1)
        w2 = _vel(W, b2)
        if t == POINT:
            r1 = _rot(R, b1, f[P1:P1 + 3])
            r2 = _rot(R, b2, f[P2:P2 + 3])
            g = _cross(w1, _cross(w1, r1)) - _cross(w2, _cross(w2, r2))
            for i in range(3):
                gamma[row + i] = g[i]
            row += 3
        elif t == PERP:
            u = _rot(R, b1, f[A1:A1 + 3])
            w = _rot(R, b2, f[B2:B2 + 3])
            gamma[row] = (_cross(w1, _cross(w1, u)) @ w + 2.0 * (_cross(w1, u) @ _cross(w2, w))
                          + u @ _cross(w2, _cross(w2, w)))
            row += 1
        elif t == DIST:
            r1 = _rot(R, b1, f[P1:P1 + 3])
            r2 = _rot(R, b2, f[P2:P2 + 3])
            a = _rot(R, b1, f[A1:A1 + 3])
            d = _pos(X, b2) + r2 - _pos(X, b1) - r1
            dd = _vel(V, b2) + _cross(w2, r2) - _vel(V, b1) - _cross(w1, r1)
            ddd = _cross(w2, _cross(w2, r2)) - _cross(w1, _cross(w1, r1))
            gamma[row] = ddd @ a + 2.0 * (dd @ _cross(w1, a)) + d @ _cross(w1, _cross(w1, a))
            row += 1
        else:  # ANGLE
            ang = theta[act] + f[C0]
            td = theta_dot[act]
            u = _rot(R, b2, f[B2:B2 + 3])
            w = _rot(R, b1, -np.sin(ang) * f[U1:U1 + 3] + np.cos(ang) * f[V1:V1 + 3])
            wd = _rot(R, b1, -np.cos(ang) * f[U1:U1 + 3] - np.sin(ang) * f[V1:V1 + 3])
            w2u = _cross(w2, u)
            gamma[row] = (_cross(w2, w2u) @ w + 2.0 * (w2u @ _cross(w1, w))
                          + u @ _cross(w1, _cross(w1, w))
                          + 2.0 * td * (w2u @ wd + u @ _cross(w1, wd))
                          - td * td * (u @ w))
            row += 1


def count_rows(prim_i: np.ndarray) -> int:
    """Number of scalar constraint rows of a primitive table."""
    return int(sum(ROWS[t] for t in prim_i[:, 0]))


def primitive(kind: int, b1: int, b2: int, act: int = -1, p1=(0, 0, 0), p2=(0, 0, 0),
              a1=(0, 0, 0), b2v=(0, 0, 0), u1=(0, 0, 0), v1=(0, 0, 0), c0: float = 0.0):
    """One primitive as (int row, float row)."""
    fi = np.array([kind, b1, b2, act], dtype=np.int64)
    ff = np.concatenate([p1, p2, a1, b2v, u1, v1, [c0]]).astype(np.float64)
    assert ff.shape == (NF,)
    return fi, ff
