"""The shipped Orthoglide trees over the whole box [-0.26, 0.06]^3: the controller's meets
the targets, the plant's is at least 10x more accurate (the figures in docs/trees.md).

2000 random states, the 1001-point diagonal and a stress set on the box's faces, edges and
corners (and 1 % and 3 % inside them), where random sampling rarely looks and the worst
errors sit: about 11,000 exact evaluations, a few seconds on two cores.
"""

from __future__ import annotations

import pytest

from pkrt.models.trees.shipped import MACHINES
from pkrt.models.kinematics.mechanism import load_mechanism
from pkrt.models.trees.accuracy import accuracies
from pkrt.rt.core.treefile import load_tree

# the targets of the controller's tree (relative to each output's scale)
MAX_COEF, MAX_TAU, MAX_JUMP, MAX_BYTES = 5e-3, 5e-3, 1e-3, 16 * 2 ** 20


@pytest.fixture(scope="module")
def figures():
    ctrl, plant = load_tree(MACHINES / "orthoglide.pkt"), load_tree(MACHINES / "orthoglide-plant.pkt")
    return accuracies([ctrl, plant], load_mechanism("orthoglide"), random=2000, diagonal=1001,
                      per_line=21, seed=5, jobs=2)


def test_controller_tree_meets_the_targets_over_the_whole_box(figures):
    c = figures[0]
    assert c["compared"] == c["states"] > 10_000
    assert c["max_rel_coef_error"] <= MAX_COEF, c
    assert c["max_rel_tau_error"] <= MAX_TAU, c
    assert c["max_face_jump"] <= MAX_JUMP
    assert c["bytes"] <= MAX_BYTES


def test_plant_tree_is_ten_times_more_accurate(figures):
    c, p = figures
    assert p["compared"] == p["states"]
    assert p["max_rel_coef_error"] <= c["max_rel_coef_error"] / 10, (p, c)
    assert p["max_rel_tau_error"] <= c["max_rel_tau_error"] / 10, (p, c)
    assert p["max_rel_coef_error"] <= 1e-3  # beyond the paper: under 0.1 % over the whole box
