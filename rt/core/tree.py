"""Reduced-dynamics tree: immutable flat arrays and the numba kernels that evaluate them.

Two kinds of tree cover the root box [lo, hi] of actuator space (SI: m or rad per axis).

Kind BOXES (the paper's piecewise quadratics). Node 0 is the root. An inner node n splits along
``node_dim[n]`` at ``node_split[n]``: theta[dim] < split goes to ``node_child[n, 0]``, otherwise
to ``node_child[n, 1]``. A leaf has ``node_dim = -1`` and its leaf index in ``node_child[n, 0]``.
Leaf l covers ``leaf_box[l, 0] <= theta <= leaf_box[l, 1]`` and holds, per output o, quadratic
coefficients ``coef[l, o, :]`` over the basis u(z) = (1, z_1..z_s, z_j z_k for j <= k row by
row), z = (2 theta - lo_l - hi_l) / (hi_l - lo_l) in [-1, 1]. ``leaf_ok[l] = 0`` marks a leaf
out of the model's domain (cannot be assembled or too close to a singularity).

Kind SPLINE (tensor-product cubic B-splines, continuous with two continuous derivatives across
every cell face by construction). Axis a has the knot vector
``knots[knot_start[a]:knot_start[a] + knot_count[a]]`` (n_a + 4 knots: lo_a four times, the
interior knots, hi_a four times) and n_a coefficients. ``spl_coef[r, o]`` is the coefficient of
output o for the multi-index (i_0, .., i_{s-1}), r = i_0 n_1 .. n_{s-1} + .. + i_{s-1} (the last
axis fastest; the outputs of a row are contiguous, so the inner loop over outputs vectorises).
Evaluation: per axis the knot span, the 4 non-zero cubic B-spline values, then f_o = sum over
the 4^s rows of the product of the basis values times ``spl_coef[r, o]``. The whole root box is
in the domain (the builder refuses models that are not), so a spline tree never reports
OUT_OF_DOMAIN. Two paths, chosen by T[SPLINE_FAST]: the fast one (``Tree.arrays``;
``spline_outputs_fast``) finds the span in a per-axis bin table, evaluates the span's B-splines
as power-form polynomials by Horner and contracts rows padded to a multiple of 4 outputs with
fused multiply-adds (tables computed at load time by ``pkrt.rt.core.splinepoly``, no file
change); the reference one (``Tree.reference_arrays``; ``spline_outputs``) is the binary search
and Cox-de Boor over the file's coefficients, kept for tests, benchmarks and the face-jump
check. They agree to rounding (about 1e-15 of each output's scale on the shipped trees).

Every tree's ``arrays`` is one tuple holding both kinds' arrays, read in the kernels by the
named positions KIND, LO, HI, ... (the unused kind's arrays are empty with the same dtype and
ndim), so all trees have one numba type: the kernels compile once and branch on T[KIND] at
run time. A boxes tree's coefficients are in the tuple as (n_leaves, n_basis, n_out) (each
leaf's outputs contiguous for the basis term, so the evaluation vectorises); ``Tree.coef`` is
the same memory seen as (n_leaves, n_out, n_basis).

Outputs f, in order (``pkrt.models.reduction.output_layout``): H upper triangle row by row,
D row by row (s x s(s+1)/2), p_ext. Equation of motion: H thetadd + D [td td] - p_ext = tau.

The ``*_w`` kernels take a scratch array of ``work_size(s)`` floats and allocate nothing (use
them, or ``TreeWorkspace``, on the online path); ``eval_outputs``, ``eval_model`` and
``eval_tau`` are the same with the scratch allocated per call.

Reference counting: the ``*_w`` kernels are compiled without numba's runtime (``_nrt=False``)
and are called, not inlined. They allocate nothing, so they need no runtime; with it, every
array taken out of the tree tuple or sliced from ``work`` (and every argument of an inlined
kernel) costs an atomic incref/decref call per evaluation that numba cannot prune across the
loops, about a third of the time of an evaluation. ``eval_model_w`` and ``eval_tau_w`` run
the same body with s = 3 as a constant when theta has 3 entries (the Orthoglide), so LLVM
unrolls the small loops.

Kernel status codes: OK = 0, CLAMPED = 1 (theta was outside the root box and was clamped),
OUT_OF_DOMAIN = 2 (the leaf is marked out of domain; boxes only). Status is never silent:
callers check it. ``eval_model_w`` and ``eval_tau_w`` return BAD_SHAPE = -1, touching nothing,
when a state vector's length is not the tree's s (numba does not check bounds).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from pkrt.rt.core.splinepoly import empty_tables, spline_tables

OK, CLAMPED, OUT_OF_DOMAIN = 0, 1, 2
BAD_SHAPE = -1
BOXES, SPLINE = 0, 1
KIND_NAMES = {BOXES: "boxes", SPLINE: "spline"}
ORDER = 4  # cubic B-splines: 4 non-zero basis functions per axis


def n_basis(s: int) -> int:
    return 1 + s + s * (s + 1) // 2


def n_outputs(s: int) -> int:
    m = s * (s + 1) // 2
    return m + s * m + s


# Positions in the kernels' tree tuple (``Tree.arrays``), named: T[LO] is the root box's lo.
# A plain tuple, not a NamedTuple: numba types a plain tuple of arrays in its C dispatcher
# (about 0.8 us a Python call) but a NamedTuple in Python (3-5 us a call, measured).
(KIND, LO, HI, NODE_DIM, NODE_SPLIT, NODE_CHILD, LEAF_BOX, LEAF_OK, COEF, KNOTS, KNOT_START,
 KNOT_COUNT, SPL_COEF, SPLINE_FAST, SPAN_AXIS, BIN_MAP, SPAN_BINS, SPAN_MAP, SPAN_POLY) = range(19)


def _empty(*shape, dtype=np.float64):
    return lambda: np.zeros(shape, dtype=dtype)


@dataclass(frozen=True)
class Tree:
    """Immutable tree arrays (Pinocchio-style model); ``header`` holds the file metadata.
    The arrays of the kind not in use are empty (see the module docstring)."""
    lo: np.ndarray  # (s,) float64
    hi: np.ndarray  # (s,) float64
    node_dim: np.ndarray  # (n_nodes,) int32, -1 for a leaf
    node_split: np.ndarray  # (n_nodes,) float64
    node_child: np.ndarray  # (n_nodes, 2) int32
    leaf_box: np.ndarray  # (n_leaves, 2, s) float64
    leaf_ok: np.ndarray  # (n_leaves,) uint8
    coef: np.ndarray  # (n_leaves, n_out, n_basis) float64
    header: dict = field(default_factory=dict, compare=False)
    kind: int = BOXES
    knots: np.ndarray = field(default_factory=_empty(0))  # (sum knot_count,) float64
    knot_start: np.ndarray = field(default_factory=_empty(0, dtype=np.int32))  # (s,) int32
    knot_count: np.ndarray = field(default_factory=_empty(0, dtype=np.int32))  # (s,) int32
    spl_coef: np.ndarray = field(default_factory=_empty(0, 0))  # (prod n_a, n_out) float64

    def __post_init__(self):
        # the kernels read a leaf's block as (n_basis, n_out) (``box_outputs``): the
        # coefficients are held once, in that layout, and ``coef`` is its (n_leaves, n_out,
        # n_basis) view (the file's and the builder's order)
        kernel = np.ascontiguousarray(np.swapaxes(self.coef, 1, 2))
        object.__setattr__(self, "coef", np.swapaxes(kernel, 1, 2))

    @property
    def s(self) -> int:
        return len(self.lo)

    @property
    def n_leaves(self) -> int:
        return len(self.leaf_ok)

    @property
    def kind_name(self) -> str:
        return KIND_NAMES[self.kind]

    @property
    def grid_points(self) -> list[int]:
        """Spline: interpolation points per axis (= coefficients per axis); boxes: []."""
        return [int(c) - ORDER for c in self.knot_count] if self.kind == SPLINE else []

    def _tuple(self, spl_coef: np.ndarray, fast: int, tables: dict) -> tuple:
        return (int(self.kind), self.lo, self.hi, self.node_dim, self.node_split,
                self.node_child, self.leaf_box, self.leaf_ok, np.swapaxes(self.coef, 1, 2), self.knots,
                self.knot_start, self.knot_count, spl_coef, fast, tables["span_axis"],
                tables["bin_map"], tables["span_bins"], tables["span_map"], tables["span_poly"])

    @cached_property
    def arrays(self) -> tuple:
        """The tuple every kernel takes as its first argument (positions KIND, LO, ...). A
        spline tree's holds the fast path's tables (``pkrt.rt.core.splinepoly``, computed here
        from the knots) and its coefficients padded to whole vectors at SPL_COEF."""
        if self.kind != SPLINE:
            return self._tuple(self.spl_coef, 0, empty_tables(self.s))
        tables = spline_tables(self.knots, self.knot_start, self.knot_count, self.spl_coef)
        return self._tuple(tables["spl_pad"], 1, tables)

    @cached_property
    def reference_arrays(self) -> tuple:
        """The same tree for the reference spline path (binary search, Cox-de Boor, the file's
        unpadded coefficients): the kernel before the fast path, kept for tests and benchmarks.
        Same numba type as ``arrays``; for a boxes tree the same evaluation."""
        return self._tuple(self.spl_coef, 0, empty_tables(self.s))

    @property
    def nbytes(self) -> int:
        """Bytes of the file's arrays (what ``pkrt tree info`` reports)."""
        return sum(a.nbytes for a in self.reference_arrays[1:] if isinstance(a, np.ndarray))

    @property
    def kernel_nbytes(self) -> int:
        """Bytes of the arrays the kernels read (``arrays``: with the fast path's tables)."""
        return sum(a.nbytes for a in self.arrays[1:] if isinstance(a, np.ndarray))


def empty_boxes(s: int) -> dict:
    """The box arrays of a spline tree (empty, with the dtypes and ndims of the kernel type)."""
    return dict(node_dim=np.zeros(0, np.int32), node_split=np.zeros(0),
                node_child=np.zeros((0, 2), np.int32), leaf_box=np.zeros((0, 2, s)),
                leaf_ok=np.zeros(0, np.uint8), coef=np.zeros((0, n_outputs(s), n_basis(s))))


@njit(cache=True, inline="always")
def clamp(T, theta, th):
    """Clamp theta into the root box (into th); return OK or CLAMPED."""
    lo, hi = T[LO], T[HI]
    status = OK
    for i in range(theta.shape[0]):
        x = theta[i]
        if not (x >= lo[i]):  # also catches NaN
            x = lo[i]
            status = CLAMPED
        elif x > hi[i]:
            x = hi[i]
            status = CLAMPED
        th[i] = x
    return status


@njit(cache=True, inline="always")
def find_leaf(T, theta, th):
    """Clamp theta into the root box (into th) and return (leaf, status). A spline tree has
    no leaves: (0, OK or CLAMPED)."""
    status = clamp(T, theta, th)
    if T[KIND] == SPLINE:
        return 0, status
    node_dim, node_split, node_child = T[NODE_DIM], T[NODE_SPLIT], T[NODE_CHILD]
    n = 0
    while node_dim[n] >= 0:
        d = node_dim[n]
        if th[d] < node_split[n]:
            n = node_child[n, 0]
        else:
            n = node_child[n, 1]
    leaf = node_child[n, 0]
    if T[LEAF_OK][leaf] == 0:
        status = OUT_OF_DOMAIN
    return leaf, status


@njit(cache=True, inline="always")
def basis(T, leaf, th, u):
    """Quadratic basis u at th in the box-normalised coordinates of a leaf."""
    box = T[LEAF_BOX]
    s = th.shape[0]
    u[0] = 1.0
    for i in range(s):
        u[1 + i] = (2.0 * th[i] - box[leaf, 0, i] - box[leaf, 1, i]) / (box[leaf, 1, i] - box[leaf, 0, i])
    c = 1 + s
    for j in range(s):
        for k in range(j, s):
            u[c] = u[1 + j] * u[1 + k]
            c += 1


@njit(cache=True, inline="always")
def box_outputs(T, leaf, u, f):
    """Flat outputs f = the leaf's coefficients times the basis u. The leaf's block is
    (n_basis, n_out) (``Tree.arrays``): the inner loop runs over contiguous outputs, which LLVM
    vectorises without reordering any sum (2.2x faster than a dot product per output in 6-D);
    each output still sums its terms in basis order, so results are the same bits."""
    cl = T[COEF][leaf]
    nb, n_out = cl.shape
    for o in range(n_out):
        f[o] = cl[0, o]  # u[0] = 1
    for b in range(1, nb):
        ub = u[b]
        for o in range(n_out):
            f[o] += cl[b, o] * ub


@njit(cache=True, inline="always")
def knot_span(T, a, x):
    """Span i (knot_start offset removed) with t[i] <= x < t[i+1], in 3..n-1 (x = hi_a gives
    n - 1), by binary search over axis a's knots t."""
    t0 = T[KNOT_START][a]
    t = T[KNOTS]
    lo_i = ORDER - 1
    hi_i = T[KNOT_COUNT][a] - ORDER  # n: t[n] = hi_a
    while hi_i - lo_i > 1:
        mid = (lo_i + hi_i) >> 1
        if x < t[t0 + mid]:
            hi_i = mid
        else:
            lo_i = mid
    return lo_i


@njit(cache=True, inline="always")
def bspline_values(T, a, i, x, N, k):
    """The 4 non-zero cubic B-spline values at x on span i of axis a into N[k..k+3] (those
    of the basis functions i-3..i): Cox-de Boor ('The NURBS Book' A2.2) unrolled for degree
    3, in scalars."""
    t = T[KNOTS]
    j = T[KNOT_START][a] + i
    left1, left2, left3 = x - t[j], x - t[j - 1], x - t[j - 2]
    right1, right2, right3 = t[j + 1] - x, t[j + 2] - x, t[j + 3] - x
    # degree 1
    temp = 1.0 / (right1 + left1)
    n0 = right1 * temp
    n1 = left1 * temp
    # degree 2
    temp = n0 / (right1 + left2)
    m0 = right1 * temp
    saved = left2 * temp
    temp = n1 / (right2 + left1)
    m1 = saved + right2 * temp
    m2 = left1 * temp
    # degree 3
    temp = m0 / (right1 + left3)
    N[k] = right1 * temp
    saved = left3 * temp
    temp = m1 / (right2 + left2)
    N[k + 1] = saved + right2 * temp
    saved = left2 * temp
    temp = m2 / (right3 + left1)
    N[k + 2] = saved + right3 * temp
    N[k + 3] = left1 * temp


@njit(cache=True, inline="always")
def contract_rows(T, C, N, base, s, f, n_cols):
    """f[:n_cols] += the 4^s rows of C from row ``base`` on, each times the product of its
    axes' basis values in N (4 per axis): the general-s contraction of both spline paths."""
    total = 1
    for a in range(s):
        total *= ORDER
    for idx in range(total):  # the 4^s rows: idx in base 4, the last axis fastest
        rem = idx
        w = 1.0
        r = base
        stride = 1
        for a in range(s - 1, -1, -1):
            d = rem % ORDER
            rem //= ORDER
            w *= N[ORDER * a + d]
            r += d * stride
            stride *= T[KNOT_COUNT][a] - ORDER
        for o in range(n_cols):
            f[o] += w * C[r, o]


@njit(cache=True, inline="always")
def spline_outputs(T, th, f, work, s, fix_axis, fix_span):
    """Flat outputs f at th (inside the root box) of a spline tree; work holds 4 s floats.
    ``fix_axis >= 0`` forces that axis's knot span to ``fix_span`` (face-jump checks; the
    online path passes -1)."""
    N = work[:ORDER * s]
    C = T[SPL_COEF]
    m = s * (s + 1) // 2
    n_out = m + s * m + s  # a constant when s is (f holds n_outputs(s))
    base = 0
    for a in range(s):
        i = knot_span(T, a, th[a])
        if a == fix_axis:
            i = fix_span
        bspline_values(T, a, i, th[a], N, ORDER * a)
        base = base * (T[KNOT_COUNT][a] - ORDER) + i - (ORDER - 1)
    for o in range(n_out):
        f[o] = 0.0
    if s == 3:  # the Orthoglide: the last axis's 4 rows are contiguous, one pass over them
        n1 = T[KNOT_COUNT][1] - ORDER
        n2 = T[KNOT_COUNT][2] - ORDER
        for i0 in range(ORDER):
            for i1 in range(ORDER):
                w01 = N[i0] * N[ORDER + i1]
                r = base + (i0 * n1 + i1) * n2
                a0 = w01 * N[2 * ORDER]
                a1 = w01 * N[2 * ORDER + 1]
                a2 = w01 * N[2 * ORDER + 2]
                a3 = w01 * N[2 * ORDER + 3]
                R = C[r:r + ORDER]
                for o in range(n_out):
                    f[o] += a0 * R[0, o] + a1 * R[1, o] + a2 * R[2, o] + a3 * R[3, o]
        return
    contract_rows(T, C, N, base, s, f, n_out)


@intrinsic
def fmuladd(typingctx, a, b, c):
    """a * b + c, fused where the target has FMA (LLVM's llvm.fmuladd; float64 only)."""
    if not all(isinstance(x, types.Float) for x in (a, b, c)):
        return None

    def codegen(context, builder, sig, args):
        d = ir.DoubleType()
        fn = builder.module.declare_intrinsic("llvm.fmuladd", [d], ir.FunctionType(d, [d, d, d]))
        return builder.call(fn, args)
    return types.float64(types.float64, types.float64, types.float64), codegen


@njit(cache=True, inline="always")
def span_lookup(T, a, x):
    """knot_span's span (3..n-1, t[i] <= x < t[i+1]; x = hi_a gives n - 1) from the axis's bin
    table and a step or two against the knots (``pkrt.rt.core.splinepoly``): the same span
    as the binary search, with no unpredictable branches at random states."""
    ax = T[SPAN_AXIS]
    bm = T[BIN_MAP]
    b = int((x - bm[a, 0]) * bm[a, 1])
    nb = ax[a, 1]
    if b >= nb:
        b = nb - 1
    if b < 0:
        b = 0
    i = T[SPAN_BINS][ax[a, 0] + b]
    t = T[KNOTS]
    t0 = T[KNOT_START][a]
    n = T[KNOT_COUNT][a] - ORDER
    while i > ORDER - 1 and x < t[t0 + i]:
        i -= 1
    while i < n - 1 and x >= t[t0 + i + 1]:
        i += 1
    return i


@njit(cache=True, inline="always")
def poly_values(T, a, i, x, N, k):
    """The 4 non-zero cubic B-spline values at x on span i of axis a into N[k..k+3]: the
    span's power-form polynomials in u = (x - t_i) / (t_{i+1} - t_i), by Horner."""
    j = T[SPAN_AXIS][a, 2] + i - (ORDER - 1)
    sm = T[SPAN_MAP]
    P = T[SPAN_POLY]
    u = (x - sm[j, 0]) * sm[j, 1]
    for q in range(ORDER):
        N[k + q] = ((P[j, q, 3] * u + P[j, q, 2]) * u + P[j, q, 1]) * u + P[j, q, 0]


@njit(cache=True, inline="always")
def spline_outputs_fast(T, th, g, N, s):
    """The fast spline path: outputs at th (inside the root box) into g, which holds the
    padded row width (``pad_width(n_out)``; the padding gets zeros); N holds 4 s floats.
    Table span lookup, Horner basis values, then the contraction as ``spline_outputs``
    over rows padded to whole vectors."""
    C = T[SPL_COEF]
    m = s * (s + 1) // 2
    n_pad = (m + s * m + s + 3) // 4 * 4  # a constant when s is (= C.shape[1])
    base = 0
    for a in range(s):
        i = span_lookup(T, a, th[a])
        poly_values(T, a, i, th[a], N, ORDER * a)
        base = base * (T[KNOT_COUNT][a] - ORDER) + i - (ORDER - 1)
    for o in range(n_pad):
        g[o] = 0.0
    if s == 3:
        # C as one flat vector with the row width n_pad a constant: each row's offset is then
        # an immediate from 4 pointers (with C[r, o] every row took a pointer register of its
        # own, spilled and reloaded: 1.6x the time of the contraction, measured)
        P = n_pad
        Cf = C.reshape(C.size)
        n1 = T[KNOT_COUNT][1] - ORDER
        n2 = T[KNOT_COUNT][2] - ORDER
        b0, b1, b2, b3 = N[2 * ORDER], N[2 * ORDER + 1], N[2 * ORDER + 2], N[2 * ORDER + 3]
        for i0 in range(ORDER):  # one pass over g per i0: its 16 rows (4 blocks of 4)
            w0 = N[i0]
            c0, c1, c2, c3 = w0 * N[ORDER], w0 * N[ORDER + 1], w0 * N[ORDER + 2], w0 * N[ORDER + 3]
            r = (base + i0 * n1 * n2) * P
            A = Cf[r:r + ORDER * P]  # slices: the loop indices below are non-negative, so vectorised
            B = Cf[r + n2 * P:r + (n2 + ORDER) * P]
            E = Cf[r + 2 * n2 * P:r + (2 * n2 + ORDER) * P]
            F = Cf[r + 3 * n2 * P:r + (3 * n2 + ORDER) * P]
            for o in range(P):
                x0 = fmuladd(b0, A[o], fmuladd(b1, A[P + o], fmuladd(b2, A[2 * P + o], b3 * A[3 * P + o])))
                x1 = fmuladd(b0, B[o], fmuladd(b1, B[P + o], fmuladd(b2, B[2 * P + o], b3 * B[3 * P + o])))
                x2 = fmuladd(b0, E[o], fmuladd(b1, E[P + o], fmuladd(b2, E[2 * P + o], b3 * E[3 * P + o])))
                x3 = fmuladd(b0, F[o], fmuladd(b1, F[P + o], fmuladd(b2, F[2 * P + o], b3 * F[3 * P + o])))
                g[o] = fmuladd(c0, x0, fmuladd(c1, x1, fmuladd(c2, x2, fmuladd(c3, x3, g[o]))))
        return
    contract_rows(T, C, N, base, s, g, n_pad)


@njit(cache=True)
def work_size(s: int) -> int:
    """Length of the scratch array the ``*_w`` kernels take: th (s), [td td] (s(s+1)/2), the
    quadratic basis or the spline basis values (4 per axis), the flat outputs padded to a
    multiple of 4. (Jitted: callable from Python and from other kernels.)"""
    m = s * (s + 1) // 2
    return s + m + max(1 + s + m, ORDER * s) + (m + s * m + s + 3) // 4 * 4


@njit(cache=True, _nrt=False)  # see "Reference counting" above
def eval_outputs_w(T, theta, f, work):
    """Fill the flat outputs f at theta using ``work`` (work_size(s)) as scratch; return the
    status. Allocates nothing."""
    s = theta.shape[0]
    m = s * (s + 1) // 2
    th = work[:s]
    u = work[s + m:]
    leaf, status = find_leaf(T, theta, th)
    if T[KIND] == SPLINE:
        if T[SPLINE_FAST]:
            nb = max(1 + s + m, ORDER * s)
            g = work[s + m + nb:]
            spline_outputs_fast(T, th, g, u, s)
            for o in range(f.shape[0]):
                f[o] = g[o]
        else:
            spline_outputs(T, th, f, u, s, -1, 0)
        return status
    basis(T, leaf, th, u)
    box_outputs(T, leaf, u, f)
    return status


@njit(cache=True, inline="always")
def unpack_outputs(f, H, D, p_ext, s):
    """H (symmetric), D and p_ext from the flat outputs f (order: module docstring)."""
    m = s * (s + 1) // 2
    o = 0
    for j in range(s):
        for k in range(j, s):
            H[j, k] = f[o]
            H[k, j] = f[o]
            o += 1
    for i in range(s):
        for c in range(m):
            D[i, c] = f[o]
            o += 1
    for i in range(s):
        p_ext[i] = f[o]
        o += 1


@njit(cache=True, inline="always")
def _model_s(T, theta, H, D, p_ext, work, s):
    """eval_model_w with s = theta.shape[0] passed in (a constant in the s = 3 and 6 paths):
    the flat outputs into the end of work, then unpacked."""
    m = s * (s + 1) // 2
    nf = m + s * m + s
    n_pad = (nf + 3) // 4 * 4
    th = work[:s]
    f = work[work.shape[0] - n_pad:]
    leaf, status = find_leaf(T, theta, th)
    if T[KIND] == SPLINE:
        if T[SPLINE_FAST]:
            spline_outputs_fast(T, th, f, work[s + m:], s)
        else:
            spline_outputs(T, th, f, work[s + m:], s, -1, 0)
    else:
        u = work[s + m:s + m + 1 + s + m]
        basis(T, leaf, th, u)
        box_outputs(T, leaf, u, f)
    unpack_outputs(f, H, D, p_ext, s)
    return status


@njit(cache=True, _nrt=False)  # see "Reference counting" above
def eval_model_w(T, theta, H, D, p_ext, work):
    """Fill preallocated H (s, s), D (s, s(s+1)/2), p_ext (s,) using ``work`` as scratch;
    return the status. Allocates nothing."""
    if theta.shape[0] != T[LO].shape[0]:
        return BAD_SHAPE
    if theta.shape[0] == 3:  # s a compile-time constant: LLVM unrolls the small loops
        return _model_s(T, theta, H, D, p_ext, work, 3)
    if theta.shape[0] == 6:
        return _model_s(T, theta, H, D, p_ext, work, 6)
    return _model_s(T, theta, H, D, p_ext, work, theta.shape[0])


@njit(cache=True, inline="always")
def quad_velocities(td, out):
    """[td td] = (td1^2, td1 td2, ..., ts^2), upper triangle, row by row."""
    s = td.shape[0]
    c = 0
    for j in range(s):
        for k in range(j, s):
            out[c] = td[j] * td[k]
            c += 1


@njit(cache=True, inline="always")
def _tau_s(T, theta, theta_dot, theta_ddot, H, D, p_ext, tau, work, s):
    """eval_tau_w with s = theta.shape[0] passed in (a constant in the s = 3 path)."""
    m = s * (s + 1) // 2
    status = _model_s(T, theta, H, D, p_ext, work, s)
    w = work[s:s + m]
    quad_velocities(theta_dot, w)
    for i in range(s):
        acc = -p_ext[i]
        for j in range(s):
            acc += H[i, j] * theta_ddot[j]
        for c in range(m):
            acc += D[i, c] * w[c]
        tau[i] = acc
    return status


@njit(cache=True, _nrt=False)  # see "Reference counting" above
def eval_tau_w(T, theta, theta_dot, theta_ddot, H, D, p_ext, tau, work):
    """tau = H thetadd + D [td td] - p_ext, filling H, D, p_ext too, using ``work`` as
    scratch; return the status. Allocates nothing (the online path)."""
    s = T[LO].shape[0]
    if theta.shape[0] != s or theta_dot.shape[0] != s or theta_ddot.shape[0] != s:
        return BAD_SHAPE
    if theta.shape[0] == 3:  # s a compile-time constant: LLVM unrolls the small loops
        return _tau_s(T, theta, theta_dot, theta_ddot, H, D, p_ext, tau, work, 3)
    if theta.shape[0] == 6:
        return _tau_s(T, theta, theta_dot, theta_ddot, H, D, p_ext, tau, work, 6)
    return _tau_s(T, theta, theta_dot, theta_ddot, H, D, p_ext, tau, work, theta.shape[0])


@njit(cache=True)
def _scratch(s):
    return np.empty(work_size(s))


@njit(cache=True)
def eval_outputs(T, theta, f):
    """As eval_outputs_w with a scratch array allocated per call (offline use)."""
    return eval_outputs_w(T, theta, f, _scratch(theta.shape[0]))


@njit(cache=True)
def eval_model(T, theta, H, D, p_ext):
    """As eval_model_w with a scratch array allocated per call (prefer eval_model_w online)."""
    return eval_model_w(T, theta, H, D, p_ext, _scratch(theta.shape[0]))


@njit(cache=True)
def eval_tau(T, theta, theta_dot, theta_ddot, H, D, p_ext, tau):
    """As eval_tau_w with a scratch array allocated per call (prefer eval_tau_w online)."""
    return eval_tau_w(T, theta, theta_dot, theta_ddot, H, D, p_ext, tau,
                      _scratch(theta.shape[0]))


@njit(cache=True)
def spline_face_jumps(T, scale, per_face):
    """Spline tree: largest relative step of any output across the interior knot planes.

    On every interior knot plane of every axis, per_face^(s-1) points inside each cell face
    are evaluated with the polynomial pieces on both sides (the knot span forced to the left
    and to the right one). Returns (max |f_left - f_right| / scale, faces checked, the point
    of the max)."""
    s = T[LO].shape[0]
    nf = scale.shape[0]
    work = _scratch(s)
    fl = np.empty(nf)
    fr = np.empty(nf)
    th = np.empty(s)
    best = np.zeros(s)
    worst = 0.0
    faces = 0
    counts = np.empty(s, np.int64)
    idx = np.zeros(s, np.int64)
    for d in range(s):
        nd = T[KNOT_COUNT][d] - ORDER
        for plane in range(ORDER, nd):  # interior knots t[4..n-1]: spans plane-1 | plane
            th_d = T[KNOTS][T[KNOT_START][d] + plane]
            n_cells = 1
            for a in range(s):
                counts[a] = 1 if a == d else (T[KNOT_COUNT][a] - 2 * ORDER + 1) * per_face
                n_cells *= counts[a]
            n_faces = 1
            for a in range(s):
                if a != d:
                    n_faces *= T[KNOT_COUNT][a] - 2 * ORDER + 1
            faces += n_faces
            for c in range(n_cells):
                rem = c
                for a in range(s - 1, -1, -1):
                    idx[a] = rem % counts[a]
                    rem //= counts[a]
                for a in range(s):
                    if a == d:
                        th[a] = th_d
                    else:
                        cell = idx[a] // per_face
                        frac = (idx[a] % per_face + 0.5) / per_face
                        t0 = T[KNOTS][T[KNOT_START][a] + ORDER - 1 + cell]
                        t1 = T[KNOTS][T[KNOT_START][a] + ORDER + cell]
                        th[a] = t0 + (t1 - t0) * frac
                spline_outputs(T, th, fl, work[s + s * (s + 1) // 2:], s, d, plane - 1)
                spline_outputs(T, th, fr, work[s + s * (s + 1) // 2:], s, d, plane)
                for o in range(nf):
                    j = abs(fl[o] - fr[o]) / scale[o]
                    if j > worst:
                        worst = j
                        best[:] = th
    return worst, faces, best
