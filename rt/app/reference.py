"""The run's reference, planned offline in the CLI layer (which may use the models) and handed
to the runtime as arrays: the configuration's ``[demo]`` or a task-space CSV (x,y,z[,roll,
pitch,yaw]) through the model's inverse kinematics (``pkrt.models.taskspace``) for any machine
with a ``[tool]``; an actuator CSV or a ROS 2 bag goes to the runtime as given."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from pkrt.rt.runtime.config import MachineConfig
from pkrt.rt.core.errors import UserError
from pkrt.rt.core.plan import Planned, csv_columns

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


class ExactInLoop:
    """The exact reduction as the model in the loop: ``(theta, H, D, p) -> status`` filling the
    controller's arrays, each call assembled warm from the last one (0 ok, 2 the mechanism
    cannot be assembled there: out of domain)."""

    def __init__(self, mech: "Mechanism"):
        from pkrt.models.reduction import ExactModel

        self.exact = ExactModel(mech)

    def __call__(self, theta, H, D, p) -> int:
        from pkrt.models.reduction import AssemblyError

        try:
            r = self.exact(theta)
        except (AssemblyError, UserError):
            return 2
        H[...] = r.H
        D[...] = r.D
        p[...] = r.p_ext
        return 0


def exact_model(config: MachineConfig, plan: Planned, lockstep: bool, samples: int = 200):
    """The exact model for ``[controller] model = "exact"`` and its time per call measured on
    ``samples`` consecutive (warm) evaluations of the planned reference around its fastest
    sample (p50, p99 in us). Refused (one line) in real time when the p99 exceeds the loop period."""
    import time

    model = ExactInLoop(machine_mechanism(config))
    s = plan.pos.shape[1]
    H, D, p = np.zeros((s, s)), np.zeros((s, s * (s + 1) // 2)), np.zeros(s)
    fast = int(np.argmax(np.abs(plan.vel).max(axis=1)))
    k0 = min(max(fast - samples // 2, 0), max(plan.n - samples, 0))
    rows = plan.pos[k0:k0 + samples]
    model(rows[0], H, D, p)  # compile or load the kernels
    t = []
    for th in rows:
        t0 = time.perf_counter()
        model(th, H, D, p)
        t.append(time.perf_counter() - t0)
    us = np.array(t) * 1e6
    figures = {"samples": len(us), "p50": float(np.percentile(us, 50)), "p99": float(np.percentile(us, 99))}
    period_us = 1e6 / config.rate_hz
    if not lockstep and figures["p99"] > period_us:
        raise UserError(f"{config.path}: [controller] model = \"exact\": its p99 is {figures['p99']:.0f} us per "
                        f"call over {len(us)} warm evaluations along the reference, more than the {period_us:.0f} us "
                        f"loop period; use model = \"tree\", a lower --rate, or --lockstep")
    return model, figures
