"""The exact reduced model H, D, p_ext at any actuator configuration.

Equation of motion in actuator coordinates (``shared/reference-models.md``):
H(theta) thetadd + D(theta) [td td] - p_ext(theta) = tau, with
[td td] = (td1^2, td1 td2, ..., td1 ts, td2^2, ..., ts^2) (upper triangle, row by row).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pkrt.rt.core.tree import quad_velocities

from ..kinematics import constraints as C
from ..kinematics.assembly import Assembler, checked_theta
from ..kinematics.mechanism import AssemblyError, Config, Mechanism


def velocity_pairs(s: int) -> list[tuple[int, int]]:
    """Index pairs (j, k), j <= k, in the order of [td td]."""
    return [(j, k) for j in range(s) for k in range(j, s)]


def quadratic_velocities(theta_dot: np.ndarray) -> np.ndarray:
    """[td td] of ``shared/reference-models.md``, in ``velocity_pairs`` order (the core's
    kernel ``pkrt.rt.core.tree.quad_velocities``)."""
    td = np.asarray(theta_dot, dtype=float)
    out = np.empty(len(td) * (len(td) + 1) // 2)
    quad_velocities(td, out)
    return out


@dataclass(frozen=True)
class Reduced:
    """Exact reduced model at one configuration (SI; N or N m per actuator)."""
    theta: np.ndarray
    H: np.ndarray  # (s, s)
    D: np.ndarray  # (s, s(s+1)/2)
    p_ext: np.ndarray  # (s,)
    q_theta: np.ndarray  # (n, s)
    config: Config

    def h(self, theta_dot) -> np.ndarray:
        return self.D @ quadratic_velocities(np.asarray(theta_dot, float))

    def tau(self, theta_dot, theta_ddot) -> np.ndarray:
        return self.H @ np.asarray(theta_ddot, float) + self.h(theta_dot) - self.p_ext


def reduce_at(mech: Mechanism, cfg: Config, theta: np.ndarray) -> Reduced:
    """q_theta (eq. 11), H (eq. 18), D = q_theta^T (A + M B) (eq. 28) and p_ext (eq. 16).

    A and B are the quadratic forms of the gyroscopic forces and of the analytic constraint
    drift, extracted exactly by polarisation (they are quadratic in theta_dot).
    """
    theta = checked_theta(mech, theta)
    s = mech.n_act
    qt = np.empty((mech.n_coords, s))
    H = np.empty((s, s))
    D = np.empty((s, s * (s + 1) // 2))
    p_ext = np.empty(s)
    if not C.reduce_kernel(mech.prim_i, mech.prim_f, mech.square_rows, cfg.X, cfg.R, mech.masses,
                           mech.inertias, mech.gravity, theta, qt, H, D, p_ext):
        raise AssemblyError(f"{mech.name} at theta = {np.round(theta, 9).tolist()}: the constraint "
                            f"Jacobian with the actuators locked is singular (no reduced model)")
    return Reduced(theta, H, D, p_ext, qt, cfg)


class ExactModel:
    """theta -> exact Reduced, assembling with warm starts (one per process)."""

    def __init__(self, mech: Mechanism):
        self.mech = mech
        self.assembler = Assembler(mech)

    def __call__(self, theta) -> Reduced:
        theta = checked_theta(self.mech, theta)
        return reduce_at(self.mech, self.assembler.solve(theta), theta)

    def outputs(self, theta) -> np.ndarray:
        """Flat output vector f = (H upper triangle row by row, D row by row, p_ext)."""
        r = self(theta)
        return flatten_outputs(r.H, r.D, r.p_ext)


def output_layout(s: int) -> list[str]:
    """Names of the flat outputs, in order: H_jk (j <= k), D_i_c, p_ext_i."""
    names = [f"H[{j},{k}]" for j, k in velocity_pairs(s)]
    names += [f"D[{i},{c}]" for i in range(s) for c in range(s * (s + 1) // 2)]
    names += [f"p_ext[{i}]" for i in range(s)]
    return names


def flatten_outputs(H: np.ndarray, D: np.ndarray, p_ext: np.ndarray) -> np.ndarray:
    s = H.shape[0]
    iu = np.triu_indices(s)
    return np.concatenate([H[iu], D.ravel(), p_ext])


def unflatten_outputs(f: np.ndarray, s: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    m = s * (s + 1) // 2
    H = np.empty((s, s))
    iu = np.triu_indices(s)
    H[iu] = f[:m]
    H.T[iu] = f[:m]
    D = f[m:m + s * m].reshape(s, m)
    return H, D, f[m + s * m:m + s * m + s].copy()


__all__ = ["ExactModel", "Reduced", "reduce_at", "output_layout", "flatten_outputs", "unflatten_outputs",
           "quadratic_velocities", "velocity_pairs"]
