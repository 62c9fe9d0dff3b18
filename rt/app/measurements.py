"""An instrument's readings of the tool, one per dwell of a run (``pkrt calibrate``'s input),
and the simulated instrument of ``pkrt run --measure``.

The file is CSV: ``#`` lines are comments; the header is ``dwell,t,x,y,z`` or
``dwell,t,x,y,z,roll,pitch,yaw``; each row is the reading at one dwell of the run's log
(``pkrt.rt.runtime.machine.dwells``): its number (1 for the first dwell), a time inside it (s, the
log's clock: a run of ``pkrt calibrate plan``'s trajectory rests where its report says), the
tool's position (m) and, from an instrument that measures it, the tool frame's orientation
(rad, R = Rz(yaw) Ry(pitch) Rx(roll)), all in the instrument's own frame.

The simulated instrument reads the plant's own tool: the plant's actuator positions averaged
over each dwell's reading, through the plant's description (its ``plant_model``, a geometry
the controller's model does not know), into the frame of ``[tracker] pose``, plus Gaussian
noise of ``[tracker]`` (``noise_position`` per coordinate, ``noise_orientation`` per component
of a rotation vector), seeded by ``[tracker] seed``.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass

import numpy as np

from pkrt.rt.core.errors import UserError

POSITION = ["dwell", "t", "x", "y", "z"]
POSE = POSITION + ["roll", "pitch", "yaw"]


class MeasurementFileError(UserError):
    """A measurement file that cannot be read (one line, exit 2)."""


@dataclass(frozen=True)
class Measurements:
    """Readings: dwell numbers (1-based), times (s), positions (N, 3, m), frames (N, 3, 3) or None."""
    dwell: np.ndarray
    t: np.ndarray
    position: np.ndarray
    rotation: np.ndarray | None


def write_measurements(path: str, dwell, t, position, rotation=None, comment: str = "") -> None:
    from pkrt.models.kinematics.taskspace import matrix_rpy

    with open(path, "w", newline="") as f:
        for line in comment.splitlines():
            f.write(f"# {line}\n")
        w = csv.writer(f)
        w.writerow(POSE if rotation is not None else POSITION)
        for i in range(len(dwell)):
            row = [int(dwell[i]), f"{t[i]:.6f}", *(f"{x:.9f}" for x in position[i])]
            if rotation is not None:
                row += [f"{x:.9f}" for x in matrix_rpy(rotation[i])]
            w.writerow(row)


def read_measurements(path: str) -> Measurements:
    """The readings of a measurement file; one-line errors for anything else."""
    from pkrt.models.kinematics.taskspace import rpy_matrix

    try:
        with open(path, newline="") as f:
            lines = [ln for ln in f if ln.strip() and not ln.lstrip().startswith("#")]
    except UnicodeDecodeError:
        raise MeasurementFileError(f"{path}: not a text file (expected CSV with header {','.join(POSITION)})") from None
    rows = list(csv.reader(lines))
    if not rows or [c.strip() for c in rows[0]] not in (POSITION, POSE):
        got = ",".join(rows[0]) if rows else "nothing"
        raise MeasurementFileError(f"{path}: expected the header {','.join(POSITION)} or {','.join(POSE)}, got {got}")
    head = [c.strip() for c in rows[0]]
    if len(rows) == 1:
        raise MeasurementFileError(f"{path}: no readings")
    vals = []
    for i, r in enumerate(rows[1:], start=2):
        try:
            v = [float(x) for x in r]
        except ValueError:
            raise MeasurementFileError(f"{path}: reading {i - 1}: not a number in {','.join(r)}") from None
        if len(v) != len(head) or not np.all(np.isfinite(v)):
            raise MeasurementFileError(f"{path}: reading {i - 1}: expected {len(head)} finite numbers, got {','.join(r)}")
        if v[0] != int(v[0]) or v[0] < 1:
            raise MeasurementFileError(f"{path}: reading {i - 1}: dwell must be a whole number >= 1, got {r[0]}")
        vals.append(v)
    a = np.array(vals)
    rot = np.array([rpy_matrix(x) for x in a[:, 5:8]]) if len(head) == len(POSE) else None
    return Measurements(a[:, 0].astype(int), a[:, 1], a[:, 2:5], rot)


def simulated_readings(plant, theta: np.ndarray, tracker, orientation: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """The simulated instrument's readings of ``plant``'s tool (a Mechanism) at actuator
    positions ``theta`` (N, s): positions (N, 3) and frames (N, 3, 3) or None, with noise."""
    from pkrt.models.calibration.jacobian import Frame, read, tool_frame
    from pkrt.models.kinematics.assembly import Assembler
    from pkrt.models.kinematics.description import rotation_from_vector
    from pkrt.models.kinematics.taskspace import rpy_matrix, tool_of

    tool = tool_of(plant)
    asm = Assembler(plant)
    P, Rt = np.empty((len(theta), 3)), np.empty((len(theta), 3, 3))
    for i, th in enumerate(theta):
        P[i], Rt[i] = tool_frame(asm.solve(th), tool)
    pose = np.asarray(tracker.pose, float)
    pos, rot = read(P, Rt, Frame(rpy_matrix(pose[3:]), pose[:3]))
    rng = np.random.default_rng(tracker.seed)
    pos = pos + rng.normal(0.0, tracker.noise_position, pos.shape)
    if not orientation:
        return pos, None
    rot = np.array([rotation_from_vector(rng.normal(0.0, tracker.noise_orientation, 3)) @ r for r in rot])
    return pos, rot


class PlantPositions:
    """``on_cycle`` hook of a run with the simulated instrument: the plant's own actuator
    positions (not its sensors': no noise, no quantum, no delay) at every cycle where the
    planned reference ``plan`` rests (held after its end)."""

    def __init__(self, drives, plan, then=None):
        from pkrt.rt.runtime.machine.dwells import resting

        self.drives, self.then = drives, then
        self.rest = resting(plan.pos, np.arange(plan.n) / plan.rate_hz)
        self.rows: dict[int, np.ndarray] = {}

    def __call__(self, k: int, t: float) -> None:
        if k >= len(self.rest) or self.rest[k]:
            self.rows[k] = self.drives.plant.theta.copy()
        if self.then is not None:
            self.then(k, t)


def measure_run(config, plant, log_path: str, plant_positions: PlantPositions, out: str) -> dict:
    """The simulated instrument's readings of the tool of ``plant`` (the plant's Mechanism) at
    every dwell of the run's log, written to ``out``."""
    from pkrt.models.kinematics.taskspace import tool_of
    from pkrt.rt.runtime.machine.dwells import find_dwells
    from pkrt.rt.runtime.record.logfile import read_log
    from pkrt.rt.runtime.logs.logstats import columns

    log = read_log(log_path)
    dwells = find_dwells(columns(log.channels["ref_pos"]), log.channels["t"])
    orientation = tool_of(plant).orientation
    cycles = np.rint(np.asarray(log.channels["t"]) * config.rate_hz).astype(int)  # the loop's cycle k of a row
    theta = []
    for d in dwells:
        rows = [plant_positions.rows.get(int(c)) for c in cycles[d.rows]]
        if any(r is None for r in rows):  # cannot happen: the log rests where the plan does
            raise UserError(f"--measure: the plant's positions were not recorded over dwell {len(theta) + 1}")
        theta.append(np.mean(rows, axis=0))
    tr = config.tracker
    pos, rot = (simulated_readings(plant, np.array(theta), tr, orientation) if dwells
                else (np.zeros((0, 3)), np.zeros((0, 3, 3)) if orientation else None))
    write_measurements(out, np.arange(1, len(dwells) + 1), [d.t_read for d in dwells], pos, rot,
                       f"pkrt run --measure: the simulated instrument ([tracker] of {config.path}) reading the tool of "
                       f"{plant.description.path}\nat each dwell of {log_path}")
    return {"path": out, "readings": len(dwells), "orientation": orientation, "plant_model": plant.description.path,
            "tracker_pose": np.asarray(tr.pose).tolist(), "noise_position_m": tr.noise_position,
            "noise_orientation_rad": tr.noise_orientation if orientation else None}
