"""Build reduced-dynamics trees from the exact model (paper section 4, plus adaptive splits).

Boxes live in unit coordinates of the root box (exact ``Fraction`` per axis, 0 = lo, 1 = hi).
Each box is sampled with a central composite design in box-normalised coordinates z in
[-1, 1]^s: the 2^s corners, the 2 s face centres (star points on the box sides, as in the
paper) and the centre; for s = 1 that is z = -1, 0, 1. Held-out points, not used in the fit,
are the star points at z_d = +/-0.5 (which become the centres of the children if the box is
split along d) and, for s >= 2, the inner corners z in {-0.5, 0.5}^s (they see the mixed
third-order terms that vanish on the axes; for s = 5, 6 a 16-point fraction of them). Samples are keyed by their exact rational coordinates, so neighbouring boxes
share them and each is computed once. A quadratic is least-squares fitted per output.

Held-out error of a box: max over its held-out points and outputs of |fit - f| / scale_o,
scale_o being the largest |f_o| over all in-domain samples (``treeverify.output_scale``).
A box is out of domain (``leaf_ok = 0``) when any of its samples cannot be assembled or has a
singularity measure below the threshold.

Uniform build: N intervals per axis (N^s leaves), split in a balanced binary tree.
Adaptive build: start from the root box; each round, among the in-domain leaves whose held-out
error exceeds ``tol``, split the worst ones (those within BATCH_FACTOR of the worst, worst
first, at most ``max_leaves`` leaves in all) at their middle along the axis whose star points
err most. Out-of-domain leaves are split (at their middle along their widest axis) only while
they have an in-domain sample and are larger than the largest in-domain leaf.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from pkrt.rt.core.errors import UserError
from pkrt.rt.core.tree import Tree
from pkrt.rt.core.versions import software_versions

from .mechanism import Mechanism
from .reduction import output_layout
from .treeverify import MAX_SAMPLES, SampleEvaluator, output_scale, verify_tree

FORMAT_BUILDER = "pkrt.models.treebuild 3"
DEFAULT_VERIFY_SAMPLES = 1000
MIN_WIDTH = Fraction(1, 2 ** 24)  # adaptive: boxes this narrow (unit coordinates) are not split
BATCH_FACTOR = 1.5  # adaptive: each round splits the failing leaves within this factor of the worst

Point = tuple[Fraction, ...]


class BuildError(UserError):
    """Impossible build settings."""


# -- designs in box-normalised coordinates ----------------------------------------------------

def ccd_points(s: int) -> list[tuple[float, ...]]:
    """Fit points: corners, face centres (star points on the sides), centre; z in {-1, 0, 1}."""
    pts = list(itertools.product((-1.0, 1.0), repeat=s))
    for d in range(s):
        for v in (-1.0, 1.0):
            z = [0.0] * s
            z[d] = v
            pts.append(tuple(z))
    pts.append(tuple([0.0] * s))
    return list(dict.fromkeys(pts))  # s = 1: face centres are the corners


def inner_corners(s: int) -> list[tuple[float, ...]]:
    """Inner corners z in {-0.5, 0.5}^s: all of them for s <= 4; for s = 5, 6 the 16 of a
    resolution IV fraction (the first 4 axes in full, axis 4 + i signed as the product of the
    first 4 axes' signs but axis i). A mixed cubic z_i z_j z_k is +-1/8 at every inner corner,
    so a fraction sees it as well as the full set, at 16 instead of 2^s exact samples."""
    base = list(itertools.product((-0.5, 0.5), repeat=min(s, 4)))
    pts = []
    for z in base:
        sign = [1.0 if v > 0 else -1.0 for v in z]
        extra = [0.5 * float(np.prod([sign[k] for k in range(4) if k != i])) for i in range(s - 4)]
        pts.append(tuple(z) + tuple(extra))
    return pts


def heldout_points(s: int) -> list[tuple[float, ...]]:
    """Held-out points: star points at z_d = -0.5, +0.5 (order: axis 0 -, axis 0 +, ...),
    then for s >= 2 the inner corners (``inner_corners``)."""
    pts = []
    for d in range(s):
        for v in (-0.5, 0.5):
            z = [0.0] * s
            z[d] = v
            pts.append(tuple(z))
    if s >= 2:
        pts += inner_corners(s)
    return pts


def basis_matrix(z: np.ndarray) -> np.ndarray:
    """Rows u(z) in the kernel's order: 1, z_1..z_s, z_j z_k (j <= k) row by row."""
    z = np.atleast_2d(z)
    n, s = z.shape
    cols = [np.ones(n)] + [z[:, i] for i in range(s)]
    cols += [z[:, j] * z[:, k] for j in range(s) for k in range(j, s)]
    return np.stack(cols, axis=1)


@dataclass
class Design:
    s: int
    fit_z: np.ndarray  # (n_fit, s)
    ho_z: np.ndarray  # (n_ho, s): 2 s star points first
    pinv: np.ndarray  # (n_basis, n_fit): coef = pinv @ F_fit
    U_ho: np.ndarray  # (n_ho, n_basis)

    @classmethod
    def of(cls, s: int) -> "Design":
        fz = np.array(ccd_points(s))
        hz = np.array(heldout_points(s))
        return cls(s, fz, hz, np.linalg.pinv(basis_matrix(fz)), basis_matrix(hz))


# -- boxes and nodes ----------------------------------------------------------------------------

@dataclass
class Node:
    """A box [a, b] in unit coordinates; inner nodes split ``dim`` at ``at``."""
    a: Point
    b: Point
    dim: int = -1
    at: Fraction | None = None
    children: tuple["Node", "Node"] | None = None
    # leaf data
    ok: bool = True
    coef: np.ndarray | None = None  # (n_out, n_basis)
    resid: np.ndarray | None = None  # (s, n_out): max |fit - f| at the star points per axis
    resid_c: np.ndarray | None = None  # (n_out,): max |fit - f| at the inner corners

    def points(self, zs: np.ndarray) -> list[Point]:
        """Exact unit coordinates of box-normalised points (z in {-1, -0.5, 0, 0.5, 1})."""
        half = [(self.b[d] - self.a[d]) / 2 for d in range(len(self.a))]
        mid = [(self.a[d] + self.b[d]) / 2 for d in range(len(self.a))]
        return [tuple(mid[d] + half[d] * Fraction(z[d]) for d in range(len(self.a))) for z in zs]

    def split(self, d: int, at: Fraction) -> None:
        b0 = list(self.b)
        b0[d] = at
        a1 = list(self.a)
        a1[d] = at
        self.dim, self.at = d, at
        self.children = (Node(self.a, tuple(b0)), Node(tuple(a1), self.b))
        self.coef = self.resid = self.resid_c = None

    def leaves(self) -> list["Node"]:
        if self.children is None:
            return [self]
        return self.children[0].leaves() + self.children[1].leaves()


def to_theta(x: Fraction, lo: float, hi: float) -> float:
    """Unit coordinate -> actuator value (exact at the ends)."""
    if x == 0:
        return lo
    if x == 1:
        return hi
    return lo + (hi - lo) * float(x)


class _Samples:
    """Exact-model samples keyed by exact unit coordinates, computed once each."""

    def __init__(self, mech: Mechanism, ev: SampleEvaluator, lo: np.ndarray, hi: np.ndarray):
        self.mech = mech
        self.ev = ev
        self.lo, self.hi = lo.copy(), hi.copy()  # the tree's root box
        self.f: dict[Point, np.ndarray] = {}
        self.sing: dict[Point, float] = {}

    def theta(self, p: Point) -> np.ndarray:
        return np.array([to_theta(x, self.lo[d], self.hi[d]) for d, x in enumerate(p)])

    def ensure(self, pts) -> None:
        new = sorted(set(p for p in pts if p not in self.f))  # lexicographic: coherent walks
        if not new:
            return
        F, sing = self.ev.evaluate(np.array([self.theta(p) for p in new]))
        for p, f, g in zip(new, F, sing):
            self.f[p], self.sing[p] = f, float(g)

    def scale(self, threshold: float) -> np.ndarray:
        """Output scales over the in-domain samples (``treeverify.output_scale``)."""
        n_out = len(output_layout(self.mech.n_act))
        F = np.array([f for p, f in self.f.items() if self.sing[p] >= threshold]).reshape(-1, n_out)
        return output_scale(F, self.mech.n_act)


def _fit_leaf(node: Node, smp: _Samples, design: Design, threshold: float) -> None:
    fit_p, ho_p = node.points(design.fit_z), node.points(design.ho_z)
    F = np.array([smp.f[p] for p in fit_p])
    Fh = np.array([smp.f[p] for p in ho_p])
    sing = min(smp.sing[p] for p in fit_p + ho_p)
    finite = bool(np.all(np.isfinite(F)) and np.all(np.isfinite(Fh)))
    node.ok = finite and sing >= threshold
    n_out = F.shape[1]
    if not finite:
        node.coef = np.full((n_out, design.pinv.shape[0]), np.nan)
        node.resid = np.full((design.s, n_out), np.nan)
        node.resid_c = np.full(n_out, np.nan)
        return
    node.coef = (design.pinv @ F).T
    r = np.abs(design.U_ho @ node.coef.T - Fh)  # (n_ho, n_out)
    k = 2 * design.s
    node.resid = r[:k].reshape(design.s, 2, n_out).max(axis=1)
    node.resid_c = r[k:].max(axis=0) if len(r) > k else np.zeros(n_out)


def _leaf_error(node: Node, scale: np.ndarray) -> tuple[float, int]:
    """(held-out relative error, axis whose star points err most)."""
    per_axis = (node.resid / scale).max(axis=1)
    d = int(np.argmax(per_axis))
    return max(float(per_axis[d]), float((node.resid_c / scale).max())), d


def _volume(nd: Node) -> Fraction:
    v = Fraction(1)
    for a, b in zip(nd.a, nd.b):
        v *= b - a
    return v


def _widest(nd: Node) -> int:
    w = [b - a for a, b in zip(nd.a, nd.b)]
    return w.index(max(w))


def _partly_in_domain(leaves: list[Node], smp: "_Samples", design: Design, threshold: float) -> list[Node]:
    """Adaptive: out-of-domain leaves with an in-domain sample, larger than the largest
    in-domain leaf (all of them while there is none), to split so that the domain's edge is
    resolved as finely as the in-domain leaves (a root box across a singularity would
    otherwise stay one out-of-domain leaf)."""
    ok_vol = max((_volume(nd) for nd in leaves if nd.ok), default=Fraction(0))
    out = []
    for nd in leaves:
        if nd.ok or _volume(nd) <= ok_vol or nd.b[_widest(nd)] - nd.a[_widest(nd)] <= MIN_WIDTH:
            continue
        pts = nd.points(design.fit_z) + nd.points(design.ho_z)
        if any(np.all(np.isfinite(smp.f[p])) and smp.sing[p] >= threshold for p in pts):
            out.append(nd)
    out.sort(key=lambda nd: (nd.a, nd.b))
    return out


# -- tree layouts ---------------------------------------------------------------------------

def _uniform_nodes(node: Node, idx_lo: list[int], idx_hi: list[int], n: int) -> None:
    """Split a box covering grid intervals [idx_lo, idx_hi) until single cells, halving the
    axis with the most intervals (lowest axis on ties)."""
    counts = [h - l for l, h in zip(idx_lo, idx_hi)]
    d = int(np.argmax(counts))
    if counts[d] <= 1:
        return
    mid = idx_lo[d] + counts[d] // 2
    node.split(d, Fraction(mid, n))
    h0 = list(idx_hi)
    h0[d] = mid
    l1 = list(idx_lo)
    l1[d] = mid
    _uniform_nodes(node.children[0], idx_lo, h0, n)
    _uniform_nodes(node.children[1], l1, idx_hi, n)


def _to_tree(root: Node, lo: np.ndarray, hi: np.ndarray, header: dict) -> Tree:
    """Flatten the node tree (depth first, low child first) into the kernel arrays (root box
    [lo, hi])."""
    nodes: list[Node] = []
    stack = [root]
    while stack:
        nd = stack.pop()
        nodes.append(nd)
        if nd.children is not None:
            stack.append(nd.children[1])
            stack.append(nd.children[0])
    index = {id(nd): k for k, nd in enumerate(nodes)}
    leaves = [nd for nd in nodes if nd.children is None]
    leaf_index = {id(nd): k for k, nd in enumerate(leaves)}
    node_dim = np.full(len(nodes), -1, dtype=np.int32)
    node_split = np.zeros(len(nodes))
    node_child = np.zeros((len(nodes), 2), dtype=np.int32)
    for k, nd in enumerate(nodes):
        if nd.children is None:
            node_child[k, 0] = leaf_index[id(nd)]
        else:
            node_dim[k] = nd.dim
            node_split[k] = to_theta(nd.at, lo[nd.dim], hi[nd.dim])
            node_child[k] = (index[id(nd.children[0])], index[id(nd.children[1])])
    leaf_box = np.array([[[to_theta(x, lo[d], hi[d]) for d, x in enumerate(p)]
                          for p in (nd.a, nd.b)] for nd in leaves])
    leaf_ok = np.array([1 if nd.ok else 0 for nd in leaves], dtype=np.uint8)
    coef = np.ascontiguousarray(np.array([nd.coef for nd in leaves]))
    return Tree(lo, hi, node_dim, node_split, node_child, leaf_box, leaf_ok, coef, header=header)


KINDS = ("spline", "boxes")
SPLINE_DEFAULT_MAX_S = 3  # pkrt build's default kind: spline up to 3 actuators, boxes beyond
DEFAULT_MAX_BYTES = 16 * 2 ** 20  # coefficient table bound (the Orthoglide target: <= 16 MB)


@dataclass
class BuildSettings:
    """What determines a tree (recorded in its header; ``jobs`` is not: it changes nothing)."""
    boxes: int | None = None  # uniform: intervals per axis (boxes or spline cells)
    tol: float | None = None  # adaptive: held-out relative error target
    kind: str = "boxes"  # "boxes" (quadratic leaves) or "spline" (tensor cubic spline)
    max_bytes: int = DEFAULT_MAX_BYTES  # adaptive spline: coefficient table bound (bytes)
    max_leaves: int = 4096
    sing_threshold: float | None = None  # default: the model's singular_threshold
    verify_samples: int = DEFAULT_VERIFY_SAMPLES
    seed: int = 0
    region: tuple[float, ...] | None = None  # lo, hi (all actuators) or lo1, hi1, lo2, ... inside the ranges
    extra: dict = field(default_factory=dict)

    def root_box(self, mech: Mechanism) -> tuple[np.ndarray, np.ndarray]:
        """The tree's box: the actuator ranges, or ``region`` inside them (one-line error)."""
        lo, hi = mech.ranges[:, 0].copy(), mech.ranges[:, 1].copy()
        if self.region is None:
            return lo, hi
        r = np.asarray(self.region, float).reshape(-1)
        if r.size == 2:
            r = np.tile(r, len(lo))
        if r.size != 2 * len(lo):
            raise BuildError(f"--region needs 2 or {2 * len(lo)} numbers (lo,hi per actuator), got {r.size}")
        r = r.reshape(-1, 2)
        if not np.all(r[:, 0] < r[:, 1]) or np.any(r[:, 0] < lo) or np.any(r[:, 1] > hi):
            raise BuildError(f"--region must have lo < hi inside the actuator ranges {np.c_[lo, hi].tolist()}, "
                             f"got {r.tolist()}")
        return r[:, 0].copy(), r[:, 1].copy()

    def check(self, s: int) -> None:
        if self.kind not in KINDS:
            raise BuildError(f"--kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if (self.boxes is None) == (self.tol is None):
            raise BuildError("give exactly one of --boxes N (uniform) or --tol REL (adaptive)")
        if self.kind == "spline" and self.boxes is not None and self.boxes < 3:
            raise BuildError(f"--boxes must be at least 3 for a spline tree (not-a-knot cubic "
                             f"interpolation needs 4 points per axis), got {self.boxes}")
        if not 1 <= self.max_bytes <= 2 ** 40:
            raise BuildError(f"--max-bytes must be in 1..2^40, got {self.max_bytes}")
        if self.boxes is not None and not 1 <= self.boxes:
            raise BuildError(f"--boxes must be at least 1, got {self.boxes}")
        if self.boxes is not None and self.boxes ** s > 10 ** 6:
            raise BuildError(f"--boxes {self.boxes} gives {self.boxes ** s} leaves for {s} "
                             f"actuators; at most 10^6 are supported")
        if self.tol is not None and not (np.isfinite(self.tol) and self.tol > 0):
            raise BuildError(f"--tol must be a positive relative error, got {self.tol}")
        if not 1 <= self.max_leaves <= 10 ** 6:
            raise BuildError(f"--max-leaves must be in 1..10^6, got {self.max_leaves}")
        if self.sing_threshold is not None and not (0 <= self.sing_threshold < np.inf):
            raise BuildError(f"--sing-threshold must be a finite number >= 0, got {self.sing_threshold}")
        if not 0 <= self.verify_samples <= MAX_SAMPLES:
            raise BuildError(f"--verify-samples must be in 0..{MAX_SAMPLES}, got {self.verify_samples}")


def build_tree(mech: Mechanism, settings: BuildSettings, jobs: int | None = None,
               progress: bool | None = None, scheduler: str | None = None) -> tuple[Tree, dict]:
    """Build, verify and return (tree, stats). Deterministic for any ``jobs`` and
    ``scheduler`` (a Dask scheduler's address or ``local``: see ``SampleEvaluator``)."""
    s = mech.n_act
    settings.check(s)
    settings.root_box(mech)  # a bad --region: one line before any sampling
    t0 = time.perf_counter()
    thr = mech.description.singular_threshold if settings.sing_threshold is None else settings.sing_threshold
    with SampleEvaluator(mech, jobs, progress, desc="build", scheduler=scheduler) as ev:
        smp = _Samples(mech, ev, *settings.root_box(mech))
        if settings.kind == "spline":
            tree = _spline_tree(mech, settings, smp, thr)
        else:
            tree = _boxes_tree(mech, settings, smp, thr)
        return _finish(tree, mech, settings, ev, t0)


def _spline_tree(mech: Mechanism, settings: BuildSettings, smp: _Samples, thr: float) -> Tree:
    """A spline tree (``pkrt.models.splinebuild``) with its header."""
    from .splinebuild import build_spline

    tree, facts = build_spline(mech, smp, thr, settings.boxes, settings.tol, settings.max_bytes)
    header = _header(mech, settings, facts.pop("output_scale"), {
        "kind": "spline", "max_bytes": settings.max_bytes if settings.tol is not None else None,
        "sing_threshold": thr, "design": "not-a-knot cubic interpolation on a tensor grid; "
        "held out: interval midpoints on the grid lines, corner-cell centres",
        **facts, "samples": len(smp.f), "samples_failed": 0})
    return dataclasses.replace(tree, header=header)


def _boxes_tree(mech: Mechanism, settings: BuildSettings, smp: _Samples, thr: float) -> Tree:
    """A tree of boxes, uniform (``settings.boxes`` per axis) or adaptive (to ``settings.tol``),
    with its header."""
    s = mech.n_act
    design = Design.of(s)
    root = Node(tuple([Fraction(0)] * s), tuple([Fraction(1)] * s))
    if settings.boxes is not None:
        _uniform_nodes(root, [0] * s, [settings.boxes] * s, settings.boxes)
        _fit_leaves(root.leaves(), smp, design, thr)
        stop, rounds = "uniform", 0
    else:
        stop, rounds = _refine(root, settings, smp, design, thr)
    leaves = root.leaves()
    scale = smp.scale(thr)
    heldout = [_leaf_error(nd, scale)[0] for nd in leaves if nd.ok]
    header = _header(mech, settings, scale, {
        "kind": "boxes", "max_leaves": settings.max_leaves if settings.tol is not None else None,
        "sing_threshold": thr, "design": "ccd; held out: star 0.5 + inner corners 0.5"
        + (" (16-point fraction)" if s > 4 else ""),
        "stop": stop, "rounds": rounds,
        "leaves": len(leaves), "leaves_out_of_domain": sum(1 for nd in leaves if not nd.ok),
        "samples": len(smp.f),
        "samples_failed": sum(1 for f in smp.f.values() if not np.all(np.isfinite(f))),
        "max_heldout_error": max(heldout) if heldout else None})
    return _to_tree(root, smp.lo, smp.hi, header)


def _fit_leaves(leaves: list[Node], smp: _Samples, design: Design, thr: float) -> None:
    """Sample the fit and held-out points of every leaf (one batch), then fit each."""
    smp.ensure(p for nd in leaves for p in nd.points(design.fit_z) + nd.points(design.ho_z))
    for nd in leaves:
        _fit_leaf(nd, smp, design, thr)


def _refine(root: Node, settings: BuildSettings, smp: _Samples, design: Design, thr: float) -> tuple[str, int]:
    """Adaptive refinement: fit the new leaves, then split the worst failing leaves (and those
    partly in the domain) until the tolerance is met or a bound is reached. Returns (why it
    stopped, rounds)."""
    s = len(root.a)
    leaf_bytes = (2 * s + len(output_layout(s)) * design.pinv.shape[0]) * 8 + 1 + 2 * (8 + 4 + 8)
    leaf_budget = min(settings.max_leaves, max(1, settings.max_bytes // leaf_bytes))
    new, rounds = [root], 0
    while True:
        rounds += 1
        _fit_leaves(new, smp, design, thr)
        scale = smp.scale(thr)
        leaves = root.leaves()
        errs = {id(nd): _leaf_error(nd, scale) for nd in leaves if nd.ok}
        over = [nd for nd in leaves if nd.ok and errs[id(nd)][0] > settings.tol]
        failing = [nd for nd in over if nd.b[errs[id(nd)][1]] - nd.a[errs[id(nd)][1]] > MIN_WIDTH]
        partial = _partly_in_domain(leaves, smp, design, thr)
        if not failing and not partial:
            return ("tolerance met" if not over else "minimum box width reached"), rounds
        budget = leaf_budget - len(leaves)
        if budget <= 0:
            return ("max_leaves reached" if leaf_budget == settings.max_leaves else "max_bytes reached"), rounds
        new = []
        for nd, d in _splits(failing, partial, errs, budget):
            nd.split(d, (nd.a[d] + nd.b[d]) / 2)
            new.extend(nd.children)


def _splits(failing: list[Node], partial: list[Node], errs: dict, budget: int) -> list[tuple[Node, int]]:
    """(leaf, dimension) to split this round, at most ``budget``: the failing leaves within
    ``BATCH_FACTOR`` of the worst (along their worst held-out point's axis), then leaves partly
    in the domain (along their widest axis)."""
    pick = []
    if failing:
        failing.sort(key=lambda nd: (-errs[id(nd)][0], nd.a, nd.b))
        worst = errs[id(failing[0])][0]
        pick = [(nd, errs[id(nd)][1]) for nd in failing if errs[id(nd)][0] >= worst / BATCH_FACTOR][:budget]
    return pick + [(nd, _widest(nd)) for nd in partial[: budget - len(pick)]]


def _header(mech: Mechanism, settings: BuildSettings, scale: np.ndarray, build: dict) -> dict:
    return {
        "model": {"name": mech.name, "content_hash": mech.content_hash},
        "actuators": {"names": mech.actuator_names, "units": mech.actuator_units,
                      "ranges": np.c_[settings.root_box(mech)].tolist()},
        "outputs": output_layout(mech.n_act),
        "output_scale": np.asarray(scale).tolist(),
        "build": {"builder": FORMAT_BUILDER,
                  "mode": "uniform" if settings.boxes is not None else "adaptive",
                  "boxes": settings.boxes, "tol": settings.tol,
                  "region": None if settings.region is None else np.c_[settings.root_box(mech)].tolist(),
                  **build, **settings.extra},
        "verification": {},
        "software": software_versions(),  # the versions it was built with
    }


def _finish(tree: Tree, mech: Mechanism, settings: BuildSettings, ev: SampleEvaluator,
            t0: float) -> tuple[Tree, dict]:
    """Verify (into the header) and return (tree, stats)."""
    build_time = time.perf_counter() - t0
    if settings.verify_samples > 0:
        tree.header["verification"] = verify_tree(tree, mech, settings.verify_samples,
                                                  settings.seed, evaluator=ev)
    stats = {"build_seconds": build_time, "total_seconds": time.perf_counter() - t0,
             "exact_evaluations": ev.n_evaluated, "tree_bytes_in_memory": tree.nbytes}
    return tree, stats


__all__ = ["BuildSettings", "BuildError", "build_tree", "ccd_points", "heldout_points",
           "basis_matrix", "Design", "to_theta"]
