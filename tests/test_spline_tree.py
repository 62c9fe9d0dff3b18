"""Spline trees: the kernel against scipy, interpolation, continuity, files, builds, CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.interpolate import NdBSpline

from pkrt.models.trees.shipped import MACHINES
from pkrt.models.kinematics.mechanism import load_mechanism
from pkrt.models.reduction.exact import ExactModel, flatten_outputs
from pkrt.models.trees.splines import fit, spline_tree
from pkrt.models.trees.build import build_tree
from pkrt.models.trees.settings import BuildError, BuildSettings
from pkrt.models.trees.verify import face_jumps
from pkrt.rt.cli import main
from pkrt.rt.core.tree import (CLAMPED, OK, SPLINE, SPLINE_FAST, eval_model, eval_outputs,
                          eval_tau, n_outputs)
from pkrt.rt.core.workspace import TreeWorkspace
from pkrt.rt.core.treefile import TreeFileError, tree_bytes, tree_from_bytes

from .test_treefile import repack, set_array


def header_for(s: int, lo, hi) -> dict:
    return {"model": {"name": "test", "content_hash": "ab" * 32},
            "actuators": {"names": [f"q{i}" for i in range(s)], "units": ["m"] * s,
                          "ranges": np.c_[lo, hi].tolist()},
            "outputs": [f"f{i}" for i in range(n_outputs(s))],
            "output_scale": [1.0] * n_outputs(s), "build": {"mode": "test"}, "verification": {}}


def random_spline(s: int, counts, seed: int = 0):
    """A spline tree through random values on a random graded grid over [-1, 1] x [0, 2] x .."""
    rng = np.random.default_rng(seed)
    lo, hi = -1.0 + np.arange(s), 1.0 + np.arange(s)
    xs = [np.concatenate([[lo[a]], np.sort(rng.uniform(lo[a], hi[a], n - 2)), [hi[a]]])
          for a, n in enumerate(counts)]
    V = rng.standard_normal((*counts, n_outputs(s)))
    knots, C = fit(xs, V)
    tree = spline_tree(lo, hi, knots, C, header_for(s, lo, hi))
    return tree, xs, V, knots, C


@pytest.mark.parametrize("s, counts", [(1, (9,)), (2, (5, 8)), (3, (6, 4, 7))])
def test_kernel_matches_scipy_and_interpolates(s, counts):
    tree, xs, V, knots, C = random_spline(s, counts)
    ref = NdBSpline(tuple(knots), C.reshape(*counts, -1), 3)
    rng = np.random.default_rng(1)
    f = np.empty(n_outputs(s))
    pts = tree.lo + (tree.hi - tree.lo) * rng.random((300, s))
    pts = np.concatenate([pts, [tree.lo, tree.hi]])
    for p in pts:
        assert eval_outputs(tree.arrays, p, f) == OK
        assert np.max(np.abs(f - ref(p[None, :])[0])) < 1e-11 * np.max(np.abs(C))
    for idx in np.ndindex(*counts):
        p = np.array([xs[a][i] for a, i in enumerate(idx)])
        assert eval_outputs(tree.arrays, p, f) == OK
        assert np.max(np.abs(f - V[idx])) < 1e-10


def test_model_tau_and_workspace_agree_with_outputs():
    tree, *_ = random_spline(3, (6, 5, 7), seed=2)
    rng = np.random.default_rng(3)
    H, D, p, tau, f = np.empty((3, 3)), np.empty((3, 6)), np.empty(3), np.empty(3), np.empty(27)
    ws = TreeWorkspace(tree)
    for _ in range(50):
        th = tree.lo + (tree.hi - tree.lo) * rng.random(3)
        td, tdd = rng.normal(size=3), rng.normal(size=3)
        eval_outputs(tree.arrays, th, f)
        assert eval_tau(tree.arrays, th, td, tdd, H, D, p, tau) == OK
        assert np.array_equal(flatten_outputs(H, D, p), f) and np.array_equal(H, H.T)
        w = np.array([td[j] * td[k] for j in range(3) for k in range(j, 3)])
        assert np.allclose(tau, H @ tdd + D @ w - p, rtol=1e-13, atol=1e-12)
        assert ws.tau_of(tree, th, td, tdd) == OK and np.array_equal(ws.tau, tau)


def test_continuous_across_every_knot_plane():
    """The pieces on both sides of every interior knot agree to rounding: by the forced-span
    check of face_jumps and by stepping one ulp across the knot."""
    tree, *_ = random_spline(3, (7, 6, 8), seed=4)
    scale = np.full(n_outputs(3), 1.0)
    jump, faces, _, _ = face_jumps(tree, scale)
    assert faces == 3 * (3 * 5) + 2 * (4 * 5) + 4 * (4 * 3)  # interior planes x cells on each
    assert jump < 1e-12
    f1, f2 = np.empty(27), np.empty(27)
    for a in range(3):
        t = tree.knots[tree.knot_start[a]:tree.knot_start[a] + tree.knot_count[a]]
        for x in t[4:-4]:
            p = 0.5 * (tree.lo + tree.hi)
            p[a] = x
            q = p.copy()
            q[a] = np.nextafter(x, -np.inf)
            eval_outputs(tree.arrays, p, f1)
            eval_outputs(tree.arrays, q, f2)
            assert np.max(np.abs(f1 - f2)) < 1e-12


def test_clamping_status():
    tree, *_ = random_spline(2, (5, 5))
    f, g = np.empty(n_outputs(2)), np.empty(n_outputs(2))
    assert eval_outputs(tree.arrays, np.array([3.0, 1.0]), f) == CLAMPED
    assert eval_outputs(tree.arrays, np.array([1.0, 1.0]), g) == OK
    assert np.array_equal(f, g)
    assert eval_outputs(tree.arrays, np.array([np.nan, 1.0]), f) == CLAMPED
    H, D, p = np.empty((2, 2)), np.empty((2, 3)), np.empty(2)
    assert eval_model(tree.arrays, np.array([-9.0, 9.0]), H, D, p) == CLAMPED


# -- files ------------------------------------------------------------------------------------

def test_spline_file_round_trip_and_same_bytes():
    tree, *_ = random_spline(2, (6, 5))
    data = tree_bytes(tree)
    u = tree_from_bytes(data)
    assert u.kind == SPLINE and u.grid_points == [6, 5] and tree_bytes(u) == data
    for a, b in zip(tree.arrays[1:SPLINE_FAST], u.arrays[1:SPLINE_FAST]):  # the file's arrays
        assert a.dtype == b.dtype and a.ndim == b.ndim and np.array_equal(a, b)


TREE2, *_ = random_spline(2, (6, 5))


@pytest.mark.parametrize("mutate, message", [
    (set_array("knots", TREE2.knots[::-1].copy()), "knots of axis"),
    (set_array("knot_count", np.array([10, 8], np.int32)), "disagree"),
    (set_array("knot_count", np.array([7, 9], np.int32)), "knot_count"),
    (set_array("knot_start", np.array([0, 9], np.int32)), "disagree"),
    (set_array("spl_coef", np.full((30, n_outputs(2)), np.nan)), "non-finite"),
    (set_array("spl_coef", np.zeros((29, n_outputs(2)))), "spl_coef has shape"),
    (set_array("knots", np.where(np.arange(19) == 5, 2.5, TREE2.knots)), "knots of axis 0"),
    (set_array("leaf_ok", np.array([1], np.uint8)), "must be empty"),
    (set_array("spl_coef", np.zeros(30)), "dimensions"),
    (lambda b: b.update(kind="octree"), "kind 'octree'"),
    (lambda b: b.pop("kind"), "'kind'"),
])
def test_bad_spline_arrays_are_refused(mutate, message):
    with pytest.raises(TreeFileError, match=message):
        tree_from_bytes(repack(TREE2, mutate))


def test_interior_knots_must_increase():
    t = TREE2.knots.copy()
    t[5] = t[4]  # an empty interior span on axis 0
    with pytest.raises(TreeFileError, match="strictly increasing"):
        tree_from_bytes(repack(TREE2, set_array("knots", t)))


def _probe(tree) -> None:
    s = tree.s
    f = np.empty(n_outputs(s))
    H, D, p, tau = np.empty((s, s)), np.empty((s, s * (s + 1) // 2)), np.empty(s), np.empty(s)
    for th in ([-1.0, 1.0], [0.3, 0.5], [1.0, 2.0], [5.0, -5.0], [np.nan, 1.0]):
        assert eval_outputs(tree.arrays, np.array(th), f) in (OK, CLAMPED)
        assert eval_tau(tree.arrays, np.array(th), np.ones(s), np.ones(s), H, D, p, tau) in (OK, CLAMPED)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["knots", "knot_start", "knot_count", "spl_coef", "lo", "hi"]),
       st.integers(0, 10 ** 6), st.integers(1, 255))
def test_fuzz_spline_array_bytes_with_valid_checksum(name, pos, x):
    """Corrupted spline arrays in a re-signed file: refused, or evaluated safely."""
    def mutate(body):
        d = bytearray(body["arrays"][name]["data"])
        d[pos % len(d)] ^= x
        body["arrays"][name]["data"] = bytes(d)
    try:
        tree = tree_from_bytes(repack(TREE2, mutate))
    except TreeFileError:
        return
    _probe(tree)


# -- builds -------------------------------------------------------------------------------------

def test_fivebar_spline_build_interpolates_and_is_deterministic():
    mech = load_mechanism("fivebar")
    st_ = BuildSettings(kind="spline", boxes=4, verify_samples=50)
    a, stats = build_tree(mech, st_, jobs=1, progress=False)
    b, _ = build_tree(mech, st_, jobs=2, progress=False)
    assert tree_bytes(a) == tree_bytes(b)
    verified = a.header["verification"]["compared"]  # random + stress + diagonal states
    assert verified >= 50
    assert a.grid_points == [5, 5] and stats["exact_evaluations"] == 25 + 2 * 4 * 5 + 4 + verified  # grid, lines, corner cells, verify
    exact = ExactModel(mech)
    f = np.empty(n_outputs(2))
    scale = np.array(a.header["output_scale"])
    lo, hi = mech.ranges[:, 0], mech.ranges[:, 1]
    for u in ((0, 0), (0.25, 0.75), (1, 0.5)):
        th = lo + (hi - lo) * np.array(u)
        eval_outputs(a.arrays, th, f)
        assert np.max(np.abs(f - exact.outputs(th)) / scale) < 1e-9


def test_adaptive_spline_meets_its_tolerance_on_the_fourbar():
    mech = load_mechanism("fourbar")
    tree, _ = build_tree(mech, BuildSettings(kind="spline", tol=2e-3, verify_samples=400),
                         jobs=1, progress=False)
    b, v = tree.header["build"], tree.header["verification"]
    assert b["stop"] == "tolerance met" and b["max_heldout_error"] <= 0.5 * 2e-3
    assert v["max_rel_coef_error"] < 2e-3 and v["max_rel_tau_error"] < 2e-3
    # graded: the grid is denser towards the singular ends than in the middle
    t = tree.knots[3:-3]
    w = np.diff(t)
    assert w[0] < w[len(w) // 2] / 2 and w[-1] < w[len(w) // 2] / 2


def test_max_bytes_bounds_the_adaptive_spline():
    mech = load_mechanism("fourbar")
    tree, _ = build_tree(mech, BuildSettings(kind="spline", tol=1e-7, max_bytes=20 * 3 * 8,
                                             verify_samples=0), jobs=1, progress=False)
    assert tree.header["build"]["stop"] == "max_bytes reached"
    assert tree.spl_coef.nbytes <= 20 * 3 * 8


def _wide_fourbar(tmp_path):
    src = (MACHINES / "fourbar.toml").read_text()
    path = tmp_path / "fourbar-wide.toml"
    path.write_text(src.replace("range = [-1.75, 1.75]", "range = [-1.9, 1.9]"))
    return path


def test_spline_refuses_a_box_out_of_the_domain(tmp_path, capsys):
    path = _wide_fourbar(tmp_path)
    with pytest.raises(BuildError, match="shrink the actuator ranges or use --kind boxes"):
        build_tree(load_mechanism(str(path)), BuildSettings(kind="spline", boxes=8), jobs=1,
                   progress=False)
    out = tmp_path / "t.pkt"
    assert main(["build", str(path), "-o", str(out), "--kind", "spline", "--jobs", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pkrt: error: ") and err.count("\n") == 1 and not out.exists()
    # the default kind falls back to boxes, and says so
    assert main(["build", str(path), "-o", str(out), "--jobs", "1", "--verify-samples", "20",
                 "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["kind"] == "boxes" and "--kind boxes" in r["spline_refused"]


def test_cli_build_spline_and_info(tmp_path, capsys):
    out = tmp_path / "fb.pkt"
    assert main(["build", "fourbar", "-o", str(out), "--kind", "spline", "--boxes", "6",
                 "--jobs", "1", "--verify-samples", "30"]) == 0
    assert "spline, 7 grid points" in capsys.readouterr().out
    assert main(["tree", "info", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["kind"] == "spline" and info["grid_points"] == [7]
    assert info["array_bytes"] == 7 * 3 * 8 + 11 * 8 + 2 * 4 + 2 * 8  # coef, knots, counts, box
    assert main(["build", "fourbar", "-o", str(out), "--kind", "spline", "--boxes", "2"]) == 2
    assert main(["build", "fourbar", "-o", str(out), "--kind", "cubes"]) == 2


def test_max_bytes_bounds_adaptive_boxes():
    """--max-bytes caps the leaf budget of an adaptive box tree too."""
    mech = load_mechanism("fourbar")
    tree, _ = build_tree(mech, BuildSettings(kind="boxes", tol=1e-9, max_bytes=2000, verify_samples=0),
                         jobs=1, progress=False)
    assert tree.header["build"]["stop"] == "max_bytes reached"
    assert tree.coef.nbytes <= 2000 < 2 * tree.coef.nbytes
