"""Tree building, verification and the shipped trees, against the exact model."""

from __future__ import annotations

import dataclasses
import json
import platform
import subprocess
import sys

import numpy as np
import pytest

from pkrt.models.trees.shipped import MACHINES, SHIPPED, settings_for
from pkrt.models.kinematics.mechanism import load_mechanism
from pkrt.models.reduction.exact import ExactModel, flatten_outputs
from pkrt.models.trees.boxes import ccd_points
from pkrt.models.trees.build import build_tree
from pkrt.models.trees.settings import BuildSettings, BuildError
from pkrt.models.trees.outputs import tree_outputs
from pkrt.models.trees.verify import verify_tree
from pkrt.rt.cli import main
from pkrt.rt.core.tree import CLAMPED, OK, OUT_OF_DOMAIN, eval_model, eval_outputs, eval_tau
from pkrt.rt.core.treefile import check_tree_matches_model, load_tree, tree_bytes, tree_from_bytes


@pytest.fixture(scope="module")
def fourbar():
    return load_mechanism("fourbar")


@pytest.fixture(scope="module")
def orthoglide():
    return load_mechanism("orthoglide")


# -- shipped trees ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_tree_matches_its_model(name):
    model, settings = settings_for(name)
    tree = load_tree(MACHINES / name)
    mech = load_mechanism(model)
    check_tree_matches_model(tree, mech.content_hash)
    b = tree.header["build"]
    assert (b["kind"], b["boxes"], b["tol"]) == (settings.kind, settings.boxes, settings.tol)
    assert tree.kind_name == settings.kind
    assert tree.header["actuators"]["names"] == mech.actuator_names
    assert np.array_equal(np.c_[tree.lo, tree.hi], np.c_[settings.root_box(mech)])  # the ranges or a region
    assert tree.header["verification"]["samples"] == settings.verify_samples


REBUILD_TOLERANCE = 1e-12  # of each output's scale: rounding differs across CPUs and BLAS builds


def settings_from_header(header: dict) -> BuildSettings:
    """The build settings recorded in a tree header (those that are BuildSettings fields)."""
    names = {f.name for f in dataclasses.fields(BuildSettings)} - {"extra", "verify_samples", "seed"}
    kw = {k: v for k, v in header["build"].items() if k in names and v is not None}
    return BuildSettings(**kw, verify_samples=0)  # the verification does not change the arrays


@pytest.mark.parametrize("name", ["fourbar.pkt", "fivebar.pkt"])
def test_shipped_tree_agrees_with_a_rebuild(name):
    """A rebuild from the settings in the shipped tree's header gives the same outputs to
    1e-12 of each output's scale at many points (not the same bits: on another CPU 133 of the
    four-bar's 144 coefficients differed by up to 1.8e-15), the same domain everywhere."""
    shipped = load_tree(MACHINES / name)
    mech = load_mechanism(shipped.header["model"]["name"])
    check_tree_matches_model(shipped, mech.content_hash)
    rebuilt, _ = build_tree(mech, settings_from_header(shipped.header), jobs=1, progress=False)
    rng = np.random.default_rng(5)
    lo, hi = shipped.lo, shipped.hi
    theta = np.concatenate([lo + (hi - lo) * rng.random((3000, shipped.s)),
                            lo + (hi - lo) * np.linspace(0, 1, 501)[:, None], [lo, hi]])
    a, sa = tree_outputs(shipped, theta)
    b, sb = tree_outputs(rebuilt, theta)
    assert np.array_equal(sa, sb)
    scale = np.array(shipped.header["output_scale"])
    ok = sa != OUT_OF_DOMAIN
    err = np.abs(a[ok] - b[ok]) / scale
    assert err.max() <= REBUILD_TOLERANCE, (
        f"{name} differs from a rebuild by {err.max():.2e} of an output's scale: the exact "
        f"model's numerics changed? Rebuild the shipped trees: python -m pkrt.models.trees.shipped")
    assert np.allclose(rebuilt.header["output_scale"], scale, rtol=REBUILD_TOLERANCE, atol=0)


def test_orthoglide_build_is_deterministic_across_jobs(orthoglide):
    """Same bytes for any --jobs: one machine, one process run, the same code, so the very same
    floating-point operations in the same order (bit-for-bit is the property checked here)."""
    s = BuildSettings(boxes=2, verify_samples=40, seed=3)
    a, _ = build_tree(orthoglide, s, jobs=1, progress=False)
    b, _ = build_tree(orthoglide, s, jobs=2, progress=False)
    assert tree_bytes(a) == tree_bytes(b)
    s = BuildSettings(tol=0.05, max_leaves=5, verify_samples=20)
    a, _ = build_tree(orthoglide, s, jobs=1, progress=False)
    b, _ = build_tree(orthoglide, s, jobs=2, progress=False)
    assert a.n_leaves == 5 and a.header["build"]["stop"] == "max_leaves reached"
    assert tree_bytes(a) == tree_bytes(b)


# -- the design and the fit ---------------------------------------------------------------------

def test_ccd_design_sizes_and_shared_samples(orthoglide):
    assert len(ccd_points(1)) == 3 and len(ccd_points(2)) == 9 and len(ccd_points(3)) == 15
    tree, stats = build_tree(orthoglide, BuildSettings(boxes=2, verify_samples=0), jobs=1,
                             progress=False)
    # shared CCD points on the 5^3 half-step grid (corners 27, face centres 3*4*3 = 36,
    # centres 8) plus 6 held-out star points and 8 inner corners per box: each computed once
    assert tree.header["build"]["samples"] == 27 + 36 + 8 + 14 * 8 == stats["exact_evaluations"]


def test_kernel_interpolates_fourbar_samples_exactly(fourbar):
    """In 1-d the CCD (corners and centre) determines the quadratic: the tree reproduces the
    exact model at those points (to round-off), with either leaf at a shared corner."""
    tree, _ = build_tree(fourbar, BuildSettings(boxes=16, verify_samples=0), jobs=1, progress=False)
    exact = ExactModel(fourbar)
    f = np.empty(3)
    scale = np.array(tree.header["output_scale"])
    for lo, hi in tree.leaf_box[:, :, 0]:
        for th in (lo + 1e-12 * (hi - lo), 0.5 * (lo + hi)):
            assert eval_outputs(tree.arrays, np.array([th]), f) == OK
            assert np.max(np.abs(f - exact.outputs([th])) / scale) < 1e-8


def test_kernels_agree_with_exact_orthoglide(orthoglide):
    tree = load_tree(MACHINES / "orthoglide.pkt")
    exact = ExactModel(orthoglide)
    scale = np.array(tree.header["output_scale"])
    rng = np.random.default_rng(7)
    H, D, p, tau = np.empty((3, 3)), np.empty((3, 6)), np.empty(3), np.empty(3)
    for _ in range(25):
        th = -0.18 + 0.2 * rng.random(3)  # away from the stiff corners
        td, tdd = rng.normal(size=3) * 0.3, rng.normal(size=3) * 3
        r = exact(th)
        assert eval_tau(tree.arrays, th, td, tdd, H, D, p, tau) == OK
        assert np.max(np.abs(flatten_outputs(H, D, p) - flatten_outputs(r.H, r.D, r.p_ext)) / scale) < 5e-3
        assert np.allclose(H, H.T)
        assert np.max(np.abs(tau - r.tau(td, tdd))) < 5e-3 * np.max(np.abs(r.tau(td, tdd))) + 0.05


# -- the figures that must show -----------------------------------------------------------------

def test_fourbar_paper_figure(fourbar):
    """The paper's 16 boxes on [-1.75, 1.75]: under 1 % for |theta| <= 1.5, growing near the
    ends (the shipped spline tree is graded towards them: see the shipped-tree tests)."""
    tree, _ = build_tree(fourbar, BuildSettings(boxes=16), jobs=1, progress=False)
    inner = verify_tree(tree, fourbar, 400, seed=1, region=[-1.5, 1.5], jobs=1, progress=False)
    assert inner["max_rel_coef_error"] < 0.01
    assert inner["compared"] == sum(inner["sets"].values()) and inner["sets"]["random"] == 400
    assert inner["out_of_domain_samples"] == 0
    ends = verify_tree(tree, fourbar, 200, seed=1, region=[1.6, 1.75], jobs=1, progress=False)
    assert ends["max_rel_coef_error"] > 3 * inner["max_rel_coef_error"]
    v = tree.header["verification"]
    assert v["max_rel_coef_error"] >= inner["max_rel_coef_error"]
    assert v["max_face_jump"] < 1e-9  # 1-d CCD interpolates the shared corners


def test_orthoglide_figures_recorded_in_the_shipped_trees():
    """The stored verification (1000 random states over the whole box, plus the stress set on
    faces, edges and corners and the diagonal) of the controller's and the plant's trees; the
    whole-box targets are checked in test_shipped_accuracy.py."""
    ctrl = load_tree(MACHINES / "orthoglide.pkt")
    plant = load_tree(MACHINES / "orthoglide-plant.pkt")
    vc, vp = ctrl.header["verification"], plant.header["verification"]
    for v in (vc, vp):
        assert v["compared"] >= v["samples"] == 1000 and v["out_of_domain_samples"] == 0
        assert v["exact_failed_samples"] == 0
        assert {"max_rel_coef_error", "max_rel_tau_error", "max_face_jump"} <= set(v)
        assert v["max_face_jump"] < 1e-12  # continuous by construction
    assert vc["max_rel_coef_error"] < 5e-3 and vc["max_rel_tau_error"] < 5e-3
    assert vp["max_rel_coef_error"] < vc["max_rel_coef_error"] and vp["max_rel_coef_error"] < 1e-3


def test_adaptive_beats_uniform_in_the_same_memory(orthoglide):
    """64 leaves either way (same array bytes): adaptive splitting puts them where the model
    is stiff, and both report the face jumps."""
    uni, _ = build_tree(orthoglide, BuildSettings(boxes=4, verify_samples=300), jobs=2, progress=False)
    ada, _ = build_tree(orthoglide, BuildSettings(tol=1e-4, max_leaves=64, verify_samples=300),
                        jobs=2, progress=False)
    assert ada.n_leaves == uni.n_leaves == 64 and ada.nbytes == uni.nbytes
    vu, va = uni.header["verification"], ada.header["verification"]
    assert va["max_rel_coef_error"] < vu["max_rel_coef_error"] / 2
    assert va["max_face_jump"] > 0 and vu["max_face_jump"] > 0


def test_orthoglide_central_region(orthoglide):
    tree = load_tree(MACHINES / "orthoglide.pkt")
    r = verify_tree(tree, orthoglide, 150, seed=2, region=[-0.18, -0.02], jobs=1, progress=False)
    assert r["max_rel_coef_error"] < 5e-3
    assert r["max_rel_tau_error"] < 5e-3


# -- out of domain and clamping -----------------------------------------------------------------

def test_clamped_status(fourbar):
    tree = load_tree(MACHINES / "fourbar.pkt")
    f, g = np.empty(3), np.empty(3)
    assert eval_outputs(tree.arrays, np.array([2.3]), f) == CLAMPED
    assert eval_outputs(tree.arrays, np.array([1.75]), g) == OK
    assert np.array_equal(f, g)  # exact: the same kernel at the same point, in one process
    assert eval_outputs(tree.arrays, np.array([np.nan]), f) == CLAMPED
    H, D, p = np.empty((1, 1)), np.empty((1, 1)), np.empty(1)
    assert eval_model(tree.arrays, np.array([-9.0]), H, D, p) == CLAMPED


def test_boxes_beyond_the_singularity_are_out_of_domain(tmp_path):
    """A four-bar whose range crosses its singular configurations (|theta| = 1.8496 rad):
    the end boxes cannot be assembled, are marked, counted and reported when evaluated."""
    src = (MACHINES / "fourbar.toml").read_text()
    assert "range = [-1.75, 1.75]" in src
    path = tmp_path / "fourbar-wide.toml"
    path.write_text(src.replace("range = [-1.75, 1.75]", "range = [-1.95, 1.95]"))
    mech = load_mechanism(str(path))
    tree, _ = build_tree(mech, BuildSettings(boxes=8, verify_samples=60), jobs=1, progress=False)
    tree = tree_from_bytes(tree_bytes(tree))
    b, v = tree.header["build"], tree.header["verification"]
    assert list(tree.leaf_ok) == [0, 1, 1, 1, 1, 1, 1, 0]
    assert b["leaves_out_of_domain"] == 2 and b["samples_failed"] > 0
    assert v["out_of_domain_samples"] > 0 and v["tree_in_domain_but_exact_failed"] == 0
    f = np.empty(3)
    assert eval_outputs(tree.arrays, np.array([1.9]), f) == OUT_OF_DOMAIN
    assert eval_outputs(tree.arrays, np.array([5.0]), f) == OUT_OF_DOMAIN
    assert eval_outputs(tree.arrays, np.array([0.3]), f) == OK


def test_singularity_threshold_marks_boxes(fourbar):
    """The measure is smallest near the ends of the range (0.0208 at +/-1.75, 0.028 at 0)."""
    tree, _ = build_tree(fourbar, BuildSettings(boxes=4, sing_threshold=0.022, verify_samples=0),
                         jobs=1, progress=False)
    assert list(tree.leaf_ok) == [0, 1, 1, 0]
    assert tree.header["build"]["sing_threshold"] == 0.022


def test_bad_settings(fourbar):
    with pytest.raises(BuildError):
        build_tree(fourbar, BuildSettings(), jobs=1)
    with pytest.raises(BuildError):
        build_tree(fourbar, BuildSettings(boxes=2, tol=0.1), jobs=1)
    with pytest.raises(BuildError):
        build_tree(fourbar, BuildSettings(tol=-1.0), jobs=1)


# -- the CLI ------------------------------------------------------------------------------------

def test_cli_build_info_verify(tmp_path, capsys):
    out = tmp_path / "fb.pkt"
    assert main(["build", "fourbar", "-o", str(out), "--kind", "boxes", "--boxes", "4", "--jobs", "1",
                 "--verify-samples", "30", "--json"]) == 0
    cap = capsys.readouterr()
    r = json.loads(cap.out)
    assert cap.err == ""  # no progress bar when stderr is not a terminal
    assert r["leaves"] == 4 and r["file_bytes"] == out.stat().st_size
    assert main(["tree", "info", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["leaves"] == 4 and info["model"]["name"] == "fourbar"
    assert info["software"]["numpy"] == np.__version__ and set(info["software"]) == {
        "python", "numpy", "scipy", "numba", "msgpack", "pkrt"}
    assert main(["tree", "info", str(out)]) == 0
    built = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("built with: ")]
    assert len(built) == 1 and f"python {platform.python_version()}" in built[0] and "scipy" in built[0]
    assert main(["tree", "verify", str(out), "--samples", "30", "--jobs", "1", "--json",
                 "--region", "-1,1"]) == 0
    ver = json.loads(capsys.readouterr().out)
    assert ver["passed"] and ver["region"] == [[-1.0, 1.0]]
    assert main(["tree", "verify", str(out), "--samples", "30", "--jobs", "1",
                 "--max-error", "1e-9"]) == 1
    assert "verification failed" in capsys.readouterr().err
    assert main(["build", "fourbar", "-o", str(out), "--boxes", "4", "--tol", "0.1"]) == 2
    assert main(["tree", "verify", str(out), "--model", "orthoglide"]) == 2
    assert "rebuild the tree" in capsys.readouterr().err
    assert main(["tree", "verify", str(out), "--region", "-3,1"]) == 2


def test_progress_bar_only_on_a_terminal(tmp_path):
    """stderr on a real pseudo-terminal: tqdm draws a bar; the JSON on stdout is unchanged."""
    import os
    import subprocess
    import sys
    import threading
    import fcntl
    import struct
    import termios
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 24 x 100
    chunks: list[bytes] = []

    def drain():
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO once the terminal is closed
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    out = tmp_path / "fb.pkt"
    try:
        proc = subprocess.run([sys.executable, "-m", "pkrt.rt.cli", "build", "fourbar", "-o", str(out),
                               "--kind", "boxes", "--boxes", "4", "--jobs", "1", "--verify-samples", "30",
                               "--json"],
                              stdout=subprocess.PIPE, stderr=slave, timeout=120)
    finally:
        os.close(slave)
        reader.join(5)
        os.close(master)
    err = b"".join(chunks)
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["leaves"] == 4
    assert b"build" in err and b"pt" in err  # the tqdm bar ("build: ... pt/s")


def test_allocation_free_kernels_match_and_workspace():
    """Exact comparisons: the kernels run the same arithmetic in the same order, in one
    process on one machine (no stored values from elsewhere)."""
    from pkrt.rt.core.tree import eval_outputs_w, eval_tau_w, work_size
    from pkrt.rt.core.workspace import TreeWorkspace
    tree = load_tree(MACHINES / "orthoglide.pkt")
    ws = TreeWorkspace(tree)
    rng = np.random.default_rng(11)
    H, D, p, tau = np.empty((3, 3)), np.empty((3, 6)), np.empty(3), np.empty(3)
    work, f, g = np.full(work_size(3), np.nan), np.empty(27), np.empty(27)
    for th in list(tree.lo + (tree.hi - tree.lo) * rng.random((20, 3))) + [np.array([0.5, 0, -1.0])]:
        td, tdd = rng.normal(size=3), rng.normal(size=3)
        s1 = eval_tau(tree.arrays, th, td, tdd, H, D, p, tau)
        s2 = eval_tau_w(tree.arrays, th, td, tdd, ws.H, ws.D, ws.p_ext, ws.tau, work)
        assert s1 == s2 and np.array_equal(tau, ws.tau) and np.array_equal(H, ws.H)
        assert ws.tau_of(tree, th, td, tdd) == s1 and np.array_equal(ws.tau, tau)
        assert ws.model_of(tree, th) == s1 and np.array_equal(ws.D, D)
        assert eval_outputs_w(tree.arrays, th, f, work) == eval_outputs(tree.arrays, th, g) == s1
        assert np.array_equal(f, g) and np.array_equal(f, flatten_outputs(H, D, p))
    assert s1 == CLAMPED


def test_adaptive_build_over_a_range_crossing_the_singularity(tmp_path):
    """Adaptive build of the four-bar on [-1.9, 1.9] (singular at |theta| = 1.8496): the root
    box's corners cannot be assembled, so the root is out of domain; it used to stay the only
    leaf (out-of-domain leaves were never split): a tree out of domain everywhere, exit 0. Now
    leaves that are partly in domain are split down to the in-domain leaves' size."""
    src = (MACHINES / "fourbar.toml").read_text()
    path = tmp_path / "fourbar-wide.toml"
    path.write_text(src.replace("range = [-1.75, 1.75]", "range = [-1.9, 1.9]"))
    mech = load_mechanism(str(path))
    tree, _ = build_tree(mech, BuildSettings(tol=1e-3, verify_samples=200), jobs=1, progress=False)
    ok = tree.leaf_ok.astype(bool)
    assert ok.any() and not ok.all()
    lo, hi = tree.leaf_box[ok, 0, 0].min(), tree.leaf_box[ok, 1, 0].max()
    assert lo < -1.6 and hi > 1.6  # in domain up to the last in-domain box towards the singularity
    f = np.empty(3)
    assert eval_outputs(tree.arrays, np.array([0.3]), f) == OK
    assert eval_outputs(tree.arrays, np.array([1.88]), f) == OUT_OF_DOMAIN
    v = tree.header["verification"]
    assert v["compared"] > 0 and v["tree_in_domain_but_exact_failed"] == 0
    assert v["max_rel_coef_error"] < 0.05
    assert tree.header["build"]["stop"] == "tolerance met"


def test_cli_build_output_is_a_folder(tmp_path, capsys):
    """'-o' naming a folder: refused before building (it built the whole tree, then failed
    with 'Is a directory: DIR.tmp' and left that temporary file beside the folder)."""
    folder = tmp_path / "trees"
    folder.mkdir()
    assert main(["build", "fourbar", "-o", str(folder), "--boxes", "2", "--jobs", "1",
                 "--verify-samples", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pkrt: error: -o {folder}: ") and "directory" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trees"]


def test_cli_model_eval_in_an_out_of_domain_box(tmp_path, capsys):
    """Exit 1 with 'pkrt: error: ...' on stderr (the message went to stdout, stderr empty);
    with --json also one JSON object on stdout."""
    src = (MACHINES / "fourbar.toml").read_text()
    path = tmp_path / "fourbar-wide.toml"
    path.write_text(src.replace("range = [-1.75, 1.75]", "range = [-1.95, 1.95]"))
    out = tmp_path / "wide.pkt"
    assert main(["build", str(path), "-o", str(out), "--boxes", "8", "--jobs", "1",
                 "--verify-samples", "0"]) == 0
    capsys.readouterr()
    assert main(["model", "eval", str(out), "--theta", "1.9"]) == 1
    cap = capsys.readouterr()
    assert cap.out == ""
    assert cap.err.strip().splitlines() == ["pkrt: error: theta in a box marked out of domain"]
    assert main(["model", "eval", str(out), "--theta", "1.9", "--json"]) == 1
    cap = capsys.readouterr()
    assert json.loads(cap.out)["error"] == "theta in a box marked out of domain"
    assert cap.err.startswith("pkrt: error: ")


def test_cli_build_with_no_box_in_domain_fails(tmp_path, capsys):
    """Every leaf out of domain (a threshold above the model's singularity measure anywhere)
    wrote a tree that cannot evaluate anywhere, exit 0; now exit 1, no file. An infinite
    threshold is bad input (exit 2)."""
    out = tmp_path / "none.pkt"
    assert main(["build", "fourbar", "-o", str(out), "--boxes", "4", "--jobs", "1", "--verify-samples", "0",
                 "--sing-threshold", "1e9"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("pkrt: error: ") and "out of domain" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
    assert main(["build", "fourbar", "-o", str(out), "--boxes", "4", "--jobs", "1", "--verify-samples", "0",
                 "--sing-threshold", "inf"]) == 2
    assert "--sing-threshold" in capsys.readouterr().err


def test_cli_absurd_sample_counts_are_usage_errors(tmp_path, capsys):
    """--samples / --verify-samples of 1e11 died with a MemoryError traceback (745 GiB)."""
    assert main(["tree", "verify", str(MACHINES / "fourbar.pkt"), "--samples", "100000000000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pkrt: error: --samples") and len(err.strip().splitlines()) == 1, err
    out = tmp_path / "x.pkt"
    assert main(["build", "fourbar", "-o", str(out), "--kind", "boxes", "--boxes", "2",
                 "--verify-samples", "100000000000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pkrt: error: --verify-samples") and not out.exists(), err


def test_huge_jobs_does_not_fork_a_process_per_job(fourbar):
    """--jobs 100000 made a pool of 100000 processes (forked at start); the result does not
    depend on jobs, so the pool is capped at a few per core."""
    import os

    from pkrt.models.trees.sampling import SampleEvaluator

    ev = SampleEvaluator(fourbar, jobs=100000, progress=False)
    assert 2 <= ev.jobs <= 4 * max(2, os.cpu_count() or 1)
    assert SampleEvaluator(fourbar, jobs=1).jobs == 1 and SampleEvaluator(fourbar, jobs=2).jobs == 2


def test_build_over_a_region(orthoglide, tmp_path):
    """--region: the tree covers that box inside the ranges (recorded in its header), agrees
    with the exact model there as its verification says, and refuses the box outside it (one
    line, before any sampling)."""
    region = (-0.2, -0.1, -0.15, -0.05, -0.2, -0.1)
    tree, _ = build_tree(orthoglide, BuildSettings(boxes=2, region=region, verify_samples=200), jobs=1,
                         progress=False)
    want = np.array(region).reshape(3, 2)
    assert np.array_equal(np.c_[tree.lo, tree.hi], want)
    assert tree.header["build"]["region"] == want.tolist() == tree.header["actuators"]["ranges"]
    assert tree.header["verification"]["max_rel_tau_error"] < 0.01
    exact = ExactModel(orthoglide)
    th = np.array([-0.13, -0.07, -0.16])
    f, status = tree_outputs(tree, th[None])
    assert status[0] == 0
    scale = np.array(tree.header["output_scale"])
    r = exact(th)
    assert np.max(np.abs(f[0] - flatten_outputs(r.H, r.D, r.p_ext)) / scale) < 0.01
    out = tmp_path / "t.pkt"
    p = subprocess.run([sys.executable, "-m", "pkrt.rt.cli", "build", "orthoglide", "-o", str(out),
                        "--kind", "boxes", "--boxes", "2", "--region=-0.3,0.0"], capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "--region must have lo < hi inside" in p.stderr
    assert not out.exists()


def test_a_plant_on_a_region_tree_stops_when_it_leaves_the_region(orthoglide):
    """A plant tree built over a region (hexapod-plant.pkt is one) has no physics outside it:
    the simulated drives stop with the reason instead of integrating clamped dynamics."""
    from pkrt.drivers.base import DriveError
    from pkrt.drivers.sim import Plant, SimDrives

    tree, _ = build_tree(orthoglide, BuildSettings(boxes=2, region=(-0.2, -0.1), verify_samples=0), jobs=1,
                         progress=False)
    drives = SimDrives(Plant(tree, viscous=20.0, coulomb=5.0, force_limit=400.0, substeps=2))
    drives.period = 1e-3
    drives.prepare(np.full(3, -0.15))
    drives.configure()
    drives.enable()
    with pytest.raises(DriveError, match=r"simulated plant left its tree's box at position .* \(box "):
        for k in range(2000):  # 400 N on each axis: out of the 0.1 m wide box within 0.1 s
            drives.read(k * 1e-3)
            drives.write(np.full(3, 400.0))
    assert 0 < k < 300
    assert np.any(drives.plant.theta > -0.1)  # pushed out through the upper side
