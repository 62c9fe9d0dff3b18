"""Motion sources of a served machine: each cycle one of them gives the controller its
reference (pos, vel, acc) in actuator units (m or rad and their derivatives).

- ``Hold``: stand still at a position.
- ``JointJog``: per-axis velocity jog (continuous, released by ``release``) with acceleration
  ``a``; the soft limits (actuator ranges) are never crossed: the velocity towards a limit is
  capped so that braking at ``a`` stops before it. With a ``guard`` (``guarded``), the jog is
  released as soon as its stopping point would take a passive joint beyond its limit.
- ``Program``: a planned reference (a move, a task-space line, a whole program) played along
  its path with a time scaling: path time tau advances at rate r (1 = as planned), and r
  changes at a bounded rate so that every axis' acceleration P''(tau) r^2 + P'(tau) r_dot
  stays within the limits. Feed hold ramps r to 0, resume back to the override, stop ramps to
  0 and ends. The position between planned samples is the cubic Hermite of the samples'
  positions and velocities (on the path to O(h^4)). A program's events (``Planned.events``)
  fire as path time passes their sample; one that holds (a G-code tool change, M0, M1) stops
  the program there, at rest on its path, until ``resume``.
"""

from __future__ import annotations

import numpy as np

from pkrt.rt.core.plan import Planned


class Source:
    """A motion source: ``step(dt)`` advances one cycle and fills ``pos``, ``vel``, ``acc``;
    ``done`` once it has come to rest for good. ``kind`` names it in the status."""

    kind = "source"

    def __init__(self, s: int):
        self.pos = np.zeros(s)
        self.vel = np.zeros(s)
        self.acc = np.zeros(s)
        self.done = False

    def step(self, dt: float) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        """Begin a controlled stop (``done`` once at rest)."""
        self.done = True

    def status(self) -> dict:
        return {"kind": self.kind}


class Hold(Source):
    """Stand still at ``pos``."""

    kind = "hold"

    def __init__(self, pos: np.ndarray):
        super().__init__(len(pos))
        self.pos[:] = pos

    def step(self, dt: float) -> None:
        pass


def guarded(src) -> None:
    """The passive joints' guard of an unplanned source (a stream, a velocity jog), each cycle:
    ``src.guard(pos, stopping point)`` (made by the application from the model: the runtime
    holds no model) gives the reason when the stopping point is beyond a limit; the source then
    stops at once (short of the limit: its stopping point was inside the cycle before), and
    ``stale`` keeps the reason."""
    if src.guard is None or src.stopping:
        return
    why = src.guard(src.pos, src.stop_point())
    if why:
        src.stale = why
        src.stop()


def motion_limits(limits, margin: float) -> tuple[np.ndarray, np.ndarray]:
    """The velocity and acceleration every reference of a served machine keeps within: the
    configuration's ``[limits]`` less ``margin`` of them (the machine tracks its reference
    with an error, and the supervisor faults on the measured velocity: a move at the full
    limit tripped it at 1.0002 of it)."""
    s = limits.position.shape[0]
    return (1 - margin) * limits.velocity * np.ones(s), (1 - margin) * limits.acceleration * np.ones(s)


def braking_speed(d: np.ndarray, a: np.ndarray, dt: float) -> np.ndarray:
    """Largest speed from which braking at ``a`` in steps of dt (trapezoidal position update)
    stops within distance d >= 0: v^2 / (2 a) + v dt / 2 + v dt <= d (the last term: the cycle
    before braking starts)."""
    d = np.maximum(d, 0.0)
    b = 1.5 * dt
    return a * (-b + np.sqrt(b * b + 2.0 * d / a))


class JointJog(Source):
    """Continuous joint jog: ``velocity`` (per axis, signed) until ``release``; speeds capped
    at ``vmax``, accelerations at ``a``; never past [lo, hi]."""

    kind = "jog"

    def __init__(self, start: np.ndarray, velocity: np.ndarray, vmax: np.ndarray, a: np.ndarray,
                 lo: np.ndarray, hi: np.ndarray, guard=None, dt: float = 1e-3):
        super().__init__(len(start))
        self.pos[:] = start
        self.guard, self.dt, self.stale = guard, dt, None
        self.a, self.lo, self.hi = np.asarray(a, float), np.asarray(lo, float), np.asarray(hi, float)
        self.vmax = np.asarray(vmax, float)
        self.target = np.clip(np.asarray(velocity, float), -self.vmax, self.vmax)
        self.released = False
        self.at_limit = False

    def set_velocity(self, velocity: np.ndarray) -> None:
        self.target = np.clip(np.asarray(velocity, float), -self.vmax, self.vmax)
        self.released = False

    def release(self) -> None:
        self.target[:] = 0.0
        self.released = True

    stop = release

    @property
    def stopping(self) -> bool:
        return self.released

    def stop_point(self) -> np.ndarray:
        """Where braking begun next cycle ends: a cycle more at the acceleration limit, then
        braking at it (``braking_speed``'s distance)."""
        v = np.abs(self.vel) + self.a * self.dt
        return self.pos + np.where(self.vel >= 0, 1.0, -1.0) * (v * v / (2 * self.a) + 2.5 * v * self.dt)

    def step(self, dt: float) -> None:
        v0 = self.vel
        up = braking_speed(self.hi - self.pos, self.a, dt)
        down = braking_speed(self.pos - self.lo, self.a, dt)
        want = np.clip(self.target, -down, up)
        self.at_limit = bool(np.any(want != self.target))
        acc = np.clip((want - v0) / dt, -self.a, self.a)
        v1 = v0 + acc * dt
        p1 = self.pos + 0.5 * (v0 + v1) * dt
        clipped = (p1 < self.lo) | (p1 > self.hi)  # a last guard: at the limit, at rest
        if np.any(clipped):
            p1 = np.clip(p1, self.lo, self.hi)
            v1 = np.where(clipped, 0.0, v1)
        self.pos[:] = p1
        self.vel[:] = v1
        self.acc[:] = acc
        guarded(self)
        if self.released and not np.any(v1):
            self.done = True

    def status(self) -> dict:
        return {"kind": self.kind, "velocity": self.target.tolist(), "released": self.released,
                "at_limit": self.at_limit}


def plan_peaks(plan: Planned) -> tuple[np.ndarray, np.ndarray]:
    """The largest abs velocity and acceleration per axis of a plan. Taken where the plan is
    made (the server's threads), not in the loop: 0.2 ms for 2000 samples of 3 axes."""
    return np.abs(plan.vel).max(axis=0), np.abs(plan.acc).max(axis=0)


class Program(Source):
    """A planned reference played with a time scaling (feed hold, resume, override, stop).

    ``vmax``, ``amax``: the limits per axis; ``ramp_s``: the shortest time r takes from 0 to
    1 (its rate is bounded by 1 / ramp_s, and further by the accelerations); the scaling is
    capped at ``rate_cap``, the largest r at which the planned velocities and accelerations
    scaled by r and r^2 stay within the limits."""

    kind = "program"

    def __init__(self, plan: Planned, vmax: np.ndarray, amax: np.ndarray, ramp_s: float = 0.25,
                 override: float = 1.0, kind: str = "program",
                 peaks: tuple[np.ndarray, np.ndarray] | None = None, info: dict | None = None):
        s = plan.pos.shape[1]
        super().__init__(s)
        self.kind = kind
        self.plan = plan
        self.h = 1.0 / plan.rate_hz
        self.t_end = (plan.n - 1) * self.h
        self.amax = np.asarray(amax, float) * np.ones(s)
        peak_v, peak_a = peaks if peaks is not None else plan_peaks(plan)  # ``plan_peaks``, taken before
        with np.errstate(divide="ignore"):
            cap = min(np.min(np.where(peak_v > 0, vmax / np.maximum(peak_v, 1e-300), np.inf)),
                      np.min(np.where(peak_a > 0, np.sqrt(self.amax / np.maximum(peak_a, 1e-300)), np.inf)))
        self.rate_cap = float(min(cap, 10.0))
        self.rdot_max = 1.0 / ramp_s
        self.override = float(override)
        self.tau = 0.0  # path time (s)
        self.r = min(self.override, self.rate_cap)  # starts as planned (at rest: P' = 0 at tau = 0)
        self.rdot = 0.0
        self.target = self.r
        self.held = False
        self.stopping = False
        self.info = info or {}  # what runs: {"file": ..., "kind": "csv" | "gcode" | "demo"} (status)
        self.events = sorted(plan.events, key=lambda e: e["sample"])
        self.next_event = 0
        self.fired: list[dict] = []  # events passed since the machine last took them
        self.waiting: dict | None = None  # the event that holds the program now (until resume)
        self._sample(0.0)

    # -- commands ---------------------------------------------------------------------------------
    def hold(self) -> None:
        self.held, self.target = True, 0.0

    def resume(self) -> None:
        self.held, self.target = False, min(self.override, self.rate_cap)
        if self.waiting is not None:
            self.waiting = None
            self.next_event += 1

    def set_override(self, f: float) -> None:
        self.override = float(f)
        if not (self.held or self.stopping):
            self.target = min(self.override, self.rate_cap)

    def stop(self) -> None:
        self.stopping, self.target = True, 0.0

    @property
    def at_rest(self) -> bool:
        return self.r == 0.0

    # -- the cycle --------------------------------------------------------------------------------
    def _sample(self, tau: float) -> None:
        """pos (cubic Hermite), P' and P'' (linear) at path time tau into pos, self.d1, self.d2."""
        p = self.plan
        x = min(max(tau / self.h, 0.0), p.n - 1.0)
        k = min(int(x), p.n - 2) if p.n > 1 else 0
        u = x - k
        if p.n == 1:
            self.pos[:], self.d1, self.d2 = p.pos[0], p.vel[0] * 0.0, p.acc[0] * 0.0
            return
        u2, u3 = u * u, u * u * u
        h00, h10, h01, h11 = 2 * u3 - 3 * u2 + 1, u3 - 2 * u2 + u, -2 * u3 + 3 * u2, u3 - u2
        h = self.h
        self.pos[:] = h00 * p.pos[k] + h10 * h * p.vel[k] + h01 * p.pos[k + 1] + h11 * h * p.vel[k + 1]
        self.d1 = (1 - u) * p.vel[k] + u * p.vel[k + 1]
        self.d2 = (1 - u) * p.acc[k] + u * p.acc[k + 1]

    def _rdot(self, dt: float) -> float:
        """The rate of change of r towards the target: at most rdot_max, and such that every
        axis' |P'' r^2 + P' r_dot| <= amax; 0 if nothing else is feasible."""
        want = np.clip((self.target - self.r) / dt, -self.rdot_max, self.rdot_max)
        base = self.d2 * self.r * self.r
        lo, hi = -np.inf, np.inf
        for i in range(len(base)):
            d = self.d1[i]
            if abs(d) < 1e-12:
                continue
            a, b = (-self.amax[i] - base[i]) / d, (self.amax[i] - base[i]) / d
            if a > b:
                a, b = b, a
            lo, hi = max(lo, a), min(hi, b)
        if lo > hi:
            return 0.0
        return float(min(max(want, lo), hi))

    def step(self, dt: float) -> None:
        if self.done:
            self.vel[:] = 0.0
            self.acc[:] = 0.0
            return
        self.rdot = rd = self._rdot(dt)
        r1 = self.r + rd * dt
        if r1 < 0.0 or (rd < 0 and r1 < 1e-9):
            r1 = 0.0
        tau = self.tau + 0.5 * (self.r + r1) * dt
        self.r = r1
        if tau >= self.t_end:
            tau, self.r = self.t_end, 0.0
        if self.next_event < len(self.events) and self.waiting is None:
            tau = self._events(tau)
            if self.waiting is not None:
                rd = 0.0
        self.tau = tau
        self._sample(tau)
        self.vel[:] = self.d1 * self.r
        self.acc[:] = self.d2 * self.r * self.r + self.d1 * rd
        if tau >= self.t_end or (self.stopping and self.r == 0.0):
            self.vel[:] = 0.0
            self.acc[:] = 0.0
            self.done = True

    def _events(self, tau: float) -> float:
        """Fire the events path time ``tau`` passed (into ``fired``); at one that holds, stop
        there (the plan is at rest at an event's sample) and return its time."""
        while self.next_event < len(self.events):
            ev = self.events[self.next_event]
            at = ev["sample"] * self.h
            if at > tau + 1e-12:
                break
            self.fired.append(ev)
            if ev.get("hold"):
                self.waiting, self.held, self.target, self.r, self.rdot = ev, True, 0.0, 0.0, 0.0
                return min(at, tau)
            self.next_event += 1
        return tau

    def program_status(self) -> dict:
        """What runs, how far (path time over duration) and the program line of the motion
        now, or of the event holding it (None where the plan has no lines, or between them)."""
        line = None
        if self.waiting is not None:  # held at an event: its line
            line = self.waiting.get("line")
        elif self.plan.line is not None:
            ln = int(self.plan.line[min(int(round(self.tau / self.h)), self.plan.n - 1)])
            line = ln or None
        return {"file": self.info.get("file"), "kind": self.info.get("kind"),
                "progress": min(max(self.tau / self.t_end, 0.0), 1.0) if self.t_end > 0 else 1.0, "line": line}

    def status(self) -> dict:
        return {"kind": self.kind, "path_time_s": self.tau, "duration_s": self.t_end, "rate": self.r,
                "override": self.override, "rate_cap": self.rate_cap, "held": self.held,
                "waiting": self.waiting["text"] if self.waiting else None,
                "description": self.plan.description.get("kind")}
