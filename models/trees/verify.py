"""Verification of a tree against the exact model.

``verify_tree`` compares a tree with the exact model at seeded states (random, packed on the
box's boundary, on its diagonal), sampled with ``sampling.SampleEvaluator``, and reports the
distribution of the relative errors and where the worst sit (see its docstring for the
definitions and bounds). Everything goes through the public kernels (``eval_outputs``,
``eval_tau``), so it works for any tree kind; the faces between cells come from
``internal_faces``.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from pkrt.rt.core.errors import UserError
from pkrt.rt.core.tree import BOXES, OUT_OF_DOMAIN, SPLINE, Tree, n_outputs, spline_face_jumps

from ..kinematics.mechanism import Mechanism
from ..reduction.exact import output_layout
from .exact import MAX_SAMPLES
from .outputs import (ACCELERATION_RANGES_PER_S2, VELOCITY_RANGES_PER_S, exact_taus, output_groups, output_scale,
                      tree_outputs, tree_taus)
from .sampling import SampleEvaluator, spatial_order

STRESS_SAMPLES = 1000  # default states on the region's faces, edges and corners
DIAGONAL_SAMPLES = 201  # default states on the region's diagonal


# -- faces between cells: where a piecewise fit may step ----------------------------------------

def internal_faces(tree: Tree) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """Faces between cells as (axis d, lo, hi): the face is lo <= theta <= hi with
    lo[d] = hi[d] the face's position on axis d. Box trees: every leaf's upper face on every
    axis where it is not on the root box's boundary. A tree kind without leaf boxes exposes its
    cell boundaries as ``tree.knots`` (per axis, sorted, lo and hi included): every interior
    knot plane, cell by cell."""
    faces = []
    if tree.kind == BOXES:
        for blo, bhi in tree.leaf_box:
            for d in range(tree.s):
                if bhi[d] < tree.hi[d]:
                    lo, hi = blo.copy(), bhi.copy()
                    lo[d] = bhi[d]
                    faces.append((d, lo, hi))
        return faces
    knots = spline_knot_planes(tree)
    cells = [list(zip(k[:-1], k[1:])) for k in knots]
    for d in range(tree.s):
        others = [k for k in range(tree.s) if k != d]
        for x in knots[d][1:-1]:
            for combo in itertools.product(*(cells[k] for k in others)):
                lo, hi = np.empty(tree.s), np.empty(tree.s)
                lo[d] = hi[d] = x
                for k, (a, b) in zip(others, combo):
                    lo[k], hi[k] = a, b
                faces.append((d, lo, hi))
    return faces


def spline_knot_planes(tree: Tree) -> list[np.ndarray]:
    """A spline tree's cell boundaries per axis (its distinct knots, lo and hi included)."""
    return [np.unique(tree.knots[a:a + n]) for a, n in zip(tree.knot_start, tree.knot_count)]


FACE_CHUNK = 4096  # face points evaluated at a time (4096 x 153 outputs x 8 B = 5 MB per array)


def face_jumps(tree: Tree, scale: np.ndarray, per_face: int = 3) -> tuple[float, int, list, str | None]:
    """Largest relative jump of any output across internal faces, measured through the
    public kernel: on a per_face^(s-1) grid inside each face, the tree is evaluated one
    rounding step below and one above the face's position (so the search lands in either
    cell whatever its tie rule); jump = |f_above - f_below| / scale. Points where either side
    is out of domain are skipped. Returns (max jump, faces checked, theta of the max, output)."""
    if tree.kind == SPLINE:  # both polynomial pieces at every interior knot plane, exactly
        worst, n, at = spline_face_jumps(tree.arrays, np.asarray(scale, float), per_face)
        return float(worst), int(n), at.tolist() if worst > 0 else [], None
    s = tree.s
    faces = internal_faces(tree)
    if not faces:
        return 0.0, 0, [], None
    fr = (np.arange(per_face) + 0.5) / per_face
    grid = np.array(list(itertools.product(fr, repeat=s - 1))) if s > 1 else np.zeros((1, 0))
    pts, axis = [], []
    for d, lo, hi in faces:
        others = [k for k in range(s) if k != d]
        p = np.repeat(lo[None, :], len(grid), axis=0)
        p[:, others] = lo[others] + (hi[others] - lo[others]) * grid
        pts.append(p)
        axis.append(np.full(len(grid), d))
    P, A = np.concatenate(pts), np.concatenate(axis)
    best: tuple[float, list, str | None] | None = None
    for c in range(0, len(P), FACE_CHUNK):  # bounded memory: s = 6 has 3^5 points per face
        Pc, Ac = P[c:c + FACE_CHUNK], A[c:c + FACE_CHUNK]
        rows = np.arange(len(Pc))
        below, above = Pc.copy(), Pc.copy()
        below[rows, Ac] = np.nextafter(Pc[rows, Ac], -np.inf)
        above[rows, Ac] = np.nextafter(Pc[rows, Ac], np.inf)
        Fb, sb = tree_outputs(tree, below)
        Fa, sa = tree_outputs(tree, above)
        ok = (sb != OUT_OF_DOMAIN) & (sa != OUT_OF_DOMAIN)
        if not ok.any():
            continue
        J = np.abs(Fa[ok] - Fb[ok]) / scale
        i, o = np.unravel_index(int(np.argmax(J)), J.shape)
        if best is None or J[i, o] > best[0]:  # the first maximum, as one argmax over all
            best = (float(J[i, o]), Pc[ok][i].tolist(), output_layout(s)[o])
    if best is None:
        return 0.0, len(faces), [], None
    return best[0], len(faces), best[1], best[2]


def parse_region(tree: Tree, region) -> tuple[np.ndarray, np.ndarray]:
    """Region as (lo, hi) per axis from 2 numbers (all axes) or 2 s numbers (lo1, hi1, ...)."""
    if region is None:
        return tree.lo.copy(), tree.hi.copy()
    r = np.asarray(region, float)
    s = tree.s
    if r.size == 2:
        r = np.tile(r, s)
    if r.size != 2 * s:
        raise UserError(f"--region needs 2 or {2 * s} numbers (lo,hi per axis), got {r.size}")
    lo, hi = r[0::2], r[1::2]
    if not np.all(lo < hi) or np.any(lo < tree.lo) or np.any(hi > tree.hi):
        raise UserError(f"--region must have lo < hi inside the tree's box "
                        f"{np.c_[tree.lo, tree.hi].tolist()}, got {np.c_[lo, hi].tolist()}")
    return lo, hi


# -- where to look: random states, the box's boundary, the diagonal -----------------------------

def stress_points(lo: np.ndarray, hi: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """n thetas packed on the boundary of [lo, hi], where piecewise fits err most: the 2^s
    corners first, then equal shares with s - 1 coordinates (edges), ..., 1 coordinate
    (faces) pinned at a bound (for s = 1: at an end), the others uniform. Half the pinned
    coordinates sit exactly on the bound, half a log-uniform 1e-4..1e-1 of the width inside."""
    s, w = len(lo), hi - lo
    corners = np.array(list(itertools.product(*zip(lo, hi))))[:n]
    rest = n - len(corners)
    levels = list(range(max(s - 1, 1), 0, -1))  # pinned coordinates per point
    parts = [corners]
    for j, k in enumerate(levels):
        m = rest // len(levels) + (1 if j < rest % len(levels) else 0)
        if m <= 0:
            continue
        u = rng.random((m, s))
        pinned = np.argsort(rng.random((m, s)), axis=1)[:, :k]
        upper = rng.integers(0, 2, (m, k)).astype(bool)
        inset = np.where(rng.random((m, k)) < 0.5, 0.0, 10.0 ** rng.uniform(-4, -1, (m, k)))
        rows = np.arange(m)[:, None]
        u[rows, pinned] = np.where(upper, 1.0 - inset, inset)
        parts.append(lo + w * u)
    return np.concatenate(parts) if parts else np.zeros((0, s))


def _quantiles(e: np.ndarray) -> dict:
    return {"p50": float(np.percentile(e, 50)), "p99": float(np.percentile(e, 99)),
            "max": float(e.max())}


def verify_tree(tree: Tree, mech: Mechanism, samples: int = 2000, seed: int = 0,
                region=None, jobs: int | None = None, progress: bool | None = None,
                evaluator: SampleEvaluator | None = None, diagonal: bool = False,
                stress: int = STRESS_SAMPLES, diagonal_samples: int = DIAGONAL_SAMPLES,
                worst: int = 5) -> dict:
    """Compare a tree with the exact model at seeded states.

    States: ``samples`` with theta uniform in the region (default: the tree's root box), plus
    ``stress`` on the region's faces, edges and corners (``stress_points``), plus
    ``diagonal_samples`` evenly spaced on its diagonal from the lower to the upper corner (the
    paper's Figure 5). ``diagonal``: only the diagonal, with ``samples`` points. theta_dot and
    theta_ddot are uniform within +/-VELOCITY_RANGES_PER_S and +/-ACCELERATION_RANGES_PER_S2
    times the actuator range per second (per second squared).

    Errors are relative to scales: coefficient errors |f_hat - f| / scale_o with scale_o the
    largest |f_o| known in the domain, i.e. the larger of the tree header's ``output_scale``
    (from the build samples) and the maximum over the states compared here; tau errors
    |tau_hat_i - tau_i| / max |tau_i| over the compared states. The error of a state is its
    largest over outputs (axes); the report gives their p50, p99 and maximum, the maximum per
    set and per group, and the ``worst`` states. Jumps across cell faces: ``face_jumps``, same
    scales. States the tree reports out of domain or the model cannot assemble are counted,
    not compared.
    """
    _check_counts(samples, stress, diagonal_samples)
    s = tree.s
    rlo, rhi = parse_region(tree, region)
    rng = np.random.default_rng(seed)
    width = tree.hi - tree.lo
    vmax, amax = VELOCITY_RANGES_PER_S * width, ACCELERATION_RANGES_PER_S2 * width
    diag = lambda n: rlo + (rhi - rlo) * np.linspace(0.0, 1.0, n)[:, None]  # noqa: E731
    if diagonal:
        sets = {"diagonal": diag(samples)}
    else:
        sets = {"random": rlo + (rhi - rlo) * rng.random((samples, s)),
                "stress": stress_points(rlo, rhi, stress, rng),
                "diagonal": diag(diagonal_samples)}
    theta = np.concatenate(list(sets.values()))
    set_id = np.concatenate([np.full(len(v), k) for k, v in enumerate(sets.values())])
    n = len(theta)
    td = vmax * (2 * rng.random((n, s)) - 1)
    tdd = amax * (2 * rng.random((n, s)) - 1)
    order = spatial_order(theta, rlo, rhi)
    theta, td, tdd, set_id = theta[order], td[order], tdd[order], set_id[order]

    if evaluator is None:
        with SampleEvaluator(mech, jobs, progress, desc="verify") as ev:
            F, sing = ev.evaluate(theta)
    else:
        F, sing = evaluator.evaluate(theta)
    Fh, status = tree_outputs(tree, theta)
    exact_ok = np.all(np.isfinite(F), axis=1)
    tree_ok = status != OUT_OF_DOMAIN
    both = exact_ok & tree_ok
    # the domain's maxima: states in out-of-domain cells (near a singularity) do not count
    stored = tree.header.get("output_scale")
    seen = output_scale(F[both], s) if both.any() or stored is None else np.asarray(stored, float)
    scale = seen if stored is None else np.maximum(np.asarray(stored, float), seen)
    report: dict = {
        "samples": samples, "seed": seed,
        "sampling": "diagonal" if diagonal else "uniform random + stress (faces, edges, corners) + diagonal",
        "sets": {k: len(v) for k, v in sets.items()},
        "region": np.c_[rlo, rhi].tolist(),
        "velocity_bound": vmax.tolist(), "acceleration_bound": amax.tolist(),
        "compared": int(both.sum()),
        "out_of_domain_samples": int((~tree_ok).sum()),
        "exact_failed_samples": int((~exact_ok).sum()),
        "tree_in_domain_but_exact_failed": int((tree_ok & ~exact_ok).sum()),
        "output_scale": "max of the tree header's and of the states evaluated",
        "scale_above_stored": (float(np.max(seen / np.asarray(stored, float)))
                               if stored is not None else None),
        "coef_scale": scale.tolist(),
    }
    if not both.any():
        report.update(max_rel_coef_error=None, max_rel_tau_error=None)
    else:
        compared = _Compared(theta[both], set_id[both], list(sets), worst)
        report.update(compared.coef_errors(np.abs(Fh[both] - F[both]) / scale, s))
        report.update(compared.tau_errors(tree, F[both], td[both], tdd[both], s))
    jump, faces, at, out = face_jumps(tree, scale)
    report["max_face_jump"] = jump
    report["faces_checked"] = faces
    report["worst_face_theta"] = at
    report["worst_face_output"] = out
    return report


def _check_counts(samples: int, stress: int, diagonal_samples: int) -> None:
    if not 1 <= samples <= MAX_SAMPLES:
        raise UserError(f"--samples must be in 1..{MAX_SAMPLES}, got {samples}")
    for name, v in (("--stress", stress), ("--diagonal-samples", diagonal_samples)):
        if not 0 <= v <= MAX_SAMPLES:
            raise UserError(f"{name} must be in 0..{MAX_SAMPLES}, got {v}")


@dataclass
class _Compared:
    """The states compared (``th``), the set each is from (``sid``: index into ``set_names``)
    and how many of the worst to report."""
    th: np.ndarray
    sid: np.ndarray
    set_names: list[str]
    worst: int

    def per_set(self, err: np.ndarray) -> dict:
        """The largest error of each set (None for a set with no state compared)."""
        return {g: float(err[self.sid == k].max()) if (self.sid == k).any() else None
                for k, g in enumerate(self.set_names)}

    def coef_errors(self, rel: np.ndarray, s: int) -> dict:
        """The report's coefficient errors from ``rel`` (n, n_out), relative errors."""
        th, sid, names = self.th, self.sid, output_layout(s)
        per_state, per_output = rel.max(axis=1), rel.argmax(axis=1)
        i = int(np.argmax(per_state))
        group_of = {o: g for g, sl in output_groups(s).items() for o in range(n_outputs(s))[sl]}
        return {
            "max_rel_coef_error": float(per_state[i]),
            "worst_output": names[per_output[i]],
            "worst_theta": th[i].tolist(),
            "mean_rel_coef_error": float(rel.mean()),
            "group_max_rel_error": {g: float(rel[:, sl].max()) for g, sl in output_groups(s).items()},
            "coef_error": _quantiles(per_state),
            "set_max_rel_coef_error": self.per_set(per_state),
            "worst_coef_states": [
                {"theta": th[k].tolist(), "set": self.set_names[sid[k]], "error": float(per_state[k]),
                 "output": names[per_output[k]], "group": group_of[int(per_output[k])]}
                for k in np.argsort(-per_state, kind="stable")[:self.worst]],
        }

    def tau_errors(self, tree: Tree, F: np.ndarray, td: np.ndarray, tdd: np.ndarray, s: int) -> dict:
        """The report's torque errors at the compared states (exact outputs ``F``, velocities
        ``td``, accelerations ``tdd``), relative to each axis's largest |tau|."""
        th, sid = self.th, self.sid
        tau = exact_taus(F, td, tdd, s)
        tau_h = tree_taus(tree, th, td, tdd)
        tscale = np.abs(tau).max(axis=0)
        tscale = np.where(tscale > 0, tscale, 1.0)
        trel = np.abs(tau_h - tau) / tscale
        t_state, t_axis = trel.max(axis=1), trel.argmax(axis=1)
        return {
            "max_rel_tau_error": float(t_state.max()),
            "tau_error": _quantiles(t_state),
            "tau_scale": tscale.tolist(),
            "set_max_rel_tau_error": self.per_set(t_state),
            "worst_tau_states": [
                {"theta": th[k].tolist(), "set": self.set_names[sid[k]], "error": float(t_state[k]),
                 "axis": int(t_axis[k]), "theta_dot": td[k].tolist(),
                 "theta_ddot": tdd[k].tolist()}
                for k in np.argsort(-t_state, kind="stable")[:self.worst]],
        }


__all__ = ["verify_tree", "face_jumps", "internal_faces", "stress_points", "parse_region", "STRESS_SAMPLES",
           "DIAGONAL_SAMPLES"]
