"""What ``pkrt tree info`` reports, as plain data (the CLI prints it): a tree file's summary."""

from __future__ import annotations

from pkrt.rt.core.tree import Tree
from pkrt.rt.core.treefile import tree_bytes


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
