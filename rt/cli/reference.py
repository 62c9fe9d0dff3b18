"""The run's reference, planned offline in the CLI layer (which may use the models) and handed
to the runtime as arrays: the configuration's ``[demo]`` or a task-space CSV (x,y,z[,roll,
pitch,yaw]) through the model's inverse kinematics (``pkrt.models.taskspace``) for any machine
with a ``[tool]``; an actuator CSV or a ROS 2 bag goes to the runtime as given. After the run,
the tracking error at the tool from the log (forward kinematics, outside the loop)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..config import MachineConfig
from ..errors import UserError
from ..plan import Planned, csv_columns

if TYPE_CHECKING:
    from pkrt.models.mechanism import Mechanism


def machine_mechanism(config: MachineConfig) -> "Mechanism":
    """The configuration's model (a run of actuator values never loads it)."""
    from pkrt.models.mechanism import load_mechanism

    return load_mechanism(config.model_path)


def plan_reference(config: MachineConfig, trajectory=None, mech: "Mechanism | None" = None,
                   axes: list[str] | None = None):
    """A ``Planned`` at the loop rate for the demo (``None`` or ``"demo"``) or a task-space
    CSV (its columns after ``t`` start with ``x`` and are not the actuators' names ``axes``);
    anything else (a ``Planned``, an actuator CSV's path) is returned unchanged."""
    if isinstance(trajectory, Planned):
        return trajectory
    if trajectory is None or trajectory == "demo":
        if config.demo.points is None and config.demo.task == "none":
            raise UserError(f"{config.path}: no demo for this machine (no [demo] table); give --traj FILE.csv")
        from pkrt.models.taskspace import plan_demo

        return plan_demo(mech or machine_mechanism(config), config.demo, config.rate_hz)
    cols = csv_columns(str(trajectory))
    if cols is not None and cols[1:2] == ["x"] and cols[1:] != axes:  # task coordinates
        from pkrt.models.taskspace import TaskKinematics, load_task_csv, tool_of

        mech = mech or machine_mechanism(config)
        if mech.description.tool is None:
            raise UserError(f"{trajectory}: task-space columns need a machine with a [tool] ({mech.name} has none)")
        return TaskKinematics(mech).plan(load_task_csv(str(trajectory), config.rate_hz, tool_of(mech).coordinates))
    return trajectory


def tool_error(config: MachineConfig, log) -> dict | None:
    """Tracking error at the tool, after the run: the forward kinematics (the model's solver)
    of the logged positions against that of the logged reference. Euclidean distance of the tool
    point (m): RMS and max; None for a machine without a [tool] or a log without rows."""
    pos, ref = log.get("pos"), log.get("ref_pos")
    mech = machine_mechanism(config)
    if mech.description.tool is None or pos is None or len(pos) == 0:
        return None
    from pkrt.models.taskspace import TaskKinematics, tool_of

    kin = TaskKinematics(mech)
    npos = len(tool_of(mech).position)
    ok = np.all(np.isfinite(pos), axis=1)
    e = np.linalg.norm(kin.forward(pos[ok])[:, :npos] - kin.forward(ref[ok])[:, :npos], axis=1)
    return {"rms_m": float(np.sqrt(np.mean(e**2))), "max_m": float(e.max()), "samples": int(ok.sum())}
