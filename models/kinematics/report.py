"""What ``pkrt model check`` reports, as plain data (the CLI prints it): a model's structure at
its reference assembly."""

from __future__ import annotations

from .mechanism import Mechanism
from .passive import reference_margins
from .taskspace import tool_pose


def check_report(mech: Mechanism) -> dict:
    """Counts, actuators (units m or rad), the reference assembly and its singularity measure,
    the tool, and the margins of the passive-joint limits and capsules there (``protection``:
    None when the description declares none)."""
    cfg = mech.ref_config
    sigma = mech.singularity_measure(cfg, mech.theta_ref)
    return {
        "model": mech.name,
        "file": mech.description.path,
        "content_hash": mech.content_hash,
        "bodies": mech.n_bodies,
        "joints": len(mech.description.joints),
        "coordinates": mech.n_coords,
        "constraints": mech.n_joint_rows,
        "redundant_constraints": mech.n_redundant,
        "independent_constraints": len(mech.independent) - len(mech.idle),
        "idle_freedoms": len(mech.idle),
        "idle": [{"body": f.body, "axis": f.axis} for f in mech.idle],
        "mobility": mech.n_coords - len(mech.independent),
        "actuators": [{"name": a.name, "joint": a.joint, "unit": a.unit, "range": list(a.range)}
                      for a in mech.description.actuators],
        "reference_theta": mech.theta_ref,
        "singularity_measure": sigma,
        "singular_threshold": mech.description.singular_threshold,
        "tool": tool_report(mech),
        "protection": reference_margins(mech),
    }


def tool_report(mech: Mechanism) -> dict | None:
    """The tool and its pose at the reference assembly (task coordinates, m and rad)."""
    tool = mech.description.tool
    if tool is None:
        return None
    return {"body": tool.body, "point": tool.point, "coordinates": list(tool.coordinates),
            "reference_pose": tool_pose(mech, mech.ref_config)}


