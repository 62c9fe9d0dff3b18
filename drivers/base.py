"""The drive interface every backend implements (ros2_control-style lifecycle).

A ``Drives`` object is the group of s axes of one machine, in actuator order, in SI units at the
actuator (m or rad; N or N m). The loop calls, every cycle, ``read(t)`` then ``write(tau)``.

Lifecycle: UNCONFIGURED -configure()-> CONFIGURED -enable()-> ENABLED; any fault -> FAULTED;
``disable()`` (idempotent, never raises) -> DISABLED: torque off. Leaving the loop for any
reason disables the drives.
"""

from __future__ import annotations

import enum
import time

import numpy as np

from pkrt.rt.core.errors import Fault
from pkrt.rt.core.schema import ConfigError


class DriveState(enum.Enum):
    UNCONFIGURED = "unconfigured"
    CONFIGURED = "configured"
    ENABLED = "enabled"
    FAULTED = "faulted"
    DISABLED = "disabled"


class DriveError(Fault):
    """A drive or bus fault at run time (the loop stops safely, exit 1)."""


DriveConfigError = ConfigError  # bad drive settings in a machine configuration (exit 2)


def round_carried(x: float, carry: list[float], i: int, lim: int) -> int:
    """A command ``x`` (finite, in the drive's integer unit) rounded into [-lim, lim], with the
    rounding left over from axis i's last command (``carry[i]``) added first and this one's
    kept there (error feedback): averaged over a few cycles the drive applies ``x`` exactly, as
    a finer unit would, where plain rounding leaves up to half a unit of force unmatched (the
    Orthoglide then stood 1-2 encoder counts off its target: docs/drives.md). A clamped
    command carries nothing."""
    x += carry[i]
    c = round(x)
    if -lim <= c <= lim:
        carry[i] = x - c
        return c
    carry[i] = 0.0
    return lim if c > lim else -lim

class Feedback:
    """Preallocated feedback of one read: positions (m or rad), velocities (m/s or rad/s),
    ``fresh`` true when this read brought new data from every axis, ``stamp`` the loop time
    (s) of the read."""

    def __init__(self, n_axes: int):
        self.position = np.zeros(n_axes)
        self.velocity = np.zeros(n_axes)
        self.fresh = False
        self.stamp = 0.0


class Drives:
    """Base class of the drive backends. Subclasses implement the ``_do_*`` hooks."""

    backend = "base"

    def __init__(self, n_axes: int):
        self.n_axes = n_axes
        self.state = DriveState.UNCONFIGURED
        self.fault_reason: str | None = None
        self.fault_time: float | None = None  # time.monotonic() of the first fault (the host-pause probe's clock)
        self.feedback = Feedback(n_axes)
        self.torque_on = False  # True while torque commands reach the actuators
        self.outputs: dict = {}  # the machine's outputs (spindle, coolant, tool) as last set
        self.output_changes: list[dict] = []  # every change: {"t": loop time s, name: value, ...}

    # -- lifecycle ---------------------------------------------------------------------------
    def configure(self) -> None:
        self._do_configure()
        self.state = DriveState.CONFIGURED

    def enable(self) -> None:
        if self.state is not DriveState.CONFIGURED:
            raise DriveError(f"cannot enable drives in state {self.state.value}")
        self._do_enable()
        self.state = DriveState.ENABLED
        self.torque_on = True

    def disable(self) -> None:
        """Torque off. Idempotent; never raises (called on every way out of the loop)."""
        try:
            self._do_disable()
        except Exception as e:  # noqa: BLE001 - a failing disable must not mask the cause
            if self.fault_reason is None:
                self.fault_reason = f"disable failed: {e}"
        self.torque_on = False
        if self.state is not DriveState.FAULTED:
            self.state = DriveState.DISABLED

    def close(self) -> None:
        self.disable()
        self._do_close()

    def fault(self, reason: str) -> None:
        """Record a fault (first reason wins) and take torque off."""
        if self.fault_reason is None:
            self.fault_reason, self.fault_time = reason, time.monotonic()
        self.disable()
        self.state = DriveState.FAULTED

    def describe(self) -> dict:
        """The settings in use, for the run log's header."""
        return {"backend": self.backend}

    def set_outputs(self, changes: dict, t: float) -> None:
        """Set machine outputs at loop time t (s): ``spindle`` ("cw", "ccw", "off"),
        ``spindle_speed`` (the program's S), ``mist``, ``flood`` (bool), ``tool`` (the tool
        asked for). Recorded here (the simulated plant has nothing more to do); a backend
        wired to such outputs maps them in ``_do_outputs``. Called at rest, between motions."""
        if not changes:
            return
        self.outputs.update(changes)
        if len(self.output_changes) < 100_000:
            self.output_changes.append({"t": t, **changes})
        self._do_outputs(changes)

    def prepare(self, theta0: np.ndarray) -> None:
        """Before enabling: a simulated backend starts its plant at theta0 (at rest); real
        drives leave the machine where it is."""

    # -- cyclic ------------------------------------------------------------------------------
    def read(self, t: float) -> Feedback:
        """Fill and return ``self.feedback`` for loop time t (s)."""
        raise NotImplementedError

    def write(self, tau: np.ndarray) -> None:
        """Command actuator torques/forces (N or N m), SI, actuator order."""
        raise NotImplementedError

    def advance(self, t_next: float) -> None:
        """After ``write``, between cycles: a backend whose plant runs in this process
        integrates the command to the next read's loop time ``t_next`` (s) here, in the loop's
        sleep budget rather than in the next ``read``; the feedback sequence is the same.
        Real drives do nothing."""

    # -- hooks -------------------------------------------------------------------------------
    def _do_configure(self) -> None:
        pass

    def _do_enable(self) -> None:
        pass

    def _do_disable(self) -> None:
        pass

    def _do_close(self) -> None:
        pass

    def _do_outputs(self, changes: dict) -> None:
        pass
