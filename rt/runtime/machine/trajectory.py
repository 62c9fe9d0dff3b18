"""Reference trajectories, planned once before the loop starts.

Every trajectory is sampled at the loop rate into arrays ``pos``, ``vel``, ``acc`` of shape
(n, s) (actuator units: m or rad and their derivatives), so a cycle only indexes them.
Kinds: joint-space quintic point-to-point moves and actuator CSV files resampled to the loop
rate; task-space paths are planned from the model before the run (``pkrt.rt.app.reference``).
The ``Planned`` type and the path maths shared with the offline planners live in ``plan`` (core).
"""

from __future__ import annotations

import numpy as np

from pkrt.rt.core.errors import UserError
from pkrt.rt.core.plan import Planned, plan_moves, read_csv_samples  # noqa: F401 (plan_moves: the runtime's name for it)


def quintic_duration(delta: np.ndarray, vmax: np.ndarray, amax: np.ndarray) -> float:
    """Shortest quintic move time meeting per-axis velocity and acceleration limits."""
    d = np.abs(delta)
    t_v = 1.875 * d / vmax
    t_a = np.sqrt(5.7735026919 * d / amax)  # peak |s''| of the quintic is 10/sqrt(3)
    return float(max(np.max(t_v), np.max(t_a), 1e-3))


def load_trajectory_csv(path: str, rate_hz: float, axes: list[str]) -> Planned:
    """A CSV with a header: ``t`` then one column per actuator (named as the model's
    actuators). Resampled to the loop rate by a cubic spline (velocities and accelerations from
    the spline). Task-space CSVs (x, y, z, ...) are planned from the model before the run
    (``pkrt.rt.app.reference``)."""
    head, P, Pd, Pdd = read_csv_samples(path, rate_hz, [list(axes)])
    return Planned(rate_hz, P, Pd, Pdd, {"kind": "csv", "path": str(path), "columns": head})


def validate(plan: Planned, lo: np.ndarray, hi: np.ndarray, vmax: np.ndarray, amax: np.ndarray,
             axes: list[str], in_domain=None, k0: int = 0) -> None:
    """Refuse a reference outside the actuator ranges, the model's domain or the velocity and
    acceleration limits, naming the time and axis at fault (``k0``: the first row's index, when
    ``plan`` is a block of a longer reference)."""
    checks = [("below its lower limit", plan.pos < lo - 1e-12, lo),
              ("above its upper limit", plan.pos > hi + 1e-12, hi),
              ("exceeds the velocity limit", np.abs(plan.vel) > vmax * (1 + 1e-9), vmax),
              ("exceeds the acceleration limit", np.abs(plan.acc) > amax * (1 + 1e-9), amax)]
    for what, bad, lim in checks:
        if np.any(bad):
            k, i = np.argwhere(bad)[0]
            val = (plan.pos if "limit" in what and "velocity" not in what and "acceleration" not in what
                   else plan.vel if "velocity" in what else plan.acc)[k, i]
            raise UserError(f"trajectory refused: at t = {(k0 + k) / plan.rate_hz:.4f} s axis {axes[i]} {what} "
                            f"({val:.6g} vs {lim[i]:.6g})")
    if not np.all(np.isfinite(plan.pos)):
        raise UserError("trajectory refused: non-finite values")
    if in_domain is not None:
        ok = in_domain(plan.pos)
        if not np.all(ok):
            k = int(np.argmin(ok))
            raise UserError(f"trajectory refused: at t = {(k0 + k) / plan.rate_hz:.4f} s the position "
                            f"{np.round(plan.pos[k], 6).tolist()} is outside the model's domain")
