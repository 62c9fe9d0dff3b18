"""Live targets: a stream of actuator targets followed through ruckig's online jerk-limited
generator, one ``update`` a cycle. The actuator ranges are checked every cycle (ruckig's
community version has no position limits: a sample outside them is a fault, never sent); a
stream that gets no new target for ``timeout_s`` of loop time ends in a controlled stop
(ruckig's velocity interface to zero), and so does one whose stopping point a ``guard`` (the
passive joints' limits, made by the application from the model) finds beyond a limit.
Units: actuator (m or rad), s.
"""

from __future__ import annotations

import time

import numpy as np
from ruckig import ControlInterface, InputParameter, OutputParameter, Result, Ruckig, Synchronization

from pkrt.rt.runtime.machine.motion import Source, guarded

JERK_PER_ACCEL = 20.0  # 1/s: the jerk limit is this times the acceleration limit (a 50 ms ramp)
COST_RING = 1 << 17  # generator costs kept (131 s at 1 kHz)


class LiveTarget(Source):
    """Follows ``set_target`` targets from ``start`` at rest; ``vmax``, ``amax`` per axis."""

    kind = "stream"

    def __init__(self, start: np.ndarray, target: np.ndarray, t: float, vmax: np.ndarray, amax: np.ndarray,
                 lo: np.ndarray, hi: np.ndarray, dt: float, timeout_s: float, guard=None):
        s = len(start)
        super().__init__(s)
        self.lo, self.hi, self.timeout_s, self.guard, self.dt = lo, hi, timeout_s, guard, dt
        self.amax = np.asarray(amax, float) * np.ones(s)
        self.otg = Ruckig(s, dt)
        self.inp, self.out = InputParameter(s), OutputParameter(s)
        self.inp.current_position = list(map(float, start))
        self.inp.current_velocity = [0.0] * s
        self.inp.current_acceleration = [0.0] * s
        self.inp.max_velocity = list(map(float, vmax))
        self.inp.max_acceleration = list(map(float, amax))
        self.inp.max_jerk = list(map(float, JERK_PER_ACCEL * np.asarray(amax, float)))
        self.pos[:] = start
        self.stopping = False
        self.stale: str | None = None
        self.limit_error: str | None = None
        self.t = t
        self.targets = 0
        # s per ``update`` of the generator, the last COST_RING cycles: wall time (preemption by the
        # host and other threads included) and this thread's CPU time (the generator's own cost)
        self.cost = np.zeros(COST_RING)
        self.cost_cpu = np.zeros(COST_RING)
        self.updates = 0
        self.set_target(target, t)

    def set_target(self, target, t: float) -> None:
        self.inp.target_position = list(map(float, target))
        self.inp.target_velocity = [0.0] * len(target)
        self.t_target = t
        self.targets += 1

    def stop(self) -> None:
        """Velocity to zero under the jerk limit, each axis as fast as it can (not synchronised:
        the shortest stop on every axis, the one ``stop_point`` bounds)."""
        self.stopping = True
        self.inp.control_interface = ControlInterface.Velocity
        self.inp.synchronization = Synchronization.No
        self.inp.target_velocity = [0.0] * len(self.pos)
        self.inp.target_acceleration = [0.0] * len(self.pos)

    def step(self, dt: float) -> None:
        self.t += dt
        if not self.stopping and self.t - self.t_target > self.timeout_s:
            self.stale = f"stream stale: no target for {self.t - self.t_target:.3g} s"
            self.stop()
        c0, t0 = time.thread_time(), time.perf_counter()
        res = self.otg.update(self.inp, self.out)
        j = self.updates % COST_RING
        self.cost[j], self.cost_cpu[j] = time.perf_counter() - t0, time.thread_time() - c0
        self.updates += 1
        if res not in (Result.Working, Result.Finished):
            self.limit_error = f"live-target generator failed ({res})"
            self.done = True
            return
        p = self.out.new_position
        self.pos[:] = p
        self.vel[:] = self.out.new_velocity
        self.acc[:] = self.out.new_acceleration
        if np.any(self.pos < self.lo) or np.any(self.pos > self.hi):
            i = int(np.argmax((self.pos < self.lo) | (self.pos > self.hi)))
            self.limit_error = (f"stream: reference would leave the range of axis {i} ({self.pos[i]:.6g}, "
                                f"range [{self.lo[i]:g}, {self.hi[i]:g}])")
            self.pos[:] = np.clip(self.pos, self.lo, self.hi)
        self.out.pass_to_input(self.inp)
        guarded(self)
        if self.stopping and res == Result.Finished:
            self.vel[:] = 0.0
            self.acc[:] = 0.0
            self.done = True

    def stop_point(self) -> np.ndarray:
        """Where a stop begun next cycle would end, per axis (the stop is not synchronised):
        from the state one cycle ahead (the acceleration still growing at the jerk limit), the
        jerk-limited ramp to full braking, braking, and the ramp back to rest."""
        dt, A, J = self.dt, self.amax, JERK_PER_ACCEL * self.amax
        sign = np.where(self.vel >= 0, 1.0, -1.0)
        a0 = np.minimum(self.acc * sign + J * dt, A)  # along the motion
        v = np.abs(self.vel) + np.maximum(self.acc * sign, 0.0) * dt
        T = (a0 + A) / J  # the ramp to -A
        v1 = v + a0 * T - 0.5 * J * T * T
        d = np.where(v1 > 0, v * T + 0.5 * a0 * T * T - J * T ** 3 / 6 + v1 * v1 / (2 * A) + A ** 3 / (24 * J * J),
                     v * T + 0.5 * np.maximum(a0, 0.0) * T * T)  # stopped within the ramp: bounded by it
        return self.pos + sign * (d + v * dt)

    def costs(self, cpu: bool = False) -> np.ndarray:
        """The generator's cost of each update kept (s), oldest first: wall time, or with
        ``cpu`` the loop thread's CPU time."""
        c, n = (self.cost_cpu if cpu else self.cost), self.updates
        return c[:n].copy() if n <= COST_RING else np.roll(c, -(n % COST_RING))

    def status(self) -> dict:
        return {"kind": self.kind, "target": list(self.inp.target_position), "targets": self.targets,
                "stopping": self.stopping, "stale": self.stale}
