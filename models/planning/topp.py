"""Time-optimal path parameterisation (TOPP-RA's reachability analysis) with the reduced dynamics.

A geometric path theta(s) in actuator space (a task-space ``Motion`` through the model's inverse
kinematics, or an actuator-space one) is timed in minimum time from rest to rest under
per-actuator velocity, acceleration and force limits. With x = sdot^2 and u = sddot (TOPP-RA,
Pham and Pham 2018), on a grid s_0 .. s_N:

    thetadot = theta_s sdot,  thetaddot = theta_s u + theta_ss x,
    tau = H(theta) thetaddot + D(theta) [thetadot thetadot] - p_ext(theta) + friction
        = a u + b x + c + f_c sign(theta_s) + b_v theta_s sqrt(x),
    a = H theta_s,  b = H theta_ss + D [theta_s theta_s],  c = -p_ext.

Every constraint is linear in (u, x) except viscous friction (the sqrt(x) term). It is bounded
soundly by two lines in x: below by the chord x / sqrt(X) over [0, X] (X the velocity cap at the
grid point), above by the tangent at x0, sqrt(x0) / 2 + x / (2 sqrt(x0)); the upper force row
uses whichever bound makes the friction force largest, the lower row the smallest, so the true
force lies between the two rows' values for every x in [0, X]. x0 starts at X (always valid) and
is then set to the previous pass's optimum (the tangent is exact there), repeated while the time
improves by more than 0.1 %. Coulomb friction is a constant per sign of theta_s (both signs where
theta_s is near zero).

The backward pass computes the controllable sets K_i (two-variable LPs solved by vertex
enumeration in numba), the forward pass picks the largest feasible u at each point. The grid
checks constraints at its points only; the result is sampled at the loop rate (time stretched
by under one period to end on a sample) and checked there against the planning limits (the
limits times 1 - margin). Where a sample exceeds them, the limits at the two grid points around
it are tightened by the excess and the path is re-planned (at most 8 times); a trajectory still
beyond the machine's limits themselves is refused.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from numba import njit

from pkrt.rt.core.errors import UserError
from pkrt.rt.core.plan import MAX_SAMPLES, Planned
from pkrt.rt.core.tree import OUT_OF_DOMAIN, eval_model, eval_tau

from ..kinematics.taskspace import check_ranges
from .geompath import Motion, quintic_hermite


# -- limits and dynamics --------------------------------------------------------------------

@dataclass
class PlanLimits:
    """Per-actuator limits (m or rad units; force N or N m) and friction; ``margin`` is the
    fraction of the velocity, acceleration and force limits kept free for the controller."""
    velocity: np.ndarray
    acceleration: np.ndarray
    force: np.ndarray
    viscous: np.ndarray
    coulomb: np.ndarray
    margin: float = 0.1

    def __post_init__(self):
        s = len(self.velocity)
        for name in ("velocity", "acceleration", "force", "viscous", "coulomb"):
            setattr(self, name, np.broadcast_to(np.asarray(getattr(self, name), float), (s,)).copy())
        if not 0 <= self.margin < 1:
            raise UserError(f"planning margin must be in [0, 1), got {self.margin}")

    @property
    def planning(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        k = 1.0 - self.margin
        return self.velocity * k, self.acceleration * k, self.force * k

    @classmethod
    def from_config(cls, config, margin: float = 0.1) -> "PlanLimits":
        """[limits] velocity and acceleration, [controller] tau_max, and the controller's
        friction feed-forward (the machine's identified friction)."""
        c = config.controller
        return cls(config.limits.velocity, config.limits.acceleration, c.tau_max, c.viscous, c.coulomb, margin)


class TreeDynamics:
    """H, D, p_ext at theta from a reduced-dynamics tree (refuses points out of its domain)."""

    def __init__(self, tree):
        self.T, self.s, self._eval, self._ood = tree.arrays, tree.s, eval_model, OUT_OF_DOMAIN
        s = self.s
        self.name = "tree"
        self._H, self._D, self._p = np.zeros((s, s)), np.zeros((s, s * (s + 1) // 2)), np.zeros(s)

    def tau_along(self, pos, vel, acc) -> np.ndarray:
        """H acc + D [vel vel] - p_ext per row (one compiled loop over the tree)."""
        out = np.empty_like(pos)
        k = _tree_tau(self.T, np.ascontiguousarray(pos), np.ascontiguousarray(vel), np.ascontiguousarray(acc), out)
        if k >= 0:
            self(pos[k])  # raises: out of the domain
        return out

    def __call__(self, theta):
        st = self._eval(self.T, np.ascontiguousarray(theta, dtype=float), self._H, self._D, self._p)
        if st == self._ood:
            raise UserError(f"theta = {np.round(theta, 6).tolist()} is outside the model's domain "
                            f"(too close to a singularity or not assemblable)")
        return self._H.copy(), self._D.copy(), self._p.copy()


class ExactDynamics:
    """H, D, p_ext at theta from the exact reduction of the model."""

    def __init__(self, mech):
        from ..reduction.exact import ExactModel

        self.exact = ExactModel(mech)
        self.name = "exact"

    def __call__(self, theta):
        from ..kinematics.mechanism import AssemblyError

        try:
            r = self.exact(theta)
        except AssemblyError as e:
            raise UserError(str(e)) from None
        return r.H, r.D, r.p_ext


def quad(v: np.ndarray) -> np.ndarray:
    """[v v] = (v1^2, v1 v2, ..., vs^2), upper triangle row by row, over the last axis."""
    s = v.shape[-1]
    j, k = np.triu_indices(s)
    return v[..., j] * v[..., k]


@njit(cache=True)
def _tree_tau(T, pos, vel, acc, out):
    """Fill out[k] = tau at row k; the first row out of the tree's domain, or -1."""
    s = pos.shape[1]
    H, D, p = np.empty((s, s)), np.empty((s, s * (s + 1) // 2)), np.empty(s)
    tau = np.empty(s)
    for k in range(pos.shape[0]):
        if eval_tau(T, pos[k], vel[k], acc[k], H, D, p, tau) == OUT_OF_DOMAIN:
            return k
        out[k] = tau
    return -1


def forces(dyn, pos, vel, acc, limits: PlanLimits) -> np.ndarray:
    """tau (n, s) along a trajectory: dynamics plus friction (Coulomb with the sign of the
    velocity, viscous)."""
    if hasattr(dyn, "tau_along"):
        out = dyn.tau_along(pos, vel, acc)
    else:
        out = np.empty_like(pos)
        for k in range(len(pos)):
            H, D, p = dyn(pos[k])
            out[k] = H @ acc[k] + D @ quad(vel[k]) - p
    return out + limits.coulomb * np.sign(vel) + limits.viscous * vel


# -- the LP core ------------------------------------------------------------------------------

@njit(cache=True)
def _x_range(A, B, C, xhi, klo, khi, d2):
    """min and max of x over {(u, x): A u + B x <= C, 0 <= x <= xhi, klo <= x + d2 u <= khi}
    by vertex enumeration (rows normalised); (nan, nan) when empty."""
    m = A.shape[0] + 4
    a, b, c = np.empty(m), np.empty(m), np.empty(m)
    a[:m - 4], b[:m - 4], c[:m - 4] = A, B, C
    a[m - 4], b[m - 4], c[m - 4] = 0.0, 1.0, xhi
    a[m - 3], b[m - 3], c[m - 3] = 0.0, -1.0, 0.0
    a[m - 2], b[m - 2], c[m - 2] = d2, 1.0, khi
    a[m - 1], b[m - 1], c[m - 1] = -d2, -1.0, -klo
    lo, hi = np.inf, -np.inf
    tol = 1e-9 * (1.0 + xhi)
    for i in range(m):
        for j in range(i + 1, m):
            det = a[i] * b[j] - a[j] * b[i]
            if abs(det) < 1e-14:
                continue
            u = (c[i] * b[j] - c[j] * b[i]) / det
            x = (a[i] * c[j] - a[j] * c[i]) / det
            ok = True
            for r in range(m):
                if a[r] * u + b[r] * x > c[r] + tol * (1.0 + abs(c[r])):
                    ok = False
                    break
            if ok:
                lo = min(lo, x)
                hi = max(hi, x)
    if lo > hi:
        return np.nan, np.nan
    return max(lo, 0.0), min(hi, xhi)


@njit(cache=True)
def _reachability(A, B, C, xmax, ds):
    """Backward controllable sets K (N+1, 2) then the greedy forward pass: x (N+1,), u (N,).
    ``bad`` is the first grid index with an empty set (-1 if none)."""
    N = len(ds)
    K = np.zeros((N + 1, 2))
    K[N, 0], K[N, 1] = 0.0, 0.0
    for i in range(N - 1, -1, -1):
        lo, hi = _x_range(A[i], B[i], C[i], xmax[i], K[i + 1, 0], K[i + 1, 1], 2.0 * ds[i])
        if np.isnan(lo):
            return K, np.zeros(N + 1), np.zeros(N), i
        K[i, 0], K[i, 1] = lo, hi
    x = np.zeros(N + 1)
    u = np.zeros(N)
    if K[0, 0] > 1e-12:
        return K, x, u, 0
    for i in range(N):
        d2 = 2.0 * ds[i]
        ulo, uhi = (K[i + 1, 0] - x[i]) / d2, (K[i + 1, 1] - x[i]) / d2
        for r in range(A.shape[1]):
            rhs = C[i, r] - B[i, r] * x[i]
            if A[i, r] > 1e-14:
                uhi = min(uhi, rhs / A[i, r])
            elif A[i, r] < -1e-14:
                ulo = max(ulo, rhs / A[i, r])
        ui = uhi if uhi >= ulo else ulo  # rounding: stay controllable
        xn = min(max(x[i] + d2 * ui, K[i + 1, 0]), K[i + 1, 1])
        x[i + 1] = max(xn, 0.0)
        u[i] = (x[i + 1] - x[i]) / d2
    x[N] = 0.0
    u[N - 1] = (x[N] - x[N - 1]) / (2.0 * ds[N - 1])
    return K, x, u, -1


# -- the path on its grid ---------------------------------------------------------------------

@dataclass
class GridPath:
    """A motion on its grid: s (N+1,), and per grid point one or two evaluations (junctions of
    segments with different curvature): theta, theta_s, theta_ss (N+1, e, s); the feed cap on x;
    the segment index of each grid point (the later one at a junction)."""
    s: np.ndarray
    theta: np.ndarray
    theta_s: np.ndarray
    theta_ss: np.ndarray
    x_feed: np.ndarray
    segment: np.ndarray
    H: np.ndarray = None  # (N+1, s, s) at theta[:, 0]
    D: np.ndarray = None
    p: np.ndarray = None


def grid_for(motion: Motion, points: int) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Grid over the motion: about ``points`` intervals in all, spread by length, at least 4 per
    segment (8 for blends and arcs); segment junctions are grid points. Returns s, the segment
    index per point, and the indices of the junction points."""
    L = motion.length
    off = motion.offsets
    s_parts, seg_idx, junctions = [], [], []
    for k, g in enumerate(motion.segments):
        lo = 4 if g.kind == "line" else 8
        n = max(int(np.ceil(points * g.length / L)), lo)
        part = off[k] + np.linspace(0.0, g.length, n + 1)
        if k > 0:  # the junction belongs to the later segment (as in Motion.eval)
            part = part[1:]
            junctions.append(len(np.concatenate(s_parts)) - 1)
            seg_idx[-1][-1] = k
        s_parts.append(part)
        seg_idx.append(np.full(len(part), k))
    s = np.concatenate(s_parts)
    return s, np.concatenate(seg_idx), junctions


def _segment_index(motion: Motion, s: np.ndarray) -> np.ndarray:
    """The segment of each path parameter (a junction belongs to the later segment)."""
    return np.clip(np.searchsorted(motion.offsets, s, side="right") - 1, 0, len(motion.segments) - 1)


def _line_of(motion: Motion, k: int) -> str:
    ln = motion.segments[int(k)].line
    return f"line {ln}: " if ln is not None else ""


class PathPlanner:
    """Times motions of one machine: ``kin`` (``TaskKinematics``, for task motions), ``dyn``
    (``TreeDynamics``, which also refuses points out of the tree's domain, too close to a
    singularity; or ``ExactDynamics``), ``limits``, the loop rate; the mechanism's ranges.
    ``smooth`` (s): the time-optimal profile is bang-bang in the path acceleration; a moving
    average of s(t) over this window (twice) makes the path acceleration continuous with a
    bounded jerk (the path is unchanged: only its timing), lengthening each motion by twice the
    window; the loop-rate check applies to the smoothed trajectory."""

    def __init__(self, mech, dyn, limits: PlanLimits, rate_hz: float, kin=None, grid_points: int = 200,
                 smooth: float = 0.002, closed_form: bool = True, held_acc: bool = True):
        self.mech, self.dyn, self.limits, self.rate_hz = mech, dyn, limits, float(rate_hz)
        self.kin, self.grid_points = kin, grid_points
        self.smooth = smooth  # s: jerk smoothing window (0: none)
        self.closed_form = closed_form  # task motions: the legs' closed form where the machine has one
        self.held_acc = held_acc  # acc: each period's mean (see ``sample``)
        self._legs = None
        self._passive = None

    @property
    def passive(self):
        """The check of the passive joints and capsules (``PathCheck``), None when the model
        declares none."""
        if self._passive is None:
            from ..kinematics.passive import PathCheck, compile_passive

            p = compile_passive(self.mech)
            self._passive = PathCheck(self.mech, p) if p is not None else False
        return self._passive or None

    @property
    def legs(self):
        """The machine's closed-form inverse kinematics (``legik.leg_kinematics``), found and
        checked on first use; None: Newton on the model's constraints."""
        if self._legs is None:
            from ..kinematics.legik import leg_kinematics

            self._legs = (leg_kinematics(self.kin) if self.closed_form and self.kin is not None else None) or False
        return self._legs or None

    # geometry to actuator space on the grid
    def grid(self, motion: Motion) -> GridPath:
        s, seg, junctions = grid_for(motion, self.grid_points)
        P, P1, P2 = motion.eval(s)
        n, dof = len(s), self.mech.n_act
        ev = 2 if junctions else 1
        th, ths, thss = np.empty((n, ev, dof)), np.empty((n, ev, dof)), np.empty((n, ev, dof))
        left = {}
        for j in junctions:  # the earlier segment's end
            g = motion.segments[seg[j] - 1]
            left[j] = [a[0] for a in g.eval(np.array([g.length]))]
        if motion.task and self.legs is not None:
            self._grid_closed(motion, P, P1, P2, seg, left, th, ths, thss)
        elif motion.task:
            kin = self.kin
            try:
                kin.start_at(P[0])
            except UserError as e:
                raise UserError(f"{_line_of(motion, seg[0])}{e}") from None
            cfg, theta = kin.cfg, kin.theta
            for i in range(n):
                if i > 0:
                    dsi = s[i] - s[i - 1]
                    cfg = cfg.step(qd * dsi + 0.5 * qdd * dsi * dsi)
                    theta = theta + ths[i - 1, 0] * dsi + 0.5 * thss[i - 1, 0] * dsi * dsi
                cfg, theta, res = kin.solve_pose(P[i], cfg, theta)
                if not res < kin.tol:
                    raise UserError(f"{_line_of(motion, seg[i])}the tool pose {np.round(P[i], 6).tolist()} is outside "
                                    f"{self.mech.name}'s workspace (cannot assemble: residual {res:.3g})")
                check_ranges(self.mech, theta, _line_of(motion, seg[i]))
                qd, thd, qdd, thdd = kin.rates(cfg, theta, P[i], P1[i], P2[i])
                th[i], ths[i], thss[i] = theta, thd, thdd
                if i in left:
                    _, thd_l, _, thdd_l = kin.rates(cfg, theta, P[i], left[i][1], left[i][2])
                    ths[i, 1], thss[i, 1] = thd_l, thdd_l
            kin.cfg, kin.theta = cfg, theta
        else:
            th[:, 0], ths[:, 0], thss[:, 0] = P, P1, P2
            for j, (_, l1, l2) in left.items():
                ths[j, 1], thss[j, 1] = l1, l2
            for i in range(n):
                check_ranges(self.mech, th[i, 0], _line_of(motion, seg[i]))
        if ev == 2:  # one-sided values differ at junctions only
            th[:, 1] = th[:, 0]
            one = np.setdiff1d(np.arange(n), junctions)
            ths[one, 1], thss[one, 1] = ths[one, 0], thss[one, 0]
        feed = np.array([motion.segments[k].feed for k in seg])
        for j in junctions:
            feed[j] = min(feed[j], motion.segments[seg[j] - 1].feed)
        speed = np.maximum(np.linalg.norm(P1, axis=1), 1e-12)
        x_feed = np.where(np.isfinite(feed), (feed / speed) ** 2, np.inf)
        dyn = []
        for i in range(n):
            try:
                dyn.append(self.dyn(th[i, 0]))
            except UserError as e:
                raise UserError(f"{_line_of(motion, seg[i])}{e}") from None
        H, D, p = (np.array([d[k] for d in dyn]) for k in range(3))
        return GridPath(s, th, ths, thss, x_feed, seg, H, D, p)

    def _grid_closed(self, motion: Motion, P, P1, P2, seg, left, th, ths, thss) -> None:
        """Fill th, ths, thss (n, e, s) from the closed form, all points at once; refuses a point
        outside the workspace or the actuator ranges as the Newton path does."""
        th[:, 0], ths[:, 0], thss[:, 0] = self.legs.solve(P, P1, P2)
        bad = ~np.all(np.isfinite(th[:, 0]) & np.isfinite(ths[:, 0]) & np.isfinite(thss[:, 0]), axis=1)
        if bad.any():
            i = int(np.argmax(bad))
            raise UserError(f"{_line_of(motion, seg[i])}the tool pose {np.round(P[i], 6).tolist()} is outside "
                            f"{self.mech.name}'s workspace (no closed-form solution)")
        lo, hi = self.mech.ranges[:, 0], self.mech.ranges[:, 1]
        out = np.any((th[:, 0] < lo - 1e-12) | (th[:, 0] > hi + 1e-12), axis=1)
        if out.any():
            i = int(np.argmax(out))
            check_ranges(self.mech, th[i, 0], _line_of(motion, seg[i]))
        for j, (_, l1, l2) in left.items():
            _, t1, t2 = self.legs.solve(P[j], l1, l2)
            ths[j, 1], thss[j, 1] = t1[0], t2[0]

    # the LP rows
    def rows(self, g: GridPath, x0: np.ndarray | None, scale: np.ndarray):
        """A, B, C (N+1, rows) and xmax (N+1,): constraints A u + B x <= C at each grid point,
        with the viscous term's tangent at x0 (None: at the velocity cap); ``scale`` (N+1, 3, s)
        multiplies the planning limits (velocity, acceleration, force) per point (tightened
        after a loop-rate check)."""
        vlim, alim, flim = self.limits.planning
        fc, bv = self.limits.coulomb, self.limits.viscous
        ts, tss = g.theta_s, g.theta_ss  # (n, e, s)
        vl, al, fl = vlim * scale[:, 0], (alim * scale[:, 1])[:, None], (flim * scale[:, 2])[:, None]
        big = np.abs(ts).max(axis=1)
        with np.errstate(divide="ignore"):
            xv = np.where(big > 1e-12, (vl / np.maximum(big, 1e-12)) ** 2, np.inf).min(axis=1)
        X = np.minimum(g.x_feed, xv)
        if not np.all(np.isfinite(X)):
            i = int(np.argmin(np.isfinite(X)))
            raise UserError(f"the path does not move the actuators at s = {g.s[i]:.6g} (a zero-length segment?)")
        xt = X if x0 is None else np.maximum(x0, 1e-9 * X)  # the viscous tangent point
        xt = np.maximum(xt, 1e-300)[:, None, None]
        alpha, beta = np.sqrt(xt) / 2, 1 / (2 * np.sqrt(xt))
        gamma = np.where(X > 0, 1 / np.sqrt(np.maximum(X, 1e-300)), 0.0)[:, None, None]
        a = np.einsum("njk,nek->nej", g.H, ts)
        b = np.einsum("njk,nek->nej", g.H, tss) + np.einsum("njc,nec->nej", g.D, quad(ts))
        c = -g.p[:, None, :]
        v = bv * ts
        up = v >= 0
        fup, flo = np.where(ts > -1e-9, fc, -fc), np.where(ts < 1e-9, -fc, fc)
        slope_up, off_up = np.where(up, beta, gamma) * v, np.where(up, alpha * v, 0.0)
        slope_lo, off_lo = np.where(up, gamma, beta) * v, np.where(up, 0.0, alpha * v)
        al = np.broadcast_to(al, ts.shape)
        A = np.concatenate([ts, -ts, a, -a], axis=1)
        B = np.concatenate([tss, -tss, b + slope_up, -b - slope_lo], axis=1)
        C = np.concatenate([al, al, fl - c - fup - off_up, fl + c + flo + off_lo], axis=1)
        n = len(g.s)
        A, B, C = A.reshape(n, -1), B.reshape(n, -1), C.reshape(n, -1)
        norm = np.hypot(A, B)
        norm[norm < 1e-300] = 1.0
        return A / norm, B / norm, C / norm, X

    def solve(self, g: GridPath, scale: np.ndarray, motion: Motion):
        """x (N+1,), u (N,) and the number of passes (the viscous tangent refined)."""
        ds = np.diff(g.s)
        x0, best, T_best, passes = None, None, np.inf, 0
        for passes in range(1, 6):
            A, B, C, xmax = self.rows(g, x0, scale)
            K, x, u, bad = _reachability(A, B, C, xmax, ds)
            if bad >= 0:
                if best is not None:
                    break
                raise UserError(f"{_line_of(motion, g.segment[bad])}the path cannot be followed within the "
                                f"force limits at actuator position {np.round(g.theta[bad, 0], 6).tolist()} "
                                f"(the machine cannot hold or move it there)")
            T = profile_time(ds, x)
            if best is not None and T > T_best * (1 - 1e-3):
                if T < T_best:
                    best, T_best = (x, u), T
                break
            best, T_best = (x, u), T
            x0 = x.copy()
            if not np.any(self.limits.viscous * np.abs(g.theta_s).max(axis=(0, 1))):
                break  # no viscous friction: one pass is exact
        return best[0], best[1], passes

    # timing to the loop rate
    def plan_motion(self, motion: Motion) -> tuple[Planned, dict]:
        """Minimum-time rest-to-rest timing of ``motion`` at the loop rate, checked there."""
        t0 = time.perf_counter()
        g = self.grid(motion)
        t_grid = time.perf_counter() - t0
        dof = self.mech.n_act
        scale = np.ones((len(g.s), 3, dof))
        x_feed0 = g.x_feed.copy()
        speed_grid = np.maximum(np.linalg.norm(motion.eval(g.s)[1], axis=1), 1e-12)
        for attempt in range(9):
            x, u, passes = self.solve(g, scale, motion)
            t_lp = time.perf_counter() - t0 - t_grid
            s, sd, plan, tau, ratio, speed, feed, over_feed = self._timed(motion, g, x, 1.0)
            worst = max(ratio.max(), over_feed.max())
            if worst <= 1 + 1e-3:
                break
            # tighten at the grid points whose timing reaches the sample through the smoothing
            w = 2 * int(round(self.smooth * self.rate_hz))
            lo = np.clip(np.searchsorted(g.s, s[np.maximum(np.arange(len(s)) - w, 0)], side="right") - 1, 0, None)
            hi = np.searchsorted(g.s, s[np.minimum(np.arange(len(s)) + w, len(s) - 1)], side="left") + 1
            for k, q, j in np.argwhere(ratio > 1 + 1e-3):
                f = 1.0 / (1.0 + 1.5 * (ratio[k, q, j] - 1.0))
                sl = slice(lo[k], hi[k])
                scale[sl, q, j] = np.minimum(scale[sl, q, j], scale[sl, q, j] * f)
            for k in np.nonzero(over_feed > 1 + 1e-3)[0]:  # the feed cap on x at the points around
                sl = slice(lo[k], hi[k])
                cap = (feed[k] / speed_grid[sl]) ** 2 / over_feed[k] ** 2
                g.x_feed[sl] = np.minimum(g.x_feed[sl], np.minimum(x_feed0[sl], cap))
        # what the refinements leave between grid points (a few per mille at most): the whole
        # motion slowed uniformly until every sample keeps every planning limit, the feed too
        # (velocities scale with 1 / stretch, accelerations and the forces' dynamic part with its
        # square), so the limits hold at any margin, 0 included
        stretch = 1.0
        while worst > 1.0:
            stretch *= min(worst, 1.1) * (1 + 1e-6)
            if stretch > 4.0:
                k, q, j = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
                what = ("velocity", "acceleration", "force")[q]
                raise UserError(f"{_line_of(motion, motion.segments.index(motion.segment_at(s[k])))}planned motion "
                                f"exceeds actuator {self.mech.actuator_names[j]}'s {what} limit at the loop rate "
                                f"({ratio[k, q, j] * (1 - self.limits.margin):.3f} of it) however slowly it is "
                                f"timed")
            s, sd, plan, tau, ratio, speed, feed, over_feed = self._timed(motion, g, x, stretch)
            worst = max(ratio.max(), over_feed.max())
        feed_bound = g.x_feed < np.inf
        feed_bound &= x >= 0.99 * g.x_feed
        report = {"duration_s": plan.duration, "grid_points": len(g.s), "refinements": attempt, "stretch": stretch,
                  "viscous_passes": passes, "grid_s": t_grid, "timing_s": t_lp, "tau": tau,
                  "worst_of_planning_limits": float(worst), "s": s, "speed": speed,
                  "line": np.array([motion.segments[k].line or 0 for k in _segment_index(motion, s)]),
                  "feed": feed,
                  "feed_bound_lines": sorted({int(motion.segments[k].line or 0) for k in g.segment[feed_bound]})}
        return plan, report

    def _timed(self, motion: Motion, g: GridPath, x: np.ndarray, stretch: float):
        """The grid profile ``x`` at the loop rate, its time stretched by ``stretch`` (>= 1),
        smoothed and sampled, with its forces and its use of each planning limit: s, sdot,
        the plan, tau (n, s), ratio (n, 3, s) of velocity, acceleration and force to their
        planning limits, the tool speed, the feed cap and their ratio per sample."""
        s, sd, sdd = smoothed(*sample_profile(g.s, x, self.rate_hz, stretch), int(round(self.smooth * self.rate_hz)))
        plan = self.sample(motion, g, s, sd, sdd)
        try:
            tau = forces(self.dyn, plan.pos, plan.vel, plan.acc, self.limits)
        except UserError as e:
            raise UserError(f"{_line_of(motion, g.segment[0])}{e}") from None
        vl, al, fl = self.limits.planning
        ratio = np.stack([np.abs(plan.vel) / vl, np.abs(plan.acc) / al, np.abs(tau) / fl], axis=1)
        speed = np.linalg.norm(motion.eval(s)[1], axis=1) * sd  # tool speed (task motions)
        feed = np.array([motion.segments[k].feed for k in _segment_index(motion, s)])
        return s, sd, plan, tau, ratio, speed, feed, speed / feed

    def sample(self, motion: Motion, g: GridPath, s, sd, sdd) -> Planned:
        """Actuator pos, vel, acc at the loop samples: an actuator-space motion exactly; a task
        motion by the quintic Hermite interpolant in s of theta, theta_s, theta_ss at the grid
        points (exact from the kinematics there; a junction's one-sided values on each side).
        With ``held_acc`` (default) acc[k] is the mean acceleration over the period [t_k,
        t_k+1], (vel[k+1] - vel[k]) * rate: the loop holds its feed-forward for the whole
        period, and the instantaneous value at t_k misses the velocity change of a period in
        which the acceleration jumps (the bang-bang switches); the last sample keeps its own."""
        if not motion.task:
            P, P1, P2 = motion.eval(s)
        else:
            i = np.clip(np.searchsorted(g.s, s, side="right") - 1, 0, len(g.s) - 2)
            h = g.s[i + 1] - g.s[i]
            e = g.theta_s.shape[1] - 1  # the left-hand values at the interval's right end
            P, P1, P2 = quintic_hermite((s - g.s[i]) / h, h, g.theta[i, 0], g.theta_s[i, 0], g.theta_ss[i, 0],
                                        g.theta[i + 1, 0], g.theta_s[i + 1, e], g.theta_ss[i + 1, e])
        vel = P1 * sd[:, None]
        acc = P1 * sdd[:, None] + P2 * (sd**2)[:, None]
        if self.held_acc and len(vel) > 1:  # the mean over each period: exactly v(t_k+1) - v(t_k) per period
            acc[:-1] = np.diff(vel, axis=0) * self.rate_hz
        return Planned(self.rate_hz, P, vel, acc, dict(motion.description))


def smoothed(s, sd, sdd, k: int):
    """s, sdot, sddot averaged twice over k samples (rest before and after): continuous sddot,
    jerk at most (max |sddot| jump) / k per sample."""
    if k <= 1:
        return s, sd, sdd
    box = np.ones(k) / k
    out = []
    for v, rest in ((s, (s[0], s[-1])), (sd, (0.0, 0.0)), (sdd, (0.0, 0.0))):
        for _ in range(2):
            v = np.convolve(np.concatenate([np.full(k - 1, rest[0]), v, np.full(k - 1, rest[1])]), box, "valid")
        out.append(v)
    out[0][-1], out[1][[0, -1]], out[2][[0, -1]] = s[-1], 0.0, 0.0
    return tuple(out)


def profile_time(ds: np.ndarray, x: np.ndarray) -> float:
    sq = np.sqrt(np.maximum(x, 0.0))
    den = sq[:-1] + sq[1:]
    if np.any(den <= 0):
        return np.inf
    return float(np.sum(2 * ds / den))


def sample_profile(s_grid: np.ndarray, x: np.ndarray, rate_hz: float, stretch: float = 1.0):
    """s, sdot, sddot at the loop samples k / rate_hz of the grid profile (constant u between
    grid points), time stretched by lambda >= ``stretch`` (by under one period more) so that the
    motion ends exactly on a sample."""
    ds = np.diff(s_grid)
    sq = np.sqrt(np.maximum(x, 0.0))
    den = sq[:-1] + sq[1:]
    if np.any(den <= 0):
        i = int(np.argmax(den <= 0))
        raise UserError(f"the planned motion stops inside the path (at s = {s_grid[i]:.6g}): infeasible there")
    dt = 2 * ds / den
    tg = np.concatenate([[0.0], np.cumsum(dt)])
    T = tg[-1] * stretch
    if not T * rate_hz < MAX_SAMPLES:
        raise UserError(f"the planned motion takes {T:.6g} s, more than {MAX_SAMPLES} samples at {rate_hz:g} Hz "
                        f"(is the feed in units per minute?)")
    K = max(int(np.ceil(T * rate_hz - 1e-9)), 1)
    lam = K / (tg[-1] * rate_hz)
    tau = np.arange(K + 1) / rate_hz / lam
    i = np.clip(np.searchsorted(tg, tau, side="right") - 1, 0, len(ds) - 1)
    u = (x[1:] - x[:-1]) / (2 * ds)
    h = tau - tg[i]
    s = np.minimum(s_grid[i] + sq[i] * h + 0.5 * u[i] * h * h, s_grid[i + 1])
    sd = np.maximum(sq[i] + u[i] * h, 0.0)
    sdd = u[i].copy()
    s[-1], sd[-1] = s_grid[-1], 0.0
    return s, sd / lam, sdd / lam**2


