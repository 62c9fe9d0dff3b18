"""Task-space motion for any machine with a ``[tool]``: paths in task coordinates, inverse
kinematics by the model's own constraint solver, forward kinematics.

Task coordinates (see ``description.ToolSpec``): the tool point's world position x, y, z (m)
or a subset of them, and for 6-DOF machines roll, pitch, yaw (rad) of the tool frame,
R = Rz(yaw) Ry(pitch) Rx(roll). Inverse kinematics solves the stacked constraints (independent
passive rows and actuator rows, the actuators free) together with the tool pose imposed as
extra rows, by Newton from the previous sample's solution predicted to second order.
Velocities and accelerations are exact: the velocity and acceleration constraint equations
(tool Jacobian, analytic constraint drift) solved at each converged sample, never finite
differences of positions. The result is the runtime's ``Planned`` at the loop rate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg

from pkrt.rt.core.errors import UserError
from pkrt.rt.core.plan import (MAX_SAMPLES, Planned, cartesian_path, circle_basis, concatenate, plan_moves,
                               quintic_profile, read_csv_samples)

from .mechanism import AssemblyError, Config, Mechanism
from .assembly import Assembler


# -- orientation --------------------------------------------------------------------------

def rpy_matrix(rpy) -> np.ndarray:
    """R = Rz(yaw) Ry(pitch) Rx(roll)."""
    r, p, y = rpy
    cr, sr, cp, sp, cy, sy = np.cos(r), np.sin(r), np.cos(p), np.sin(p), np.cos(y), np.sin(y)
    return np.array([[cy * cp, cy * sp * sr - sy * cr, cy * sp * cr + sy * sr],
                     [sy * cp, sy * sp * sr + cy * cr, sy * sp * cr - cy * sr],
                     [-sp, cp * sr, cp * cr]])


def matrix_rpy(R: np.ndarray) -> np.ndarray:
    """(roll, pitch, yaw) of R = Rz(yaw) Ry(pitch) Rx(roll), pitch in [-pi/2, pi/2]."""
    return np.array([np.arctan2(R[2, 1], R[2, 2]), np.arctan2(-R[2, 0], np.hypot(R[0, 0], R[1, 0])),
                     np.arctan2(R[1, 0], R[0, 0])])


def rpy_rates(rpy, rpy_d, rpy_dd) -> tuple[np.ndarray, np.ndarray]:
    """World angular velocity w = E(rpy) rpy_d and acceleration w_d = E rpy_dd + E_d rpy_d."""
    _, p, y = rpy
    _, pd, yd = rpy_d
    cp, sp, cy, sy = np.cos(p), np.sin(p), np.cos(y), np.sin(y)
    E = np.array([[cy * cp, -sy, 0.0], [sy * cp, cy, 0.0], [-sp, 0.0, 1.0]])
    Ed = np.array([[-sy * cp * yd - cy * sp * pd, -cy * yd, 0.0],
                   [cy * cp * yd - sy * sp * pd, -sy * yd, 0.0],
                   [-cp * pd, 0.0, 0.0]])
    return E @ rpy_d, E @ rpy_dd + Ed @ rpy_d


def rotation_vector(A: np.ndarray) -> np.ndarray:
    """Rotation vector of a rotation matrix (angle below pi)."""
    v = 0.5 * np.array([A[2, 1] - A[1, 2], A[0, 2] - A[2, 0], A[1, 0] - A[0, 1]])
    s = np.linalg.norm(v)
    c = 0.5 * (np.trace(A) - 1.0)
    return v if s < 1e-300 else v * (np.arctan2(s, c) / s)


# -- the tool -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Tool:
    """The compiled tool of a mechanism: body index, point in the centre-of-mass frame,
    tool frame in the body frame, selected position components, orientation flag."""
    body: int
    r_local: np.ndarray
    R_local: np.ndarray
    position: tuple[int, ...]  # indices of x, y, z used
    orientation: bool
    coordinates: tuple[str, ...]

    @property
    def m(self) -> int:
        return len(self.coordinates)


def tool_of(mech: Mechanism) -> Tool:
    spec = mech.description.tool
    if spec is None:
        raise UserError(f"{mech.description.path}: no [tool] table: {mech.name} has no task "
                        f"coordinates (add [tool] body and point)")
    b = mech.body_names.index(spec.body)
    body = mech.description.bodies[b]
    pos = tuple(i for i, c in enumerate("xyz") if c in spec.coordinates)
    return Tool(b, spec.point - body.com, spec.rotation, pos, spec.orientation, spec.coordinates)


def tool_pose(mech: Mechanism, cfg: Config, tool: Tool | None = None) -> np.ndarray:
    """Task coordinates of the tool at a configuration (m, rad)."""
    tool = tool or tool_of(mech)
    b = tool.body
    p = cfg.X[b] + cfg.R[b] @ tool.r_local
    out = [p[list(tool.position)]]
    if tool.orientation:
        out.append(matrix_rpy(cfg.R[b] @ tool.R_local))
    return np.concatenate(out)


def _tool_jacobian(mech: Mechanism, cfg: Config, tool: Tool) -> tuple[np.ndarray, np.ndarray]:
    """J (m x n): task-coordinate rates (position rows; angular velocity rows) from qdot, and
    the lever arm r = R_b r_local (world, m)."""
    b = tool.body
    r = cfg.R[b] @ tool.r_local
    J = np.zeros((tool.m, mech.n_coords))
    skew = np.array([[0.0, -r[2], r[1]], [r[2], 0.0, -r[0]], [-r[1], r[0], 0.0]])
    for k, i in enumerate(tool.position):  # v_point = v_b + w_b x r = v_b - [r]x w_b
        J[k, 6 * b + i] = 1.0
        J[k, 6 * b + 3:6 * b + 6] = -skew[i]
    if tool.orientation:
        k = len(tool.position)
        J[k:k + 3, 6 * b + 3:6 * b + 6] = np.eye(3)
    return J, r


# -- paths in task coordinates ------------------------------------------------------------

# A path in task coordinates: the runtime's reference type, its columns the tool's coordinates
# (m, rad) instead of actuator values.
TaskPath = Planned


def _samples(duration: float, rate_hz: float) -> np.ndarray:
    if not (np.isfinite(duration) and duration > 0):
        raise UserError(f"path duration must be positive, got {duration}")
    n = max(int(round(duration * rate_hz)), 1)
    return np.arange(0, n + 1) / n


def line(start, end, duration: float, rate_hz: float) -> TaskPath:
    """Straight line (every coordinate linear in the path parameter) with quintic timing."""
    a, b = np.asarray(start, float), np.asarray(end, float)
    s, ds, dds = quintic_profile(_samples(duration, rate_hz))
    d = b - a
    return TaskPath(rate_hz, a + s[:, None] * d, ds[:, None] * d / duration,
                    dds[:, None] * d / duration**2,
                    {"kind": "line", "start": a.tolist(), "end": b.tolist(), "duration_s": duration})


def circle(centre, radius: float, duration: float, rate_hz: float, normal=(0, 0, 1), laps: float = 1.0,
           tilt: float = 0.0, tilt_cycles: float = 2.0) -> TaskPath:
    """Circle of ``radius`` (m) about ``centre`` (task coordinates: x, y, z, then roll, pitch,
    yaw if 6-DOF; or x, y for a planar tool) in the plane normal to ``normal``, starting at centre + radius e1
    (``pkrt.rt.core.plan.circle_basis``), with a quintic phase over ``duration`` (s) (at rest at both
    ends). For 6-DOF, ``tilt`` (rad) adds roll = tilt sin(tilt_cycles phase) per lap."""
    c = np.asarray(centre, float)
    if not radius > 0:
        raise UserError(f"circle radius must be positive, got {radius}")
    if len(c) == 2:  # a planar tool (x, y): the circle in that plane
        e1, e2 = np.array([1.0, 0.0]), np.array([0.0, 1.0])
    else:
        e1, e2 = circle_basis(normal)
    npos = len(e1)
    u = _samples(duration, rate_hz)
    s, ds, dds = quintic_profile(u)
    total = 2 * np.pi * laps
    ph, phd, phdd = total * s, total * ds / duration, total * dds / duration**2
    cs, sn = np.cos(ph), np.sin(ph)
    f = cs[:, None] * e1 + sn[:, None] * e2  # unit radius vector, and its phase derivatives
    f1 = -sn[:, None] * e1 + cs[:, None] * e2
    pos = np.repeat(c[None], len(u), 0)
    vel = np.zeros_like(pos)
    acc = np.zeros_like(pos)
    pos[:, :npos] += radius * f
    vel[:, :npos] = radius * f1 * phd[:, None]
    acc[:, :npos] = radius * (f1 * phdd[:, None] - f * (phd**2)[:, None])
    if tilt:
        if len(c) != 6:
            raise UserError("a tilt needs 6 task coordinates (x, y, z, roll, pitch, yaw)")
        k = tilt_cycles
        pos[:, 3] += tilt * np.sin(k * ph)
        vel[:, 3] = tilt * k * np.cos(k * ph) * phd
        acc[:, 3] = tilt * k * (np.cos(k * ph) * phdd - k * np.sin(k * ph) * phd**2)
    return TaskPath(rate_hz, pos, vel, acc,
                    {"kind": "circle", "centre": c.tolist(), "radius_m": radius, "duration_s": duration,
                     "laps": laps, "tilt_rad": tilt})


def join(parts: list[TaskPath], description: dict) -> TaskPath:
    """Pieces end to end; each piece's first row must repeat the previous piece's last one."""
    for a, b in zip(parts[:-1], parts[1:]):
        if np.abs(a.pos[-1] - b.pos[0]).max() > 1e-12 or np.abs(a.vel[-1] - b.vel[0]).max() > 1e-12:
            raise UserError("path pieces do not join (position or velocity jumps)")
    return concatenate(parts, description)


def round_trip(home, piece: TaskPath, approach: float) -> TaskPath:
    """From ``home`` to the start of ``piece`` (a line of ``approach`` s), the piece, and from
    its end back home; the piece must start and end at rest (lines, circles, cycles do)."""
    home = np.asarray(home, float)
    there = line(home, piece.pos[0], approach, piece.rate_hz)
    back = line(piece.pos[-1], home, approach, piece.rate_hz)
    return join([there, piece, back], {"kind": "round-trip", "home": home.tolist(),
                                       "approach_s": approach, "piece": piece.description})


def adept_cycle(start, rate_hz: float, cycle_time: float = 0.5, height: float = 0.025,
                width: float = 0.305, direction=(1, 0, 0), blend: float | None = 0.3) -> TaskPath:
    """The pick-and-place "Adept cycle" from ``start`` (x, y, z, m): up ``height``, across
    ``width`` along ``direction``, down, and back the same way, in ``cycle_time`` s.

    ``blend`` (default 0.3): each half cycle is one quintic move across, and the vertical
    moves (quintic, up then down) take the first and last ``blend`` of it, overlapping the
    horizontal move (rounded corners, as robots run the cycle). ``blend=None``: six quintic
    stop-and-go segments, each segment's time growing as the square root of its length."""
    p0 = np.asarray(start, float)
    d = np.asarray(direction, float)
    d = d / np.linalg.norm(d)
    up = np.array([0.0, 0.0, height])
    desc = {"kind": "adept-cycle", "start": p0.tolist(), "cycle_time_s": cycle_time,
            "height_m": height, "width_m": width, "direction": d.tolist(), "blend": blend}
    if blend is None:
        pts = [p0, p0 + up, p0 + up + width * d, p0 + width * d, p0 + up + width * d, p0 + up, p0]
        w = np.sqrt([height, width, height, height, width, height])
        counts = np.round(cycle_time * rate_hz * w / w.sum()).astype(int)
        counts[np.argmax(counts)] += int(round(cycle_time * rate_hz)) - counts.sum()  # on the grid
        if counts.min() < 1:
            raise UserError(f"adept cycle: {cycle_time} s is too short at {rate_hz:g} Hz")
        times = counts / rate_hz
        return join([line(a, b, T, rate_hz) for a, b, T in zip(pts[:-1], pts[1:], times)], desc)
    if not 0 < blend <= 0.5:
        raise UserError(f"adept cycle: blend must be in (0, 0.5], got {blend}")
    Th = 0.5 * cycle_time
    u = _samples(Th, rate_hz)
    s, ds, dds = quintic_profile(u)
    su, dsu, ddsu = quintic_profile(u / blend)
    sd, dsd, ddsd = quintic_profile((u - 1 + blend) / blend)
    tb = blend * Th
    z, zd, zdd = su - sd, (dsu - dsd) / tb, (ddsu - ddsd) / tb**2
    pos = p0 + np.outer(s, width * d) + np.outer(z, up)
    vel = np.outer(ds / Th, width * d) + np.outer(zd, up)
    acc = np.outer(dds / Th**2, width * d) + np.outer(zdd, up)
    there = TaskPath(rate_hz, pos, vel, acc)
    back = TaskPath(rate_hz, pos[::-1].copy(), -vel[::-1], acc[::-1].copy())
    return join([there, back], desc)


def load_task_csv(path: str, rate_hz: float, coordinates: tuple[str, ...]) -> TaskPath:
    """A CSV ``t,<coordinates>`` (e.g. t,x,y,z or t,x,y,z,roll,pitch,yaw) resampled to the
    loop rate by a clamped cubic spline."""
    head, P, Pd, Pdd = read_csv_samples(path, rate_hz, [list(coordinates)])
    return TaskPath(rate_hz, P, Pd, Pdd, {"kind": "task-csv", "path": str(path), "columns": head})


# -- kinematics ---------------------------------------------------------------------------

def check_ranges(mech: Mechanism, theta: np.ndarray, where: str) -> None:
    """Refuse actuator values outside the ranges: one line starting with ``where``."""
    lo, hi = mech.ranges[:, 0], mech.ranges[:, 1]
    bad = np.nonzero((theta < lo - 1e-12) | (theta > hi + 1e-12))[0]
    if len(bad):
        i = int(bad[0])
        raise UserError(f"{where}actuator {mech.actuator_names[i]} would be at {theta[i]:.6g} "
                        f"{mech.actuator_units[i]}, outside its range [{lo[i]:g}, {hi[i]:g}]")


class TaskKinematics:
    """Inverse and forward kinematics of a mechanism's tool; holds warm-start state."""

    def __init__(self, mech: Mechanism, tol: float = 1e-12, max_iter: int = 30, cap: float = 0.1):
        self.mech = mech
        self.tool = tool_of(mech)
        self.tol, self.max_iter, self.cap = tol, max_iter, cap
        self.assembler = Assembler(mech)
        self.cfg = mech.ref_config.copy()
        self.theta = mech.theta_ref.copy()

    # forward kinematics
    def forward(self, theta_rows, missing: bool = False) -> np.ndarray:
        """Task coordinates (k, m) of the tool for actuator values (k, s), each row by Newton
        warm from the last solution (the machine's branch). ``missing`` (logs): a row that is
        not finite or cannot be assembled gives a row of NaN (the next one walks from the last
        good solution) instead of raising ``AssemblyError``."""
        th = np.atleast_2d(np.asarray(theta_rows, float))
        if not missing:
            return np.array([tool_pose(self.mech, self.assembler.solve(t), self.tool) for t in th])
        out = np.full((len(th), self.tool.m), np.nan)
        for k, t in enumerate(th):
            if np.all(np.isfinite(t)):
                try:
                    out[k] = tool_pose(self.mech, self.assembler.solve(t), self.tool)
                except (AssemblyError, np.linalg.LinAlgError):
                    pass
        return out

    # inverse kinematics
    def _residual(self, cfg: Config, theta: np.ndarray, target: np.ndarray):
        mech, tool = self.mech, self.tool
        phi, jac, jt = mech.evaluate(cfg, theta)
        b = tool.body
        p = cfg.X[b] + cfg.R[b] @ tool.r_local
        e = [p[list(tool.position)] - target[:len(tool.position)]]
        if tool.orientation:
            e.append(rotation_vector(cfg.R[b] @ tool.R_local @ rpy_matrix(target[-3:]).T))
        return phi, jac, jt, np.concatenate(e)

    def _system(self, jac, jt, J) -> np.ndarray:
        """[[Phi_q, Phi_theta], [J_tool, 0]] on the square rows: (n + s) x (n + s)."""
        rows = self.mech.square_rows
        n, s = self.mech.n_coords, self.mech.n_act
        A = np.zeros((n + s, n + s))
        A[:n, :n] = jac[rows]
        A[:n, n:] = jt[rows]
        A[n:, :n] = J
        return A

    def solve_pose(self, target, cfg: Config | None = None, theta=None) -> tuple[Config, np.ndarray, float]:
        """Newton on (q, theta) from (cfg, theta) (default: the last solution). Returns the
        configuration, theta and the final max residual (constraints in m, tool in m or rad)."""
        cfg = (cfg or self.cfg).copy()
        theta = np.array(self.theta if theta is None else theta, float)
        n = self.mech.n_coords
        res = np.inf
        for _ in range(self.max_iter + 1):
            phi, jac, jt, e = self._residual(cfg, theta, target)
            res = max(np.abs(phi).max(), np.abs(e).max())
            if res < self.tol or not np.isfinite(res):
                break
            J, _ = _tool_jacobian(self.mech, cfg, self.tool)
            try:
                dz = -np.linalg.solve(self._system(jac, jt, J),
                                      np.concatenate([phi[self.mech.square_rows], e]))
            except np.linalg.LinAlgError:
                return cfg, theta, np.inf
            big = np.abs(dz).max()
            if big > self.cap:
                dz *= self.cap / big
            cfg = cfg.step(dz[:n])
            theta = theta + dz[n:]
        return cfg, theta, res

    def rates(self, cfg: Config, theta: np.ndarray, x: np.ndarray, xd: np.ndarray, xdd: np.ndarray):
        """Exact (qd, thd, qdd, thdd) at an assembled configuration for task rates xd, xdd."""
        mech, tool = self.mech, self.tool
        n = mech.n_coords
        _, jac, jt = mech.evaluate(cfg, theta)
        J, r = _tool_jacobian(mech, cfg, tool)
        lu = scipy.linalg.lu_factor(self._system(jac, jt, J))
        npos = len(tool.position)
        v_task, a_task = xd.copy(), xdd.copy()
        if tool.orientation:
            v_task[npos:], a_task[npos:] = rpy_rates(x[npos:], xd[npos:], xdd[npos:])
        z = scipy.linalg.lu_solve(lu, np.concatenate([np.zeros(n), v_task]))
        qd, thd = z[:n], z[n:]
        gamma = mech.drift(cfg, qd, theta, thd)[mech.square_rows]
        w = qd[6 * tool.body + 3:6 * tool.body + 6]
        bias = np.cross(w, np.cross(w, r))[list(tool.position)]  # a_point = J qdd + w x (w x r)
        rhs_t = a_task.copy()
        rhs_t[:npos] -= bias
        z = scipy.linalg.lu_solve(lu, np.concatenate([-gamma, rhs_t]))
        return qd, thd, z[:n], z[n:]

    def start_at(self, target) -> None:
        """Walk from the last solution to the pose ``target`` in small task steps (5 mm,
        0.05 rad), Newton at each; refuses a pose it cannot reach."""
        x0 = tool_pose(self.mech, self.cfg, self.tool)
        target = np.asarray(target, float)
        d = target - x0
        npos = len(self.tool.position)
        k = int(np.ceil(max(np.abs(d[:npos]).max() / 0.005, np.abs(d[npos:]).max(initial=0) / 0.05, 1)))
        for i in range(1, k + 1):
            cfg, theta, res = self.solve_pose(x0 + d * i / k)
            if not res < self.tol:
                raise UserError(f"{self.mech.name}: the tool cannot reach {np.round(target, 6).tolist()} "
                                f"from the reference assembly (residual {res:.3g})")
            self.cfg, self.theta = cfg, theta

    def plan(self, path: TaskPath) -> Planned:
        """Actuator pos, vel, acc (n, s) at the path's rate, exact from the kinematics;
        refuses a path that leaves the workspace or the actuator ranges (one line with t)."""
        mech = self.mech
        m = self.tool.m
        if path.pos.ndim != 2 or path.pos.shape[1] != m:
            raise UserError(f"{mech.name}: a task path needs {m} coordinate(s) "
                            f"({', '.join(self.tool.coordinates)}), got {path.pos.shape[-1]}")
        if not (np.all(np.isfinite(path.pos)) and np.all(np.isfinite(path.vel)) and np.all(np.isfinite(path.acc))):
            raise UserError(f"{mech.name}: task path values must be finite")
        self.start_at(path.pos[0])
        s, n = mech.n_act, mech.n_coords
        pos, vel, acc = np.empty((path.n, s)), np.empty((path.n, s)), np.empty((path.n, s))
        dt = 1.0 / path.rate_hz
        cfg, theta = self.cfg, self.theta
        for k in range(path.n):
            t = k * dt
            if k > 0:  # second-order prediction from the previous sample
                cfg = cfg.step(qd * dt + 0.5 * qdd * dt * dt)
                theta = theta + thd * dt + 0.5 * thdd * dt * dt
            cfg, theta, res = self.solve_pose(path.pos[k], cfg, theta)
            if not res < self.tol:
                raise UserError(f"task path refused: at t = {t:.4f} s the tool pose "
                                f"{np.round(path.pos[k], 6).tolist()} is outside {mech.name}'s "
                                f"workspace (cannot assemble: residual {res:.3g})")
            check_ranges(mech, theta, f"task path refused: at t = {t:.4f} s ")
            qd, thd, qdd, thdd = self.rates(cfg, theta, path.pos[k], path.vel[k], path.acc[k])
            pos[k], vel[k], acc[k] = theta, thd, thdd
        self.cfg, self.theta = cfg, theta
        desc = {**path.description, "task": {"tool": mech.description.tool.body,
                                             "coordinates": list(self.tool.coordinates)}}
        return Planned(path.rate_hz, pos, vel, acc, desc)


def plan_task_path(mech: Mechanism, path: TaskPath) -> Planned:
    """Plan a task path from the reference assembly (see ``TaskKinematics.plan``)."""
    return TaskKinematics(mech).plan(path)


def forward_kinematics(mech: Mechanism, theta_rows) -> np.ndarray:
    """Tool task coordinates (k, m) for actuator values (k, s) (logs and plots)."""
    return TaskKinematics(mech).forward(theta_rows)


def plan_demo(mech: Mechanism, demo, rate_hz: float) -> Planned:
    """The machine's demo from its configuration's ``[demo]`` table (``pkrt.rt.core.schema.DemoTable``):
    quintic moves through the actuator ``points`` (back to the first), then the task-space piece
    (``circle`` or ``adept-cycle``) from and back to the home tool pose, planned by the model's
    inverse kinematics. Actuator pos, vel, acc at ``rate_hz``."""
    pieces, desc = [], {"kind": "demo", "task": demo.task}
    _check_demo_length(demo, 0 if demo.points is None else len(demo.points), rate_hz)
    kin = None
    if demo.points is not None:
        pts = np.asarray(demo.points, float)
        if pts.shape[1] != mech.n_act:
            raise UserError(f"[demo] points: {mech.name} has {mech.n_act} actuators, got {pts.shape[1]} values")
        pieces.append(plan_moves(pts, [demo.move_time] * (len(pts) - 1), rate_hz, dwell=demo.dwell,
                                 what="[demo] move_time, dwell"))
        desc["points"] = pts.tolist()
    if demo.task != "none":
        kin = TaskKinematics(mech)
        theta0 = pieces[0].pos[-1] if pieces else mech.theta_ref
        home = kin.forward(theta0)[0]
        if demo.task == "circle":
            piece = _demo_circle(demo, home, rate_hz)
        else:
            start = home[:3] if demo.start is None else np.asarray(demo.start, float)
            one = adept_cycle(start, rate_hz, demo.cycle_time, demo.height, demo.width, demo.direction)
            piece = join([one] * demo.cycles, one.description) if demo.cycles > 1 else one
        # from home to the piece and back (a speed-ramped circle ends within 1e-7 m/s of rest: its
        # last sample is not exactly at the ramp's end, so the pieces are concatenated unchecked)
        parts = [piece]
        if np.abs(piece.pos[0] - home).max() > 1e-12:
            parts.insert(0, line(home, piece.pos[0], demo.approach, rate_hz))
        if np.abs(piece.pos[-1] - home).max() > 1e-12:
            parts.append(line(piece.pos[-1], home, demo.approach, rate_hz))
        path = concatenate(parts, piece.description)
        desc["piece"] = piece.description
        pieces.append(kin.plan(path))
    if not pieces:
        raise UserError(f"{mech.name}: no demo (the configuration's [demo] table has no points and no task "
                        f"piece); give --traj FILE.csv")
    return concatenate(pieces, desc) if len(pieces) > 1 else Planned(rate_hz, pieces[0].pos, pieces[0].vel,
                                                                     pieces[0].acc, desc)


def _check_demo_length(demo, points: int, rate_hz: float) -> None:
    """Refuse a demo longer than ``MAX_SAMPLES`` before planning it (its times are the
    ``[demo]`` table's, each up to 1e12 s): moves and dwells, the circle or the Adept cycles,
    the approach lines."""
    T = max(points - 1, 0) * (demo.move_time + demo.dwell)
    if demo.task == "circle":
        T += demo.circle_time if demo.speed is None else 2 * demo.ramp + np.pi * demo.diameter * demo.laps / demo.speed
    elif demo.task == "adept-cycle":
        T += demo.cycle_time * demo.cycles
    if demo.task != "none":
        T += 2 * demo.approach
    if T * rate_hz > MAX_SAMPLES:
        raise UserError(f"[demo]: the demo takes {T:.6g} s, more than {MAX_SAMPLES} samples at {rate_hz:g} Hz "
                        f"(move_time, dwell, circle_time, laps, speed, cycle_time, cycles, approach)")


def _demo_circle(demo, home: np.ndarray, rate_hz: float) -> TaskPath:
    """The demo's circle about ``centre`` (default the home pose): speed-ramped if ``speed``
    is given (position coordinates only), else a quintic phase over ``circle_time`` with the tilt."""
    centre = home if demo.centre is None else np.asarray(demo.centre, float)
    if len(centre) != len(home):
        raise UserError(f"[demo] centre: expected {len(home)} task coordinates, got {len(centre)}")
    r = 0.5 * demo.diameter
    if demo.speed is None:
        return circle(centre, r, demo.circle_time, rate_hz, normal=demo.normal, laps=demo.laps, tilt=demo.tilt,
                      tilt_cycles=demo.tilt_cycles)
    if len(centre) != 3 or demo.tilt:
        raise UserError("[demo] speed: a speed-ramped circle needs a 3-coordinate tool and no tilt")
    P, Pd, Pdd = cartesian_path("circle", rate_hz, centre=centre, diameter=demo.diameter, normal=demo.normal,
                                speed=demo.speed, ramp=demo.ramp, laps=demo.laps)
    return TaskPath(rate_hz, P, Pd, Pdd, {"kind": "circle", "centre": centre.tolist(), "diameter_m": demo.diameter,
                                          "peak_speed_m_s": demo.speed, "laps": demo.laps})

