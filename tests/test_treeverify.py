"""`pkrt tree verify`: where it looks (random, boundary, diagonal), the error distribution and
the worst states it reports, and jumps measured across cell faces through the kernel."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from pkrt.models.kinematics.mechanism import load_mechanism
from pkrt.models.reduction.exact import ExactModel
from pkrt.models.trees.boxes import basis_matrix
from pkrt.models.trees.build import build_tree
from pkrt.models.trees.settings import BuildSettings
from pkrt.rt.core.tree import SPLINE
from pkrt.models.trees.outputs import output_groups, tree_outputs
from pkrt.models.trees.verify import face_jumps, internal_faces, stress_points, verify_tree
from pkrt.rt.cli import main
from pkrt.rt.core.tree import eval_outputs


@pytest.fixture(scope="module")
def orthoglide():
    return load_mechanism("orthoglide")


@pytest.fixture(scope="module")
def box4(orthoglide):
    """A uniform 4^3 quadratic box tree: steep at the box's edges, steps across faces."""
    tree, _ = build_tree(orthoglide, BuildSettings(boxes=4, verify_samples=0), jobs=2, progress=False)
    return tree


@pytest.fixture(scope="module")
def report(box4, orthoglide):
    return verify_tree(box4, orthoglide, 600, seed=4, jobs=2, progress=False, stress=600,
                       diagonal_samples=101)


def test_stress_points_sit_on_corners_edges_and_faces():
    lo, hi = np.array([-1.0, 0.0, 2.0]), np.array([1.0, 0.5, 3.0])
    p = stress_points(lo, hi, 1008, np.random.default_rng(1))
    assert p.shape == (1008, 3) and np.all(p >= lo) and np.all(p <= hi)
    u = (p - lo) / (hi - lo)
    near = np.minimum(u, 1 - u) <= 0.1 + 1e-12  # coordinates at or near a bound
    on = np.minimum(u, 1 - u) == 0.0
    assert np.array_equal(p[:8], np.array([[a, b, c] for a in (-1, 1) for b in (0, 0.5) for c in (2, 3)]))
    counts = np.bincount(near[8:].sum(axis=1), minlength=4)
    assert counts[2] >= 500 and counts[1] + counts[2] + counts[3] == 1000  # edges, then faces
    assert 0.3 < on[8:].sum() / near[8:].sum() < 0.7  # about half exactly on the bound
    one = stress_points(np.array([0.0]), np.array([1.0]), 50, np.random.default_rng(2))
    assert len(one) == 50 and np.all(np.minimum(one, 1 - one) <= 0.1)


def test_report_distribution_and_worst_states(report, box4, orthoglide):
    r = report
    assert r["sets"] == {"random": 600, "stress": 600, "diagonal": 101}
    assert r["compared"] == 1301 and r["out_of_domain_samples"] == 0
    for key in ("coef_error", "tau_error"):
        d = r[key]
        assert 0 < d["p50"] <= d["p99"] <= d["max"]
    assert r["coef_error"]["max"] == r["max_rel_coef_error"]
    assert r["tau_error"]["max"] == r["max_rel_tau_error"]
    worst = r["worst_coef_states"]
    assert len(worst) == 5 and [w["error"] for w in worst] == sorted((w["error"] for w in worst), reverse=True)
    assert worst[0]["error"] == r["max_rel_coef_error"] and worst[0]["theta"] == r["worst_theta"]
    assert worst[0]["output"] == r["worst_output"] and worst[0]["output"].startswith(worst[0]["group"])
    assert max(r["set_max_rel_coef_error"].values()) == r["max_rel_coef_error"]
    assert max(r["group_max_rel_error"].values()) == r["max_rel_coef_error"]
    # independently: the exact model and the kernel at the reported worst state
    scale = np.array(r["coef_scale"])
    assert np.all(scale >= np.array(box4.header["output_scale"]))
    th = np.array(worst[0]["theta"])
    f = np.empty(len(scale))
    eval_outputs(box4.arrays, th, f)
    o = box4.header["outputs"].index(worst[0]["output"])
    exact = ExactModel(orthoglide).outputs(th)
    assert abs(f[o] - exact[o]) / scale[o] == pytest.approx(worst[0]["error"], rel=1e-9)
    # the boundary is where quadratic boxes err most: random states alone understate it
    assert r["set_max_rel_coef_error"]["stress"] > r["set_max_rel_coef_error"]["random"]


def test_scales_are_the_true_maxima(report, box4, orthoglide):
    """The scale of an output is at least the largest |f| met at any state evaluated."""
    r = report
    scale = np.array(r["coef_scale"])
    th = np.array([w["theta"] for w in r["worst_coef_states"] + r["worst_tau_states"]])
    F = np.array([ExactModel(orthoglide).outputs(t) for t in th])
    assert np.all(np.abs(F) <= scale * (1 + 1e-12))
    assert r["scale_above_stored"] >= 1.0 or r["scale_above_stored"] == pytest.approx(1.0)


def _leaf_value(tree, leaf: int, theta: np.ndarray) -> np.ndarray:
    """A leaf's quadratic at theta, from its box and coefficients (not through the kernel)."""
    lo, hi = tree.leaf_box[leaf]
    return tree.coef[leaf] @ basis_matrix((2 * theta - lo - hi) / (hi - lo))[0]


def test_face_jump_through_the_kernel_equals_the_leaf_polynomials(box4, report):
    """At the reported worst face point, the two leaves' polynomials (evaluated directly)
    differ by the reported jump."""
    p = np.array(report["worst_face_theta"])
    scale = np.array(report["coef_scale"])
    d = [k for k in range(3) if np.any(np.isclose(box4.leaf_box[:, 1, k], p[k], rtol=0, atol=0))
         and p[k] < box4.hi[k]]
    inside = lambda k: np.all((box4.leaf_box[k, 0] <= p) & (p <= box4.leaf_box[k, 1]))  # noqa: E731
    leaves = [k for k in range(box4.n_leaves) if inside(k)]
    assert len(d) >= 1 and len(leaves) >= 2
    jumps = [np.max(np.abs(_leaf_value(box4, a, p) - _leaf_value(box4, b, p)) / scale)
             for a in leaves for b in leaves if a < b]
    assert max(jumps) == pytest.approx(report["max_face_jump"], rel=1e-6)
    assert report["faces_checked"] == 3 * 3 * 16  # 3 inner planes per axis, 16 faces each


def test_a_continuous_fit_has_no_jumps_and_a_step_is_found(box4):
    """Every leaf holding the same global quadratic, re-expressed in its own coordinates: the
    jumps are rounding; one leaf's constant term moved by 1e-3 of the scale: a 1e-3 jump."""
    rng = np.random.default_rng(3)
    n_out = box4.coef.shape[1]
    A = rng.normal(size=(n_out, 3, 3))
    A = A + A.transpose(0, 2, 1)
    b, c = rng.normal(size=(n_out, 3)), rng.normal(size=n_out)
    coef = np.empty_like(box4.coef)
    for leaf, (lo, hi) in enumerate(box4.leaf_box):
        m, h = (lo + hi) / 2, (hi - lo) / 2  # theta = m + h z
        const = c + b @ m + np.einsum("oij,i,j->o", A, m, m) / 2
        lin = (b + np.einsum("oij,j->oi", A, m)) * h
        quad = [A[:, j, k] * h[j] * h[k] * (0.5 if j == k else 1.0) for j in range(3) for k in range(j, 3)]
        coef[leaf] = np.column_stack([const, lin, np.column_stack(quad)])
    smooth = dataclasses.replace(box4, coef=coef)
    scale = np.abs(tree_outputs(smooth, box4.lo + (box4.hi - box4.lo) * rng.random((500, 3)))[0]).max(axis=0)
    jump, faces, _, _ = face_jumps(smooth, scale)
    assert faces == 144 and jump < 1e-12
    coef = coef.copy()
    coef[21, 5, 0] += 1e-3 * scale[5]
    jump, _, at, out = face_jumps(dataclasses.replace(box4, coef=coef), scale)
    assert jump == pytest.approx(1e-3, rel=1e-6) and out == box4.header["outputs"][5]
    assert np.all((box4.leaf_box[21, 0] <= at) & (at <= box4.leaf_box[21, 1]))


def test_faces_of_a_tensor_grid():
    """Spline trees give their cell boundaries per axis (their distinct knots)."""
    knots = np.array([0, 0, 0, 0, 1, 2, 2, 2, 2, 0, 0, 0, 0, 1, 2, 3, 3, 3, 3], float)
    grid = SimpleNamespace(s=2, kind=SPLINE, knots=knots, knot_start=np.array([0, 9]),
                           knot_count=np.array([9, 10]))
    faces = internal_faces(grid)
    assert len(faces) == 1 * 3 + 2 * 2
    d, lo, hi = faces[0]
    assert d == 0 and lo.tolist() == [1.0, 0.0] and hi.tolist() == [1.0, 1.0]


def test_output_groups_cover_every_output():
    for s in (1, 2, 3, 6):
        sl = list(output_groups(s).values())
        assert sl[0].start == 0 and all(a.stop == b.start for a, b in zip(sl, sl[1:]))


def test_cli_verify_text_and_json(tmp_path, capsys):
    tree = tmp_path / "fb"
    assert main(["build", "fourbar", "-o", str(tree), "--boxes", "4", "--jobs", "1",
                 "--verify-samples", "0"]) == 0
    capsys.readouterr()
    assert main(["tree", "verify", str(tree), "--samples", "50", "--stress", "20",
                 "--diagonal-samples", "11", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    for text in ("81 of 50 random, 20 stress, 11 diagonal states compared", "p50", "p99", "worst coefficient errors",
                 "worst torque errors", "max_face_jump", "scales:"):
        assert text in out, text
    assert main(["tree", "verify", str(tree), "--samples", "50", "--stress", "0", "--jobs", "1",
                 "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["sets"] == {"random": 50, "stress": 0, "diagonal": 201}
    assert {"max_rel_coef_error", "max_rel_tau_error", "max_face_jump", "worst_output",
            "worst_theta", "group_max_rel_error", "coef_error", "tau_error"} <= set(r)
    assert r["set_max_rel_coef_error"]["stress"] is None
    assert main(["tree", "verify", str(tree), "--diagonal", "--samples", "30", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sets"] == {"diagonal": 30}
    assert main(["tree", "verify", str(tree), "--stress", "-1"]) == 2


def test_scales_come_from_the_domain_only(tmp_path):
    """A four-bar whose range crosses its singular configurations: near them the exact model
    still assembles and its outputs grow several times the in-domain maxima; states the tree
    marks out of domain must not set the scales (they made in-domain errors look tiny)."""
    src = (Path(__file__).resolve().parent.parent / "models" / "machines" / "fourbar.toml").read_text()
    path = tmp_path / "fourbar-wide.toml"
    path.write_text(src.replace("range = [-1.75, 1.75]", "range = [-1.95, 1.95]"))
    mech = load_mechanism(str(path))
    tree, _ = build_tree(mech, BuildSettings(boxes=8, verify_samples=0), jobs=1, progress=False)
    r = verify_tree(tree, mech, 300, jobs=1, progress=False, stress=100)
    assert r["out_of_domain_samples"] > 0 and r["compared"] > 0
    assert r["coef_scale"] == tree.header["output_scale"]  # nothing larger in the domain
    F = np.array([ExactModel(mech).outputs([t]) for t in (-1.84, 1.84)])
    assert np.max(np.abs(F).max(axis=0) / np.array(r["coef_scale"])) > 3
