"""A tree's flat outputs (H, D, p_ext) against the exact model's: groups, scales, tree and exact
torques at states (offline helpers of the build, the verification and the plots)."""

from __future__ import annotations

import numpy as np

from pkrt.rt.core.tree import Tree, eval_outputs, eval_tau

from ..reduction.exact import quadratic_velocities, unflatten_outputs

# default verification bounds, per axis, as multiples of the actuator range (hi - lo)
VELOCITY_RANGES_PER_S = 2.0  # |theta_dot_i| <= 2 (hi_i - lo_i) / s
ACCELERATION_RANGES_PER_S2 = 20.0  # |theta_ddot_i| <= 20 (hi_i - lo_i) / s^2


def output_groups(s: int) -> dict[str, slice]:
    """Slices of the flat outputs: H, D, p_ext."""
    m = s * (s + 1) // 2
    return {"H": slice(0, m), "D": slice(m, m + s * m), "p_ext": slice(m + s * m, m + s * m + s)}


def output_scale(F: np.ndarray, s: int, floor: float = 1e-6) -> np.ndarray:
    """Per output: largest |f| over the finite rows of F, floored at ``floor`` times the
    largest of its group (so structurally zero outputs do not divide by round-off)."""
    finite = np.all(np.isfinite(F), axis=1)
    big = np.abs(F[finite]).max(axis=0) if finite.any() else np.ones(F.shape[1])
    out = big.copy()
    for sl in output_groups(s).values():
        g = big[sl].max() if big[sl].size else 0.0
        out[sl] = np.maximum(big[sl], floor * g if g > 0 else 1.0)
    return out


def tree_outputs(tree: Tree, thetas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Tree outputs (n, n_out) and status codes (n,) at thetas (offline helper)."""
    T = tree.arrays
    F = np.empty((len(thetas), tree.coef.shape[1]))
    st = np.empty(len(thetas), dtype=np.int64)
    for i, th in enumerate(np.ascontiguousarray(thetas, dtype=float)):
        st[i] = eval_outputs(T, th, F[i])
    return F, st


def tree_taus(tree: Tree, theta: np.ndarray, td: np.ndarray, tdd: np.ndarray) -> np.ndarray:
    """tau (n, s) from the tree's eval_tau kernel at the states (theta, td, tdd)."""
    s = tree.s
    H, D, p = np.empty((s, s)), np.empty((s, s * (s + 1) // 2)), np.empty(s)
    out = np.empty((len(theta), s))
    for k in range(len(theta)):
        eval_tau(tree.arrays, theta[k], td[k], tdd[k], H, D, p, out[k])
    return out


def exact_taus(F: np.ndarray, td: np.ndarray, tdd: np.ndarray, s: int) -> np.ndarray:
    """tau = H tdd + D [td td] - p_ext (n, s) from exact flat outputs F (n, n_out)."""
    out = np.empty((len(F), s))
    for k in range(len(F)):
        H, D, p = unflatten_outputs(F[k], s)
        out[k] = H @ tdd[k] + D @ quadratic_velocities(td[k]) - p
    return out
