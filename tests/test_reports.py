"""The reports behind ``pkrt model check`` and ``pkrt tree info``, called as a library."""

from __future__ import annotations

from pkrt.models.kinematics.mechanism import load_mechanism
from pkrt.models.kinematics.report import check_report
from pkrt.models.trees.summary import tree_depth, tree_summary
from pkrt.models.trees.build import build_tree
from pkrt.models.trees.settings import BuildSettings
from pkrt.rt.runtime.machine.config import MACHINES_DIR
from pkrt.rt.core.treefile import load_tree


def test_check_report_of_the_fourbar():
    r = check_report(load_mechanism("fourbar"))
    # spatial four-bar: 3 moving bodies, 18 coordinates, 20 rows of rank 17 (docs/design-notes.md)
    assert (r["coordinates"], r["constraints"], r["redundant_constraints"], r["mobility"]) == (18, 20, 3, 1)
    assert r["tool"] is None and len(r["actuators"]) == 1
    assert r["singularity_measure"] > r["singular_threshold"]


def test_tree_summary_of_the_shipped_orthoglide_spline():
    tree = load_tree(MACHINES_DIR / "orthoglide.pkt")
    r = tree_summary(tree)
    assert r["kind"] == "spline" and r["s"] == 3 and r["grid_points"] == tree.grid_points
    assert len(r["grid_points"]) == 3 and "leaves" not in r
    assert r["file_bytes"] > r["array_bytes"] > 0


def test_tree_summary_of_a_uniform_box_tree():
    tree, _ = build_tree(load_mechanism("fivebar"), BuildSettings(kind="boxes", boxes=4, verify_samples=0),
                         jobs=1, progress=False)
    r = tree_summary(tree)
    assert r["kind"] == "boxes" and r["leaves"] == 16 and r["nodes"] == 31 and r["s"] == 2
    assert r["depth"] == tree_depth(tree) == 4  # 4 x 4 boxes by halving: 2 x 2 splits
    assert r["file_bytes"] > r["array_bytes"] > 0
