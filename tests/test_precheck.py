"""The whole-program check before motion (``pkrt.models.planning.precheck``): its parts against
independent references (the compiled inverse kinematics against ``legik``'s, the path samples
against the planner's geometry, the preview's bound and tolerance), its figures against sums
over the interpreter's own commands, and its refusals: a program with an error at line 90,000
of 100,000 (syntax, an unsupported word, a modal error, a point outside the workspace or an
actuator's range) refused in one line naming the file and the line, by ``check_program`` and by
``pkrt plan`` before any planning; the first of two errors named."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from scipy.spatial import cKDTree

from pkrt.models.kinematics.legik import leg_kinematics
from pkrt.models.kinematics.reach import INSIDE, NO_POSE, OUT_OF_DOMAIN, OUT_OF_RANGE, Reach
from pkrt.models.kinematics.taskspace import TaskKinematics, tool_pose
from pkrt.models.planning.gcode import _Items, canon_stream, read_lines
from pkrt.models.planning.geompath import Arc
from pkrt.models.planning.ngc_path import Decimator, samples
from pkrt.models.planning.ngc_setup import Setup
from pkrt.models.planning.precheck import check_program
from pkrt.rt.app.reference import gcode_setup, machine_mechanism, path_planner, program_reach
from pkrt.rt.bench.camprograms import finishing, placed_machine, relief
from pkrt.rt.cli import main
from pkrt.rt.core.errors import UserError
from pkrt.rt.core.tree import Tree, n_basis, n_outputs
from pkrt.rt.runtime.machine.config import load_machine

G54 = np.array([-40.0, -40.0, -120.0])  # mm: an 80 mm relief inside the Orthoglide's workspace


@pytest.fixture(scope="module")
def ortho():
    config = load_machine("orthoglide")
    planner = path_planner(config)
    setup = gcode_setup(config)
    setup.offsets[1] = G54
    origin = planner.kin.forward(planner.mech.theta_ref)[0]
    return config, planner, setup, origin


@pytest.fixture(scope="module")
def long_relief(tmp_path_factory):
    """A 100,000-line relief raster (its text: lines are replaced at 90,000)."""
    path = relief(tmp_path_factory.mktemp("relief") / "relief.ngc", lines=100_300)
    return path.read_text().split("\n")


# -- the parts ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["orthoglide", "delta"])
def test_compiled_inverse_kinematics_equals_legik_and_refuses_what_it_refuses(name):
    mech = machine_mechanism(load_machine(name))
    kin = TaskKinematics(mech)
    legs = leg_kinematics(kin)
    reach = Reach(kin)
    home = tool_pose(mech, mech.ref_config, kin.tool)
    P = home + np.random.default_rng(5).uniform(-1, 1, (5000, 3)) * 0.4  # many beyond the workspace
    z = np.zeros_like(P)
    ref = legs.solve(P, z, z)[0]
    got = reach.actuators(P)
    both = np.isfinite(ref).all(axis=1)
    assert 500 < both.sum() < 4500  # inside and outside both tried
    assert np.array_equal(both, np.isfinite(got).all(axis=1))
    assert np.abs(got[both] - ref[both]).max() < 1e-12
    lo, hi = mech.ranges[:, 0], mech.ranges[:, 1]
    inside = both & np.all((ref >= lo - 1e-12) & (ref <= hi + 1e-12), axis=1)
    k, code, i, _ = reach.first_outside(P)
    assert k == int(np.argmin(inside)) and code in (NO_POSE, OUT_OF_RANGE)
    assert reach.first_outside(P[inside])[1] == INSIDE


def test_a_tree_out_of_domain_leaf_is_refused():
    """A boxes tree whose half x >= 0 is out of the model's domain: a point there is refused,
    one on the other side is not (the loop's reference check would refuse it the same)."""
    mech = machine_mechanism(load_machine("orthoglide"))
    kin, s = TaskKinematics(mech), mech.n_act
    lo, hi = mech.ranges[:, 0].copy(), mech.ranges[:, 1].copy()
    box = np.array([[lo, np.where(np.arange(s) == 0, 0.0, hi)], [np.where(np.arange(s) == 0, 0.0, lo), hi]])
    tree = Tree(lo, hi, np.array([0, -1, -1], np.int32), np.array([0.0, 0.0, 0.0]),
                np.array([[1, 2], [0, 0], [1, 0]], np.int32), box, np.array([1, 0], np.uint8),
                np.zeros((2, n_outputs(s), n_basis(s))))
    reach = Reach(kin, tree_arrays=tree.arrays)
    home = tool_pose(mech, mech.ref_config, kin.tool)
    th_lo, th_hi = (reach.actuators(home[None] + d)[0] for d in ([-0.03, 0, 0], [0.03, 0, 0]))
    inside, outside = (home + d for d in ([-0.03, 0, 0], [0.03, 0, 0]) )
    assert (th_lo[0] < 0) != (th_hi[0] < 0)  # the two points on either side of the split
    bad = outside if th_hi[0] >= 0 else inside
    good = inside if th_hi[0] >= 0 else outside
    assert reach.first_outside(good[None])[1] == INSIDE
    k, code, _, theta = reach.first_outside(np.vstack([good, good, bad]))
    assert (k, code) == (2, OUT_OF_DOMAIN) and "outside the model's domain" in reach.why(code, -1, theta, bad)


def _program(tmp_path, text: str):
    p = tmp_path / "p.ngc"
    p.write_text(text)
    return str(p)


ARCS = """G21 G90 F600
G0 X1 Y2 Z3
G17 G2 X11 Y2 I5 J0
G3 X1 Y2 R5 Z1
G18 G2 X1 Z-7 I0 K-4 P2
G19 G3 Y-6 Z1 J-4 K4
G91 G17 G2 X0 Y0 I-3 J3 Z-2 P3
G90 G1 X0 Y0 Z0
M2
"""


def test_samples_lie_on_the_planners_path_and_reach_the_arcs_extremes(tmp_path, ortho):
    """Every sample of the arcs (all planes, helices, several turns) on the planner's own arc
    (``gcode._arc``) within rounding, none more than the step from the last, and the checked
    points' box the arcs' true box (their extreme points)."""
    _, planner, _, origin = ortho
    setup = Setup(offsets={1: np.array([-30.0, -30.0, -100.0])})
    path = _program(tmp_path, ARCS)
    got = check_program(path, program_reach(planner), setup, origin, step_mm=0.5)
    canon = [c for c in canon_stream(read_lines(path), setup, path=path) if c.kind in ("traverse", "feed", "arc")]
    conv = _Items(np.asarray(origin), np.zeros(3), setup, {})
    segs = []
    for c in canon:
        conv.command(c)
        segs += conv.segs
        conv.segs, conv.tols = [], []
    dense = np.vstack([g.eval(np.linspace(0, g.length, 100_000))[0] for g in segs])
    spacing = np.linalg.norm(np.diff(dense, axis=0), axis=1)
    arr = np.array
    rows = (arr([{"traverse": 0, "feed": 1, "arc": 2}[c.kind] for c in canon], np.int8),
            arr([c.line for c in canon], np.int64), arr([c.start for c in canon]), arr([c.end for c in canon]),
            arr([c.centre or (0.0, 0.0) for c in canon]), arr([c.turn for c in canon], np.int32),
            arr([c.plane for c in canon], np.int16), arr([c.feed for c in canon]), arr([c.units for c in canon]),
            arr([c.offset for c in canon]), np.asarray(origin, float), 0.5, 0.05)
    acc, q = np.zeros(12), np.zeros(3)
    n = samples(*rows, np.empty((0, 3)), np.empty(0, np.int64), np.empty(0, np.int8), acc, False, q)
    P = np.empty((n, 3))
    samples(*rows, P, np.empty(n, np.int64), np.empty(n, np.int8), acc, True, q)
    assert cKDTree(dense).query(P)[0].max() < 0.5 * spacing[spacing < 1e-4].max() + 1e-9  # on the path
    assert np.linalg.norm(np.diff(P, axis=0), axis=1).max() <= 0.5e-3 + 1e-12
    assert got.points == n + 1  # and the start
    assert np.allclose(got.box, [dense.min(axis=0), dense.max(axis=0)], atol=1e-8)
    assert got.motions == {"traverse": 1, "feed": 1, "arc": 5}
    assert sum(isinstance(g, Arc) for g in segs) == 5
    assert got.feed_length_m == pytest.approx(sum(g.length for g in segs if g.feed < math.inf), rel=1e-9)
    assert cKDTree(dense).query(got.preview.points)[0].max() < 1e-6  # the preview's points are on it too


def test_the_preview_is_bounded_within_its_tolerance_and_keeps_every_change_of_kind():
    rng = np.random.default_rng(2)
    steps = rng.normal(size=(200_000, 3)) * 1e-4
    pts = np.cumsum(steps, axis=0)
    kinds = (np.arange(len(pts)) // 997 % 2).astype(np.int8)  # runs of traverse and feed
    lines = np.arange(len(pts)) + 1
    d = Decimator(cap=5000, tol=1e-6)
    for k in range(0, len(pts), 30_000):
        d.add(pts[k:k + 30_000], lines[k:k + 30_000], kinds[k:k + 30_000])
    P, L, K, tol = d.result()
    assert len(P) <= 5000 and tol > 1e-6
    assert np.array_equal(P[0], pts[0]) and np.array_equal(P[-1], pts[-1])
    assert np.all(np.diff(L) > 0)  # in order, each point with its own line
    assert np.array_equal(pts[L - 1], P) and np.array_equal(kinds[L - 1], K)
    changes = np.nonzero(np.diff(kinds))[0]
    kept = set(L.tolist())
    assert all(int(lines[j]) in kept and int(lines[j + 1]) in kept for j in changes)  # both ends of every change
    seg = np.clip(np.searchsorted(L, lines, side="right") - 1, 0, len(L) - 2)  # the kept chord about each point
    a, d = P[seg], P[seg + 1] - P[seg]
    u = np.clip(np.einsum("ij,ij->i", pts - a, d) / np.maximum(np.einsum("ij,ij->i", d, d), 1e-300), 0, 1)
    assert np.linalg.norm(pts - a - u[:, None] * d, axis=1).max() <= 2 * tol
    drill = Decimator(cap=1000)  # a change of kind at every point: still bounded
    drill.add(pts[:50_000], lines[:50_000], (np.arange(50_000) % 2).astype(np.int8))
    assert len(drill.result()[0]) <= 1001


# -- whole programs ----------------------------------------------------------------------------------

def test_a_relief_is_accepted_with_figures_summed_from_the_interpreters_commands(tmp_path, ortho):
    _, planner, setup, origin = ortho
    path = str(relief(tmp_path / "r.ngc", lines=5000))
    got = check_program(path, program_reach(planner), setup, origin)
    canon = list(canon_stream(read_lines(path), setup, path=path))
    moves = [c for c in canon if c.kind in ("traverse", "feed", "arc")]
    assert got.motions["feed"] == sum(c.kind == "feed" for c in moves) and got.lines == len(open(path).read().splitlines()) - 1  # M30 ends it: '%' is not read
    feeds = [c for c in moves if c.kind == "feed"]
    length = [np.linalg.norm(c.end - c.start) for c in feeds]
    assert got.feed_length_m == pytest.approx(sum(length) * 1e-3, rel=1e-12)
    assert got.feed_time_s == pytest.approx(sum(d / c.feed * 60 for d, c in zip(length, feeds)), rel=1e-12)
    ends = np.array([origin + (c.end + c.offset) * 1e-3 for c in moves])
    assert np.all(got.box[0] <= ends.min(axis=0) + 1e-12) and np.all(got.box[1] >= ends.max(axis=0) - 1e-12)
    assert got.interpreted <= 8 and got.points >= len(moves)
    assert 100 < len(got.preview.points) <= 20_000 and got.preview.lines.max() <= got.lines
    s = got.summary()
    assert s["events"]["spindle"] >= 1 and s["preview_points"] == len(got.preview.points)


LINE = 90_000
ERRORS = {  # what is put at line 90,000, and what the refusal says
    "syntax": ("X1.2.3 Z-1", "cannot read the number 'X1.2.3'"),
    "unsupported word": ("G1 X10 A5", "A5 is not supported"),
    "modal": ("G2 X10 Y10", "G2 needs the centre"),
    "far outside": ("G1 X300 Y0 Z-100", "actuator q1 would be at 0.06"),  # the first sample past q1's end
    "actuator range": ("G1 X-70 Y-70 Z-150", "outside its range"),
}


@pytest.mark.parametrize("what", list(ERRORS))
def test_an_error_at_line_90000_is_refused_naming_it(what, long_relief, tmp_path, ortho):
    _, planner, setup, origin = ortho
    bad, why = ERRORS[what]
    lines = list(long_relief)
    lines[LINE - 1] = bad
    path = _program(tmp_path, "\n".join(lines))
    t0 = time.perf_counter()
    with pytest.raises(UserError) as e:
        check_program(path, program_reach(planner), setup, origin)
    took = time.perf_counter() - t0
    msg = str(e.value)
    assert msg.startswith(f"{path}: line {LINE}: ") and why in msg and "\n" not in msg, msg
    print(f"{what}: refused in {took * 1e3:.0f} ms: {msg}")


def test_the_first_of_two_errors_is_named_even_on_an_interpreter_line(tmp_path, ortho):
    """A point outside the workspace on a line only the interpreter runs (M8 on it), then a
    syntax error: the first is named (the interpreter's motions are checked before what follows)."""
    _, planner, setup, origin = ortho
    text = "G21 G90 G0 X0 Y0 Z0 F600\nG1 X1\nM8 G1 X300\nG1 X2\nG1 X1.2.3\nM2\n"
    with pytest.raises(UserError, match=r": line 3: actuator q1 would be at .* outside its range"):
        check_program(_program(tmp_path, text), program_reach(planner), setup, origin)


@pytest.mark.parametrize("text, why", [("", "empty program"), ("  \n\n", "empty program"),
                                       ("G21\nM3 S100\nM2\n", "the program has no motion"),
                                       ("G21\nG0 X1\n", "the program ends without M2 or M30 \\(line 2\\)")])
def test_programs_without_motion_or_end_are_refused(text, why, tmp_path, ortho):
    _, planner, setup, origin = ortho
    path = _program(tmp_path, text)
    with pytest.raises(UserError, match=f"^{path}: {why}"):
        check_program(path, program_reach(planner), setup, origin)


def test_pkrt_plan_refuses_line_90000_before_planning_and_check_reports_figures(long_relief, tmp_path, capsys):
    machine = str(placed_machine(tmp_path / "ortho.toml"))
    good = _program(tmp_path, "\n".join(long_relief))
    assert main(["plan", good, "--check", "--machine", machine, "--json"]) == 0
    import json

    r = json.loads(capsys.readouterr().out)
    assert r["lines"] > 100_000 and r["motions"]["feed"] > 99_000 and r["interpreted_lines"] <= 8
    lines = list(long_relief)
    lines[LINE - 1] = ERRORS["far outside"][0]
    bad = tmp_path / "bad.ngc"
    bad.write_text("\n".join(lines))
    for extra in ([], ["--check"]):
        t0 = time.perf_counter()
        code = main(["plan", str(bad), "--json", "--machine", machine, *extra])
        took = time.perf_counter() - t0
        err = capsys.readouterr().err
        assert code == 2 and err.startswith(f"pkrt: error: {bad}: line {LINE}: ") and err.count("\n") == 1, err
        assert took < 30  # refused by the check: planning 90,000 lines would take many minutes


@pytest.mark.parametrize("args, why", [(["--check"], "--check: give FILE"), (["--check", "--adept"], "--check: give FILE"),
                                       (["p.csv", "--check"], "--check is for G-code programs"),
                                       (["p.ngc", "--check", "-o", "out.csv"], "--check writes no reference"),
                                       (["missing.ngc", "--check"], "missing.ngc: no such file"),
                                       (["p.ngc", "--check", "--origin", "1,2"], "--origin: expected three")])
def test_pkrt_plan_check_refuses_what_it_cannot_do_in_one_line(args, why, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.ngc").write_text("G21 G90 F600\nG1 X1\nM2\n")
    (tmp_path / "p.csv").write_text("x,y,z\n0,0,0\n")
    assert main(["plan", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pkrt: error: ") and why in err and err.count("\n") == 1, err
