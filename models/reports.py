"""What ``pkrt model check`` and ``pkrt tree info`` report, as plain data (the CLI prints it):
a model's structure at its reference assembly, and a tree file's summary."""

from __future__ import annotations

from pkrt.rt.core.tree import Tree
from pkrt.rt.core.treefile import tree_bytes

from .mechanism import Mechanism


def check_report(mech: Mechanism) -> dict:
    """Counts, actuators (units m or rad), the reference assembly and its singularity measure,
    and the tool."""
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
    }


def tool_report(mech: Mechanism) -> dict | None:
    """The tool and its pose at the reference assembly (task coordinates, m and rad)."""
    tool = mech.description.tool
    if tool is None:
        return None
    from .taskspace import tool_pose

    return {"body": tool.body, "point": tool.point, "coordinates": list(tool.coordinates),
            "reference_pose": tool_pose(mech, mech.ref_config)}


def tree_summary(tree: Tree) -> dict:
    """Header fields, kind, sizes (bytes) and cells of a loaded tree: grid points per axis for a
    spline; leaf counts and depth for boxes."""
    h = tree.header
    data = tree_bytes(tree)
    cells = ({"grid_points": tree.grid_points} if tree.kind_name == "spline" else
             {"nodes": int(len(tree.node_dim)), "leaves": tree.n_leaves,
              "leaves_out_of_domain": int((tree.leaf_ok == 0).sum()), "depth": tree_depth(tree)})
    return {
        "model": h["model"], "actuators": h["actuators"], "s": tree.s, "kind": tree.kind_name,
        **cells, "array_bytes": tree.nbytes, "file_bytes": len(data),
        "outputs": h["outputs"], "output_scale": h["output_scale"],
        "build": h["build"], "verification": h["verification"],
        "software": h.get("software"),  # None in trees built before versions were recorded
    }


def tree_depth(tree: Tree) -> int:
    """Longest root-to-leaf path (the loader guarantees a proper tree)."""
    deepest, stack = 0, [(0, 0)]
    while stack:
        n, d = stack.pop()
        deepest = max(deepest, d)
        if tree.node_dim[n] >= 0:
            stack += [(int(tree.node_child[n, 0]), d + 1), (int(tree.node_child[n, 1]), d + 1)]
    return deepest
