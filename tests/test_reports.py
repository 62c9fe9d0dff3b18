"""The reports behind ``pkrt model check`` and ``pkrt tree info``, called as a library."""

from __future__ import annotations

from pkrt.models.mechanism import load_mechanism
from pkrt.models.reports import check_report, tree_depth, tree_summary
from pkrt.rt.config import MACHINES_DIR
from pkrt.rt.treefile import load_tree


def test_check_report_of_the_fourbar():
    r = check_report(load_mechanism("fourbar"))
    # spatial four-bar: 3 moving bodies, 18 coordinates, 20 rows of rank 17 (README notes)
    assert (r["coordinates"], r["constraints"], r["redundant_constraints"], r["mobility"]) == (18, 20, 3, 1)
    assert r["tool"] is None and len(r["actuators"]) == 1
    assert r["singularity_measure"] > r["singular_threshold"]


def test_tree_summary_of_the_uniform_orthoglide_tree():
    tree = load_tree(MACHINES_DIR / "orthoglide.pkt")
    r = tree_summary(tree)
    assert r["leaves"] == 512 and r["nodes"] == 1023 and r["s"] == 3
    assert r["depth"] == tree_depth(tree) == 9  # 8 x 8 x 8 boxes by halving: 3 x 3 splits
    assert r["file_bytes"] > r["array_bytes"] > 0
