"""Tool channels of a run log, computed after the run (never in the loop) in the CLI layer,
which may use the models: the tool's task coordinates for the logged reference (``tool_ref``)
and the measured positions (``tool``), by the forward kinematics of the model the log was run
with (``pkrt.models.kinematics.taskspace.TaskKinematics.forward``: Newton per row, warm from the last
row). Units: x, y, z in m (world frame of the model), roll, pitch, yaw in rad
(R = Rz(yaw) Ry(pitch) Rx(roll)). A row with a non-finite position, or one that cannot be
assembled, gives NaN.

The model is the one the log's header names: the logged configuration's ``[machine] model``,
relative to the logged configuration path (as recorded, else beside the log), or a built-in
name; it must have the content hash the log records, else the channels are left out with a
one-line note saying why. A log that names no machine, or a machine without a ``[tool]``, gets
no channels and no note.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from pkrt.rt.runtime.machine.config import model_file
from pkrt.rt.core.errors import UserError
from pkrt.rt.runtime.record.logfile import Log

CHANNELS = ("tool_ref", "tool")  # from ref_pos, from pos


def log_model_path(log: Log) -> tuple[str | None, str | None]:
    """The model file the log's header names, and a reason when none is found (the log names
    no machine: ``(None, None)``)."""
    h = log.header
    raw = h.get("machine")
    table = raw.get("machine") if isinstance(raw, dict) else None
    model = table.get("model") if isinstance(table, dict) else None
    if not isinstance(model, str) or not model:
        return None, None
    where = h.get("machine_path")
    dirs = [Path(where).parent, Path(log.path).parent / Path(where).parent] if isinstance(where, str) else []
    cands = list(dict.fromkeys(model_file(model, d) for d in dirs or [Path(log.path).parent]))
    for c in cands:
        if Path(c).is_file():
            return c, None
    return None, f"the model file {' or '.join(cands)} is not there"


def tool_channels(log: Log) -> tuple[Log, dict]:
    """The log with ``tool_ref`` and ``tool`` appended (see the module docstring), and what was
    done: ``{"channels", "coordinates", "rows", "seconds", "note"}``; ``note`` is one line when
    the channels are left out for a reason, ``channels`` empty when left out."""
    info: dict = {"channels": [], "coordinates": [], "rows": log.n_cycles, "seconds": 0.0, "note": None}
    present = [c for c, src in zip(CHANNELS, ("ref_pos", "pos")) if log.get(src) is not None]
    if not present or log.n_cycles == 0:
        return log, info
    path, why = log_model_path(log)
    if path is None:
        info["note"] = f"tool channels left out: {why}" if why else None
        return log, info
    from pkrt.models.kinematics.mechanism import load_mechanism
    from pkrt.models.kinematics.taskspace import TaskKinematics, tool_of

    try:
        mech = load_mechanism(path)
    except UserError as e:
        info["note"] = f"tool channels left out: the model does not load ({e})"
        return log, info
    recorded = log.header.get("model_hash")
    if not isinstance(recorded, str):
        info["note"] = "tool channels left out: the log records no model hash to check the model file against"
        return log, info
    if mech.content_hash != recorded:
        info["note"] = (f"tool channels left out: {path} has changed since the run (content hash "
                        f"{mech.content_hash[:12]}..., the log records {str(recorded)[:12]}...)")
        return log, info
    if mech.description.tool is None:
        return log, info
    tool = tool_of(mech)
    kin = TaskKinematics(mech)
    units = ",".join("rad" if c in ("roll", "pitch", "yaw") else "m" for c in tool.coordinates)
    units = "m" if not tool.orientation else units  # one unit for all columns, or one each
    extra = []
    t0 = time.perf_counter()
    for name, src in zip(CHANNELS, ("ref_pos", "pos")):
        theta = log.get(src)
        if theta is None:
            continue
        theta = theta[:, None] if theta.ndim == 1 else theta
        if theta.shape[1] != mech.n_act:
            info["note"] = (f"tool channels left out: the log's {src} has {theta.shape[1]} column(s), "
                            f"{mech.name} has {mech.n_act} actuator(s)")
            return log, info
        kin.assembler.reset()  # each channel from the reference assembly, as the run was planned
        extra.append((name, kin.forward(theta, missing=True), units, list(tool.coordinates)))
    info.update(channels=[e[0] for e in extra], coordinates=list(tool.coordinates),
                seconds=time.perf_counter() - t0)
    return log.with_channels(extra), info


def tool_error(log: Log) -> dict | None:
    """Tracking error at the tool from the tool channels: Euclidean distance of the tool point
    (m; position coordinates only), RMS and max over the rows where both are finite; None
    without both channels or without such rows."""
    ref, act = log.get("tool_ref"), log.get("tool")
    if ref is None or act is None:
        return None
    npos = sum(c in ("x", "y", "z") for c in log.labels.get("tool", []))
    e = np.linalg.norm(ref[:, :npos] - act[:, :npos], axis=1)
    e = e[np.isfinite(e)]
    if len(e) == 0:
        return None
    return {"rms_m": float(np.sqrt(np.mean(e**2))), "max_m": float(e.max()), "samples": int(len(e))}
