"""Whole-box accuracy of a tree: random states, the diagonal, and a stress set on the box's
faces, edges and corners (where random sampling rarely looks and the worst errors sit).

Same definitions as ``pkrt tree verify``: coefficient error max_o |f_hat_o - f_o| / scale_o
(the tree header's output scales), torque error |tau_hat_i - tau_i| / max |tau_i| over all the
states compared, velocities and accelerations uniform within the verification bounds, face
jumps from ``verify.face_jumps``. Used by the accuracy benchmark, the shipped-tree tests
and ``shipped``.
"""

from __future__ import annotations

import itertools

import numpy as np

from pkrt.rt.core.tree import OUT_OF_DOMAIN, Tree

from ..kinematics.mechanism import Mechanism
from .outputs import ACCELERATION_RANGES_PER_S2, VELOCITY_RANGES_PER_S, tree_outputs
from .sampling import SampleEvaluator, spatial_order
from .splines import tau_of_flat
from .verify import face_jumps


def stress_thetas(lo: np.ndarray, hi: np.ndarray, per_line: int = 41) -> np.ndarray:
    """Points packed on the box's boundary: the corners, ``per_line`` points along every edge,
    and for s >= 3 a per_line-square grid on every 2-d face; plus the same at 1 % and 3 % of
    the range inside (the layer where a boundary-driven error peaks)."""
    s = len(lo)
    u = np.linspace(0.0, 1.0, per_line)
    pts = []
    for inset in (0.0, 0.01, 0.03):
        ends = (inset, 1.0 - inset)
        for free in range(min(s, 2) + 1):  # 0: corners, 1: edges, 2: faces
            for axes in itertools.combinations(range(s), free):
                fixed = [a for a in range(s) if a not in axes]
                for corner in itertools.product(ends, repeat=len(fixed)):
                    for vals in itertools.product(u, repeat=free):
                        p = np.empty(s)
                        p[fixed] = corner
                        p[list(axes)] = vals
                        pts.append(p)
    U = np.unique(np.array(pts), axis=0)
    return lo + (hi - lo) * U


def accuracies(trees: list[Tree], mech: Mechanism, random: int = 2000, diagonal: int = 1001,
               per_line: int = 41, seed: int = 0, jobs: int | None = None) -> list[dict]:
    """Worst errors of trees over the same box (the first tree's) at the same states: random,
    the diagonal and the stress set (see the module); the exact model is evaluated once."""
    s, lo, hi = trees[0].s, trees[0].lo, trees[0].hi
    rng = np.random.default_rng(seed)
    sets = {"random": lo + (hi - lo) * rng.random((random, s)),
            "diagonal": lo + (hi - lo) * np.linspace(0.0, 1.0, diagonal)[:, None],
            "stress": stress_thetas(lo, hi, per_line)}
    theta = np.concatenate(list(sets.values()))
    which = np.concatenate([np.full(len(v), k) for k, v in enumerate(sets.values())])
    order = spatial_order(theta, lo, hi)
    theta, which = theta[order], which[order]
    width = hi - lo
    td = VELOCITY_RANGES_PER_S * width * (2 * rng.random(theta.shape) - 1)
    tdd = ACCELERATION_RANGES_PER_S2 * width * (2 * rng.random(theta.shape) - 1)
    with SampleEvaluator(mech, jobs, False, desc="accuracy") as ev:
        F, _ = ev.evaluate(theta)
    return [_errors(tree, sets, theta, which, td, tdd, F) for tree in trees]


def accuracy(tree: Tree, mech: Mechanism, **kw) -> dict:
    """``accuracies`` of one tree."""
    return accuracies([tree], mech, **kw)[0]


def _errors(tree: Tree, sets: dict, theta, which, td, tdd, F) -> dict:
    Fh, status = tree_outputs(tree, theta)
    ok = np.all(np.isfinite(F), axis=1) & (status != OUT_OF_DOMAIN)
    scale = np.asarray(tree.header["output_scale"], float)
    coef = (np.abs(Fh - F) / scale).max(axis=1)
    tau, tau_h = tau_of_flat(F[ok], td[ok], tdd[ok]), tau_of_flat(Fh[ok], td[ok], tdd[ok])
    tscale = np.abs(tau).max(axis=0)
    tau_err = np.full(len(theta), np.nan)
    tau_err[ok] = (np.abs(tau_h - tau) / np.where(tscale > 0, tscale, 1.0)).max(axis=1)
    out = {"states": int(len(theta)), "compared": int(ok.sum())}
    for k, name in enumerate(sets):
        m = ok & (which == k)
        out[f"coef_{name}"] = float(coef[m].max()) if m.any() else None
        out[f"tau_{name}"] = float(tau_err[m].max()) if m.any() else None
    i = int(np.nanargmax(np.where(ok, coef, np.nan)))
    out["max_rel_coef_error"] = float(coef[ok].max())
    out["p99_rel_coef_error"] = float(np.percentile(coef[ok], 99))
    out["worst_theta"] = theta[i].tolist()
    out["max_rel_tau_error"] = float(tau_err[ok].max())
    out["max_face_jump"] = face_jumps(tree, scale)[0]
    out["bytes"] = tree.nbytes
    return out


__all__ = ["accuracy", "accuracies", "stress_thetas"]
