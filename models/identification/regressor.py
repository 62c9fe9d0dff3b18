"""The regressor of the reduced inverse dynamics: tau = Y(theta, theta_dot, theta_ddot) pi.

Standard parameters, 10 per body then 3 per actuator, in this order:

- per body b, in the body's frame as the description file gives it (origin and axes of the
  file's body frame, which moves with the body): ``m`` (kg), ``m c`` = (mx, my, mz) (kg m: the
  mass times the centre of mass), and the inertia about the body frame's ORIGIN (not the centre
  of mass) in that frame's axes, ``(Ixx, Ixy, Ixz, Iyy, Iyz, Izz)`` (kg m^2, tensor
  convention: Ixy is the (x, y) entry of the inertia matrix, i.e. -sum m x y). The inertia
  about the origin is I_c + m (|c|^2 1 - c c^T);
- per actuator a: viscous ``b`` (N s/m or N m s/rad), Coulomb ``Fc`` (N or N m; the shared
  model Fc tanh(theta_dot / V_EPS) of ``pkrt.rt.core.friction``) and a constant ``offset``.

The descriptions carry no rotor inertias (an actuated joint's moving part is a body of its own
and appears through its 10 columns).

Exact and linear: each body's wrench is linear in its parameters (Newton-Euler about the frame
origin), the velocity Jacobian and accelerations come from the kinematics only (q_theta and
the constraint drift, independent of every inertial parameter), and
tau = sum_b J_b^T W_b (the body's needed wrench: inertial forces minus gravity) is the reduced
inverse dynamics of ``pkrt.models.reduction`` (tau = H thetadd + D [td td] - p_ext).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pkrt.rt.core.friction import V_EPS

from ..kinematics import constraints as C
from ..kinematics.assembly import Assembler, checked_theta
from ..kinematics.description import Description
from ..kinematics.mechanism import AssemblyError, Config, Mechanism

CHORD_ITERATIONS = 12  # corrections on the previous state's factors before a full Newton
BODY_PARAMS = ("m", "mx", "my", "mz", "Ixx", "Ixy", "Ixz", "Iyy", "Iyz", "Izz")
ACTUATOR_PARAMS = ("viscous", "coulomb", "offset")
_SYM = ((0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2))  # Ixx Ixy Ixz Iyy Iyz Izz


def parameter_names(mech: Mechanism) -> list[str]:
    """``body.m``, ``body.mx``, ..., then ``actuator.viscous``, ... (the column order of Y)."""
    names = [f"{b}.{p}" for b in mech.body_names for p in BODY_PARAMS]
    names += [f"{a}.{p}" for a in mech.actuator_names for p in ACTUATOR_PARAMS]
    return names


def inertia_about_origin(mass: float, com: np.ndarray, inertia_c: np.ndarray) -> np.ndarray:
    """Parallel axis: inertia about the frame origin from the one about the centre of mass."""
    c = np.asarray(com, float)
    return inertia_c + mass * ((c @ c) * np.eye(3) - np.outer(c, c))


def body_parameters(mass: float, com, inertia_c) -> np.ndarray:
    """The 10 standard parameters (m, m c, I_origin as Ixx Ixy Ixz Iyy Iyz Izz)."""
    I = inertia_about_origin(mass, com, inertia_c)
    return np.r_[mass, mass * np.asarray(com, float), [I[i, j] for i, j in _SYM]]


def body_from_parameters(p: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """(mass, com, inertia about the centre of mass) from the 10 standard parameters."""
    m = float(p[0])
    c = np.asarray(p[1:4], float) / m
    I = np.empty((3, 3))
    for k, (i, j) in enumerate(_SYM):
        I[i, j] = I[j, i] = p[4 + k]
    return m, c, I - m * ((c @ c) * np.eye(3) - np.outer(c, c))


def model_parameters(desc: Description, viscous=0.0, coulomb=0.0, offset=0.0) -> np.ndarray:
    """pi of a description (its bodies' values) with the given friction (scalars or per axis)."""
    s = len(desc.actuators)
    fr = np.c_[np.broadcast_to(viscous, s), np.broadcast_to(coulomb, s), np.broadcast_to(offset, s)]
    return np.r_[np.concatenate([body_parameters(b.mass, b.com, b.inertia) for b in desc.bodies]),
                 fr.ravel()]


def _skew(v: np.ndarray) -> np.ndarray:
    """[v]x for a stack of vectors (..., 3) -> (..., 3, 3)."""
    S = np.zeros(v.shape[:-1] + (3, 3))
    S[..., 0, 1], S[..., 0, 2] = -v[..., 2], v[..., 1]
    S[..., 1, 0], S[..., 1, 2] = v[..., 2], -v[..., 0]
    S[..., 2, 0], S[..., 2, 1] = -v[..., 1], v[..., 0]
    return S


def _inertia_map(v: np.ndarray) -> np.ndarray:
    """L(v) (..., 3, 6) with I v = L(v) (Ixx, Ixy, Ixz, Iyy, Iyz, Izz)."""
    L = np.zeros(v.shape[:-1] + (3, 6))
    x, y, z = v[..., 0], v[..., 1], v[..., 2]
    L[..., 0, 0], L[..., 0, 1], L[..., 0, 2] = x, y, z
    L[..., 1, 1], L[..., 1, 3], L[..., 1, 4] = x, y, z
    L[..., 2, 2], L[..., 2, 4], L[..., 2, 5] = x, y, z
    return L


def body_wrench_regressor(a: np.ndarray, w: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """Newton-Euler regressor (..., 6, 10) in body-frame components: (F, N) about the frame
    origin = Yb (m, m c, I_origin), given the origin's acceleration minus gravity ``a``, the
    angular velocity ``w`` and acceleration ``alpha`` (all (..., 3), body frame).

    F = m a + alpha x mc + w x (w x mc);  N = I alpha + w x (I w) + mc x a."""
    Y = np.zeros(a.shape[:-1] + (6, 10))
    Sw = _skew(w)
    Y[..., :3, 0] = a
    Y[..., :3, 1:4] = _skew(alpha) + Sw @ Sw
    Y[..., 3:, 1:4] = -_skew(a)
    Y[..., 3:, 4:] = _inertia_map(alpha) + Sw @ _inertia_map(w)
    return Y


class Regressor:
    """Y(theta, theta_dot, theta_ddot) of a mechanism, (s, 10 nb + 3 s), assembling with warm
    starts (one per thread or process). Y does not depend on any inertial parameter of the
    mechanism: the same Y serves every mass distribution on the same geometry."""

    def __init__(self, mech: Mechanism):
        self.mech = mech
        self.assembler = Assembler(mech)
        self.com = np.array([b.com for b in mech.description.bodies])  # nb x 3, body frame
        self.names = parameter_names(mech)
        self.n_params = len(self.names)

    def __call__(self, theta, theta_dot, theta_ddot) -> np.ndarray:
        mech = self.mech
        theta = checked_theta(mech, theta)
        td = np.asarray(theta_dot, float)
        tdd = np.asarray(theta_ddot, float)
        s, nb = mech.n_act, mech.n_bodies
        cfg = self.assembler.solve(theta)
        _, jac, jt = mech.evaluate(cfg, theta)
        rows = mech.square_rows
        # the kernels' sparse LU (single-threaded; BLAS threads only contend at this size)
        LU = np.ascontiguousarray(jac[rows])
        piv = np.empty(len(rows), dtype=np.int64)
        if not C.lu_factor(LU, piv):
            raise AssemblyError(f"{mech.name} at theta = {np.round(theta, 9).tolist()}: the constraint "
                                f"Jacobian with the actuators locked is singular (no reduced model)")
        qt = -np.ascontiguousarray(jt[rows])  # (6 nb, s)
        C.lu_solve(LU, piv, qt)
        qd = qt @ td
        vp = -mech.drift(cfg, qd, theta, td)[rows].reshape(-1, 1)  # velocity-product accelerations
        C.lu_solve(LU, piv, vp)
        qdd = qt @ tdd + vp[:, 0]
        J = qt.reshape(nb, 6, s)
        V, A = qd.reshape(nb, 6), qdd.reshape(nb, 6)
        R = cfg.R
        Rt = R.transpose(0, 2, 1)
        cw = np.einsum("bij,bj->bi", R, self.com)  # centre of mass from the origin, world
        w, alpha = V[:, 3:], A[:, 3:]
        a_o = A[:, :3] - np.cross(alpha, cw) - np.cross(w, np.cross(w, cw))
        # body-frame Jacobian of (origin velocity, angular velocity): v_o = v_c + cw x w
        Jb = np.empty((nb, 6, s))
        Jb[:, :3] = Rt @ (J[:, :3] + _skew(cw) @ J[:, 3:])
        Jb[:, 3:] = Rt @ J[:, 3:]
        ab = np.einsum("bji,bj->bi", R, a_o - mech.gravity[None, :])
        Yb = body_wrench_regressor(ab, np.einsum("bji,bj->bi", R, w), np.einsum("bji,bj->bi", R, alpha))
        Y = np.empty((s, self.n_params))
        Y[:, :10 * nb] = np.einsum("bks,bkp->sbp", Jb, Yb).reshape(s, 10 * nb)
        fr = Y[:, 10 * nb:].reshape(s, s, 3)
        fr[...] = 0.0
        idx = np.arange(s)
        fr[idx, idx, 0] = td
        fr[idx, idx, 1] = np.tanh(td / V_EPS)
        fr[idx, idx, 2] = 1.0
        return Y

    def batch(self, theta: np.ndarray, theta_dot: np.ndarray, theta_ddot: np.ndarray) -> np.ndarray:
        """Y at n states (rows of the (n, s) arrays), (n, s, p): the same values as ``stack``,
        the kinematics of every state in one numba loop (each state's assembly warm-started
        from the previous one: give neighbouring states in sequence, e.g. a trajectory), the
        rest vectorised over the states. A state the loop cannot assemble from its
        predecessor goes through the assembler's sub-stepped walk."""
        mech = self.mech
        th = np.ascontiguousarray(theta, dtype=float).reshape(-1, mech.n_act)
        td = np.ascontiguousarray(theta_dot, dtype=float).reshape(th.shape)
        tdd = np.ascontiguousarray(theta_ddot, dtype=float).reshape(th.shape)
        n, s, nb = len(th), mech.n_act, mech.n_bodies
        for t in th:
            checked_theta(mech, t)
        X, R = np.empty((n, nb, 3)), np.empty((n, nb, 3, 3))
        J, A = np.empty((n, 6 * nb, s)), np.empty((n, 6 * nb))
        V = np.empty((n, 6 * nb))
        asm = self.assembler
        k = 0
        while k < n:
            if k > 0 or np.any(th[0] != asm.theta):
                x0, r0, t0 = (X[k - 1], R[k - 1], th[k - 1]) if k else (asm.cfg.X, asm.cfg.R, asm.theta)
                asm.theta, asm.cfg = t0.copy(), Config(x0.copy(), r0.copy())
                cfg = asm.solve(th[k])  # the sub-stepped walk (raises AssemblyError when it cannot)
            else:
                cfg = asm.cfg
            X[k], R[k] = cfg.X, cfg.R
            k = _kinematics(mech.prim_i, mech.prim_f, mech.square_rows, mech.n_rows, th, td, tdd, k, asm.tol,
                            asm.max_iter, X, R, J, V, A)
            if k < 0:
                k = -k - 1
                raise AssemblyError(f"{mech.name} at theta = {np.round(th[k], 9).tolist()}: the constraint "
                                    f"Jacobian with the actuators locked is singular (no reduced model)")
        asm.theta, asm.cfg = th[-1].copy(), Config(X[-1].copy(), R[-1].copy())
        return self._assemble_rows(R, J.reshape(n, nb, 6, s), V.reshape(n, nb, 6), A.reshape(n, nb, 6), td)

    def _assemble_rows(self, R, J, V, A, td) -> np.ndarray:
        """Y (n, s, p) from rotations R (n, nb, 3, 3), velocity Jacobians J (n, nb, 6, s),
        velocities V and accelerations A (n, nb, 6): (centre of mass, angular), world frame."""
        mech = self.mech
        n, nb, _, s = J.shape
        Rt = np.swapaxes(R, -1, -2)
        cw = np.einsum("nbij,bj->nbi", R, self.com)
        w, alpha = V[..., 3:], A[..., 3:]
        a_o = A[..., :3] - np.cross(alpha, cw) - np.cross(w, np.cross(w, cw))
        Jb = np.empty_like(J)
        Jb[..., :3, :] = Rt @ (J[..., :3, :] + _skew(cw) @ J[..., 3:, :])
        Jb[..., 3:, :] = Rt @ J[..., 3:, :]
        ab = np.einsum("nbji,nbj->nbi", R, a_o - mech.gravity)
        Yb = body_wrench_regressor(ab, np.einsum("nbji,nbj->nbi", R, w), np.einsum("nbji,nbj->nbi", R, alpha))
        Y = np.zeros((n, s, self.n_params))
        Y[:, :, :10 * nb] = np.einsum("nbks,nbkp->nsbp", Jb, Yb).reshape(n, s, 10 * nb)
        idx = np.arange(s)
        c = 10 * nb + 3 * idx
        Y[:, idx, c] = td
        Y[:, idx, c + 1] = np.tanh(td / V_EPS)
        Y[:, idx, c + 2] = 1.0
        return Y

    def stack(self, theta: np.ndarray, theta_dot: np.ndarray, theta_ddot: np.ndarray) -> np.ndarray:
        """Y at n states (rows of the (n, s) arrays): (n, s, p), one state at a time."""
        return np.stack([self(a, b, c) for a, b, c in zip(theta, theta_dot, theta_ddot)])


@njit(cache=True)
def _kinematics(prim_i, prim_f, rows, nrow, th, td, tdd, k0, tol, max_iter, X, R, J, V, A):
    """From state k0 (X[k0], R[k0] assembled), for k = k0, k0 + 1, ...: the velocity Jacobian
    q_theta (J[k]), velocities V[k] = J td and accelerations A[k] = J tdd + the velocity-product
    term, then the assembly of state k + 1 by Newton from state k. Returns n when done, the
    index of a state whose Newton did not converge (to be walked to in sub-steps), or
    -(k + 1) when the square Jacobian at state k is singular."""
    n, s = th.shape
    m = rows.shape[0]
    phi = np.empty(nrow)
    jac = np.empty((nrow, m))
    jt = np.empty((nrow, s))
    gam = np.empty(nrow)
    LU = np.empty((m, m))
    piv = np.empty(m, dtype=np.int64)
    vp = np.empty((m, 1))
    dq = np.empty(m)
    dq_col = np.empty((m, 1))
    k = k0
    while k < n:
        C.evaluate(prim_i, prim_f, X[k], R[k], th[k], phi, jac, jt)
        for i in range(m):
            for j in range(m):
                LU[i, j] = jac[rows[i], j]
            for j in range(s):
                J[k, i, j] = -jt[rows[i], j]
        if not C.lu_factor(LU, piv):
            return -(k + 1)
        C.lu_solve(LU, piv, J[k])
        for i in range(m):
            v = 0.0
            for j in range(s):
                v += J[k, i, j] * td[k, j]
            V[k, i] = v
        nb = m // 6
        C.drift(prim_i, prim_f, X[k], R[k], np.ascontiguousarray(V[k].reshape((nb, 6))[:, :3]),
                np.ascontiguousarray(V[k].reshape((nb, 6))[:, 3:]), th[k], td[k], gam)
        for i in range(m):
            vp[i, 0] = -gam[rows[i]]
        C.lu_solve(LU, piv, vp)
        for i in range(m):
            a = vp[i, 0]
            for j in range(s):
                a += J[k, i, j] * tdd[k, j]
            A[k, i] = a
        if k + 1 == n:
            return n
        # predict with q_theta (eq. 12), correct by chord Newton on the factors of state k
        for i in range(m):
            dq[i] = 0.0
            for j in range(s):
                dq[i] += J[k, i, j] * (th[k + 1, j] - th[k, j])
        C.step_config(X[k], R[k], dq, X[k + 1], R[k + 1])
        ok = False
        for _ in range(CHORD_ITERATIONS):
            C.evaluate(prim_i, prim_f, X[k + 1], R[k + 1], th[k + 1], phi, jac, jt)
            res = 0.0
            for i in range(nrow):
                res = max(res, abs(phi[i]))
            if res < tol:
                ok = True
                break
            if not res < 1e-3:  # NaN or far off: the full Newton
                break
            for i in range(m):
                dq_col[i, 0] = -phi[rows[i]]
            C.lu_solve(LU, piv, dq_col)
            C.step_config(X[k + 1], R[k + 1], dq_col[:, 0].copy(), X[k + 1], R[k + 1])
        if not ok:
            X[k + 1] = X[k]
            R[k + 1] = R[k]
            res, _ = C.newton(prim_i, prim_f, rows, X[k + 1], R[k + 1], th[k], th[k + 1], tol, max_iter, 0.1,
                              phi, jac, jt)
            if not res < tol:
                return k + 1
        k += 1
    return n


__all__ = ["ACTUATOR_PARAMS", "BODY_PARAMS", "Regressor", "body_from_parameters", "body_parameters",
           "body_wrench_regressor", "inertia_about_origin", "model_parameters", "parameter_names"]
