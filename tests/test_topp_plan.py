"""``pkrt plan`` and ``pkrt run --gcode`` end to end on the Orthoglide's example program: the
tool stays within the G64 tolerance of the programmed path (closed-form forward kinematics),
the feed is reached within 1 % where the planner finds it reachable, the planned CSV plays in
``pkrt run --traj`` and ``--gcode`` runs in lockstep without saturating a drive; a program asking
for more force than the machine has is refused before motion, naming its line."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from scipy.spatial import cKDTree

from pkrt.models.planning.gcode import parse_program
from pkrt.models.planning.geompath import Motion
from pkrt.rt.cli import main
from pkrt.rt.runtime.machine.refstream import csv_source
from pkrt.rt.runtime.machine.trajectory import load_trajectory_csv
from tests.orthoglide_oracle import orthoglide_fk
from tests.test_gcode import plan_refused

DEMO = str(resources.files("pkrt.models") / "machines" / "orthoglide-demo.ngc")
L = 0.31


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    d = tmp_path_factory.mktemp("plan")
    out, png = d / "planned.csv", d / "planned.png"
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "pkrt.rt.cli", "plan", DEMO, "-o", str(out), "--plot", str(png),
                        "--json"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), out, png


def _programmed_points(step: float = 2e-5) -> np.ndarray:
    """Dense points on the programmed path: the program with exact stops (no blends)."""
    text = Path(DEMO).read_text().replace("G64 P0.5", "G61")
    pts = []
    for it in parse_program(text, "demo").items:
        if isinstance(it, Motion):
            for g in it.segments:
                pts.append(g.eval(np.linspace(0, g.length, max(int(g.length / step), 2)))[0])
    return np.vstack(pts)


def test_planned_tool_path_within_the_g64_tolerance(planned):
    report, out, png = planned
    rows = np.loadtxt(out, delimiter=",", skiprows=1)
    tool = np.array([orthoglide_fk(th, L) for th in rows[::3, 1:4]])
    dist, _ = cKDTree(_programmed_points()).query(tool)
    assert dist.max() <= 0.5e-3 + 3e-5, dist.max()  # G64 P0.5, plus the dense sampling's spacing
    assert png.stat().st_size > 10_000
    assert report["duration_s"] == pytest.approx((len(rows) - 1) / 1000.0)


def test_feed_reached_within_1_percent_where_reachable(planned):
    report, _, _ = planned
    feeds = report["feeds"]
    assert {f["line"] for f in feeds} >= {6, 7, 8, 10, 11, 12}  # the G1, G2, G3 lines (N30 .. N90)
    for f in feeds:
        assert f["peak_speed_m_s"] <= f["feed_m_s"] * 1.01
        if f["feed_reachable"]:
            assert f["peak_speed_m_s"] >= f["feed_m_s"] * 0.99, f
    assert sum(f["feed_reachable"] for f in feeds) >= 5
    for what in ("velocity", "acceleration", "force"):
        assert set(report["binding"][what]) == {"q1", "q2", "q3"}


def test_planned_csv_plays_in_pkrt_run(planned, capsys):
    _, out, _ = planned
    code = main(["run", "--traj", str(out), "--lockstep", "--no-log", "--json"])
    r = json.loads(capsys.readouterr().out)
    assert code == 0 and r["fault"] is None and r["saturated_cycles"] == 0
    assert r["max_error"] < 1e-3


def test_run_gcode_in_lockstep(capsys):
    code = main(["run", "--gcode", DEMO, "--lockstep", "--no-log", "--json"])
    r = json.loads(capsys.readouterr().out)
    assert code == 0 and r["fault"] is None and r["saturated_cycles"] == 0
    assert r["max_error"] < 1e-3


def _weak_orthoglide(tmp_path: Path, tau_max: float) -> Path:
    src = resources.files("pkrt.models") / "machines" / "orthoglide-sim.toml"
    text = Path(src).read_text()
    mdir = Path(src).parent
    text = text.replace('tree = "orthoglide.pkt"', f'tree = "{mdir / "orthoglide.pkt"}"')
    text = text.replace('plant_tree = "orthoglide-plant.pkt"', f'plant_tree = "{mdir / "orthoglide-plant.pkt"}"')
    text = text.replace('tool_table = "orthoglide-tools.tbl"', f'tool_table = "{mdir / "orthoglide-tools.tbl"}"')
    text = text.replace("tau_max = 400.0", f"tau_max = {tau_max}")
    p = tmp_path / "weak.toml"
    p.write_text(text)
    return p


def test_planned_csv_carries_the_planned_velocities_and_accelerations(planned):
    """``-o`` writes t, positions, then ``<name>_vel`` and ``<name>_acc``: ``pkrt run --traj``
    (whole or streamed) reads them back exactly instead of differentiating a spline through
    the positions (which rounds off the time-optimal profile's corners)."""
    _, out, _ = planned
    with open(out) as f:
        head = f.readline().strip().split(",")
    assert head == ["t", "q1", "q2", "q3", "q1_vel", "q2_vel", "q3_vel", "q1_acc", "q2_acc", "q3_acc"]
    rows = np.loadtxt(out, delimiter=",", skiprows=1)
    pos, vel, acc = rows[:, 1:4], rows[:, 4:7], rows[:, 7:10]
    # the velocities are the positions' derivative (central differences at 1 kHz)...
    dt = rows[1, 0] - rows[0, 0]
    assert np.abs(np.gradient(pos, dt, axis=0) - vel)[1:-1].max() < 0.01 * np.abs(vel).max()
    # ... and each acceleration is the mean over its period (what the loop holds for one cycle)
    np.testing.assert_allclose(np.diff(vel, axis=0) / dt, acc[:-1], rtol=0, atol=1e-9 * np.abs(acc).max())
    tr = load_trajectory_csv(str(out), 1000.0, ["q1", "q2", "q3"])
    assert tr.n == len(rows)
    for got, want in ((tr.pos, pos), (tr.vel, vel), (tr.acc, acc)):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * max(1.0, np.abs(want).max()))
    src = csv_source(str(out), 1000.0, ["q1", "q2", "q3"])  # the streamed source pkrt run uses
    block = [np.empty((len(rows) + 5, 3)) for _ in range(3)]
    src.fill(0, *block)
    for got, want in zip(block, (tr.pos, tr.vel, tr.acc)):
        np.testing.assert_allclose(got[:len(rows)], want, rtol=0, atol=1e-12 * max(1.0, np.abs(want).max()))
    assert np.all(block[0][len(rows):] == pos[-1]) and np.all(block[1][len(rows):] == 0.0)


def test_a_state_csv_with_a_column_missing_is_refused_in_one_line(tmp_path, capsys):
    p = tmp_path / "short.csv"
    p.write_text("t,q1,q2,q3,q1_vel,q2_vel,q3_vel\n0,-0.1,-0.1,-0.1,0,0,0\n1,-0.1,-0.1,-0.1,0,0,0\n")
    code = main(["run", "--lockstep", "--no-log", "--traj", str(p)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "optionally followed by <name>_vel and <name>_acc" in err, err


def test_program_asking_too_much_force_is_refused_naming_its_line(tmp_path, capsys):
    cfg = _weak_orthoglide(tmp_path, 85.0)  # 76.5 N to plan with: holds the platform near home only
    prog = tmp_path / "heavy.ngc"
    prog.write_text("G21 G90\nG1 X-10 F600\nG1 X-100 Y-100 Z-100\nM2\n")
    for verb in (["plan", str(prog), "--json"], ["run", "--gcode", str(prog), "--lockstep", "--no-log"]):
        code = main(verb[:1] + ["--machine", str(cfg)] + verb[1:])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1, err
        assert "heavy.ngc: line 3: " in err and "force limits" in err, err


def test_csv_paths_task_and_actuator(tmp_path, capsys):
    task = tmp_path / "task.csv"
    task.write_text("x,y,z\n0,0,0\n0.02,0.01,-0.01\n0.04,0.0,-0.03\n")
    act = tmp_path / "act.csv"
    act.write_text("q1,q2,q3\n-0.1,-0.1,-0.1\n-0.05,-0.12,-0.1\n0.0,-0.1,-0.15\n")
    for path, first in ((task, None), (act, [-0.1, -0.1, -0.1])):
        out = tmp_path / f"{path.stem}-planned.csv"
        assert main(["plan", str(path), "-o", str(out), "--json"]) == 0
        r = json.loads(capsys.readouterr().out)
        rows = np.loadtxt(out, delimiter=",", skiprows=1)
        assert r["duration_s"] == pytest.approx(rows[-1, 0]) and r["duration_s"] > 0.05
        if first is None:  # the tool passes through every point of the task path
            tool = np.array([orthoglide_fk(th, L) for th in rows[:, 1:4]])
            for p in ([0, 0, 0], [0.02, 0.01, -0.01], [0.04, 0.0, -0.03]):
                assert np.linalg.norm(tool - p, axis=1).min() < 1e-4
        else:
            assert np.allclose(rows[0, 1:4], first) and np.allclose(rows[-1, 1:4], [0.0, -0.1, -0.15])


@pytest.mark.parametrize("text, expected", [
    ("t,x,y,z\n0,0,0,0\n1,0.01,0,0\n", "no t: the planner times it"),
    ("x,y,z\n0,0,0\n", "at least 2 points"),
    ("x,y,z\n0,0,0\n0,0,0\n", "each distinct"),
    ("x,y,z\n0,0,0\n0.01,nan,0\n", "finite numbers"),
    ("x,y,z\n0,0,0\n0.01,abc,0\n", "not a number"),
])
def test_bad_csv_paths(text, expected, tmp_path, capsys):
    p = tmp_path / "bad.csv"
    err = plan_refused(p, text, capsys)
    assert expected in err and str(p) in err, err


@pytest.mark.parametrize("margin,smooth", [(0.0, 0.0), (0.0, 0.002), (0.5, 0.0)])
def test_adept_cycle_keeps_every_limit_at_any_margin(margin, smooth, tmp_path, capsys):
    """``pkrt plan --adept --machine delta --margin M --smooth S``: planned at every margin in
    [0, 1), 0 included, and every loop-rate sample of the written reference keeps every
    planning limit (the limits times 1 - margin): velocity and acceleration from the CSV,
    forces recomputed along it from the planner's own tree with the friction it feeds forward."""
    from pkrt.models.planning.topp import PlanLimits, TreeDynamics, forces
    from pkrt.rt.runtime.machine.config import load_machine
    from pkrt.rt.runtime.machine.runsetup import load_controller_tree

    out = tmp_path / "adept.csv"
    code = main(["plan", "--adept", "--machine", "delta", "--margin", str(margin), "--smooth", str(smooth),
                 "-o", str(out), "--json"])
    r = json.loads(capsys.readouterr().out)
    assert code == 0
    cfg = load_machine("delta")
    lim = PlanLimits.from_config(cfg, margin)
    vl, al, fl = lim.planning
    rows = np.loadtxt(out, delimiter=",", skiprows=1)
    pos, vel, acc = rows[:, 1:4], rows[:, 4:7], rows[:, 7:10]
    tau = forces(TreeDynamics(load_controller_tree(cfg)), pos, vel, acc, lim)
    rnd = 1 + 1e-9  # the CSV's decimal digits
    assert np.all(np.abs(vel) <= vl * rnd) and np.all(np.abs(acc) <= al * rnd)
    assert np.all(np.abs(tau) <= fl * rnd), np.abs(tau).max(axis=0)
    # time-optimal: some limit binds (within 1 %)
    assert max(np.abs(vel).max() / vl.max(), np.abs(acc).max() / al.max(), np.abs(tau).max() / fl.max()) > 0.99
    assert r["duration_s"] == pytest.approx((len(rows) - 1) / 1000.0)
