"""Constraint primitives and their numba kernels (absolute coordinates).

Every moving body b has a position x_b (its centre of mass, world frame, m) and a rotation
R_b (body to world). Velocities are the world-frame linear velocity v_b (m/s) and angular
velocity w_b (rad/s); a virtual displacement is (dx_b, dpsi_b) with R_b <- exp(dpsi_b) R_b.
Column block of body b in a Jacobian: 6 b .. 6 b + 5 = (dx, dpsi). Body index -1 is ground.

Joints (see ``joints.py``) are stacks of four primitives. Each primitive row stores, in
``prim_i``: type, body 1, body 2, actuator index (-1 if none); and in ``prim_f``: p1 (point in
body 1), p2 (point in body 2), a1 (vector in body 1), b2 (vector in body 2), u1, v1 (vectors in
body 1, for ANGLE), c0 (offset), sc (the actuator's scale: joint value per unit of theta, 1 unless
calibrated), all in body frames centred on the centre of mass.

- POINT (3 rows): x1 + R1 p1 - x2 - R2 p2 = 0
- PERP  (1 row):  (R1 a1) . (R2 b2) - c0 = 0
- DIST  (1 row):  ((x2 + R2 p2) - (x1 + R1 p1)) . (R1 a1) - c0 - sc theta_k = 0
- ANGLE (1 row):  (R2 b2) . R1 (-sin(sc theta_k + c0) u1 + cos(sc theta_k + c0) v1) = 0,
  i.e. sin(alpha - sc theta_k - c0) = 0 with alpha the angle of b2 from u1 about a1.

The drift gamma is the part of the second time derivative of the constraints that does not
involve accelerations: Phi_q qdd + Phi_theta thetadd + gamma = 0. It is analytic (no finite
differences).
"""

from __future__ import annotations

import numpy as np
from numba import njit

POINT, PERP, DIST, ANGLE = 0, 1, 2, 3
ROWS = (3, 1, 1, 1)
NF = 20  # floats per primitive

# prim_f column offsets
P1, P2, A1, B2, U1, V1, C0, SC = 0, 3, 6, 9, 12, 15, 18, 19


# 3-vectors are tuples inside the kernels: they live on the stack (no allocation per use).

@njit(cache=True)
def _cross(a, b):
    return (a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0])


@njit(cache=True)
def _dot(a, b):
    return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]


@njit(cache=True)
def _add(a, b):
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


@njit(cache=True)
def _sub(a, b):
    return (a[0] - b[0], a[1] - b[1], a[2] - b[2])


@njit(cache=True)
def _lin(s, a, t, b):
    """s a + t b."""
    return (s * a[0] + t * b[0], s * a[1] + t * b[1], s * a[2] + t * b[2])


@njit(cache=True)
def _vec(f, i):
    """f[i:i + 3] as a tuple."""
    return (f[i], f[i + 1], f[i + 2])


@njit(cache=True)
def _rot(R, b, v):
    """R[b] @ v, or v itself for ground (b = -1)."""
    if b < 0:
        return v
    return (R[b, 0, 0] * v[0] + R[b, 0, 1] * v[1] + R[b, 0, 2] * v[2],
            R[b, 1, 0] * v[0] + R[b, 1, 1] * v[1] + R[b, 1, 2] * v[2],
            R[b, 2, 0] * v[0] + R[b, 2, 1] * v[1] + R[b, 2, 2] * v[2])


@njit(cache=True)
def _row(X, b):
    """X[b] as a tuple, zero for ground (positions and velocities of body b)."""
    if b < 0:
        return (0.0, 0.0, 0.0)
    return (X[b, 0], X[b, 1], X[b, 2])


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
            r1 = _rot(R, b1, _vec(f, P1))
            r2 = _rot(R, b2, _vec(f, P2))
            d = _sub(_add(_row(X, b1), r1), _add(_row(X, b2), r2))
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
            u = _rot(R, b1, _vec(f, A1))
            w = _rot(R, b2, _vec(f, B2))
            phi[row] = _dot(u, w) - f[C0]
            uw = _cross(u, w)
            if b1 >= 0:
                for i in range(3):
                    jac[row, c1 + 3 + i] = uw[i]
            if b2 >= 0:
                for i in range(3):
                    jac[row, c2 + 3 + i] = -uw[i]
            row += 1
        elif t == DIST:
            r1 = _rot(R, b1, _vec(f, P1))
            r2 = _rot(R, b2, _vec(f, P2))
            a = _rot(R, b1, _vec(f, A1))
            d = _sub(_add(_row(X, b2), r2), _add(_row(X, b1), r1))
            phi[row] = _dot(d, a) - f[C0]
            if act >= 0:
                phi[row] -= f[SC] * theta[act]
                jac_theta[row, act] = -f[SC]
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
            ang = f[SC] * theta[act] + f[C0]
            sn, cs = np.sin(ang), np.cos(ang)
            u = _rot(R, b2, _vec(f, B2))
            w = _rot(R, b1, _lin(-sn, _vec(f, U1), cs, _vec(f, V1)))
            wd = _rot(R, b1, _lin(-cs, _vec(f, U1), -sn, _vec(f, V1)))
            phi[row] = _dot(u, w)
            jac_theta[row, act] = f[SC] * _dot(u, wd)
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
        w1 = _row(W, b1)
        w2 = _row(W, b2)
        if t == POINT:
            r1 = _rot(R, b1, _vec(f, P1))
            r2 = _rot(R, b2, _vec(f, P2))
            g = _sub(_cross(w1, _cross(w1, r1)), _cross(w2, _cross(w2, r2)))
            for i in range(3):
                gamma[row + i] = g[i]
            row += 3
        elif t == PERP:
            u = _rot(R, b1, _vec(f, A1))
            w = _rot(R, b2, _vec(f, B2))
            gamma[row] = (_dot(_cross(w1, _cross(w1, u)), w) + 2.0 * _dot(_cross(w1, u), _cross(w2, w))
                          + _dot(u, _cross(w2, _cross(w2, w))))
            row += 1
        elif t == DIST:
            r1 = _rot(R, b1, _vec(f, P1))
            r2 = _rot(R, b2, _vec(f, P2))
            a = _rot(R, b1, _vec(f, A1))
            d = _sub(_add(_row(X, b2), r2), _add(_row(X, b1), r1))
            dd = _sub(_add(_row(V, b2), _cross(w2, r2)), _add(_row(V, b1), _cross(w1, r1)))
            ddd = _sub(_cross(w2, _cross(w2, r2)), _cross(w1, _cross(w1, r1)))
            gamma[row] = (_dot(ddd, a) + 2.0 * _dot(dd, _cross(w1, a))
                          + _dot(d, _cross(w1, _cross(w1, a))))
            row += 1
        else:  # ANGLE
            ang = f[SC] * theta[act] + f[C0]
            td = f[SC] * theta_dot[act]
            sn, cs = np.sin(ang), np.cos(ang)
            u = _rot(R, b2, _vec(f, B2))
            w = _rot(R, b1, _lin(-sn, _vec(f, U1), cs, _vec(f, V1)))
            wd = _rot(R, b1, _lin(-cs, _vec(f, U1), -sn, _vec(f, V1)))
            w2u = _cross(w2, u)
            gamma[row] = (_dot(_cross(w2, w2u), w) + 2.0 * _dot(w2u, _cross(w1, w))
                          + _dot(u, _cross(w1, _cross(w1, w)))
                          + 2.0 * td * (_dot(w2u, wd) + _dot(u, _cross(w1, wd)))
                          - td * td * _dot(u, w))
            row += 1


@njit(cache=True)
def step_config(X, R, dq, X_out, R_out):
    """X_out[b] = X[b] + dx_b and R_out[b] = exp([dpsi_b]x) R[b] (Rodrigues), dq = (dx_b, dpsi_b)
    per body (m, rad, world frame). The outputs may be the inputs (in-place update)."""
    for b in range(X.shape[0]):
        i = 6 * b
        for k in range(3):
            X_out[b, k] = X[b, k] + dq[i + k]
        x, y, z = dq[i + 3], dq[i + 4], dq[i + 5]
        a2 = x * x + y * y + z * z
        if a2 < 1e-8:  # series of sin(a)/a and (1 - cos a)/a^2, exact to rounding here
            sa = 1.0 - a2 / 6.0 + a2 * a2 / 120.0
            ca = 0.5 - a2 / 24.0 + a2 * a2 / 720.0
        else:
            a = np.sqrt(a2)
            sa = np.sin(a) / a
            ca = (1.0 - np.cos(a)) / a2
        # E = I + sa K + ca K^2, K = [dpsi]x
        e00 = 1.0 - ca * (y * y + z * z)
        e11 = 1.0 - ca * (x * x + z * z)
        e22 = 1.0 - ca * (x * x + y * y)
        e01 = -sa * z + ca * x * y
        e10 = sa * z + ca * x * y
        e02 = sa * y + ca * x * z
        e20 = -sa * y + ca * x * z
        e12 = -sa * x + ca * y * z
        e21 = sa * x + ca * y * z
        for c in range(3):
            r0, r1, r2 = R[b, 0, c], R[b, 1, c], R[b, 2, c]
            R_out[b, 0, c] = e00 * r0 + e01 * r1 + e02 * r2
            R_out[b, 1, c] = e10 * r0 + e11 * r1 + e12 * r2
            R_out[b, 2, c] = e20 * r0 + e21 * r1 + e22 * r2


@njit(cache=True)
def lu_factor(A, piv):
    """In-place LU factorisation with partial pivoting (as LAPACK getrf): A = P L U with unit
    L below the diagonal and U on and above it; piv[k] is the row swapped with row k.
    Returns False if a pivot is exactly zero (singular matrix)."""
    n = A.shape[0]
    for k in range(n):
        p = k
        big = abs(A[k, k])
        for i in range(k + 1, n):
            if abs(A[i, k]) > big:
                big = abs(A[i, k])
                p = i
        piv[k] = p
        if big == 0.0:
            return False
        if p != k:
            for j in range(n):
                A[k, j], A[p, j] = A[p, j], A[k, j]
        inv = 1.0 / A[k, k]
        for i in range(k + 1, n):
            f = A[i, k] * inv
            A[i, k] = f
            if f != 0.0:  # the constraint Jacobians are sparse
                for j in range(k + 1, n):
                    A[i, j] -= f * A[k, j]
    return True


@njit(cache=True)
def lu_solve(LU, piv, B):
    """Solve A X = B in place (B: n x m) with the factors of ``lu_factor``."""
    n = LU.shape[0]
    m = B.shape[1]
    for k in range(n):
        p = piv[k]
        if p != k:
            for c in range(m):
                B[k, c], B[p, c] = B[p, c], B[k, c]
    for i in range(n):
        for j in range(i):
            f = LU[i, j]
            if f != 0.0:
                for c in range(m):
                    B[i, c] -= f * B[j, c]
    for i in range(n - 1, -1, -1):
        for j in range(i + 1, n):
            f = LU[i, j]
            if f != 0.0:
                for c in range(m):
                    B[i, c] -= f * B[j, c]
        inv = 1.0 / LU[i, i]
        for c in range(m):
            B[i, c] *= inv


@njit(cache=True)
def _matTmat(A, B, out):
    """out = A^T B."""
    for i in range(A.shape[1]):
        for j in range(B.shape[1]):
            acc = 0.0
            for k in range(A.shape[0]):
                acc += A[k, i] * B[k, j]
            out[i, j] = acc


# Kernels below use explicit loops rather than array expressions and slice assignments:
# numba compiles those slowly (seconds each), and a cold start pays it once per checkout.

@njit(cache=True)
def _square(jac, rows, A):
    """A = jac[rows] (the square system)."""
    for i in range(rows.shape[0]):
        for j in range(jac.shape[1]):
            A[i, j] = jac[rows[i], j]


@njit(cache=True)
def _max_abs(v):
    m = 0.0
    for i in range(v.shape[0]):
        a = abs(v[i])
        if a > m or a != a:  # NaN propagates
            m = a
    return m


@njit(cache=True)
def newton(prim_i, prim_f, rows, X, R, theta_from, theta, tol, max_iter, cap, phi, jac, jac_theta):
    """Assemble at theta starting from (X, R), assembled at theta_from; X and R are updated in
    place. First the linear prediction dq = q_theta (theta - theta_from) (paper eq. 12), then
    Newton-Raphson on the square system ``rows`` with steps capped at ``cap`` (m or rad), until
    max |phi| over all rows < tol. Returns (max |phi| at the final X, R; Newton iterations);
    the residual is inf if the square Jacobian is exactly singular. phi, jac and jac_theta are
    work arrays (all rows); on return they hold the values at the final configuration."""
    n = rows.shape[0]
    s = theta.shape[0]
    A = np.empty((n, n))
    piv = np.empty(n, dtype=np.int64)
    qt = np.empty((n, s))
    dq = np.empty(n)
    dq_col = dq.reshape((n, 1))  # the same memory, as the n x 1 right-hand side of lu_solve
    evaluate(prim_i, prim_f, X, R, theta_from, phi, jac, jac_theta)
    _square(jac, rows, A)
    if not lu_factor(A, piv):
        return np.inf, 0
    for i in range(n):
        for k in range(s):
            qt[i, k] = -jac_theta[rows[i], k]
    lu_solve(A, piv, qt)
    for i in range(n):
        dq[i] = 0.0
        for k in range(s):
            dq[i] += qt[i, k] * (theta[k] - theta_from[k])
    it = 0
    while True:
        step_config(X, R, dq, X, R)
        evaluate(prim_i, prim_f, X, R, theta, phi, jac, jac_theta)
        res = _max_abs(phi)
        if res < tol or it == max_iter:
            return res, it
        it += 1
        _square(jac, rows, A)
        if not lu_factor(A, piv):
            return np.inf, it
        for i in range(n):
            dq[i] = -phi[rows[i]]
        lu_solve(A, piv, dq_col)
        big = _max_abs(dq)
        if big > cap:
            for i in range(n):
                dq[i] *= cap / big


@njit(cache=True)
def _mass_times(masses, Iw, Y, out):
    """out = M Y for the block-diagonal mass matrix (m I, Iw[b] per body), Y (6 nb x k)."""
    for b in range(masses.shape[0]):
        i = 6 * b
        for c in range(Y.shape[1]):
            for k in range(3):
                out[i + k, c] = masses[b] * Y[i + k, c]
                out[i + 3 + k, c] = (Iw[b, k, 0] * Y[i + 3, c] + Iw[b, k, 1] * Y[i + 4, c]
                                     + Iw[b, k, 2] * Y[i + 5, c])


@njit(cache=True)
def _quadratic_form(prim_i, prim_f, rows, X, R, Iw, q_theta, theta, theta_dot, g, a):
    """At qdot = q_theta theta_dot: g = drift on the square rows, a = gyroscopic forces
    (0, w x Iw w) per body (N, N m)."""
    nb = X.shape[0]
    V = np.empty((nb, 3))
    W = np.empty((nb, 3))
    for b in range(nb):
        for i in range(3):
            v = 0.0
            w = 0.0
            for k in range(theta_dot.shape[0]):
                v += q_theta[6 * b + i, k] * theta_dot[k]
                w += q_theta[6 * b + 3 + i, k] * theta_dot[k]
            V[b, i] = v
            W[b, i] = w
    n_all = 0
    for k in range(prim_i.shape[0]):
        n_all += 3 if prim_i[k, 0] == POINT else 1
    gamma = np.empty(n_all)
    drift(prim_i, prim_f, X, R, V, W, theta, theta_dot, gamma)
    for i in range(rows.shape[0]):
        g[i] = gamma[rows[i]]
    for b in range(nb):
        w = (W[b, 0], W[b, 1], W[b, 2])
        Lw = _rot(Iw, b, w)  # Iw[b] @ w
        t = _cross(w, Lw)
        for i in range(3):
            a[6 * b + i] = 0.0
            a[6 * b + 3 + i] = t[i]


@njit(cache=True)
def reduce_kernel(prim_i, prim_f, rows, X, R, masses, inertias, gravity, theta, q_theta, H, D,
                  p_ext):
    """Exact reduced model at an assembled configuration (X, R) (see ``reduction.reduce_at``).

    Writes q_theta (n x s), H (s x s), D (s x s(s+1)/2, columns in [td td] order) and p_ext (s).
    Returns False (outputs undefined) if the square Jacobian is exactly singular.
    The quadratic-velocity terms are the gyroscopic forces A and the analytic constraint drift
    G, both quadratic in theta_dot; their bilinear parts are taken by polarisation:
    column (j, k) = Q(e_j + e_k) - Q(e_j) - Q(e_k) for j < k, Q(e_j) for j = k.
    """
    nb = X.shape[0]
    n = 6 * nb
    s = theta.shape[0]
    n_all = 0
    for k in range(prim_i.shape[0]):
        n_all += 3 if prim_i[k, 0] == POINT else 1
    phi = np.empty(n_all)
    jac = np.empty((n_all, n))
    jt = np.empty((n_all, s))
    evaluate(prim_i, prim_f, X, R, theta, phi, jac, jt)
    A = np.empty((n, n))
    piv = np.empty(n, dtype=np.int64)
    _square(jac, rows, A)
    if not lu_factor(A, piv):
        return False
    for i in range(n):
        for k in range(s):
            q_theta[i, k] = -jt[rows[i], k]
    lu_solve(A, piv, q_theta)

    Iw = np.empty((nb, 3, 3))
    for b in range(nb):  # R I R^T
        for i in range(3):
            for j in range(3):
                acc = 0.0
                for k in range(3):
                    for l in range(3):
                        acc += R[b, i, k] * inertias[b, k, l] * R[b, j, l]
                Iw[b, i, j] = acc
    Mq = np.empty((n, s))
    _mass_times(masses, Iw, q_theta, Mq)
    _matTmat(q_theta, Mq, H)
    for j in range(s):
        for k in range(j + 1, s):
            sym = 0.5 * (H[j, k] + H[k, j])
            H[j, k] = sym
            H[k, j] = sym
    for j in range(s):
        p = 0.0
        for b in range(nb):
            for k in range(3):
                p += masses[b] * gravity[k] * q_theta[6 * b + k, j]
        p_ext[j] = p

    # quadratic forms Q(e) = (drift on the square rows, gyroscopic forces) at theta_dot = e
    nq = s * (s + 1) // 2
    G = np.empty((n, nq))
    Ag = np.empty((n, nq))
    Gd = np.empty((n, s))  # Q(e_j)
    Ad = np.empty((n, s))
    e = np.zeros(s)
    g = np.empty(n)
    ag = np.empty(n)
    for j in range(s):
        e[:] = 0.0
        e[j] = 1.0
        _quadratic_form(prim_i, prim_f, rows, X, R, Iw, q_theta, theta, e, g, ag)
        for i in range(n):
            Gd[i, j] = g[i]
            Ad[i, j] = ag[i]
    c = 0
    for j in range(s):
        for k in range(j, s):
            if j != k:  # polarisation: the td_j td_k coefficient
                e[:] = 0.0
                e[j] = 1.0
                e[k] = 1.0
                _quadratic_form(prim_i, prim_f, rows, X, R, Iw, q_theta, theta, e, g, ag)
            for i in range(n):
                if j == k:
                    G[i, c] = Gd[i, j]
                    Ag[i, c] = Ad[i, j]
                else:
                    G[i, c] = g[i] - Gd[i, j] - Gd[i, k]
                    Ag[i, c] = ag[i] - Ad[i, j] - Ad[i, k]
            c += 1
    # qdd = q_theta thetadd + B [td td] with Phi_q B = -G; D = q_theta^T (A + M B)
    B = np.empty((n, nq))
    for i in range(n):
        for c in range(nq):
            B[i, c] = -G[i, c]
    lu_solve(A, piv, B)
    MB = np.empty((n, nq))
    _mass_times(masses, Iw, B, MB)
    for i in range(n):
        for c in range(nq):
            MB[i, c] += Ag[i, c]
    _matTmat(q_theta, MB, D)
    return True


def count_rows(prim_i: np.ndarray) -> int:
    """Number of scalar constraint rows of a primitive table."""
    return int(sum(ROWS[t] for t in prim_i[:, 0]))


def primitive(kind: int, b1: int, b2: int, act: int = -1, p1=(0, 0, 0), p2=(0, 0, 0),
              a1=(0, 0, 0), b2v=(0, 0, 0), u1=(0, 0, 0), v1=(0, 0, 0), c0: float = 0.0, sc: float = 1.0):
    """One primitive as (int row, float row)."""
    fi = np.array([kind, b1, b2, act], dtype=np.int64)
    ff = np.concatenate([p1, p2, a1, b2v, u1, v1, [c0, sc]]).astype(np.float64)
    assert ff.shape == (NF,)
    return fi, ff
