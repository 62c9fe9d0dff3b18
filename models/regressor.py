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

from pkrt.rt.core.friction import V_EPS

from . import constraints as C
from .description import Description
from .mechanism import Mechanism
from .reduction import Assembler, AssemblyError, _checked_theta

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
    """Newton-Euler regressor (nb, 6, 10) in body-frame components: (F, N) about the frame
    origin = Yb (m, m c, I_origin), given the origin's acceleration minus gravity ``a``, the
    angular velocity ``w`` and acceleration ``alpha`` (all (nb, 3), body frame).

    F = m a + alpha x mc + w x (w x mc);  N = I alpha + w x (I w) + mc x a."""
    nb = a.shape[0]
    Y = np.zeros((nb, 6, 10))
    Sw = _skew(w)
    Y[:, :3, 0] = a
    Y[:, :3, 1:4] = _skew(alpha) + Sw @ Sw
    Y[:, 3:, 1:4] = -_skew(a)
    Y[:, 3:, 4:] = _inertia_map(alpha) + Sw @ _inertia_map(w)
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
        theta = _checked_theta(mech, theta)
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

    def stack(self, theta: np.ndarray, theta_dot: np.ndarray, theta_ddot: np.ndarray) -> np.ndarray:
        """Y at n states (rows of the (n, s) arrays): (n, s, p)."""
        return np.stack([self(a, b, c) for a, b, c in zip(theta, theta_dot, theta_ddot)])


__all__ = ["ACTUATOR_PARAMS", "BODY_PARAMS", "Regressor", "body_from_parameters", "body_parameters",
           "body_wrench_regressor", "inertia_about_origin", "model_parameters", "parameter_names"]
