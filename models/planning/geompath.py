"""Geometric paths (no timing) for the time-optimal planner (``pkrt.models.planning.topp``): lines, arcs
(helical and slightly spiral, as G-code allows), quintic corner blends and splines through
points, each parameterised by sigma in [0, length] with sigma close to arc length.

Coordinates are task coordinates (m; the tool's x, y, z or any subset) or actuator values (m or
rad) for an actuator-space path. Each segment gives P(sigma), P' = dP/dsigma and
P'' = d2P/dsigma2 as (k, m) arrays. A ``Motion`` is a rest-to-rest chain of segments whose
tangents join (corners are blended or made exact stops before a Motion is formed); where two
segments meet the planner checks both one-sided curvatures.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pkrt.rt.core.errors import UserError


@dataclass
class Segment:
    """Base: ``length`` (parameter range), ``feed`` cap on the tool speed |dP/dt| (m/s, inf for
    none), ``line`` (the program line it comes from, or None), ``kind``."""
    length: float
    feed: float = np.inf
    line: int | None = None
    kind: str = ""

    def eval(self, sig: np.ndarray):  # pragma: no cover - abstract
        raise NotImplementedError

    def start(self) -> np.ndarray:
        return self.eval(np.zeros(1))[0][0]

    def end(self) -> np.ndarray:
        return self.eval(np.array([self.length]))[0][0]

    def tangent(self, at_end: bool) -> np.ndarray:
        d = self.eval(np.array([self.length if at_end else 0.0]))[1][0]
        return d / np.linalg.norm(d)


@dataclass
class Line(Segment):
    a: np.ndarray = None
    b: np.ndarray = None

    @classmethod
    def between(cls, a, b, feed=np.inf, line=None) -> "Line":
        a, b = np.asarray(a, float), np.asarray(b, float)
        return cls(float(np.linalg.norm(b - a)), feed, line, "line", a, b)

    def eval(self, sig):
        sig = np.asarray(sig, float)[:, None]
        u = (self.b - self.a) / self.length
        return self.a + sig * u, np.repeat(u[None], len(sig), 0), np.zeros((len(sig), len(self.a)))


@dataclass
class Arc(Segment):
    """centre + r(phi) (cos(phi0 + d phi) e1 + sin(phi0 + d phi) e2) + axis (h0 + k phi), phi in
    [0, sweep] (rad), d = +1 counter-clockwise about ``axis`` (= e1 x e2), -1 clockwise;
    r(phi) = r0 + (r1 - r0) phi / sweep (a spiral when the end radius differs a little)."""
    centre: np.ndarray = None
    e1: np.ndarray = None
    e2: np.ndarray = None
    r0: float = 0.0
    r1: float = 0.0
    phi0: float = 0.0
    sweep: float = 0.0
    direction: int = 1
    h_rate: float = 0.0  # axial travel per radian (helix), m/rad

    @property
    def rho(self) -> float:
        return self.length / self.sweep  # sigma per radian

    def eval(self, sig):
        phi = np.asarray(sig, float) / self.rho
        dr = (self.r1 - self.r0) / self.sweep
        r = self.r0 + dr * phi
        ang = self.phi0 + self.direction * phi
        c, s = np.cos(ang)[:, None], np.sin(ang)[:, None]
        d = self.direction
        radial = c * self.e1 + s * self.e2
        tang = d * (-s * self.e1 + c * self.e2)
        axis = np.cross(self.e1, self.e2)
        P = self.centre + r[:, None] * radial + (self.h_rate * phi)[:, None] * axis
        P1 = dr * radial + r[:, None] * tang + self.h_rate * axis
        P2 = 2 * dr * tang - r[:, None] * radial
        return P, P1 / self.rho, P2 / self.rho**2


_TAU = np.linspace(0.0, 1.0, 201)


@dataclass
class Blend(Segment):
    """Quintic Hermite curve from p0 (tangent u0) to p1 (tangent u1), zero second derivative at
    both ends: joins two lines with continuous position, tangent and curvature."""
    p0: np.ndarray = None
    u0: np.ndarray = None
    p1: np.ndarray = None
    u1: np.ndarray = None

    def eval(self, sig):
        t = np.asarray(sig, float) / self.length
        z = np.zeros_like(self.p0)
        return quintic_hermite(t, self.length, self.p0, self.u0, z, self.p1, self.u1, z)


def quintic_hermite(t, h, p0, v0, a0, p1, v1, a1):
    """The quintic through p0 (t = 0) and p1 (t = 1) with first and second derivatives v0, a0,
    v1, a1 with respect to the parameter sigma = t h: value, d/dsigma, d2/dsigma2, each
    (len(t), m). The end values broadcast: (m,) or (len(t), m)."""
    t = np.asarray(t, float)[:, None]
    t2, t3, t4, t5 = t * t, t**3, t**4, t**5
    h = np.asarray(h, float).reshape(-1, 1) if np.ndim(h) else h
    basis = (  # (value, first, second derivative in t) of the six basis polynomials
        (1 - 10 * t3 + 15 * t4 - 6 * t5, -30 * t2 + 60 * t3 - 30 * t4, -60 * t + 180 * t2 - 120 * t3),
        (t - 6 * t3 + 8 * t4 - 3 * t5, 1 - 18 * t2 + 32 * t3 - 15 * t4, -36 * t + 96 * t2 - 60 * t3),
        (0.5 * t2 - 1.5 * t3 + 1.5 * t4 - 0.5 * t5, t - 4.5 * t2 + 6 * t3 - 2.5 * t4, 1 - 9 * t + 18 * t2 - 10 * t3),
        (0.5 * t3 - t4 + 0.5 * t5, 1.5 * t2 - 4 * t3 + 2.5 * t4, 3 * t - 12 * t2 + 10 * t3),
        (-4 * t3 + 7 * t4 - 3 * t5, -12 * t2 + 28 * t3 - 15 * t4, -24 * t + 84 * t2 - 60 * t3),
        (10 * t3 - 15 * t4 + 6 * t5, 30 * t2 - 60 * t3 + 30 * t4, 60 * t - 180 * t2 + 120 * t3))
    coef = (p0, h * v0, h * h * a0, h * h * a1, h * v1, p1)
    out = [sum(b[d] * c for b, c in zip(basis, coef)) for d in range(3)]
    return out[0], out[1] / h, out[2] / (h * h)


def corner_blend(a: np.ndarray, corner: np.ndarray, b: np.ndarray, tolerance: float, leg_a: float,
                 leg_b: float) -> tuple[float, "Blend | None"]:
    """The blend replacing the corner between a line ending at ``corner`` with direction ``a`` and
    one leaving it with direction ``b`` (unit vectors): its leg (the length cut from each line,
    at most ``leg_a`` and ``leg_b``) chosen so that the blend stays within ``tolerance`` of the
    two lines; (0, None) for a straight join."""
    cosang = float(np.clip(a @ b, -1.0, 1.0))
    if cosang > 1 - 1e-12:
        return 0.0, None
    unit = _blend(corner - a, a, corner + b, b, 1.0)
    P = unit.eval(_TAU * unit.length)[0]
    dev = float(_distance_to_corner(P, corner, a, b).max())  # scales linearly with the leg
    leg = min(tolerance / dev, leg_a, leg_b)
    return leg, _blend(corner - leg * a, a, corner + leg * b, b, leg)


def _blend(p0, u0, p1, u1, leg) -> Blend:
    chord = float(np.linalg.norm(p1 - p0))
    length = max(chord, 1e-3 * leg)  # the parameter range: the chord (near the arc length)
    return Blend(length, np.inf, None, "blend", p0, u0, p1, u1)


def _distance_to_corner(p, corner, a, b) -> np.ndarray:
    """Distance from each point p (k, m) to the polyline (corner - inf a, corner] + [corner,
    corner + inf b)."""
    out = []
    for d, sign in ((a, -1.0), (b, 1.0)):
        t = np.maximum(sign * ((p - corner) @ d), 0.0)
        out.append(np.linalg.norm(p - (corner + sign * t[:, None] * d), axis=1))
    return np.minimum(*out)


@dataclass
class PointSpline(Segment):
    """C2 cubic spline through points (k, m), parameterised by cumulative chord length."""
    spline: object = None

    @classmethod
    def through(cls, points, line=None) -> "PointSpline":
        from scipy.interpolate import CubicSpline

        pts = np.asarray(points, float)
        chord = np.linalg.norm(np.diff(pts, axis=0), axis=1)
        if len(pts) < 2 or np.any(chord <= 1e-12):
            raise UserError("a path needs at least 2 points, each distinct from the one before")
        s = np.concatenate([[0.0], np.cumsum(chord)])
        bc = "natural" if len(pts) > 2 else "not-a-knot"
        return cls(float(s[-1]), np.inf, line, "spline", CubicSpline(s, pts, bc_type=bc))

    def eval(self, sig):
        sig = np.asarray(sig, float)
        return self.spline(sig), self.spline(sig, 1), self.spline(sig, 2)


@dataclass
class Motion:
    """A rest-to-rest chain of segments (tangents join where they meet)."""
    segments: list[Segment]
    task: bool = True  # task coordinates (through inverse kinematics) or actuator values
    description: dict = field(default_factory=dict)

    @property
    def length(self) -> float:
        return float(sum(g.length for g in self.segments))

    @property
    def offsets(self) -> np.ndarray:
        return np.concatenate([[0.0], np.cumsum([g.length for g in self.segments])])

    def eval(self, s: np.ndarray):
        """P, P', P'' at global parameters s (each sample from the segment holding it; a junction
        belongs to the later segment)."""
        s = np.asarray(s, float)
        off = self.offsets
        idx = np.clip(np.searchsorted(off, s, side="right") - 1, 0, len(self.segments) - 1)
        m = len(self.segments[0].start())
        P, P1, P2 = np.empty((len(s), m)), np.empty((len(s), m)), np.empty((len(s), m))
        for k in np.unique(idx):
            sel = idx == k
            seg = self.segments[k]
            P[sel], P1[sel], P2[sel] = seg.eval(np.clip(s[sel] - off[k], 0.0, seg.length))
        return P, P1, P2

    def segment_at(self, s: float) -> Segment:
        off = self.offsets
        k = int(np.clip(np.searchsorted(off, s, side="right") - 1, 0, len(self.segments) - 1))
        return self.segments[k]


@dataclass
class Dwell:
    """Rest for ``seconds`` (G4 P) at the end of the previous motion."""
    seconds: float
    line: int | None = None


@dataclass
class Event:
    """Something the machine does at rest between motions (a G-code spindle, coolant or tool
    command, a program stop): ``kind``, the program ``line``, ``values`` (with ``text``, one
    line for the log) and ``hold``: a served machine holds there until resumed."""
    kind: str
    line: int | None
    values: dict = field(default_factory=dict)
    hold: bool = False


def polyline_motions(points, tolerance: float | None, feed=np.inf, lines=None, task: bool = True,
                     description: dict | None = None) -> list[Motion]:
    """Lines through ``points`` (k, m): corners blended within ``tolerance`` (each blend leg at
    most half of a line, or all of it next to a stop), exact stops where ``tolerance`` is None or
    the path reverses (turn above 175 degrees). ``lines``: program line per line segment."""
    pts = np.asarray(points, float)
    n = len(pts) - 1
    lines = lines if lines is not None else [None] * n
    feeds = np.broadcast_to(np.asarray(feed, float), (n,))
    segs = [Line.between(pts[i], pts[i + 1], feeds[i], lines[i]) for i in range(n)]
    return join_segments(segs, [tolerance] * n, description or {}, task)


def join_segments(segs: list[Segment], tolerances: list, description: dict, task: bool = True) -> list[Motion]:
    """Chain segments into rest-to-rest motions. ``tolerances[i]`` decides the corner before
    segment i: a blending tolerance (m) or None for an exact stop. Line-line corners are
    blended within it (not above 175 degrees of turn: a stop); other corners are exact stops
    unless tangent (within 1e-6 rad)."""
    keep = [i for i, g in enumerate(segs) if g.length > 1e-12]
    segs, tolerances = [segs[i] for i in keep], [tolerances[i] for i in keep]
    if not segs:
        return []
    n = len(segs)
    kinds, cut = [], np.zeros((n, 2))  # per junction: 0 straight or tangent, 1 blend, 2 stop
    for i in range(1, n):
        a, b = segs[i - 1].tangent(True), segs[i].tangent(False)
        c = float(np.clip(a @ b, -1, 1))
        tol = tolerances[i]
        lines = isinstance(segs[i - 1], Line) and isinstance(segs[i], Line)
        if c > np.cos(1e-6):
            kinds.append(0)
        elif tol is not None and tol > 0 and lines and c > np.cos(np.radians(175)):
            kinds.append(1)
        else:
            kinds.append(2)
    blends = {}
    for i in range(1, n):
        if kinds[i - 1] == 1:
            A, B = segs[i - 1], segs[i]
            la = A.length * (1.0 if (i - 1 == 0 or kinds[i - 2] == 2) else 0.5)
            lb = B.length * (1.0 if (i == n - 1 or kinds[i] == 2) else 0.5)
            leg, bl = corner_blend(A.tangent(True), A.end(), B.tangent(False), tolerances[i], la, lb)
            if bl is not None:
                bl.feed, bl.line = min(A.feed, B.feed), A.line
                cut[i - 1, 1], cut[i, 0] = leg, leg
                blends[i] = bl
    out_segs: list[list[Segment]] = [[]]
    for i, g in enumerate(segs):
        if i > 0:
            if kinds[i - 1] == 2:
                out_segs.append([])
            elif i in blends:
                out_segs[-1].append(blends[i])
        if isinstance(g, Line) and (cut[i] > 0).any():
            u = (g.b - g.a) / g.length
            g = Line.between(g.a + cut[i, 0] * u, g.b - cut[i, 1] * u, g.feed, g.line)
        if g.length > 1e-12:
            out_segs[-1].append(g)
    return [Motion(s, task, description) for s in out_segs if s]
