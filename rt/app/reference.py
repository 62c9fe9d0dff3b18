"""The run's reference, planned offline in the CLI layer (which may use the models) and handed
to the runtime as arrays: the configuration's ``[demo]`` or a task-space CSV (x,y,z[,roll,
pitch,yaw]) through the model's inverse kinematics (``pkrt.models.kinematics.taskspace``) for any machine
with a ``[tool]``; an actuator CSV or a ROS 2 bag goes to the runtime as given."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import numpy as np

from pkrt.rt.runtime.machine.config import MachineConfig
from pkrt.rt.core.errors import UserError
from pkrt.rt.core.inputs import excerpt, shorten_tokens
from pkrt.rt.core.plan import Planned, csv_columns

if TYPE_CHECKING:
    from pkrt.models.kinematics.mechanism import Mechanism


def machine_mechanism(config: MachineConfig) -> "Mechanism":
    """The configuration's model (a run of actuator values never loads it)."""
    from pkrt.models.kinematics.mechanism import load_mechanism

    return load_mechanism(config.model_path)


def passive_check(config: MachineConfig, mech: "Mechanism | None" = None):
    """The machine's check of its passive joints and capsules (``PathCheck``), or None when its
    description declares none (then no model is loaded for it)."""
    from pkrt.rt.core.protection import declares_protection

    if not declares_protection(config.model_path):
        return None
    from pkrt.models.kinematics.passive import PathCheck

    return PathCheck(mech or machine_mechanism(config))


def check_reference(config: MachineConfig, trajectory, axes: list[str], mech: "Mechanism | None" = None) -> None:
    """Refuse a run's reference (one line, with the time) that takes a passive joint beyond its
    limit or makes two bodies touch (an actuator CSV is read here for it; the runtime streams
    its own reading)."""
    check = passive_check(config, mech)
    if check is None:
        return
    plan = trajectory
    if not isinstance(plan, Planned):
        from pkrt.rt.runtime.machine.trajectory import load_trajectory_csv

        plan = load_trajectory_csv(trajectory, config.rate_hz, axes)
    check.path(plan.pos, plan.rate_hz, "trajectory refused: ")


def plan_reference(config: MachineConfig, trajectory=None, mech: "Mechanism | None" = None,
                   axes: list[str] | None = None, gcode: str | None = None):
    """A ``Planned`` at the loop rate for the demo (``None`` or ``"demo"``), a task-space CSV
    (its columns after ``t`` start with ``x`` and are not the actuators' names ``axes``) or a
    G-code program (``gcode``, timed in minimum time); anything else (a ``Planned``, an
    actuator CSV's path) is returned unchanged."""
    if gcode is not None:
        return plan_gcode(path_planner(config, mech), gcode, setup=gcode_setup(config), ranges=config.limits.position)[0]
    if isinstance(trajectory, Planned):
        return trajectory
    if trajectory is None or trajectory == "demo":
        if config.demo.points is None and config.demo.task == "none":
            raise UserError(f"{config.path}: no demo for this machine (no [demo] table); give --traj FILE.csv")
        from pkrt.models.kinematics.taskspace import plan_demo

        return plan_demo(mech or machine_mechanism(config), config.demo, config.rate_hz)
    cols = csv_columns(str(trajectory))
    if cols is not None and cols[1:2] == ["x"] and cols[1:] != axes:  # task coordinates
        from pkrt.models.kinematics.taskspace import TaskKinematics, load_task_csv, tool_of

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
        from pkrt.models.reduction.exact import ExactModel

        self.exact = ExactModel(mech)

    def __call__(self, theta, H, D, p) -> int:
        from pkrt.models.kinematics.mechanism import AssemblyError

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


# -- time-optimal planning (pkrt plan, pkrt run --gcode) -----------------------------------------

def path_planner(config: MachineConfig, mech: "Mechanism | None" = None, model: str | None = None,
                 margin: float = 0.1, grid_points: int = 200, smooth: float = 0.002, closed_form: bool = True,
                 held_acc: bool = True):
    """The machine's time-optimal planner: limits from [limits] and [controller] (tau_max, the
    friction feed-forward), forces from the controller's tree or the exact model; task paths
    through the closed-form inverse kinematics where the machine has one (``closed_form``);
    accelerations as each period's mean (``held_acc``, ``PathPlanner.sample``)."""
    from pkrt.models.kinematics.taskspace import TaskKinematics
    from pkrt.models.planning.topp import ExactDynamics, PathPlanner, PlanLimits, TreeDynamics

    from pkrt.rt.runtime.machine.runsetup import load_controller_tree

    mech = mech or machine_mechanism(config)
    model = model or config.controller.model
    dyn = ExactDynamics(mech) if model == "exact" else TreeDynamics(load_controller_tree(config))
    kin = TaskKinematics(mech) if mech.description.tool is not None else None
    return PathPlanner(mech, dyn, PlanLimits.from_config(config, margin), config.rate_hz, kin=kin,
                       grid_points=grid_points, smooth=smooth, closed_form=closed_form,
                       held_acc=held_acc)


def home_tool(planner) -> np.ndarray:
    """The tool's task coordinates at the reference assembly (G-code's default origin)."""
    if planner.kin is None:
        raise UserError(f"{planner.mech.name} has no [tool]: task-space paths need one")
    return planner.kin.forward(planner.mech.theta_ref)[0]


def gcode_setup(config: MachineConfig):
    """What G-code programs run against on this machine (``pkrt.models.planning.ngc_setup.Setup``):
    the configuration's ``[gcode]`` tool table (read now) and work offsets (m -> mm)."""
    from pkrt.models.planning.ngc_setup import Setup, read_tool_table

    g = config.gcode
    if g is None:
        return Setup()
    table = config.resolve(g.tool_table) if g.tool_table else None
    try:
        tools = read_tool_table(table, g.tool_units) if table else {}
    except UserError as e:
        raise UserError(f"{config.path}: [gcode] tool_table: {e}") from None
    offsets = {i + 1: getattr(g, f"g{54 + i}") * 1e3 for i in range(6)}
    return Setup(tools, offsets, g.block_delete, g.optional_stop, table)


def gcode_origin(planner, path: str, origin=None) -> np.ndarray:
    """Machine zero of G-code programs on the planner's machine (task coordinates, m): ``origin``,
    or the tool at the reference assembly; refused for a tool that is not in x, y, z."""
    home = home_tool(planner)
    if tuple(planner.kin.tool.coordinates) != ("x", "y", "z"):
        raise UserError(f"{path}: G-code needs a tool in x, y, z ({planner.mech.name}'s tool has "
                        f"{', '.join(planner.kin.tool.coordinates)})")
    return home if origin is None else np.asarray(origin, float)


_REACH: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def program_reach(planner, ranges=None):
    """The workspace test of the planner's machine (``pkrt.models.kinematics.reach.Reach``): its
    closed-form legs, the model's actuator ranges narrowed to ``ranges`` ((s, 2): the
    configuration's [limits] position, which the loop's reference check applies), the
    controller tree's domain when the planner's forces come from a tree; built once per
    planner and ranges."""
    from pkrt.models.kinematics.reach import Reach

    lim = planner.mech.ranges.copy()
    if ranges is not None:
        r = np.asarray(ranges, float)
        lim = np.column_stack([np.maximum(lim[:, 0], r[:, 0]), np.minimum(lim[:, 1], r[:, 1])])
    key = lim.tobytes()
    got = _REACH.get(planner)
    if got is None or got[0] != key:
        got = _REACH[planner] = (key, Reach(planner.kin, lim, getattr(planner.dyn, "T", None), planner.legs))
    return got[1]


def check_gcode(planner, path: str, origin=None, setup=None, ranges=None, preview_points: int = 20_000):
    """The whole-program check of the G-code program file ``path`` before anything moves
    (``pkrt.models.planning.precheck.check_program``: what the interpreter refuses, every end
    point and arc inside the workspace and the actuator ranges, ``program_reach``): its
    ``ProgramCheck`` (figures and the path preview), or one ``UserError`` line naming the file
    and the program line. Every G-code consumer calls it first (``plan_gcode``; the streaming
    pipeline)."""
    from pkrt.models.planning.precheck import check_program

    return check_program(path, program_reach(planner, ranges), setup, gcode_origin(planner, path, origin),
                         preview_points=preview_points)


def warm_gcode_check(config: MachineConfig, mech: "Mechanism | None" = None) -> None:
    """The check's compiled kernels loaded (numba's cache: about 0.25 s the first time in a
    process) by checking a three-line program, for a process that will check programs later
    (a served machine's planning worker); nothing for a machine that runs no G-code."""
    import os
    import tempfile

    mech = mech or machine_mechanism(config)
    if mech.description.tool is None:
        return
    planner = path_planner(config, mech)
    if tuple(planner.kin.tool.coordinates) != ("x", "y", "z"):
        return
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "warm.ngc")
        with open(p, "w") as f:
            f.write("G21 G91 F600\nG1 X0.1\nG2 X0.1 Y0.1 I0 J0.1\nG0 X-0.2 Y-0.1\nM2\n")
        try:
            check_gcode(planner, p, setup=gcode_setup(config), ranges=config.limits.position, preview_points=16)
        except UserError:
            pass  # a machine whose start is outside its own workspace: its programs say so later


def plan_gcode(planner, path: str, origin=None, setup=None, ranges=None):
    """A G-code program (``setup``: its tool table and work offsets, ``gcode_setup``; ``ranges``:
    see ``program_reach``), checked whole (``check_gcode``: its figures in the report's
    ``precheck``), interpreted and timed: (Planned, report)."""
    from pkrt.models.planning.gcode import read_program
    from pkrt.models.planning.items import plan_items

    checked = check_gcode(planner, path, origin, setup, ranges, preview_points=0)
    origin = gcode_origin(planner, path, origin)
    prog = read_program(path, origin, setup)
    try:
        plan, report = plan_items(planner, prog.items, {**prog.description, "origin": origin.tolist()})
    except UserError as e:
        raise UserError(f"{path}: {e}") from None
    report["precheck"] = checked.summary()
    return plan, report


def plan_path_csv(planner, path: str):
    """A CSV path (no time column): the tool's task coordinates or the actuators' values, one
    point a row, joined by a C2 spline and timed from rest to rest: (Planned, report)."""
    from pkrt.models.planning.geompath import Motion, PointSpline
    from pkrt.models.planning.items import plan_items

    from pkrt.rt.core.filekind import CSV, expect

    expect(path, CSV)
    cols = csv_columns(path)
    task = list(planner.kin.tool.coordinates) if planner.kin is not None else None
    axes = list(planner.mech.actuator_names)
    if cols is None or cols not in ([task] if task else []) + [axes]:
        want = " or ".join(",".join(c) for c in ([task] if task else []) + [axes])
        raise UserError(f"{path}: a path CSV has the columns {want} (no t: the planner times it); got "
                        f"{excerpt(','.join(cols)) if cols else 'no header (or one the CSV reader refuses)'}")
    try:
        rows = np.loadtxt(path, delimiter=",", comments="#", skiprows=1, ndmin=2)
    except ValueError as e:
        raise UserError(f"{path}: not a number: {shorten_tokens(str(e))}") from None
    if rows.shape[1] != len(cols) or not np.all(np.isfinite(rows)):
        raise UserError(f"{path}: every row needs {len(cols)} finite numbers")
    try:
        motion = Motion([PointSpline.through(rows)], task=cols == task,
                        description={"kind": "path-csv", "path": str(path)})
        return plan_items(planner, [motion], motion.description)
    except UserError as e:
        raise UserError(f"{path}: {e}") from None


def plan_adept(planner, demo, tolerance: float = 0.01, cycles: int = 1):
    """The [demo] table's Adept cycle (start, height, width, direction), corners blended within
    ``tolerance`` (m), each half from rest to rest, timed: (Planned, report)."""
    from pkrt.models.planning.geompath import polyline_motions
    from pkrt.models.planning.items import plan_items

    p0 = home_tool(planner)[:3] if demo.start is None else np.asarray(demo.start, float)
    d = np.asarray(demo.direction, float)
    d = d / np.linalg.norm(d)
    up, across = np.array([0.0, 0.0, demo.height]), demo.width * d
    pts = [p0, p0 + up, p0 + up + across, p0 + across]
    desc = {"kind": "adept-cycle", "timing": "time-optimal", "start": p0.tolist(), "height_m": demo.height,
            "width_m": demo.width, "direction": d.tolist(), "blend_tolerance_m": tolerance, "cycles": cycles}
    half = polyline_motions(pts, tolerance, description=desc) + polyline_motions(pts[::-1], tolerance, description=desc)
    return plan_items(planner, half * cycles, desc)
