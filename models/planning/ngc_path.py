"""The tool path of canonical motions as points (numba kernels over arrays, for the pre-check):
``samples`` puts points along lines, arcs and helices (at most ``step`` apart, arcs also within
``sag`` of the curve and at their extreme points in the plane), each with its program line and
kind, in task coordinates (m); ``Decimator`` keeps a bounded subset of a stream of such points
for the path preview, whatever the program's length (a greedy chord fit: points dropped while
those between stay within a tolerance of the chord, the tolerance doubled as needed).

Program coordinates to task coordinates as ``gcode._Items.machine``: P = origin + (p + offset)
* units * 1e-3 (m), p and offset in program units, units mm per program unit. An arc's geometry
is ``gcode._arc``'s: the radius going linearly from the start's to the end's over the sweep
``find_turn`` gives, the normal coordinate linearly (a helix).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .ngc_interp import find_turn

TRAVERSE, FEED, ARC = 0, 1, 2  # row kinds (as ngc_scan's)
# samples' figures: lengths (mm), the feed time (min), the box (lowest x y z, highest x y z; m), motions per kind
ACC_FEED_MM, ACC_TRAVERSE_MM, ACC_FEED_MIN, ACC_BOX, ACC_COUNT = 0, 1, 2, 3, 9
N_ACC = 12
_AXES = np.array([[0, 1, 2], [2, 0, 1], [1, 2, 0]], np.int64)
_HALF_PI = 0.5 * math.pi
MAX_SKIP = 16  # points dropped in a row at most (the preview's decimation)


_find_turn = njit(cache=True)(find_turn)  # the interpreter's own, compiled


@njit(cache=True, _nrt=False)
def _put(out, line, kind, w, m, x0, x1, x2, scale, off, origin, ln, kd):
    """Point m (program coordinates x0, x1, x2) into the outputs, if writing."""
    if w:
        out[m, 0] = origin[0] + (x0 + off[0]) * scale
        out[m, 1] = origin[1] + (x1 + off[1]) * scale
        out[m, 2] = origin[2] + (x2 + off[2]) * scale
        line[m] = ln
        kind[m] = kd


@njit(cache=True, _nrt=False)
def _arc_at(s, e, a1, a2, a3, k1, k2, r0, r1, phi0, phi, u, q):
    """The point of the arc at angle phi (fraction u of the sweep) into q (program coordinates)."""
    r = r0 + (r1 - r0) * u
    q[a1] = k1 + r * math.cos(phi)
    q[a2] = k2 + r * math.sin(phi)
    q[a3] = s[a3] + (e[a3] - s[a3]) * u


@njit(cache=True, _nrt=False, nogil=True)
def samples(kind, line, start, end, centre, turn, plane, feed, units, offset, origin, step, sag, out, out_line,
            out_kind, acc, write, q):
    """Points along rows of motions (kind, line, start, end (n, 3), centre (n, 2), turn, plane
    (170/180/190), feed (program units / min), units (n,) mm per unit, offset (n, 3)): each
    row's end and its inner points (not its start, the previous row's end). ``step`` and
    ``sag`` in mm. Returns the number of points; only when ``write`` (call once without to size
    the outputs), writes them (``out`` (m, 3) m, ``out_line``, ``out_kind``) and adds to ``acc``
    (``ACC_*``: lengths, feed time, the points' box, the motions per kind)."""
    m = 0
    for k in range(kind.shape[0]):
        s, e, mm = start[k], end[k], units[k]
        scale, off, ln, kd = mm * 1e-3, offset[k], line[k], kind[k]
        m0 = m
        if kd != ARC:
            d0, d1, d2 = e[0] - s[0], e[1] - s[1], e[2] - s[2]
            length = math.sqrt(d0 * d0 + d1 * d1 + d2 * d2) * mm
            n = max(1, int(math.ceil(length / step)))
            for i in range(1, n + 1):
                u = i / n
                _put(out, out_line, out_kind, write, m, s[0] + d0 * u, s[1] + d1 * u, s[2] + d2 * u, scale, off,
                     origin, ln, kd)
                m += 1
            if write:
                _sum(acc, out, m0, m, kd, length, feed[k] * mm)
            continue
        p = (plane[k] - 170) // 10
        a1, a2, a3 = _AXES[p, 0], _AXES[p, 1], _AXES[p, 2]
        k1, k2 = centre[k, 0], centre[k, 1]
        sweep = _find_turn((s[a1], s[a2]), (k1, k2), turn[k], (e[a1], e[a2]))
        r0 = math.hypot(s[a1] - k1, s[a2] - k2)
        r1 = math.hypot(e[a1] - k1, e[a2] - k2)
        phi0 = math.atan2(s[a2] - k2, s[a1] - k1)
        rm = max(r0, r1) * mm
        length = math.hypot(abs(sweep) * 0.5 * (r0 + r1), e[a3] - s[a3]) * mm
        dphi = step / rm if rm > 0 else 2 * math.pi
        if rm > sag:
            dphi = min(dphi, 2 * math.acos(1 - sag / rm))
        n = max(1, int(math.ceil(abs(sweep) / dphi)))
        prev = phi0
        for i in range(1, n + 1):
            u = i / n
            phi = phi0 + sweep * u
            # the extreme points in the plane (multiples of pi/2) passed since the last point
            lo, hi = min(prev, phi), max(prev, phi)
            j0, j1 = int(math.floor(lo / _HALF_PI)) + 1, int(math.ceil(hi / _HALF_PI)) - 1
            for t in range(j1 - j0 + 1):
                a = (j0 + t if sweep > 0 else j1 - t) * _HALF_PI
                _arc_at(s, e, a1, a2, a3, k1, k2, r0, r1, phi0, a, (a - phi0) / sweep, q)
                _put(out, out_line, out_kind, write, m, q[0], q[1], q[2], scale, off, origin, ln, kd)
                m += 1
            if i == n:
                q[0], q[1], q[2] = e[0], e[1], e[2]
            else:
                _arc_at(s, e, a1, a2, a3, k1, k2, r0, r1, phi0, phi, u, q)
            _put(out, out_line, out_kind, write, m, q[0], q[1], q[2], scale, off, origin, ln, kd)
            m += 1
            prev = phi
        if write:
            _sum(acc, out, m0, m, kd, length, feed[k] * mm)
    return m


@njit(cache=True, _nrt=False)
def _sum(acc, out, m0, m, kind, length, feed_mm):
    """A row's figures into acc: its length (mm) by kind, its time at feed (min), the box of
    its points out[m0:m], one more motion of its kind."""
    if kind == TRAVERSE:
        acc[ACC_TRAVERSE_MM] += length
    else:
        acc[ACC_FEED_MM] += length
        acc[ACC_FEED_MIN] += length / feed_mm
    acc[ACC_COUNT + kind] += 1
    for j in range(m0, m):
        for a in range(3):
            x = out[j, a]
            if x < acc[ACC_BOX + a]:
                acc[ACC_BOX + a] = x
            if x > acc[ACC_BOX + 3 + a]:
                acc[ACC_BOX + 3 + a] = x


@njit(cache=True, _nrt=False)
def _keep(P, L, K, c, x0, x1, x2, ln, kd):
    P[c, 0], P[c, 1], P[c, 2], L[c], K[c] = x0, x1, x2, ln, kd
    return c + 1


@njit(cache=True, _nrt=False)
def _off_chord(a0, a1, a2, b0, b1, b2, x0, x1, x2, tol):
    """Point x farther than tol from the segment a-b."""
    d0, d1, d2 = b0 - a0, b1 - a1, b2 - a2
    e0, e1, e2 = x0 - a0, x1 - a1, x2 - a2
    dd = d0 * d0 + d1 * d1 + d2 * d2
    u = 0.0 if dd == 0.0 else min(1.0, max(0.0, (e0 * d0 + e1 * d1 + e2 * d2) / dd))
    f0, f1, f2 = e0 - u * d0, e1 - u * d1, e2 - u * d2
    return f0 * f0 + f1 * f1 + f2 * f2 > tol * tol


@njit(cache=True, _nrt=False)
def _coarsen(P, L, K, c, tol, kinds):
    """Decimate the kept points P[:c] in place with ``tol`` (the rule of ``decimate``; without
    ``kinds``, a change of kind is not kept for its own sake); their new count."""
    out, skip0 = 1, 1  # P[skip0:j]: the points skipped since the last one kept (not overwritten yet)
    for j in range(1, c):
        change = kinds and K[j] != K[out - 1]
        bad = change or j - skip0 >= MAX_SKIP
        a = out - 1
        for i in range(skip0, j):
            if bad:
                break
            bad = _off_chord(P[a, 0], P[a, 1], P[a, 2], P[j, 0], P[j, 1], P[j, 2], P[i, 0], P[i, 1], P[i, 2], tol)
        if bad and j - 1 >= skip0:  # the last point skipped ends the chord
            out = _keep(P, L, K, out, P[j - 1, 0], P[j - 1, 1], P[j - 1, 2], L[j - 1], K[j - 1])
            skip0 = j
        if change:
            out = _keep(P, L, K, out, P[j, 0], P[j, 1], P[j, 2], L[j], K[j])
            skip0 = j + 1
    if skip0 < c:  # the last point
        out = _keep(P, L, K, out, P[c - 1, 0], P[c - 1, 1], P[c - 1, 2], L[c - 1], K[c - 1])
    return out


@njit(cache=True, _nrt=False, nogil=True)
def decimate(pts, lines, kinds, P, L, K, B, BL, BK, st, fs):
    """Points pts (n, 3) with their lines and kinds (0 traverse, else feed) into the kept points
    P, L, K (cap rows): a point is dropped while every point dropped since the last one kept
    stays within the tolerance ``fs[0]`` (m) of the chord from that one to the newest, and at
    most ``MAX_SKIP`` in a row; where the kind changes, the run's last point and the new one
    are kept. At ``cap`` the tolerance doubles and the kept points are decimated again. B, BL,
    BK: the points dropped since the last one kept (``st[1]`` of them); ``st[0]``: kept."""
    cap = P.shape[0]
    c, nb, tol = st[0], st[1], fs[0]
    for k in range(pts.shape[0]):
        x0, x1, x2, ln, kd = pts[k, 0], pts[k, 1], pts[k, 2], lines[k], 1 if kinds[k] else 0
        if c == 0:
            c = _keep(P, L, K, c, x0, x1, x2, ln, kd)
            continue
        change = kd != K[c - 1]
        bad = change or nb >= MAX_SKIP
        a = c - 1
        for i in range(nb):
            if bad:
                break
            bad = _off_chord(P[a, 0], P[a, 1], P[a, 2], x0, x1, x2, B[i, 0], B[i, 1], B[i, 2], tol)
        if bad and nb:
            c = _keep(P, L, K, c, B[nb - 1, 0], B[nb - 1, 1], B[nb - 1, 2], BL[nb - 1], BK[nb - 1])
            nb = 0
        if change:
            c = _keep(P, L, K, c, x0, x1, x2, ln, kd)
        else:
            B[nb, 0], B[nb, 1], B[nb, 2], BL[nb], BK[nb] = x0, x1, x2, ln, kd
            nb += 1
        if c >= cap - 2:
            changes = 0
            for j in range(1, c):
                changes += K[j] != K[j - 1]
            exact = 4 * changes < cap  # else mostly changes of kind (a drilling pattern): those go too
            while c >= cap // 2:
                tol *= 2.0
                c = _coarsen(P, L, K, c, tol, exact)
    st[0], st[1], fs[0] = c, nb, tol


class Decimator:
    """A bounded preview of a stream of path points: ``add(points, lines, kinds)`` batch by
    batch, then ``result()`` -> (points (k, 3) m, lines (k,), kinds (k,): 0 traverse, 1 feed or
    arc; the tolerance reached, m). At most ``cap`` points, the first and the last included,
    every change between traverse and feed kept exactly, every point dropped within about twice
    the tolerance of the kept polyline; the tolerance starts at ``tol`` (m) and doubles
    whenever the points would exceed ``cap``."""

    def __init__(self, cap: int = 20_000, tol: float = 1e-5):
        self.P, self.L, self.K = np.zeros((cap, 3)), np.zeros(cap, np.int64), np.zeros(cap, np.int8)
        self.B, self.BL, self.BK = np.zeros((MAX_SKIP, 3)), np.zeros(MAX_SKIP, np.int64), np.zeros(MAX_SKIP, np.int8)
        self.st, self.fs = np.zeros(2, np.int64), np.array([tol])
        self.points_in = 0

    def add(self, points: np.ndarray, lines: np.ndarray, kinds: np.ndarray) -> None:
        self.points_in += len(points)
        decimate(points, lines, kinds, self.P, self.L, self.K, self.B, self.BL, self.BK, self.st, self.fs)

    def result(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        c, nb = int(self.st[0]), int(self.st[1])
        P, L, K = self.P[:c], self.L[:c], self.K[:c]
        if nb:  # the last point of the path
            P, L, K = np.vstack([P, self.B[nb - 1:nb]]), np.append(L, self.BL[nb - 1]), np.append(K, self.BK[nb - 1])
        return P.copy(), L.copy(), K.copy(), float(self.fs[0])
