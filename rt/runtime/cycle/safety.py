"""Safety supervision: feedback checks each cycle, stale feedback and watchdog counters.

Any fault disables the drives within the cycle it is detected in, and is logged with its
reason. Units: m or rad, m/s or rad/s.
"""

from __future__ import annotations

import numpy as np
from numba import njit

OK, NAN, POSITION, VELOCITY, FOLLOWING = 0, 1, 2, 3, 4
NAMES = {NAN: "non-finite feedback", POSITION: "position limit", VELOCITY: "velocity limit",
         FOLLOWING: "following error"}


@njit(cache=True)
def check_feedback(pos, vel, ref_pos, limits):
    """(code, axis) of the first violated check. limits rows: low, high, vmax, max |e|."""
    for i in range(pos.shape[0]):
        if not (np.isfinite(pos[i]) and np.isfinite(vel[i])):
            return NAN, i
    for i in range(pos.shape[0]):
        if pos[i] < limits[0, i] or pos[i] > limits[1, i]:
            return POSITION, i
        if abs(vel[i]) > limits[2, i]:
            return VELOCITY, i
        if abs(ref_pos[i] - pos[i]) > limits[3, i]:
            return FOLLOWING, i
    return OK, -1


class Supervisor:
    """Holds the limits and counters; ``check`` returns a fault reason or None."""

    def __init__(self, limits, axes: list[str], units: list[str]):
        self.limits = np.vstack([limits.position[:, 0], limits.position[:, 1], limits.velocity,
                                 limits.following_error]).copy()
        self.stale_max = limits.stale_cycles
        self.watchdog_max = limits.watchdog_cycles
        self.axes = axes
        self.units = units
        self.stale = 0
        self.late = 0

    def check(self, fb, ref_pos) -> str | None:
        code, i = check_feedback(fb.position, fb.velocity, ref_pos, self.limits)
        return self.verdict(code, i, fb, ref_pos)

    def verdict(self, code: int, i: int, fb, ref_pos) -> str | None:
        """The reason for ``check_feedback``'s (code, axis), or the stale counter's, or None
        (the part of ``check`` after the kernel, which the loop may have called fused)."""
        if code != OK:
            return self.describe(code, i, fb, ref_pos)
        self.stale = 0 if fb.fresh else self.stale + 1
        if self.stale >= self.stale_max:
            return f"stale feedback: no fresh data for {self.stale} cycles"
        return None

    def overrun(self, late: bool) -> str | None:
        """Count consecutive overruns; a reason once the watchdog limit is reached."""
        self.late = self.late + 1 if late else 0
        if self.late >= self.watchdog_max:
            return f"watchdog: {self.late} missed cycles in a row"
        return None

    def describe(self, code: int, i: int, fb, ref_pos) -> str:
        a, u = self.axes[i], self.units[i]
        if code == NAN:
            return f"non-finite feedback on axis {a} (position {fb.position[i]}, velocity {fb.velocity[i]})"
        if code == POSITION:
            return (f"position limit: axis {a} at {fb.position[i]:.6g} {u}, outside "
                    f"[{self.limits[0, i]:.6g}, {self.limits[1, i]:.6g}]")
        if code == VELOCITY:
            return f"velocity limit: axis {a} at {fb.velocity[i]:.6g} {u}/s, limit {self.limits[2, i]:.6g}"
        return (f"following error: axis {a} off by {ref_pos[i] - fb.position[i]:.6g} {u}, "
                f"limit {self.limits[3, i]:.6g}")
