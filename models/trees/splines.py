"""Build spline trees: tensor-product cubic interpolation on a per-axis graded grid.

The tree interpolates the exact model at every point of a tensor grid x_0 x .. x x_{s-1}
(not-a-knot cubic splines, ``scipy.interpolate.make_interp_spline`` applied axis by axis:
tensor interpolation is separable), so it is continuous with two continuous derivatives across
every cell face by construction.

Held-out points, not interpolated: for each axis a, the midpoints of axis a's intervals with
every other coordinate on its grid. There the tensor interpolant reduces to the 1-d spline
through the exact values along that grid line, so the error seen is the error of axis a's
grid alone, attributed to one slab (axis interval) exactly. For s >= 2 also the centres of
the box's 2^s corner cells, their error counted for the cell's slab on every axis (near a
corner singularity, the Orthoglide's fold 1 cm beyond its upper corner, the axes' errors
combine there). Cell centres everywhere, attributed the same way, were tried and not kept: for
the Orthoglide at tol 0.005 they refined to 43 points an axis, 16.7 MB and 337 s against 23,
2.6 MB and 8 s, both well inside the target (0.043 % and 0.038 % on 1000 random states).

The error of a held-out point is the larger of the relative coefficient error
max_o |f_hat_o - f_o| / scale_o and a torque error bound max_i sum_o |df_o| W[o, i] / tscale_i,
with W from the bounds on theta_ddot and [td td] of ``pkrt tree verify``
(``outputs.VELOCITY_RANGES_PER_S`` ...) and tscale_i the largest |tau_i| over the grid at
seeded random velocities and accelerations within them.

Uniform build (``boxes = N``): N intervals per axis. Adaptive build (``tol``): from a uniform
grid of INITIAL_INTERVALS per axis, each round inserts the midpoint of every slab whose
held-out error exceeds HELDOUT_MARGIN * tol (worst first, while the coefficient table stays
within ``max_bytes``), until none does. The margin covers the errors of the axes adding up off
the grid lines. Grid coordinates are exact fractions of the root box, so every exact value is
computed once and reused.

The whole root box must be in the model's domain: a grid or held-out point that cannot be
assembled or whose singularity measure is below the threshold stops the build (BuildError).
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
from scipy.interpolate import make_interp_spline

from pkrt.rt.core.tree import ORDER, SPLINE, Tree, empty_boxes, n_outputs

from ..kinematics.mechanism import Mechanism
from ..reduction.exact import velocity_pairs
from .outputs import ACCELERATION_RANGES_PER_S2, VELOCITY_RANGES_PER_S, tree_outputs
from .samples import to_theta
from .settings import BuildError

INITIAL_INTERVALS = 4  # adaptive: the first grid's intervals per axis (not-a-knot needs >= 3)
HELDOUT_MARGIN = 0.5  # adaptive: slabs are split while their held-out error exceeds this * tol
MIN_WIDTH = Fraction(1, 2 ** 20)  # adaptive: slabs this narrow (unit coordinates) are not split
TAU_SEED = 0  # the random velocities and accelerations of the torque scales


def table_bytes(counts: list[int], n_out: int) -> int:
    """Bytes of the coefficient table of a grid with ``counts`` points per axis."""
    return int(np.prod(counts)) * n_out * 8


def tau_weights(s: int, width: np.ndarray) -> np.ndarray:
    """(n_out, s): |d tau_i| <= sum_o |d f_o| W[o, i] at the verification's velocity and
    acceleration bounds."""
    vmax, amax = VELOCITY_RANGES_PER_S * width, ACCELERATION_RANGES_PER_S2 * width
    m = s * (s + 1) // 2
    W = np.zeros((n_outputs(s), s))
    o = 0
    for j, k in velocity_pairs(s):  # H upper triangle: H_jk multiplies tdd_k in tau_j and tdd_j in tau_k
        W[o, j] = amax[k]
        W[o, k] = amax[j]
        o += 1
    for i in range(s):
        for c, (j, k) in enumerate(velocity_pairs(s)):
            W[m + i * m + c, i] = vmax[j] * vmax[k]
    for i in range(s):
        W[m + s * m + i, i] = 1.0
    return W


def tau_of_flat(F: np.ndarray, td: np.ndarray, tdd: np.ndarray) -> np.ndarray:
    """tau = H tdd + D [td td] - p_ext for rows of flat outputs F (n, n_out) -> (n, s)."""
    s = td.shape[1]
    m = s * (s + 1) // 2
    tau = -F[:, m + s * m:m + s * m + s].copy()
    pairs = velocity_pairs(s)
    for o, (j, k) in enumerate(pairs):
        tau[:, j] += F[:, o] * tdd[:, k]
        if j != k:
            tau[:, k] += F[:, o] * tdd[:, j]
    for i in range(s):
        for c, (j, k) in enumerate(pairs):
            tau[:, i] += F[:, m + i * m + c] * td[:, j] * td[:, k]
    return tau


def fit(grid_theta: list[np.ndarray], values: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """Knot vectors per axis and coefficients (prod n_a, n_out) interpolating values
    (n_0, .., n_{s-1}, n_out) at the grid points (not-a-knot cubic, axis by axis)."""
    C = values
    knots = []
    for a, x in enumerate(grid_theta):
        spl = make_interp_spline(x, C, k=ORDER - 1, axis=a)
        knots.append(np.asarray(spl.t, float))
        C = np.moveaxis(spl.c, 0, a)  # scipy puts the interpolation axis first
    return knots, np.ascontiguousarray(C.reshape(-1, values.shape[-1]))


def spline_tree(lo: np.ndarray, hi: np.ndarray, knots: list[np.ndarray], coef: np.ndarray,
                header: dict) -> Tree:
    counts = np.array([len(t) for t in knots], dtype=np.int32)
    start = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int32)
    return Tree(lo=lo.copy(), hi=hi.copy(), **empty_boxes(len(lo)), header=header, kind=SPLINE,
                knots=np.concatenate(knots), knot_start=start, knot_count=counts, spl_coef=coef)


class SplineGrid:
    """The exact-model samples (``samples.Samples``) and the per-axis grids in unit
    coordinates of the root box."""

    def __init__(self, smp, intervals: int, threshold: float):
        self.smp = smp
        self.s = smp.mech.n_act
        self.grids = [[Fraction(k, intervals) for k in range(intervals + 1)] for _ in range(self.s)]
        self.threshold = threshold

    def theta_axis(self, a: int, xs) -> np.ndarray:
        return np.array([to_theta(x, self.smp.lo[a], self.smp.hi[a]) for x in xs])

    def grid_points(self) -> list[tuple]:
        return list(itertools.product(*self.grids))

    def heldout_points(self) -> list[list[tuple]]:
        """Per axis a: the points at axis a's interval midpoints, others on the grid, ordered
        slab by slab (slab i of axis a: entries [i * L, (i + 1) * L)); then for s >= 2 the
        centres of the box's 2^s corner cells (first slab, then last, per axis)."""
        out = []
        mids = [[(x0 + x1) / 2 for x0, x1 in zip(g, g[1:])] for g in self.grids]
        for a in range(self.s):
            others = list(itertools.product(*[g for b, g in enumerate(self.grids) if b != a]))
            out.append([o[:a] + (m,) + o[a:] for m in mids[a] for o in others])
        if self.s >= 2:  # the centres of the 2^s corner cells, first and last slab per axis
            out.append(list(itertools.product(*[(m[0], m[-1]) for m in mids])))
        return out

    def ensure(self, pts) -> None:
        """Exact values at pts (once each); BuildError if one is out of the domain."""
        self.smp.ensure(pts)
        for p in pts:
            f = self.smp.f[p]
            if not (np.all(np.isfinite(f)) and self.smp.sing[p] >= self.threshold):
                th = np.round(self.smp.theta(p), 6).tolist()
                why = ("cannot be assembled" if not np.all(np.isfinite(f)) else
                       f"has singularity measure {self.smp.sing[p]:.3g} < {self.threshold:g}")
                raise BuildError(
                    f"model '{self.smp.mech.name}' {why} at theta {th}: a spline tree needs the "
                    f"whole box in the domain; shrink the actuator ranges or use --kind boxes")

    def values(self) -> np.ndarray:
        shape = [len(g) for g in self.grids]
        F = np.array([self.smp.f[p] for p in self.grid_points()])
        return F.reshape(*shape, F.shape[1])


def heldout_errors(tree: Tree, grid: SplineGrid, scale: np.ndarray, W: np.ndarray,
                   tscale: np.ndarray) -> tuple[list[np.ndarray], float, float]:
    """Per axis, the held-out error of each slab (the largest at its grid-line midpoints);
    and the largest coefficient and torque-bound errors."""
    cells = [len(g) - 1 for g in grid.grids]
    per_axis = [np.zeros(n) for n in cells]
    worst_coef, worst_tau = 0.0, 0.0
    for k, pts in enumerate(grid.heldout_points()):
        theta = np.array([grid.smp.theta(p) for p in pts])
        F = np.array([grid.smp.f[p] for p in pts])
        Fh, _ = tree_outputs(tree, theta)
        dF = np.abs(Fh - F)
        coef = (dF / scale).max(axis=1)
        tau = (dF @ W / tscale).max(axis=1)
        worst_coef, worst_tau = max(worst_coef, float(coef.max())), max(worst_tau, float(tau.max()))
        err = np.maximum(coef, tau)
        if k < len(per_axis):  # grid-line midpoints of axis k
            per_axis[k] = np.maximum(per_axis[k], err.reshape(cells[k], -1).max(axis=1))
            continue
        for c, corner in enumerate(itertools.product((0, 1), repeat=len(cells))):
            for a, end in enumerate(corner):  # a corner cell's error counts on every axis
                i = cells[a] - 1 if end else 0
                per_axis[a][i] = max(per_axis[a][i], err[c])
    return per_axis, worst_coef, worst_tau


def build_spline(mech: Mechanism, smp, threshold: float, intervals: int | None, tol: float | None,
                 max_bytes: int) -> tuple[Tree, dict]:
    """Build a spline tree (uniform ``intervals`` per axis, or adaptive to ``tol``); returns
    (tree with an empty header, build facts for the header)."""
    n_out = n_outputs(mech.n_act)
    grid = SplineGrid(smp, intervals if intervals is not None else INITIAL_INTERVALS, threshold)
    if table_bytes([len(g) for g in grid.grids], n_out) > max_bytes:
        raise BuildError(f"{intervals} intervals per axis need "
                                f"{table_bytes([len(g) for g in grid.grids], n_out)} bytes, over "
                                f"--max-bytes {max_bytes}")
    W = tau_weights(mech.n_act, smp.hi - smp.lo)
    rounds, stop = 0, "uniform"
    while True:
        rounds += 1
        tree, scale, (per_axis, e_coef, e_tau) = _fit_grid(grid, threshold, W)
        if tol is None:
            break
        stop = _refine(grid, per_axis, HELDOUT_MARGIN * tol, n_out, max_bytes)
        if stop:
            break
    facts = {"grid_points": [len(g) for g in grid.grids], "rounds": rounds, "stop": stop,
             "heldout_margin": HELDOUT_MARGIN if tol is not None else None,
             "max_heldout_coef_error": e_coef, "max_heldout_tau_bound": e_tau,
             "max_heldout_error": max(e_coef, e_tau), "output_scale": scale}
    return tree, facts


def _fit_grid(grid: SplineGrid, threshold: float, W: np.ndarray):
    """Sample the grid and its held-out points, fit the spline; returns (tree, output scale,
    ``heldout_errors``)."""
    smp, s = grid.smp, len(grid.grids)
    pts = grid.grid_points()
    grid.ensure(pts)
    held = grid.heldout_points()
    grid.ensure([p for h in held for p in h])
    scale = smp.scale(threshold)
    F = np.array([smp.f[p] for p in pts])
    width = smp.hi - smp.lo
    rng = np.random.default_rng(TAU_SEED)
    td = VELOCITY_RANGES_PER_S * width * (2 * rng.random((len(F), s)) - 1)
    tdd = ACCELERATION_RANGES_PER_S2 * width * (2 * rng.random((len(F), s)) - 1)
    tscale = np.abs(tau_of_flat(F, td, tdd)).max(axis=0)
    tscale = np.where(tscale > 0, tscale, 1.0)
    knots, coef = fit([grid.theta_axis(a, g) for a, g in enumerate(grid.grids)], grid.values())
    tree = spline_tree(smp.lo, smp.hi, knots, coef, {})
    return tree, scale, heldout_errors(tree, grid, scale, W, tscale)


def _refine(grid: SplineGrid, per_axis: list[np.ndarray], limit: float, n_out: int, max_bytes: int) -> str | None:
    """Insert the midpoint of every slab whose held-out error is over ``limit`` (worst first,
    while the table stays within ``max_bytes``); returns why refinement stops, or None."""
    s = len(grid.grids)
    cand = [(-float(e), a, i) for a in range(s) for i, e in enumerate(per_axis[a])
            if e > limit and grid.grids[a][i + 1] - grid.grids[a][i] > MIN_WIDTH]
    if not cand:
        over = any(float(e.max()) > limit for e in per_axis)
        return "minimum slab width reached" if over else "tolerance met"
    cand.sort()
    counts = [len(g) for g in grid.grids]
    insert = []
    for _, a, i in cand:
        trial = counts.copy()
        trial[a] += 1
        if table_bytes(trial, n_out) <= max_bytes:
            counts = trial
            insert.append((a, i))
    if not insert:
        return "max_bytes reached"
    for a in range(s):
        mids = [(grid.grids[a][i] + grid.grids[a][i + 1]) / 2 for b, i in insert if b == a]
        grid.grids[a] = sorted(grid.grids[a] + mids)
    return None


__all__ = ["build_spline", "fit", "spline_tree", "tau_weights", "tau_of_flat"]
