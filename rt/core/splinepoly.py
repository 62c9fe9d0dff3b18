"""Load-time tables of the fast spline kernel: per-span power-form B-splines and span lookup.

Computed from a spline tree's knots (no file change), held in the kernels' tuple
(``pkrt.rt.core.tree.Tree.arrays``):

- ``span_axis`` (s, 3) int32: per axis the first bin in ``span_bins``, the bin count, the first
  span row in ``span_map`` / ``span_poly``.
- ``bin_map`` (s, 2) float64: per axis (lo_a, 1 / h_a), h_a the bin width (half the axis's
  narrowest knot interval, so a bin holds at most one knot).
- ``span_bins`` (total bins,) int32: the knot span (3..n-1, the ``knot_span`` convention) at the
  left end of each bin. The kernel looks the span up here and corrects it by at most a step or
  two against the knots, so it is the binary search's span exactly, without its branches.
- ``span_map`` (total spans, 2) float64: per span i (t_i, 1 / (t_{i+1} - t_i)).
- ``span_poly`` (total spans, 4, 4) float64: the 4 non-zero cubic B-splines on span i (those of
  basis functions i-3..i) as polynomials in u = (x - t_i) / (t_{i+1} - t_i) in [0, 1]:
  N_k(x) = sum_p span_poly[j, k, p] u^p, evaluated by Horner (no divisions).
- ``spl_pad`` (rows, n_pad) float64: the spline coefficients with each row padded with zeros to
  a multiple of 4 outputs (whole AVX2 vectors, no remainder loop), starting on a 64-byte cache
  line (numpy's 16-byte alignment made half of the kernel's 32-byte loads straddle two lines:
  1.2x the time at random states, measured).

The polynomial coefficients come from the same Cox-de Boor recursion as the reference kernel run
on polynomials in u, so the values agree with it to rounding (about 1e-16 relative).
"""

from __future__ import annotations

import numpy as np
from numpy.polynomial import Polynomial as P

ORDER = 4
MAX_BINS = 4096  # per axis; a finer grading keeps correct spans with a few more steps


def aligned_zeros(shape: tuple, align: int = 64) -> np.ndarray:
    """A C-contiguous float64 array of zeros whose data starts on an ``align``-byte boundary."""
    n = int(np.prod(shape))
    buf = np.zeros(n + align // 8)
    start = (-buf.ctypes.data % align) // 8
    return buf[start:start + n].reshape(shape)


def pad_width(n_out: int) -> int:
    """Outputs per coefficient row in the kernel's layout: n_out rounded up to 4."""
    return -(-n_out // 4) * 4


def span_basis_polys(t: np.ndarray, i: int) -> np.ndarray:
    """(4, 4): the cubic B-splines i-3..i on span [t_i, t_{i+1}] as power-form polynomials in
    u = (x - t_i) / (t_{i+1} - t_i) (column p: coefficient of u^p). Cox-de Boor ('The NURBS
    Book' A2.2) on polynomials."""
    w = t[i + 1] - t[i]
    x_minus = [None] + [P([t[i] - t[i + 1 - j], w]) for j in (1, 2, 3)]  # left_j = x - t[i+1-j]
    right = [None] + [P([t[i + j] - t[i], -w]) for j in (1, 2, 3)]  # right_j = t[i+j] - x
    N = [P([1.0])]
    for d in (1, 2, 3):
        saved = P([0.0])
        nxt = []
        for r in range(d):
            temp = N[r] / (t[i + r + 1] - t[i + 1 - d + r])  # right_{r+1} + left_{d-r}
            nxt.append(saved + right[r + 1] * temp)
            saved = x_minus[d - r] * temp
        nxt.append(saved)
        N = nxt
    out = np.zeros((ORDER, ORDER))
    for k, p in enumerate(N):
        c = p.coef[:ORDER]
        out[k, :len(c)] = c
    return out


def _binary_span(t: np.ndarray, n: int, x: float) -> int:
    """The reference kernel's ``knot_span`` (largest i in 3..n-1 with t[i] <= x)."""
    lo_i, hi_i = ORDER - 1, n
    while hi_i - lo_i > 1:
        mid = (lo_i + hi_i) >> 1
        if x < t[mid]:
            hi_i = mid
        else:
            lo_i = mid
    return lo_i


def spline_tables(knots: np.ndarray, knot_start: np.ndarray, knot_count: np.ndarray,
                  spl_coef: np.ndarray) -> dict[str, np.ndarray]:
    """The fast kernel's arrays (module docstring) for a spline tree's knots and coefficients."""
    s = len(knot_start)
    span_axis = np.zeros((s, 3), np.int32)
    bin_map = np.zeros((s, 2))
    bins: list[np.ndarray] = []
    maps: list[np.ndarray] = []
    polys: list[np.ndarray] = []
    n_bins = n_spans = 0
    for a in range(s):
        t = np.asarray(knots[knot_start[a]:knot_start[a] + knot_count[a]], float)
        n = len(t) - ORDER
        lo, hi = t[ORDER - 1], t[n]
        widths = np.diff(t[ORDER - 1:n + 1])
        h = max(float(widths.min()) / 2.0, (hi - lo) / MAX_BINS)
        nb = int(np.ceil((hi - lo) / h)) + 1
        span_axis[a] = (n_bins, nb, n_spans)
        bin_map[a] = (lo, 1.0 / h)
        bins.append(np.array([_binary_span(t, n, min(lo + b * h, hi)) for b in range(nb)], np.int32))
        spans = range(ORDER - 1, n)
        maps.append(np.array([(t[i], 1.0 / (t[i + 1] - t[i])) for i in spans]).reshape(-1, 2))
        polys.append(np.array([span_basis_polys(t, i) for i in spans]).reshape(-1, ORDER, ORDER))
        n_bins += nb
        n_spans += n - ORDER + 1
    rows, n_out = spl_coef.shape
    spl_pad = aligned_zeros((rows, pad_width(n_out)))
    spl_pad[:, :n_out] = spl_coef
    return dict(span_axis=span_axis, bin_map=bin_map,
                span_bins=np.concatenate(bins) if bins else np.zeros(0, np.int32),
                span_map=np.concatenate(maps) if maps else np.zeros((0, 2)),
                span_poly=np.concatenate(polys) if polys else np.zeros((0, ORDER, ORDER)),
                spl_pad=spl_pad)


def empty_tables(s: int) -> dict[str, np.ndarray]:
    """The same arrays, empty (a boxes tree, or the reference path), with the kernels' dtypes."""
    return dict(span_axis=np.zeros((0, 3), np.int32), bin_map=np.zeros((0, 2)),
                span_bins=np.zeros(0, np.int32), span_map=np.zeros((0, 2)),
                span_poly=np.zeros((0, ORDER, ORDER)), spl_pad=np.zeros((0, 0)))
