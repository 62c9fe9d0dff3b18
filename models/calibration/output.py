"""The calibrated description: the description's file with its geometry changed by ``delta``
(``parameters``), masses and inertias kept, and a provenance table ``[calibration]``.

Every joint is written with its frames explicit in each body's frame (``point1``, ``point2``,
``axis1``, ``axis2``, ``ref1``, ``ref2``), the actuators with their ``offset`` and ``scale``, the
tool with its point (and its frame's rotation), and the bodies' poses (the assembly guess) at
the calibrated machine's assembly at the guess (its universal joints' axes are then exactly
perpendicular there, as the loader requires). The model keeps its name: logs of the machine
stay logs of the same machine. ``random_change`` draws a truth for tests and benchmarks.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np

from ..identification.estimate import dump_toml
from ..kinematics.assembly import Assembler
from ..kinematics.description import rotation_from_vector
from ..kinematics.taskspace import rotation_vector
from .parameters import GeometricParameters

JOINT_FRAME_KEYS = ("at", "axis", "ref", "point1", "point2", "axis1", "axis2", "ref1", "ref2")


def _vec(v) -> list[float]:
    return [float(x) for x in np.asarray(v, float)]


def calibrated_document(params: GeometricParameters, delta, table: dict | None = None) -> dict:
    """The description's TOML document with the geometry changed by ``delta`` and ``table`` as
    its ``[calibration]``."""
    delta = np.asarray(delta, float)
    desc = params.mech.description
    doc = tomllib.loads(Path(desc.path).read_text(encoding="utf-8"))
    frames = {}  # (joint, side) -> [point, rotation]
    for g in params.groups:
        if g.kind == "point":
            frames.setdefault((g.joint, g.side), [np.zeros(3), np.eye(3)])[0] = g.basis @ delta[g.cols]
        elif g.kind == "turn":
            frames.setdefault((g.joint, g.side), [np.zeros(3), np.eye(3)])[1] = rotation_from_vector(g.basis @ delta[g.cols])
        elif g.kind in ("offset", "scale"):
            spec = desc.actuators[g.actuator]
            base = spec.offset if g.kind == "offset" else spec.scale
            doc["actuators"][g.actuator][g.kind] = float(base + delta[g.cols[0]])
        elif g.kind == "tool point":
            doc["tool"]["point"] = _vec(desc.tool.point + delta[g.cols])
        else:
            doc["tool"]["rotation"] = _vec(rotation_vector(rotation_from_vector(delta[g.cols]) @ desc.tool.rotation))
    for j, (js, tbl) in enumerate(zip(desc.joints, doc["joints"])):
        for k in JOINT_FRAME_KEYS:
            tbl.pop(k, None)
        for side, point, axis, ref in ((1, js.point1, js.axis1, js.ref1), (2, js.point2, js.axis2, js.ref2)):
            dp, Rm = frames.get((j, side), [np.zeros(3), np.eye(3)])
            tbl[f"point{side}"] = _vec(point + dp)
            if js.type != "spherical":
                tbl[f"axis{side}"], tbl[f"ref{side}"] = _vec(Rm @ axis), _vec(Rm @ ref)
    mech, _ = params.apply(delta)
    cfg = Assembler(mech).solve(desc.theta_guess)
    for b, (body, tbl) in enumerate(zip(desc.bodies, doc["bodies"])):
        tbl["position"] = _vec(cfg.X[b] - cfg.R[b] @ body.com)
        tbl["rotation"] = _vec(rotation_vector(cfg.R[b]))
    doc.pop("calibration", None)
    if table is not None:
        doc["calibration"] = table
    return doc


def write_description(params: GeometricParameters, delta, path: str, table: dict | None = None,
                      comment: str = "") -> str:
    """Write the calibrated description (``calibrated_document``); returns its text."""
    text = dump_toml(calibrated_document(params, delta, table), comment)
    Path(path).write_text(text, encoding="utf-8")
    return text


def random_change(params: GeometricParameters, rng: np.random.Generator, size: float = 1.0) -> np.ndarray:
    """A change of every geometric parameter, uniform within ``size`` times its prior (0.5 mm,
    2 mrad, 2e-3 of scale)."""
    return size * params.prior * rng.uniform(-1.0, 1.0, params.n)
