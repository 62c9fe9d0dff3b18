"""The task-space readout of the panel: the tool's coordinates of the machine's actuator
positions by the forward kinematics of its model (``TaskKinematics.forward``, Newton warm
from the last solution), computed in the panel's process, never in the loop's. Units: x, y, z
in m (world frame of the model), roll, pitch, yaw in rad."""

from __future__ import annotations

import numpy as np


class ToolReadout:
    """Forward kinematics of one machine's tool; one warm start per series (the commanded
    and the actual positions)."""

    def __init__(self, mech):
        from pkrt.models.kinematics.taskspace import TaskKinematics

        self.kin = {name: TaskKinematics(mech) for name in ("reference", "position")}
        self.coordinates = list(self.kin["reference"].tool.coordinates)

    @classmethod
    def load(cls, config_path: str) -> tuple["ToolReadout | None", str | None]:
        """The readout of the machine configured at ``config_path``, or None and why not."""
        from pkrt.rt.app.reference import machine_mechanism
        from pkrt.rt.runtime.machine.config import load_machine

        try:
            mech = machine_mechanism(load_machine(config_path))
            if mech.description.tool is None:
                return None, f"{mech.name} has no [tool]: no task-space readout"
            return cls(mech), None
        except Exception as e:  # noqa: BLE001 - any model that does not load: joint readout only
            return None, f"no task-space readout: {type(e).__name__}: {e}"

    def __call__(self, series: str, theta) -> list[float] | None:
        """Task coordinates of ``theta`` (actuator values), None where it does not assemble."""
        x = self.kin[series].forward(np.asarray(theta, float)[None, :], missing=True)[0]
        return x.tolist() if np.all(np.isfinite(x)) else None
