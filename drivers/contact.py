"""External forces at the simulated plant's tool: a force step or a stiff wall (clamp).

A contact acts on the plant through the tool's Jacobian: an external force F at the tool point
gives the actuators tau_ext = J^T F, where J is the Jacobian of the tool's position (m) in the
actuator values (x_dot = J theta_dot). The plant does not load models: the tool's position and
Jacobian come from ``tool(theta) -> (x, J)``, a callable built from the model outside the drivers
(``pkrt.rt.app.contact``), evaluated once per loop period at the state the step starts from
(rows of J and entries of x: the tool's task coordinates, position first; only x, y, z are used).

- ``force``: F (N, world frame) from the first period that starts at or after ``at`` (s, loop
  time) for ``duration`` s, J^T F held over each period.
- ``wall``: a plane through the tool's position at ``at``, its normal along the tool's velocity
  at the first period from ``at`` in which the tool moves (the machine runs into it); the
  force -k d n for a penetration d > 0 (k the stiffness, N/m) grows as the machine pushes on.
  It is evaluated at every substep of the plant's integration from the tool's position
  linearised about the period's start (x0 + J (theta - theta0)), so it stays stiff within the
  period.

``tau`` and ``force`` hold what acted over the last period (the substeps' mean): the truth the
run log records beside the observer's estimate. Units: m, N, s.
"""

from __future__ import annotations

import math

import numpy as np

KINDS = ("force", "wall")
MOVING = 1e-4  # m/s: the tool moves (a wall's normal is taken along its velocity)


class LinearTool:
    """The tool linearised about one pose: ``(theta) -> (x0 + J (theta - theta0), J)``, the data a
    contact behind a drive emulator carries (the emulator's process loads no model: the app layer
    takes x0 and J from the model at the planned pose of the contact's onset)."""

    def __init__(self, x0, J, theta0):
        self.x0, self.J, self.theta0 = (np.asarray(a, float) for a in (x0, J, theta0))

    def __call__(self, theta) -> tuple[np.ndarray, np.ndarray]:
        return self.x0 + self.J @ (np.asarray(theta, float) - self.theta0), self.J

    def data(self) -> dict:
        return {"x0": self.x0.tolist(), "J": self.J.tolist(), "theta0": self.theta0.tolist()}


class Contact:
    """One external force on the plant's tool (see the module docstring)."""

    def __init__(self, kind: str, at: float, s: int, tool, force=(0.0, 0.0, 0.0), duration: float = math.inf,
                 stiffness: float = 0.0):
        if kind not in KINDS:
            raise ValueError(f"contact kind {kind!r}: expected one of {', '.join(KINDS)}")
        self.kind, self.at, self.s, self.tool = kind, float(at), s, tool
        self.f = np.asarray(force, float).reshape(3)
        self.duration, self.stiffness = float(duration), float(stiffness)
        self.tau = np.zeros(s)  # N or N m: the actuator forces of the last period
        self.force = np.zeros(3)  # N: the tool force of the last period
        self.onset: float | None = None  # s: the start of the first period it acted in
        self.wall: np.ndarray | None = None  # the wall's point (m)
        self.normal: np.ndarray | None = None  # its unit normal, into the wall
        self._set_at: tuple[float | None, float | None] = (None, None)  # when point and normal were taken
        self.peak = 0.0  # N: the largest tool force of a period so far

    def describe(self) -> dict:
        d = {"kind": self.kind, "at_s": self.at}
        if self.kind == "force":
            d.update(force_n=self.f.tolist(), duration_s=self.duration)
        else:
            d.update(stiffness_n_per_m=self.stiffness)
        return d

    def data(self) -> dict:
        """The contact as JSON data (its tool a ``LinearTool``), for an emulator's process."""
        if not isinstance(self.tool, LinearTool):
            raise ValueError("only a contact with a LinearTool is data")
        return {"kind": self.kind, "at": self.at, "force": self.f.tolist(),
                "duration": None if math.isinf(self.duration) else self.duration, "stiffness": self.stiffness,
                "tool": self.tool.data()}

    @classmethod
    def from_data(cls, d: dict, s: int) -> "Contact":
        """The contact of ``data`` (a ``ValueError`` for anything malformed)."""
        try:
            tool = LinearTool(d["tool"]["x0"], d["tool"]["J"], d["tool"]["theta0"])
            dur = math.inf if d.get("duration") is None else float(d["duration"])
            c = cls(d["kind"], float(d["at"]), s, tool, force=d.get("force", (0.0, 0.0, 0.0)), duration=dur,
                    stiffness=float(d.get("stiffness", 0.0)))
        except (KeyError, TypeError) as e:
            raise ValueError(f"contact data: {e}") from None
        J = tool.J
        if J.ndim != 2 or J.shape[1] != s or J.shape[0] < 3 or tool.theta0.shape != (s,) or tool.x0.shape != J.shape[:1]:
            raise ValueError(f"contact data: a tool Jacobian of {s} columns, 3 rows at least, expected")
        return c

    def truth(self) -> dict:
        """What acted so far (an emulator's report): the onset (s) and the largest tool force (N)."""
        return {"onset_s": self.onset, "peak_tool_force_n": self.peak, **self.describe()}

    def acts(self, t0: float) -> bool:
        """Whether the period starting at loop time t0 (s) feels the contact."""
        if t0 < self.at - 1e-12:
            return False
        return self.kind == "wall" or t0 < self.at + self.duration - 1e-12

    def step(self, plant, tau_cmd: np.ndarray, t0: float, dt: float) -> int:
        """Integrate ``plant`` over one period from t0 (s) with the command ``tau_cmd`` held and
        the contact's force added; returns the plant's status. Repeatable: the same state and
        t0 give the same step (the drives undo and redo steps)."""
        st = self._step(plant, tau_cmd, t0, dt)
        self.peak = max(self.peak, float(np.linalg.norm(self.force)))
        return st

    def _step(self, plant, tau_cmd: np.ndarray, t0: float, dt: float) -> int:
        self.tau[:] = 0.0
        self.force[:] = 0.0
        if not self.acts(t0):
            return plant.step(tau_cmd, dt)
        if self.onset is None or self._set_at[0] == t0:
            self.onset = t0
        x, J = self.tool(plant.theta.copy())
        x, J = np.asarray(x, float)[:3], np.asarray(J, float)[:3]
        if self.kind == "force":
            self.force[:] = self.f
            self.tau[:] = J.T @ self.f
            return plant.step(tau_cmd + self.tau, dt)
        if self.wall is None or self._set_at[0] == t0:  # the wall at the tool's position at onset
            self.wall, self._set_at = x.copy(), (t0, self._set_at[1])
        if self.normal is None or self._set_at[1] == t0:
            v = J @ plant.theta_dot
            speed = float(np.linalg.norm(v))
            if speed <= MOVING:
                return plant.step(tau_cmd, dt)  # not moving yet: no normal, no force
            self.normal, self._set_at = v / speed, (self._set_at[0], t0)
        n_sub = plant.substeps
        h = dt / n_sub
        theta0 = plant.theta.copy()
        st = 0
        for _ in range(n_sub):  # the wall's force from the tool linearised about the period's start
            d = float(self.normal @ (x + J @ (plant.theta - theta0) - self.wall))
            f = -self.stiffness * max(d, 0.0) * self.normal
            tau = J.T @ f
            st = max(st, plant.step(tau_cmd + tau, h, substeps=1))
            self.force += f / n_sub
            self.tau += tau / n_sub
        return st


__all__ = ["Contact", "LinearTool", "KINDS"]
