"""Trees of boxes with quadratic leaves from the exact model (paper section 4, plus adaptive splits).

Boxes live in unit coordinates of the root box (exact ``Fraction`` per axis, 0 = lo, 1 = hi).
Each box is sampled with a central composite design in box-normalised coordinates z in
[-1, 1]^s: the 2^s corners, the 2 s face centres (star points on the box sides, as in the
paper) and the centre; for s = 1 that is z = -1, 0, 1. Held-out points, not used in the fit,
are the star points at z_d = +/-0.5 (which become the centres of the children if the box is
split along d) and, for s >= 2, the inner corners z in {-0.5, 0.5}^s (they see the mixed
third-order terms that vanish on the axes; for s = 5, 6 a 16-point fraction of them). Samples are keyed by their exact rational coordinates, so neighbouring boxes
share them and each is computed once. A quadratic is least-squares fitted per output.

Held-out error of a box: max over its held-out points and outputs of |fit - f| / scale_o,
scale_o being the largest |f_o| over all in-domain samples (``outputs.output_scale``).
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

import itertools
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from pkrt.rt.core.tree import Tree

from ..kinematics.mechanism import Mechanism
from ..reduction.exact import output_layout
from .samples import Point, Samples, to_theta
from .settings import BuildSettings, tree_header

MIN_WIDTH = Fraction(1, 2 ** 24)  # adaptive: boxes this narrow (unit coordinates) are not split
BATCH_FACTOR = 1.5  # adaptive: each round splits the failing leaves within this factor of the worst


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


def _fit_leaf(node: Node, smp: Samples, design: Design, threshold: float) -> None:
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


def _partly_in_domain(leaves: list[Node], smp: "Samples", design: Design, threshold: float) -> list[Node]:
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


def build_boxes(mech: Mechanism, settings: BuildSettings, smp: Samples, thr: float) -> Tree:
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
    header = tree_header(mech, settings, scale, {
        "kind": "boxes", "max_leaves": settings.max_leaves if settings.tol is not None else None,
        "sing_threshold": thr, "design": "ccd; held out: star 0.5 + inner corners 0.5"
        + (" (16-point fraction)" if s > 4 else ""),
        "stop": stop, "rounds": rounds,
        "leaves": len(leaves), "leaves_out_of_domain": sum(1 for nd in leaves if not nd.ok),
        "samples": len(smp.f),
        "samples_failed": sum(1 for f in smp.f.values() if not np.all(np.isfinite(f))),
        "max_heldout_error": max(heldout) if heldout else None})
    return _to_tree(root, smp.lo, smp.hi, header)


def _fit_leaves(leaves: list[Node], smp: Samples, design: Design, thr: float) -> None:
    """Sample the fit and held-out points of every leaf (one batch), then fit each."""
    smp.ensure(p for nd in leaves for p in nd.points(design.fit_z) + nd.points(design.ho_z))
    for nd in leaves:
        _fit_leaf(nd, smp, design, thr)


def _refine(root: Node, settings: BuildSettings, smp: Samples, design: Design, thr: float) -> tuple[str, int]:
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


__all__ = ["build_boxes", "ccd_points", "heldout_points", "basis_matrix", "Design"]
