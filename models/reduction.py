"""Assembly at any actuator configuration, and the exact reduced model H, D, p_ext.

Equation of motion in actuator coordinates (``shared/reference-models.md``):
H(theta) thetadd + D(theta) [td td] - p_ext(theta) = tau, with
[td td] = (td1^2, td1 td2, ..., td1 ts, td2^2, ..., ts^2) (upper triangle, row by row).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pkrt.rt.core.tree import quad_velocities

from . import constraints as C
from .mechanism import AssemblyError, Config, Mechanism


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


def _checked_theta(mech: Mechanism, theta) -> np.ndarray:
    """theta as a new float array of the actuators' size, finite (the kernels do not check)."""
    t = np.array(theta, dtype=float).reshape(-1)
    if t.shape != (mech.n_act,) or not np.all(np.isfinite(t)):
        raise AssemblyError(f"cannot assemble {mech.name} at theta = {np.asarray(theta).tolist()}: "
                            f"expected {mech.n_act} finite value(s)")
    return t


class Assembler:
    """Newton-Raphson assembly with prediction from the last solution (paper eq. 12),
    damping, step caps and sub-stepping so the solution stays on the guess's branch.

    Holds mutable warm-start state; one per thread or process.
    """

    def __init__(self, mech: Mechanism, substep: float = 0.05, tol: float = 1e-12,
                 max_iter: int = 25):
        self.mech = mech
        self.tol = tol
        self.max_iter = max_iter
        self.max_substep = substep * (mech.ranges[:, 1] - mech.ranges[:, 0])
        self._work = (np.empty(mech.n_rows), np.empty((mech.n_rows, mech.n_coords)),
                      np.empty((mech.n_rows, mech.n_act)))
        self.reset()

    def reset(self) -> None:
        self.theta = self.mech.theta_ref.copy()
        self.cfg = self.mech.ref_config.copy()

    def q_theta(self, cfg: Config, theta: np.ndarray) -> np.ndarray:
        _, jac, jt = self.mech.evaluate(cfg, theta)
        rows = self.mech.square_rows
        return -np.linalg.solve(jac[rows], jt[rows])

    def _newton(self, cfg: Config, theta_from: np.ndarray, theta: np.ndarray
                ) -> tuple[Config, float, float]:
        """Predict from cfg (assembled at theta_from) and correct at theta. Returns the
        configuration, max |phi| and, on failure only, the inverse condition number of the
        square Jacobian there (0.0 on success)."""
        mech = self.mech
        rows = mech.square_rows
        X, R = cfg.X.copy(), cfg.R.copy()
        phi, jac, jt = self._work
        res, _ = C.newton(mech.prim_i, mech.prim_f, rows, X, R, theta_from, theta, self.tol,
                          self.max_iter, 0.1, phi, jac, jt)
        new = Config(X, R)
        if res < self.tol:
            return new, res, 0.0
        if not np.all(np.isfinite(new.X)) or not np.all(np.isfinite(new.R)):
            return cfg, np.inf, 0.0  # diverged: report from the start point's side
        phi, jac, _ = mech.evaluate(new, theta)
        sv = np.linalg.svd(jac[rows], compute_uv=False)
        return new, float(np.abs(phi).max()), float(sv[-1] / sv[0]) if sv[0] > 0 else 0.0

    def solve(self, theta) -> Config:
        """Assemble at theta, walking from the last solution in sub-steps."""
        theta = _checked_theta(self.mech, theta)
        start_theta, start_cfg = self.theta, self.cfg
        n = int(np.ceil(np.max(np.abs(theta - start_theta) / self.max_substep))) if len(theta) else 1
        n = max(n, 1)
        cfg, th = start_cfg, start_theta
        k, halvings = 0, 0
        while k < n:
            target = start_theta + (theta - start_theta) * (k + 1) / n
            new, res, cond = self._newton(cfg, th, target)
            if res >= self.tol:
                if halvings < 6:
                    # restart the walk with twice as many sub-steps from the last good point
                    start_theta, start_cfg = th, cfg
                    n, k, halvings = 2 * (n - k), 0, halvings + 1
                    continue
                raise AssemblyError(
                    f"cannot assemble {self.mech.name} at theta = {np.round(theta, 9).tolist()}: "
                    f"Newton residual {res:.3g} after {self.max_iter} iterations, "
                    f"Jacobian inverse condition number {cond:.3g}")
            cfg, th = new, target
            k += 1
        self.theta, self.cfg = theta.copy(), cfg
        return cfg.copy()


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
    theta = _checked_theta(mech, theta)
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
        theta = _checked_theta(self.mech, theta)
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


__all__ = ["Assembler", "AssemblyError", "ExactModel", "Reduced", "reduce_at", "output_layout",
           "flatten_outputs", "unflatten_outputs", "quadratic_velocities", "velocity_pairs"]
