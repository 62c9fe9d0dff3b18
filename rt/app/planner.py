"""Plans what a served machine is asked to do, in the server's threads (never the loop's):
joint moves and steps (quintic), task-space moves, steps and continuous jogs (straight lines
through the model's inverse kinematics), programs (an actuator or task CSV, or the machine's
demo, joined from the machine's reference by a joint move). Every plan is checked against the
actuator ranges, the velocity and acceleration limits, the task-space workspace and the passive
joints' limits and bodies' capsules (when the model declares them) before the loop sees it.
Units: actuator (m or rad), task (m, rad), seconds.
"""

from __future__ import annotations

import threading

import numpy as np

from pkrt.rt.runtime.machine.config import MachineConfig
from pkrt.rt.core.errors import UserError
from pkrt.rt.core.plan import Planned, concatenate, quintic_profile
from pkrt.rt.runtime.machine.motion import motion_limits
from pkrt.rt.runtime.machine.trajectory import plan_moves, quintic_duration, validate

COARSE = 10          # task paths are solved every COARSE loop periods, then Hermite-resampled
JOG_AHEAD_S = 2.0    # a continuous task-space jog is planned this far ahead (the jog ends there)
EDGE_MARGIN = 0.002  # m: a task jog stops this far inside the last reachable point it found


def hermite_resample(coarse: Planned, rate_hz: float) -> Planned:
    """A reference planned at a lower rate resampled to ``rate_hz``: positions by cubic Hermite
    of the coarse positions and velocities (exact at the coarse samples), velocities by the
    Hermite's derivative, accelerations linear between the coarse ones."""
    f = int(round(rate_hz / coarse.rate_hz))
    n = (coarse.n - 1) * f + 1
    x = np.arange(n) / f
    k = np.minimum(x.astype(int), coarse.n - 2)
    u = (x - k)[:, None]
    h = 1.0 / coarse.rate_hz
    p0, p1, v0, v1 = coarse.pos[k], coarse.pos[k + 1], coarse.vel[k], coarse.vel[k + 1]
    u2, u3 = u * u, u * u * u
    pos = (2 * u3 - 3 * u2 + 1) * p0 + (u3 - 2 * u2 + u) * h * v0 + (-2 * u3 + 3 * u2) * p1 + (u3 - u2) * h * v1
    vel = ((6 * u2 - 6 * u) * p0 / h + (3 * u2 - 4 * u + 1) * v0 + (-6 * u2 + 6 * u) * p1 / h + (3 * u2 - 2 * u) * v1)
    acc = (1 - u) * coarse.acc[k] + u * coarse.acc[k + 1]
    return Planned(rate_hz, pos, vel, acc, coarse.description)


def trapezoid_line(start: np.ndarray, end: np.ndarray, speed: float, accel: float, rate_hz: float,
                   multiple: int = 1) -> Planned:
    """A straight task-space line: speed rises to ``speed`` (m/s) along a quintic over tr =
    1.875 speed / accel (peak acceleration ``accel``), cruises, falls the same way; at rest at
    both ends. The duration is rounded up to a whole number of ``multiple`` periods (the speed
    lowered to fit). A line too short to reach the speed is one quintic."""
    d = np.asarray(end, float) - np.asarray(start, float)
    L = float(np.linalg.norm(d))
    if not L > 0:
        raise UserError("a line needs two different points")
    e = d / L
    tr = 1.875 * speed / accel
    if speed * tr >= L:
        T = max(np.sqrt(5.7735 * L / accel), 1.875 * L / speed)
        n = int(np.ceil(T * rate_hz / multiple)) * multiple
        T = n / rate_hz
        s, ds, dds = quintic_profile(np.arange(n + 1) / n)
        return Planned(rate_hz, start + np.outer(s * L, e), np.outer(ds * L / T, e), np.outer(dds * L / T**2, e),
                       {"kind": "line"})
    T = L / speed + tr
    n = int(np.ceil(T * rate_hz / multiple)) * multiple
    T = n / rate_hz
    speed = L / (T - tr)
    tc = T - 2 * tr
    t = np.arange(n + 1) / rate_hz
    ur, uf = np.clip(t / tr, 0, 1), np.clip((t - tr - tc) / tr, 0, 1)

    def S1(u):  # integral of the quintic profile from 0 to u
        return 2.5 * u**4 - 3 * u**5 + u**6

    sr, dsr, _ = quintic_profile(ur)
    sf, dsf, _ = quintic_profile(uf)
    dist = speed * (tr * S1(ur) + np.clip(t - tr, 0, tc) + tr * uf - tr * S1(uf))
    v = speed * (sr - sf)
    a = speed * (dsr - dsf) / tr
    return Planned(rate_hz, start + np.outer(dist, e), np.outer(v, e), np.outer(a, e), {"kind": "line"})


class Planner:
    """Plans for one machine. The model and its kinematics are loaded on first use (a machine
    run only in joint space never loads them)."""

    def __init__(self, config: MachineConfig, settings, mech=None):
        self.config, self.settings = config, settings
        from pkrt.rt.runtime.machine.settings import soft_limits

        self.lo, self.hi = soft_limits(config, settings)
        self.vmax, self.amax = motion_limits(config.limits, settings.limit_margin)
        self.rate = config.rate_hz
        self._mech = mech
        self._kin = None
        self._passive = None
        self._lock = threading.RLock()  # the kinematics keep warm-start state: one plan at a time

    @property
    def kin(self):
        if self._kin is None:
            from pkrt.models.kinematics.taskspace import TaskKinematics

            if self._mech is None:
                from pkrt.rt.app.reference import machine_mechanism

                self._mech = machine_mechanism(self.config)
            if self._mech.description.tool is None:
                raise UserError(f"{self._mech.name} has no [tool]: task-space motion needs one")
            self._kin = TaskKinematics(self._mech)
        return self._kin

    def task_coordinates(self) -> list[str]:
        """The tool's task coordinates (the model loaded if it is not, not its kinematics)."""
        if self._mech is None:
            from pkrt.rt.app.reference import machine_mechanism

            self._mech = machine_mechanism(self.config)
        if self._mech.description.tool is None:
            raise UserError(f"{self._mech.name} has no [tool]: task-space motion needs one")
        return list(self._mech.description.tool.coordinates)

    @property
    def passive(self):
        """The check of the passive joints and capsules (``PathCheck``), None when the model
        declares none (a machine run in joint space then never loads its model)."""
        if self._passive is None:
            from pkrt.rt.app.reference import passive_check

            self._passive = passive_check(self.config, self._mech) or False
            if self._passive:
                self._mech = self._passive.mech
        return self._passive or None

    def _check(self, plan: Planned, axes) -> Planned:
        """The plan within the soft limits (widened to its start: a machine standing beyond them by
        its tracking error may come back, never go further), velocity and acceleration limits."""
        lo, hi = np.minimum(self.lo, plan.pos[0]), np.maximum(self.hi, plan.pos[0])
        validate(plan, lo - 1e-9, hi + 1e-9, self.vmax, self.amax, axes)  # rounding at a limit
        if self.passive is not None:
            with self._lock:
                self.passive.path(plan.pos, plan.rate_hz, "trajectory refused: ")
        return plan

    def check_target(self, theta: np.ndarray, what: str) -> None:
        """Refuse actuator values beyond a passive joint's limit or with two bodies touching."""
        if self.passive is None:
            return
        from pkrt.models.kinematics.mechanism import AssemblyError

        with self._lock:
            try:
                m = self.passive.margins_at(theta)[0]
            except AssemblyError:
                self.passive.assembler.reset()
                raise UserError(f"{what}: target {np.round(theta, 6).tolist()} cannot be assembled") from None
        if np.any(m < 0):
            i = int(np.argmin(m))
            raise UserError(f"{what}: target refused: {self.passive.passive.value(i, float(m[i]))}")

    # -- joint space -------------------------------------------------------------------------------
    def joint_move(self, start: np.ndarray, target: np.ndarray, speed: float, axes) -> Planned:
        """A quintic move at ``speed`` (fraction of the velocity and acceleration limits)."""
        target = np.asarray(target, float)
        if target.shape != start.shape or not np.all(np.isfinite(target)):
            raise UserError(f"a joint target needs {len(start)} finite values")
        bad = np.nonzero((target < self.lo) | (target > self.hi))[0]
        if len(bad):
            i = int(bad[0])
            raise UserError(f"target refused: axis {axes[i]} at {target[i]:.6g} is outside its soft limits "
                            f"[{self.lo[i]:g}, {self.hi[i]:g}]")
        if not 0 < speed <= 1:
            raise UserError(f"speed must be in (0, 1] (a fraction of the limits), got {speed}")
        T = quintic_duration(target - start, speed * self.vmax, speed * self.amax)
        T = max(T, 10.0 / self.rate)
        return self._check(plan_moves(np.array([start, target]), [T], self.rate), axes)

    # -- task space --------------------------------------------------------------------------------
    def forward(self, theta: np.ndarray) -> np.ndarray:
        with self._lock:
            return self.kin.forward(theta)[0]

    def _task_path(self, theta0: np.ndarray, path: Planned, axes) -> Planned:
        """Actuator reference of a task path starting where the machine is (theta0)."""
        from pkrt.models.kinematics.taskspace import TaskKinematics

        kin = self.kin
        coarse = Planned(path.rate_hz / COARSE, path.pos[::COARSE], path.vel[::COARSE], path.acc[::COARSE],
                         path.description)
        if (path.n - 1) % COARSE:
            raise UserError("internal: task path length is not a whole number of coarse steps")
        cfg = kin.assembler.solve(theta0)
        kin.cfg, kin.theta = cfg, theta0.copy()
        planned = TaskKinematics.plan(kin, coarse)
        plan = hermite_resample(planned, self.rate)
        gap = np.abs(plan.pos[0] - theta0).max()
        if gap > 1e-6:
            raise UserError(f"internal: task path starts {gap:.3g} from the machine")
        plan.pos[0] = theta0
        return self._check(plan, axes)

    def task_line(self, theta0: np.ndarray, target: np.ndarray, speed: float, accel: float, axes) -> Planned:
        with self._lock:
            x0 = self.kin.forward(theta0)[0]
            target = np.asarray(target, float)
            if target.shape != x0.shape or not np.all(np.isfinite(target)):
                raise UserError(f"a task target needs {len(x0)} finite values ({', '.join(self.kin.tool.coordinates)})")
            for _ in range(3):  # slow down until the actuators' limits hold
                path = trapezoid_line(x0, target, speed, accel, self.rate, COARSE)
                try:
                    return self._task_path(theta0, path, axes)
                except UserError as e:
                    if "velocity limit" not in str(e) and "acceleration limit" not in str(e):
                        raise
                    speed, accel = speed / 2, accel / 4
            raise UserError("task move refused: the actuators' limits do not hold even at a quarter of the speed")

    def task_motion(self, theta0: np.ndarray, spec: dict, axes) -> tuple[Planned, bool]:
        """A task-space motion from where the machine is (``theta0``), as the server validated
        it: ``spec["kind"]`` "move" (``target``: the tool's pose), "step" (``step``: an offset
        from the tool's pose) or "jog" (``direction``: a unit vector; a line ``JOG_AHEAD_S``
        at ``speed`` ahead, cut short of the workspace's edge), each a line at ``speed`` (m/s)
        and ``accel`` (m/s^2). Returns the plan and whether it is a continuous jog (one that
        ``release`` and the dead-man end)."""
        kind, speed, accel = spec["kind"], spec["speed"], spec["accel"]
        if kind == "move":
            return self.task_line(theta0, spec["target"], speed, accel, axes), False
        x0 = self.forward(theta0)
        off = np.asarray(spec["step"] if kind == "step" else spec["direction"], float)
        if off.shape != x0.shape:
            raise UserError(f"'{'step' if kind == 'step' else 'direction'}' needs {len(x0)} values "
                            f"({', '.join(self.kin.tool.coordinates)})")
        if kind == "step":
            return self.task_line(theta0, x0 + off, speed, accel, axes), False
        with self._lock:
            far, _ = self.travel(theta0, off, speed * JOG_AHEAD_S)
        if far < 1e-4:
            raise UserError("task jog refused: the workspace edge is reached in that direction")
        return self.task_line(theta0, x0 + far * off, speed, accel, axes), True

    def travel(self, theta0: np.ndarray, direction: np.ndarray, most: float) -> tuple[float, str | None]:
        """How far (m) the tool can go from where it is along ``direction`` (unit), up to
        ``most``, staying assembled, inside the soft limits and the passive joints' limits, with
        no two bodies touching (5 mm steps, then halving); and what stops it there (None: it
        got to ``most``)."""
        kin = self.kin
        x0 = kin.forward(theta0)[0]
        if direction.shape != x0.shape:
            raise UserError(f"'direction' needs {len(x0)} values ({', '.join(kin.tool.coordinates)})")
        cfg, th = kin.assembler.solve(theta0), theta0.copy()
        passive = self.passive.passive if self.passive is not None else None

        def why(dist):
            c, t, res = kin.solve_pose(x0 + dist * direction, cfg, th)
            if not res < kin.tol:
                return "the workspace's edge (cannot be assembled further)", c, t
            out = np.flatnonzero((t < self.lo) | (t > self.hi))
            if len(out):
                i = int(out[0])
                return f"actuator {kin.mech.actuator_names[i]}'s soft limit", c, t
            if passive is not None:
                m = passive.margins(c.X[None], c.R[None])[0]
                if np.any(m < 0):
                    i = int(np.argmin(m))
                    return passive.value(i, float(m[i])), c, t
            return None, c, t

        step, d = 0.005, 0.0
        while d < most:
            nxt = min(d + step, most)
            stop, c, t = why(nxt)
            if stop is not None:
                lo, hi = d, nxt
                for _ in range(10):
                    mid = 0.5 * (lo + hi)
                    s2, c2, t2 = why(mid)
                    if s2 is None:
                        lo, cfg, th = mid, c2, t2
                    else:
                        hi, stop = mid, s2
                return max(lo - EDGE_MARGIN, 0.0), stop
            d, cfg, th = nxt, c, t
        return most, None


class PlanError(UserError):
    """A plan the machine cannot follow (one line)."""


def program_from(planner: Planner, ref: Planned, theta0: np.ndarray, axes, speed: float) -> Planned:
    """A program starting where the machine is: a joint move to its first point is put first
    if it starts elsewhere."""
    planner._check(ref, axes)
    if np.abs(ref.pos[0] - theta0).max() <= 1e-9:
        return ref
    lead = planner.joint_move(theta0, ref.pos[0], speed, axes)
    if np.abs(ref.vel[0]).max() > 1e-9:
        raise UserError("the program starts moving: it must start at rest")
    return concatenate([lead, ref], {**ref.description, "lead_in": "joint move"})
