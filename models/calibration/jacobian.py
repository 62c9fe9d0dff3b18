"""The tool's pose at measured actuator configurations and the identification Jacobian: its
derivative with respect to every geometric parameter (``parameters``) and to the pose of the
instrument that measures it.

At an assembled configuration q of the model at ``delta`` the square constraint rows hold,
Phi(q, theta, delta) = 0, so dq/d delta = -Phi_q^-1 Phi_delta (theta held: the actuators are
measured), and the tool moves by J_tool dq/d delta plus the direct effect of the tool's own
parameters. Phi_delta is exact (``GeometricParameters.constraint_gradient``); one solve with
Phi_q^T per pose gives all columns.

The instrument (a laser tracker) reads the tool in its own frame, whose pose (R, t) in the
machine's base frame is unknown: a position p reads R^T (p - t), a tool frame R_t reads
R^T R_t. Its pose is estimated with the geometry, as R = exp([psi]x) R0, t = t0 + dt. Units:
m, rad.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pkrt.rt.core.errors import UserError

from ..kinematics import constraints as C
from ..kinematics.assembly import Assembler
from ..kinematics.mechanism import AssemblyError, Config
from ..kinematics.taskspace import Tool, rotation_vector
from .parameters import GeometricParameters, left_jacobian, skew


@dataclass(frozen=True)
class Frame:
    """A rigid pose: rotation R (frame to base) and origin t (m, base frame)."""
    R: np.ndarray
    t: np.ndarray

    @staticmethod
    def identity() -> "Frame":
        return Frame(np.eye(3), np.zeros(3))


class PoseModel:
    """The tool at actuator configurations ``theta`` (N, s) for any parameter change: each
    pose is assembled by Newton from its last solution (first by walking from the reference
    assembly, on the description's branch)."""

    def __init__(self, params: GeometricParameters, theta: np.ndarray):
        self.params = params
        self.theta = np.atleast_2d(np.asarray(theta, float))
        asm = Assembler(params.mech)
        self.cfgs: list[Config] = []
        for i, th in enumerate(self.theta):
            try:
                self.cfgs.append(asm.solve(th))
            except AssemblyError as e:
                raise UserError(f"pose {i + 1}: {e}") from None
        mech = params.mech
        self._work = (np.empty(mech.n_rows), np.empty((mech.n_rows, mech.n_coords)),
                      np.empty((mech.n_rows, mech.n_act)))

    @property
    def n(self) -> int:
        return len(self.theta)

    def _assemble(self, mech, i: int) -> Config:
        """Pose i of the model ``mech``, by Newton from its last solution."""
        cfg = self.cfgs[i]
        X, R = cfg.X.copy(), cfg.R.copy()
        th = self.theta[i]
        res, _ = C.newton(mech.prim_i, mech.prim_f, mech.square_rows, X, R, th, th, 1e-12, 30, 0.1, *self._work)
        if not res < 1e-10:
            raise UserError(f"pose {i + 1} cannot be assembled with these parameters (residual {res:.3g}): the "
                            f"geometry moved too far from the description's")
        self.cfgs[i] = Config(X, R)
        return self.cfgs[i]

    def poses(self, delta) -> tuple[np.ndarray, np.ndarray]:
        """Tool positions (N, 3) and tool frames (N, 3, 3) in the base frame at ``delta``."""
        mech, tool = self.params.apply(delta)
        P, Rt = np.empty((self.n, 3)), np.empty((self.n, 3, 3))
        for i in range(self.n):
            cfg = self._assemble(mech, i)
            P[i], Rt[i] = tool_frame(cfg, tool)
        return P, Rt

    def jacobian(self, delta) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Positions (N, 3), frames (N, 3, 3) and their derivatives J (N, 6, n): rows x, y, z
        of the position, then the tool frame's rotation (world components)."""
        delta = np.asarray(delta, float)
        mech, tool = self.params.apply(delta)
        rows = mech.square_rows
        P, Rt = np.empty((self.n, 3)), np.empty((self.n, 3, 3))
        J = np.empty((self.n, 6, self.params.n))
        b = tool.body
        fields = self.params.field_map(mech.prim_f, delta)[rows]
        for i in range(self.n):
            cfg = self._assemble(mech, i)
            th = self.theta[i]
            P[i], Rt[i] = tool_frame(cfg, tool)
            _, jac, _ = mech.evaluate(cfg, th)
            Jt = np.zeros((6, mech.n_coords))
            r = cfg.R[b] @ tool.r_local
            Jt[:3, 6 * b:6 * b + 3] = np.eye(3)
            Jt[:3, 6 * b + 3:6 * b + 6] = -skew(r)  # v + w x r
            Jt[3:, 6 * b + 3:6 * b + 6] = np.eye(3)
            lam = np.linalg.solve(jac[rows].T, Jt.T)  # (n, 6)
            G = self.params.constraint_gradient(self.params.row_gradients(mech.prim_f, cfg, th)[rows], fields)
            J[i] = -lam.T @ G + self.params.tool_gradient(cfg, tool, delta)
        return P, Rt, J


def tool_frame(cfg: Config, tool: Tool) -> tuple[np.ndarray, np.ndarray]:
    """The tool point (m) and the tool frame R_body R_local in the base frame."""
    Rb = cfg.R[tool.body]
    return cfg.X[tool.body] + Rb @ tool.r_local, Rb @ tool.R_local


# -- the instrument ------------------------------------------------------------------------

def read(P: np.ndarray, Rt: np.ndarray, frame: Frame) -> tuple[np.ndarray, np.ndarray]:
    """What an instrument at ``frame`` reads: positions (N, 3) and frames (N, 3, 3) in its frame."""
    return (P - frame.t) @ frame.R, np.einsum("ji,njk->nik", frame.R, Rt)


def residuals(P, Rt, frame: Frame, y_pos, y_rot, orientation: bool) -> np.ndarray:
    """Reading minus measurement per pose (N, 3 or 6): position (m), then the rotation vector
    of R_read R_measured^T (rad)."""
    pos, rot = read(P, Rt, frame)
    out = [pos - y_pos]
    if orientation:
        out.append(np.array([rotation_vector(a @ m.T) for a, m in zip(rot, y_rot)]))
    return np.concatenate(out, axis=1)


def residual_jacobian(P, Rt, J, frame: Frame, y_rot, orientation: bool, psi=np.zeros(3)
                      ) -> tuple[np.ndarray, np.ndarray]:
    """The derivatives of ``residuals`` (N, m, .) with respect to the geometry (from J, the
    tool's Jacobian) and to the instrument's pose increments (psi, dt) (N, m, 6), the instrument
    at exp([psi]x) R0 (``psi`` its current turn)."""
    n = len(P)
    m = 6 if orientation else 3
    RT = frame.R.T
    Jl = left_jacobian(psi)
    Jg = np.empty((n, m, J.shape[2]))
    Jf = np.empty((n, m, 6))
    Jg[:, :3] = np.einsum("ij,njk->nik", RT, J[:, :3])
    for i in range(n):
        Jf[i, :3, :3] = RT @ skew(P[i] - frame.t) @ Jl
        Jf[i, :3, 3:] = -RT
    if orientation:
        for i in range(n):
            e = rotation_vector(RT @ Rt[i] @ y_rot[i].T)
            Li = np.linalg.inv(left_jacobian(e))
            Jg[i, 3:] = Li @ RT @ J[i, 3:]
            Jf[i, 3:, :3] = -Li @ RT @ Jl
            Jf[i, 3:, 3:] = 0.0
    return Jg, Jf


def register(P: np.ndarray, y_pos: np.ndarray) -> Frame:
    """The instrument's pose that best maps its readings onto model positions (least squares,
    Kabsch): P ~ R y + t."""
    cp, cy = P.mean(axis=0), y_pos.mean(axis=0)
    H = (y_pos - cy).T @ (P - cp)
    U, _, Vt = np.linalg.svd(H)
    D = np.diag([1.0, 1.0, np.sign(np.linalg.det(Vt.T @ U.T))])
    R = Vt.T @ D @ U.T
    return Frame(R, cp - R @ cy)
