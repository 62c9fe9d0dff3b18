"""What a run needs before its first cycle: the controller's tree (checked against its model
file), the actuators' names and units, the reference (planned before, or an actuator CSV) checked
against ranges, tree domain and limits, the log's channels, the files a run reads (which no
output may overwrite); and the verdict of a run's summary. Units: actuator units (m or rad), s.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from numba import njit

from pkrt.rt.core.errors import Fault, UserError
from pkrt.rt.core.tree import Tree, find_leaf
from pkrt.rt.runtime.cycle.staging import ROW_ORDER
from pkrt.rt.runtime.machine.config import MachineConfig
from pkrt.rt.runtime.machine.trajectory import Planned, load_trajectory_csv, validate


@njit(cache=True)
def domain_mask(T, pos):
    """True where each row of pos lies in an in-domain leaf of the tree's box."""
    out = np.empty(pos.shape[0], dtype=np.bool_)
    th = np.empty(pos.shape[1])
    for k in range(pos.shape[0]):
        leaf, status = find_leaf(T, pos[k], th)
        out[k] = status == 0
    return out


def load_controller_tree(config: MachineConfig) -> Tree:
    """The configuration's tree, checked against its model file's content hash (its bytes
    without the passive-joint limits and radii: ``pkrt.rt.core.protection``)."""
    from pkrt.rt.core.protection import dynamics_hash
    from pkrt.rt.core.treefile import TreeFileError, check_tree_matches_model, load_tree

    tree = load_tree(config.tree)
    try:
        have = dynamics_hash(Path(config.model_path).read_bytes(), config.model_path)
    except OSError:
        raise UserError(f"{config.path}: [machine], field 'model': cannot read {config.model_path}") from None
    try:
        check_tree_matches_model(tree, have, Path(config.model_path).stem)
    except TreeFileError as e:
        raise TreeFileError(f"{config.tree}: {e}") from None
    return tree


def tree_axes(tree: Tree) -> tuple[list[str], list[str]]:
    """Actuator names and units recorded in a tree's header."""
    a = tree.header.get("actuators", {})
    s = tree.s
    return (list(a.get("names", [f"q{i + 1}" for i in range(s)])), list(a.get("units", ["m"] * s)))


def plan_trajectory(config: MachineConfig, tree: Tree, traj: str | Planned | None,
                    duration: float | None) -> Planned:
    """The reference at the loop rate: a plan made before (the demo and task-space paths are
    planned from the model in the CLI layer, ``pkrt.rt.app.reference``) or an actuator CSV file;
    validated against ranges, domain and limits before anything moves."""
    rate = config.rate_hz
    axes, _ = tree_axes(tree)
    if isinstance(traj, Planned):
        plan = traj
    elif traj is None or traj == "demo":
        raise UserError(f"{config.path}: no reference given: the demo is planned from the model before the "
                        f"run (pkrt.rt.app.reference.plan_reference)")
    else:
        plan = load_trajectory_csv(traj, rate, axes)
    if abs(plan.rate_hz - rate) > 1e-9:
        raise UserError(f"trajectory planned at {plan.rate_hz} Hz, loop runs at {rate} Hz")
    if duration is not None:
        if duration <= 0:
            raise UserError("--duration must be positive")
        plan = plan.extended(duration)
    lim = config.limits
    T = tree.arrays
    validate(plan, lim.position[:, 0], lim.position[:, 1], lim.velocity, lim.acceleration, axes,
             in_domain=lambda pos: domain_mask(T, np.ascontiguousarray(pos)))
    return plan


def reference_source(config: MachineConfig, tree: Tree, traj, duration: float | None):
    """The run's reference as a streamed source (``pkrt.rt.runtime.machine.refstream``): a ``Planned``
    made before, or an actuator CSV evaluated per block from its spline; cut or held to
    ``duration``; checked whole, block by block, against ranges, domain and limits before
    anything moves (memory: one block, whatever the duration)."""
    from pkrt.rt.runtime.machine.refstream import PlannedSource, blocks_of, csv_source, with_duration

    rate = config.rate_hz
    axes, _ = tree_axes(tree)
    if isinstance(traj, Planned):
        src = PlannedSource(traj)
    elif traj is None or traj == "demo":
        raise UserError(f"{config.path}: no reference given: the demo is planned from the model before the "
                        f"run (pkrt.rt.app.reference.plan_reference)")
    elif hasattr(traj, "fill"):  # a source already
        src = traj
    else:
        src = csv_source(traj, rate, axes)
    if abs(src.rate_hz - rate) > 1e-9:
        raise UserError(f"trajectory planned at {src.rate_hz} Hz, loop runs at {rate} Hz")
    if duration is not None:
        src = with_duration(src, duration)
    lim, T = config.limits, tree.arrays
    for k0, pos, vel, acc in blocks_of(src):
        validate(Planned(rate, pos, vel, acc), lim.position[:, 0], lim.position[:, 1], lim.velocity,
                 lim.acceleration, axes, in_domain=lambda p: domain_mask(T, np.ascontiguousarray(p)), k0=k0)
    return src


CHANNELS = [("t", 1, "s"), ("ref_pos", None, "pos"), ("ref_vel", None, "vel"), ("ref_acc", None, "acc"),
            ("pos", None, "pos"), ("vel", None, "vel"), ("tau", None, "force"),
            ("tau_model", None, "force"), ("wake_us", 1, "us"), ("compute_us", 1, "us"),
            ("flags", 1, "bits")]
assert tuple(c[0] for c in CHANNELS) == ROW_ORDER  # the staging kernel's layout


def channel_list(s: int, unit: str, extra=()) -> list[tuple[str, int, str]]:
    """The run log's channels (``CHANNELS``), then ``extra`` ones (``pkrt.rt.runtime.machine.protect.channels``)."""
    force = "N" if unit == "m" else "N m"
    names = {"pos": unit, "vel": f"{unit}/s", "acc": f"{unit}/s^2", "force": force}
    return [(n, w or s, names.get(u, u)) for n, w, u in [*CHANNELS, *extra]]


def file_hash(path: str) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def run_inputs(config: MachineConfig, trajectory=None) -> dict[str, str | None]:
    """The files a run reads (label -> path), which no output of it may overwrite."""
    return {"machine configuration": config.path, "model": config.model_path, "tree": config.tree,
            "trajectory": trajectory if isinstance(trajectory, (str, Path)) and trajectory != "demo" else None}


def check_run(summary: dict) -> None:
    """Raise Fault (exit 1) when a run ended on a fault."""
    if summary.get("fault"):
        raise Fault(f"run stopped at cycle {summary['fault_cycle']}: {summary['fault']}")
