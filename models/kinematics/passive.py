"""Passive-joint limits and interference of bodies, from the description's protection fields
(``description``: a joint's ``cone`` or ``range``, a body's ``radius`` and ``segment``).

Items, each with a margin (its unit, m or rad; negative: beyond the limit):

- **cone** (spherical, universal joint): the angle between the joint's cone axis as fixed in
  body 1 and as fixed in body 2 (they coincide at the assembly guess); margin = cone - angle.
  On a body whose spin is an idle freedom (a rod between two ball joints: the model locks it
  only to be determinate, the real rod turns freely) the tilt is taken at the rod's best spin:
  |angle(w, s) - angle(c, s)|, with s the spin axis and c the cone axis on the rod, w on the
  other body (exact, whatever the lock; for a cone axis along the rod, the rod's swing).
- **range** (passive revolute: the angle from ref1 to ref2 about axis1, rad; passive prismatic:
  (point2 - point1) . axis1, m); margin = the distance to the nearer end, inside.
- **pair** of bodies with a radius (capsules: the points within the radius of the body's
  segment) that share no joint: margin = the clearance, the distance between the two segments
  less both radii.

Margins are computed over many configurations at once (one numba loop): X (n, nb, 3), R (n,
nb, 3, 3) as the assembly gives them (centres of mass, rotations; body index -1: the ground).
``PathCheck`` assembles a planned actuator path (every sample where the actuators have moved
``STEP`` of their range since the last one checked, then every sample before the first
violation found) and refuses it with the item and the time or program line; ``Guard`` is the
runtime's check of one configuration (a stream's or a jog's stopping point).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from numba import njit

from pkrt.rt.core.errors import UserError

from .assembly import Assembler
from .mechanism import AssemblyError, Mechanism

STEP = 0.005  # a path is checked where the actuators moved this fraction of their range since the last check


@dataclass(frozen=True)
class Passive:
    """The compiled protection items of a mechanism (arrays in the centre-of-mass frames)."""
    names: tuple[str, ...]  # one per item: a joint's name, or "body1/body2" for a pair
    kinds: tuple[str, ...]  # "cone", "range" or "pair"
    units: tuple[str, ...]  # "rad" or "m"
    cone_b: np.ndarray  # (k, 2) body indices (-1: ground)
    cone_a: np.ndarray  # (k, 2, 3) the cone axis in body 1's and body 2's frame
    cone_max: np.ndarray  # (k,) rad
    cone_spin: np.ndarray  # (k, 3): the idle spin axis of body 1 or 2 (its frame), zero if none
    cone_side: np.ndarray  # (k,) 0: no idle spin, 1 or 2: body 1 or 2 spins idly
    cone_beta: np.ndarray  # (k,) rad: the angle between that body's cone axis and its spin axis
    rev_b: np.ndarray  # (k, 2)
    rev_uvr: np.ndarray  # (k, 3, 3): u1, v1 (body 1: ref1 across axis1, axis1 x it), ref2 (body 2)
    rev_lim: np.ndarray  # (k, 2) rad
    pri_b: np.ndarray  # (k, 2)
    pri_pa: np.ndarray  # (k, 3, 3): point1, axis1 (body 1), point2 (body 2)
    pri_lim: np.ndarray  # (k, 2) m
    cap_b: np.ndarray  # (c,) body of each capsule
    cap_ends: np.ndarray  # (c, 2, 3) segment ends
    cap_r: np.ndarray  # (c,) m
    pairs: np.ndarray  # (p, 2) capsule indices

    @property
    def n_items(self) -> int:
        return len(self.names)

    def margins(self, X: np.ndarray, R: np.ndarray) -> np.ndarray:
        """Margins (n, items) at configurations X (n, nb, 3), R (n, nb, 3, 3) (units: ``units``;
        one compiled loop: a few microseconds a configuration)."""
        out = np.empty((len(X), self.n_items))
        _margins(np.ascontiguousarray(X, dtype=float), np.ascontiguousarray(R, dtype=float), self.cone_b,
                 self.cone_a, self.cone_max, self.cone_spin, self.cone_side, self.cone_beta, self.rev_b, self.rev_uvr,
                 self.rev_lim, self.pri_b, self.pri_pa, self.pri_lim, self.cap_b, self.cap_ends, self.cap_r, self.pairs,
                 out)
        return out

    def value(self, k: int, margin: float) -> str:
        """Item ``k`` at ``margin``, in words: what it is and how far inside or beyond its limit."""
        kind, name, unit = self.kinds[k], self.names[k], self.units[k]
        if kind == "pair":
            a, b = name.split("/")
            return (f"bodies {a} and {b} {'touch' if margin < 0 else 'are apart'}: clearance "
                    f"{margin * 1e3:.1f} mm between their capsules")
        if kind == "cone":
            lim = float(self.cone_max[self._index(k)])
            ang = lim - margin
            return (f"joint {name} tilted {ang:.4f} rad ({np.degrees(ang):.1f} deg), its cone {lim:.4f} rad "
                    f"({np.degrees(lim):.1f} deg)")
        lims = self.rev_lim if unit == "rad" else self.pri_lim
        lo, hi = lims[self._index(k)]
        return f"joint {name} {'outside' if margin < 0 else 'inside'} its range [{lo:g}, {hi:g}] {unit} by {abs(margin):.4g} {unit}"

    def _index(self, k: int) -> int:
        """Item k's index within its own kind's arrays."""
        kind, unit = self.kinds[k], self.units[k]
        first = next(i for i in range(self.n_items) if self.kinds[i] == kind and self.units[i] == unit)
        return k - first


# 3-vectors as tuples of floats inside the kernels: no allocation, no BLAS call per product

@njit(cache=True)
def _turn(R, k, b, v):
    """R[k, b] v; the ground (b < 0) does not turn."""
    if b < 0:
        return v[0], v[1], v[2]
    M = R[k, b]
    return (M[0, 0] * v[0] + M[0, 1] * v[1] + M[0, 2] * v[2], M[1, 0] * v[0] + M[1, 1] * v[1] + M[1, 2] * v[2],
            M[2, 0] * v[0] + M[2, 1] * v[1] + M[2, 2] * v[2])


@njit(cache=True)
def _at(X, R, k, b, p):
    """World position of point p of body b at configuration k."""
    t = _turn(R, k, b, p)
    if b < 0:
        return t
    return X[k, b, 0] + t[0], X[k, b, 1] + t[1], X[k, b, 2] + t[2]


@njit(cache=True)
def _dot(a, b):
    return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]


@njit(cache=True)
def _sub(a, b):
    return a[0] - b[0], a[1] - b[1], a[2] - b[2]


@njit(cache=True)
def _axpy(s, a, b):
    """b + s a."""
    return b[0] + s * a[0], b[1] + s * a[1], b[2] + s * a[2]


@njit(cache=True)
def _angle(a, b):
    """The angle (rad) between unit vectors a and b."""
    c = (a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0])
    return np.arctan2(np.sqrt(_dot(c, c)), _dot(a, b))


@njit(cache=True)
def _segment_gap(p0, p1, q0, q1):
    """Distance between segments [p0, p1] and [q0, q1]: the closest points by clamped parameters
    (Ericson, Real-Time Collision Detection, 5.1.9), degenerate segments (points) included."""
    d1, d2, r = _sub(p1, p0), _sub(q1, q0), _sub(p0, q0)
    a, e, f = _dot(d1, d1), _dot(d2, d2), _dot(d2, r)
    tiny = 1e-300
    if a <= tiny and e <= tiny:
        s, t = 0.0, 0.0
    elif a <= tiny:
        s, t = 0.0, min(max(f / e, 0.0), 1.0)
    else:
        c = _dot(d1, r)
        if e <= tiny:
            s, t = min(max(-c / a, 0.0), 1.0), 0.0
        else:
            b = _dot(d1, d2)
            den = a * e - b * b
            s = min(max((b * f - c * e) / den, 0.0), 1.0) if den > 1e-12 * a * e else 0.0
            t = (b * s + f) / e
            if t < 0.0:
                s, t = min(max(-c / a, 0.0), 1.0), 0.0
            elif t > 1.0:
                s, t = min(max((b - c) / a, 0.0), 1.0), 1.0
    g = _sub(_axpy(s, d1, p0), _axpy(t, d2, q0))
    return np.sqrt(_dot(g, g))


@njit(cache=True)
def segment_distance(p0, p1, q0, q1):
    """Distances (n,) between segments [p0[i], p1[i]] and [q0[i], q1[i]] (arrays (n, 3))."""
    out = np.empty(p0.shape[0])
    for i in range(p0.shape[0]):
        out[i] = _segment_gap((p0[i, 0], p0[i, 1], p0[i, 2]), (p1[i, 0], p1[i, 1], p1[i, 2]),
                              (q0[i, 0], q0[i, 1], q0[i, 2]), (q1[i, 0], q1[i, 1], q1[i, 2]))
    return out


@njit(cache=True)
def _margins(X, R, cone_b, cone_a, cone_max, cone_spin, cone_side, cone_beta, rev_b, rev_uvr, rev_lim,
             pri_b, pri_pa, pri_lim, cap_b, cap_ends, cap_r, pairs, out):
    """out[k] = the margins of every item at configuration k (``Passive``'s order: cones,
    revolute ranges, prismatic ranges, pairs)."""
    for k in range(X.shape[0]):
        col = 0
        for i in range(cone_b.shape[0]):
            w1 = _turn(R, k, cone_b[i, 0], cone_a[i, 0])
            w2 = _turn(R, k, cone_b[i, 1], cone_a[i, 1])
            side = cone_side[i]
            if side == 1:  # body 1 spins idly: body 2's axis against body 1's spin axis
                ang = abs(_angle(w2, _turn(R, k, cone_b[i, 0], cone_spin[i])) - cone_beta[i])
            elif side == 2:
                ang = abs(_angle(w1, _turn(R, k, cone_b[i, 1], cone_spin[i])) - cone_beta[i])
            else:
                ang = _angle(w1, w2)
            out[k, col] = cone_max[i] - ang
            col += 1
        for i in range(rev_b.shape[0]):
            u = _turn(R, k, rev_b[i, 0], rev_uvr[i, 0])
            v = _turn(R, k, rev_b[i, 0], rev_uvr[i, 1])
            r = _turn(R, k, rev_b[i, 1], rev_uvr[i, 2])
            q = np.arctan2(_dot(r, v), _dot(r, u))
            out[k, col] = min(q - rev_lim[i, 0], rev_lim[i, 1] - q)
            col += 1
        for i in range(pri_b.shape[0]):
            d = _sub(_at(X, R, k, pri_b[i, 1], pri_pa[i, 2]), _at(X, R, k, pri_b[i, 0], pri_pa[i, 0]))
            q = _dot(d, _turn(R, k, pri_b[i, 0], pri_pa[i, 1]))
            out[k, col] = min(q - pri_lim[i, 0], pri_lim[i, 1] - q)
            col += 1
        for i in range(pairs.shape[0]):
            a, b = pairs[i, 0], pairs[i, 1]
            ba, bb = cap_b[a], cap_b[b]
            gap = _segment_gap(_at(X, R, k, ba, cap_ends[a, 0]), _at(X, R, k, ba, cap_ends[a, 1]),
                               _at(X, R, k, bb, cap_ends[b, 0]), _at(X, R, k, bb, cap_ends[b, 1]))
            out[k, col] = gap - cap_r[a] - cap_r[b]
            col += 1


def compile_passive(mech: Mechanism) -> Passive | None:
    """The protection items of a mechanism (None when its description declares none)."""
    desc = mech.description
    com = {b.name: b.com for b in desc.bodies}
    idx = {name: i for i, name in enumerate(mech.body_names)}
    idx["ground"], com["ground"] = -1, np.zeros(3)
    act = {a.joint for a in desc.actuators}
    idle = {f.body: f.axis / np.linalg.norm(f.axis) for f in mech.idle}
    names, kinds, units = [], [], []
    cone_spin, cone_side, cone_beta = [], [], []
    cone_b, cone_a, cone_max, rev_b, rev_uvr, rev_lim, pri_b, pri_pa, pri_lim = ([] for _ in range(9))
    for j in desc.joints:
        if j.cone is not None:
            cone_b.append((idx[j.body1], idx[j.body2]))
            cone_a.append((j.cone_axis1, j.cone_axis2))
            cone_max.append(j.cone)
            side = 1 if j.body1 in idle else 2 if j.body2 in idle else 0
            spin = idle[(j.body1, j.body2)[side - 1]] if side else np.zeros(3)
            cone_spin.append(spin), cone_side.append(side)
            cone_beta.append(float(_angle(spin, (j.cone_axis1, j.cone_axis2)[side - 1])) if side else 0.0)
    for j in desc.joints:
        if j.range is not None and j.name not in act and j.type == "revolute":
            r1 = j.ref1 - (j.ref1 @ j.axis1) * j.axis1
            r1 /= np.linalg.norm(r1)
            rev_b.append((idx[j.body1], idx[j.body2]))
            rev_uvr.append((r1, np.cross(j.axis1, r1), j.ref2))
            rev_lim.append(j.range)
    for j in desc.joints:
        if j.range is not None and j.name not in act and j.type == "prismatic":
            pri_b.append((idx[j.body1], idx[j.body2]))
            pri_pa.append((j.point1 - com[j.body1], j.axis1, j.point2 - com[j.body2]))
            pri_lim.append(j.range)
    for kind, unit, sel in (("cone", "rad", lambda j: j.cone is not None),
                            ("range", "rad", lambda j: j.range is not None and j.type == "revolute"),
                            ("range", "m", lambda j: j.range is not None and j.type == "prismatic")):
        for j in desc.joints:
            if sel(j):
                names.append(j.name), kinds.append(kind), units.append(unit)
    caps = [b for b in desc.bodies if b.radius is not None]
    linked = {frozenset((j.body1, j.body2)) for j in desc.joints}
    pairs = [(i, k) for i in range(len(caps)) for k in range(i + 1, len(caps))
             if frozenset((caps[i].name, caps[k].name)) not in linked]
    for i, k in pairs:
        names.append(f"{caps[i].name}/{caps[k].name}"), kinds.append("pair"), units.append("m")
    if not names:
        return None

    def arr(v, shape):
        return np.array(v, dtype=float).reshape(shape)

    return Passive(tuple(names), tuple(kinds), tuple(units),
                   np.array(cone_b, dtype=np.int64).reshape(-1, 2), arr(cone_a, (-1, 2, 3)), arr(cone_max, (-1,)),
                   arr(cone_spin, (-1, 3)), np.array(cone_side, dtype=np.int64), arr(cone_beta, (-1,)),
                   np.array(rev_b, dtype=np.int64).reshape(-1, 2), arr(rev_uvr, (-1, 3, 3)), arr(rev_lim, (-1, 2)),
                   np.array(pri_b, dtype=np.int64).reshape(-1, 2), arr(pri_pa, (-1, 3, 3)), arr(pri_lim, (-1, 2)),
                   np.array([idx[b.name] for b in caps], dtype=np.int64),
                   arr([b.segment - b.com for b in caps], (-1, 2, 3)), arr([b.radius for b in caps], (-1,)),
                   np.array(pairs, dtype=np.int64).reshape(-1, 2))


def reference_margins(mech: Mechanism) -> dict | None:
    """What ``pkrt model check`` reports: every item's margin at the reference assembly (units
    m or rad), the smallest joint margin and the closest pair (None without protection)."""
    p = compile_passive(mech)
    if p is None:
        return None
    m = p.margins(mech.ref_config.X[None], mech.ref_config.R[None])[0]
    items = [{"name": n, "kind": k, "unit": u, "margin": float(x), "text": p.value(i, float(x))}
             for i, (n, k, u, x) in enumerate(zip(p.names, p.kinds, p.units, m))]
    joints = [it for it in items if it["kind"] != "pair"]
    pairs = [it for it in items if it["kind"] == "pair"]
    return {"items": items,
            "tightest_joint": min(joints, key=lambda it: it["margin"]) if joints else None,
            "closest_pair": min(pairs, key=lambda it: it["margin"]) if pairs else None,
            "inside": bool(np.all(m >= 0))}


def check_rows(pos: np.ndarray, step: float, widths: np.ndarray) -> np.ndarray:
    """Indices of the rows of an actuator path (n, s) to check: the first, the last, and every
    one where the path has moved ``step`` of the actuators' ``widths`` (largest axis, summed
    along the path) since the last checked."""
    n = len(pos)
    if n <= 2:
        return np.arange(n)
    moved = np.concatenate([[0.0], np.cumsum(np.abs(np.diff(pos, axis=0) / widths).max(axis=1))])
    mark = np.floor(moved / step)
    keep = np.flatnonzero(np.diff(mark) > 0) + 1
    return np.unique(np.concatenate([[0], keep, [n - 1]]))


class PathCheck:
    """Checks configurations of one mechanism against its protection items: ``path`` refuses a
    planned actuator path, ``margins_at`` gives the margins of actuator values. Holds the
    assembler's warm-start state: one per thread."""

    def __init__(self, mech: Mechanism, passive: Passive | None = None, step: float = STEP):
        self.mech, self.step = mech, step
        self.passive = passive or compile_passive(mech)
        self.assembler = Assembler(mech)
        self.widths = mech.ranges[:, 1] - mech.ranges[:, 0]

    def configs(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """X, R at actuator rows (k, s), each assembled warm from the last; and the index of
        the first row that cannot be assembled (-1: none; X, R hold the rows before it)."""
        X, R = [], []
        for k, th in enumerate(rows):
            try:
                c = self.assembler.solve(th)
            except AssemblyError:
                self.assembler.reset()
                return np.array(X).reshape(-1, self.mech.n_bodies, 3), np.array(R).reshape(-1, self.mech.n_bodies, 3, 3), k
            X.append(c.X), R.append(c.R)
        return np.array(X).reshape(-1, self.mech.n_bodies, 3), np.array(R).reshape(-1, self.mech.n_bodies, 3, 3), -1

    def margins_at(self, rows) -> np.ndarray:
        """Margins (k, items) at actuator rows (k, s); raises ``AssemblyError`` for a row that
        cannot be assembled."""
        rows = np.atleast_2d(np.asarray(rows, float))
        X, R, bad = self.configs(rows)
        if bad >= 0:
            self.assembler.solve(rows[bad])  # raises, with its residual
        return self.passive.margins(X, R)

    def first_violation(self, pos: np.ndarray) -> tuple[int, int, float] | None:
        """(row, item, margin) of the first row of an actuator path (n, s) beyond a limit, item
        -1 for a row that cannot be assembled; None when the path keeps inside. The rows
        ``check_rows`` picks are checked first; the rows since the last good one before the
        first bad one are then checked each, for the first bad row."""
        pos = np.asarray(pos, float)
        self.assembler.reset()
        rows = check_rows(pos, self.step, self.widths)
        found = self._scan(pos[rows])
        if found is None:
            return None
        c = found[0]
        lo = rows[c - 1] + 1 if c > 0 else 0
        self.assembler.reset()
        if c > 0:
            self.assembler.solve(pos[rows[c - 1]])
        fine = self._scan(pos[lo:rows[c] + 1])
        k, item, margin = fine if fine is not None else (rows[c] - lo, found[1], found[2])
        return lo + k, item, margin

    def _scan(self, rows: np.ndarray) -> tuple[int, int, float] | None:
        """(index, item, margin) of the first of consecutive actuator rows beyond a limit (item
        -1: cannot be assembled), from the assembler's state; None when all keep inside."""
        X, R, bad = self.configs(rows)
        m = self.passive.margins(X, R)
        hit = np.flatnonzero((m < 0).any(axis=1))
        if len(hit):
            k = int(hit[0])
            i = int(np.argmin(m[k]))
            return k, i, float(m[k, i])
        return (bad, -1, float("nan")) if bad >= 0 else None

    def path(self, pos: np.ndarray, rate_hz: float, where: str = "", lines: np.ndarray | None = None) -> None:
        """Refuse (``UserError``, one line) an actuator path (n, s) at ``rate_hz`` that takes a
        passive joint beyond its limit or makes two bodies touch: the item, the time and, with
        ``lines`` (the program line of each sample), the line."""
        v = self.first_violation(pos)
        if v is None:
            return
        k, item, margin = v
        line = int(lines[k]) if lines is not None and k < len(lines) and lines[k] else None
        at = (f"line {line}: " if line else "") + f"at t = {k / rate_hz:.4f} s "
        if item < 0:
            raise UserError(f"{where}{at}{self.mech.name} cannot be assembled at theta = "
                            f"{np.round(pos[k], 6).tolist()} (outside its workspace)")
        raise UserError(f"{where}{at}{self.passive.value(item, margin)}")


class Guard:
    """The runtime's check of unplanned motion (a stream, a velocity jog), made here from the
    model and handed to the loop as a callable: ``guard(pos, stop)`` is None when the stopping
    point ``stop`` (actuator values) keeps every item inside its limit, or no item gets further
    beyond its limit than at ``pos`` (moving out of a violation is allowed); else the reason,
    one line. Each call assembles warm from the last one."""

    def __init__(self, mech: Mechanism, passive: Passive | None = None):
        self.check = PathCheck(mech, passive)

    def __call__(self, pos: np.ndarray, stop: np.ndarray) -> str | None:
        p = self.check.passive
        try:
            m_stop = self.check.margins_at(stop)[0]
        except AssemblyError:
            self.check.assembler.reset()
            return f"passive-joint check: cannot assemble at {np.round(stop, 6).tolist()} (outside the workspace)"
        if np.all(m_stop >= 0):
            return None
        try:
            m_now = self.check.margins_at(pos)[0]
        except AssemblyError:
            self.check.assembler.reset()
            m_now = np.zeros_like(m_stop)
        worse = m_stop < np.minimum(m_now, 0.0) - 1e-12
        if not worse.any():
            return None
        i = int(np.argmin(np.where(worse, m_stop, np.inf)))
        return f"stopped short of a limit: at its stopping point {p.value(i, float(m_stop[i]))}"
