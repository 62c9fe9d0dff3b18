"""The tool's Jacobian in the actuator values, and the tool force behind actuator forces.

J maps actuator rates to the tool's velocity: x_dot = J theta_dot, its rows the tool's position
rates (m/s, world frame) and, for a tool with orientation, its angular velocity (rad/s, world
frame). It is J_tool q_theta: the tool point's velocity in the bodies' velocities times the
passive coordinates' rates in the actuators' (the assembly's -Phi_q^-1 Phi_theta on the square
rows). By virtual power a wrench w = (F, M) at the tool point gives the actuators tau = J^T w
(N or N m), which is how the simulated plant applies a contact (``pkrt.drivers.contact``) and how
a residual of the contact observer becomes a tool force (``tool_force``).
"""

from __future__ import annotations

import numpy as np

from .assembly import Assembler
from .mechanism import Mechanism
from .taskspace import _tool_jacobian, tool_of, tool_pose


class ToolJacobian:
    """``(theta) -> (x, J)``: the tool's task coordinates (m, rad) and J (m x s), assembled warm
    from the last call (one per thread)."""

    def __init__(self, mech: Mechanism):
        self.mech = mech
        self.tool = tool_of(mech)
        self.assembler = Assembler(mech)

    def __call__(self, theta) -> tuple[np.ndarray, np.ndarray]:
        theta = np.asarray(theta, float)
        cfg = self.assembler.solve(theta)
        Jt, _ = _tool_jacobian(self.mech, cfg, self.tool)
        return tool_pose(self.mech, cfg, self.tool), Jt @ self.assembler.q_theta(cfg, theta)

    def tool_force(self, theta, tau) -> dict:
        """The tool wrench whose actuator forces are ``tau``: J^T w = tau solved by least squares
        (exact when J is square and regular). ``force`` (N, world frame), ``moment`` (N m, about
        the tool point, world frame; a tool with orientation only), ``norm`` (N)."""
        _, J = self(theta)
        w = np.linalg.lstsq(J.T, np.asarray(tau, float), rcond=None)[0]
        npos = len(self.tool.position)
        force = np.zeros(3)
        force[list(self.tool.position)] = w[:npos]
        out = {"force": force.tolist(), "norm": float(np.linalg.norm(force))}
        if self.tool.orientation:
            out["moment"] = w[npos:npos + 3].tolist()
        return out


__all__ = ["ToolJacobian"]
