"""Assembly at any actuator configuration: Newton-Raphson on the stacked constraints from the
last solution (the paper's eq. 12), on the branch of the description's assembly guess."""

from __future__ import annotations

import numpy as np

from . import constraints as C
from .mechanism import AssemblyError, Config, Mechanism


def checked_theta(mech: Mechanism, theta) -> np.ndarray:
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
        theta = checked_theta(self.mech, theta)
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
