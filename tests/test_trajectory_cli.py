"""Trajectories (quintic moves, Orthoglide Cartesian paths, CSV files) and the CLI contract
(exit codes, one-line errors, negative vector values both ways)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from pkrt.rt.cli import main
from pkrt.rt.core.errors import UserError
from pkrt.rt.core.plan import cartesian_path
from pkrt.rt.runtime.machine.trajectory import load_trajectory_csv, plan_moves, quintic_duration
from tests.orthoglide_oracle import orthoglide_demo, orthoglide_fk, orthoglide_ik

L = 0.31


def test_quintic_moves_are_smooth_and_exact_at_ends():
    p = plan_moves(np.array([[0.0, 0.0], [0.1, -0.2]]), [0.5], 1000.0)
    assert np.allclose(p.pos[0], 0) and np.allclose(p.pos[-1], [0.1, -0.2])
    assert np.allclose(p.vel[[0, -1]], 0) and np.allclose(p.acc[[0, -1]], 0, atol=1e-12)
    assert np.allclose(np.gradient(p.pos, 1e-3, axis=0)[1:-1], p.vel[1:-1], atol=3e-5)
    T = quintic_duration(np.array([0.1]), np.array([0.5]), np.array([100.0]))
    assert T == pytest.approx(1.875 * 0.1 / 0.5)


def test_orthoglide_ik_matches_reference_closed_forms():
    P = np.array([[-0.16075311] * 3, [0.08319468] * 3])
    th, _, _ = orthoglide_ik(P, np.zeros_like(P), np.zeros_like(P), L)
    assert np.allclose(th, [[-0.26] * 3, [0.06] * 3], atol=1e-8)
    assert np.allclose(orthoglide_fk(np.array([0.06] * 3), L), [0.08319468] * 3, atol=1e-8)


def test_cartesian_circle_speed_and_ik_derivatives():
    P, Pd, Pdd = cartesian_path("circle", 1000.0, centre=[-0.05] * 3, diameter=0.1, normal=(1, 1, 1),
                                speed=0.5, ramp=0.25, laps=1.0)
    assert np.linalg.norm(Pd, axis=1).max() == pytest.approx(0.5, rel=1e-9)
    assert np.allclose(np.linalg.norm(P - (-0.05), axis=1), 0.05)
    th, thd, thdd = orthoglide_ik(P, Pd, Pdd, L)
    assert np.allclose(np.gradient(th, 1e-3, axis=0)[1:-1], thd[1:-1], atol=2e-5)
    assert np.allclose(np.gradient(thd, 1e-3, axis=0)[2:-2], thdd[2:-2], atol=5e-2)


def test_demo_is_continuous():
    p = orthoglide_demo(1000.0)
    assert np.abs(np.diff(p.pos, axis=0)).max() < 1e-3
    assert np.allclose(np.gradient(p.pos, 1e-3, axis=0)[1:-1], p.vel[1:-1], atol=1e-4)


def test_csv_trajectory_resampled(tmp_path):
    f = tmp_path / "t.csv"
    t = np.linspace(0, 1, 11)
    rows = ["t,q1,q2,q3"] + [f"{x},{-0.1 + 0.01 * x},{-0.1},{-0.1 - 0.01 * x}" for x in t]
    f.write_text("\n".join(rows) + "\n")
    p = load_trajectory_csv(str(f), 1000.0, ["q1", "q2", "q3"])
    assert p.n == 1001 and np.allclose(p.pos[-1], [-0.09, -0.1, -0.11])


@pytest.mark.parametrize("text,msg", [
    ("q1,q2,q3\n1,2,3\n2,3,4\n", "first column must be 't'"),
    ("t,a,b,c\n0,1,2,3\n1,2,3,4\n", "columns must be"),
    ("t,q1,q2,q3\n0,1,2,3\n0,2,3,4\n", "time must increase"),
    ("t,q1,q2,q3\n0,1,x,3\n1,2,3,4\n", "row 2: expected a number, got .x."),
    ("t,q1,q2,q3\n0,1,2,3\n", "at least 2 rows"),
    ("t,q1,q2,q3\n0,1,2\n1,2,3,4\n", "row 2 has 3 columns, expected 4"),  # was numpy's 'inhomogeneous shape'
])
def test_bad_csv_trajectories(tmp_path, text, msg):
    f = tmp_path / "bad.csv"
    f.write_text(text)
    with pytest.raises(UserError, match=msg):
        load_trajectory_csv(str(f), 1000.0, ["q1", "q2", "q3"])


def test_negative_vectors_both_ways(capsys):
    for argv in (["model", "eval", "fourbar", "--theta", "-0.5", "--json"],
                 ["model", "eval", "fourbar", "--theta=-0.5", "--json"]):
        assert main(argv) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["theta"] == [-0.5]
    assert main(["model", "eval", "orthoglide", "--theta", "-0.1,0.02,-0.2", "--theta-dot", "-1,0,1",
                 "--theta-ddot=-1,-2,-3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"H", "D", "p_ext", "h", "tau"}


@pytest.mark.parametrize("argv,msg", [
    (["frobnicate"], "unknown verb"),
    (["model", "eval", "fourbar", "--theta", "a,b"], "comma-separated numbers"),
    (["model", "eval", "fourbar"], "--theta"),
    (["run", "--machine", "/nonexistent.toml"], "no such machine"),
    (["run", "--lockstep", "--traj", "/nonexistent.csv", "--no-log"], "cannot read trajectory"),
    (["run", "--lockstep", "--rate", "0"], "--rate"),
    (["run", "--lockstep", "--inject", "boom@1"], "unknown fault"),
])
def test_usage_errors_exit_2_with_one_line(capsys, argv, msg):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("pkrt: error: ") and msg in err and len(err.strip().splitlines()) == 1


def test_console_script_exit_codes(tmp_path):
    exe = [sys.executable, "-m", "pkrt.rt.cli"]
    r = subprocess.run(exe + ["model", "check", str(tmp_path / "missing.toml")], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.startswith("pkrt: error:")
    r = subprocess.run(exe + ["run", "--lockstep", "--no-log", "--duration", "1", "--inject", "nan@0.3", "--json"],
                       capture_output=True, text=True)
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    assert "non-finite feedback" in out["fault"] and out["torque_off_cycle"] == out["fault_cycle"] == 300
    assert r.stderr.startswith("pkrt: error: run stopped at cycle 300")


def test_main_job_json(tmp_path):
    log = tmp_path / "demo.pktlog"
    r = subprocess.run([sys.executable, "-m", "pkrt.rt.cli", "run", "--lockstep", "--json", "--log", str(log)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for key in ("rms_error", "max_error", "cycles", "overruns", "faults", "compute_us", "wake_latency_us",
                "realtime_factor"):
        assert key in out
    assert out["faults"] == 0 and out["rms_error"] < 1e-4
    assert log.exists() and (tmp_path / "demo.png").exists()


def test_model_check_reports_structure(capsys):
    assert main(["model", "check", "fourbar", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert (r["coordinates"], r["constraints"], r["redundant_constraints"], r["mobility"]) == (18, 20, 3, 1)
    assert r["singularity_measure"] > r["singular_threshold"]
    assert main(["model", "check", "orthoglide"]) == 0
    assert "mobility 3 = actuators 3" in capsys.readouterr().out


def test_model_eval_tree_matches_model(capsys):
    from pathlib import Path

    tree = Path(__file__).resolve().parent.parent / "models" / "machines" / "orthoglide.pkt"
    args = ["--theta", "-0.1,0.02,-0.2", "--theta-dot", "0.1,-0.2,0.3", "--theta-ddot", "1,2,-3", "--json"]
    assert main(["model", "eval", "orthoglide", *args]) == 0
    exact = json.loads(capsys.readouterr().out)
    assert main(["model", "eval", str(tree), *args]) == 0
    approx = json.loads(capsys.readouterr().out)
    for key in ("H", "D", "p_ext", "h", "tau"):
        a, b = np.array(exact[key]), np.array(approx[key])
        assert np.max(np.abs(a - b)) <= 0.01 * np.max(np.abs(a)), key
    # outside the tree's box: clamped and said so
    assert main(["model", "eval", str(tree), "--theta", "0.5,0,0", "--json"]) == 0
    assert "clamped" in json.loads(capsys.readouterr().out)["warning"]


def test_csv_trajectory_keeps_its_last_sample(tmp_path):
    """1.001 * 1000 is 1000.9999999999999 in floating point: the resampled plan must still
    end at the file's last time and point (floor without a tolerance dropped it)."""
    f = tmp_path / "t.csv"
    f.write_text("t,q1,q2,q3\n0,-0.1,-0.1,-0.1\n0.5,-0.09,-0.1,-0.1\n1.001,-0.08,-0.1,-0.1\n")
    p = load_trajectory_csv(str(f), 1000.0, ["q1", "q2", "q3"])
    assert p.n == 1002 and p.duration == pytest.approx(1.001)
    assert np.allclose(p.pos[-1], [-0.08, -0.1, -0.1]) and np.allclose(p.vel[-1], 0.0)


def test_overlong_trajectories_are_refused_before_allocating(tmp_path):
    """A CSV in milliseconds (or --duration 1e6) planned 10^9 samples per array: the process
    ate the machine's memory instead of saying no."""
    f = tmp_path / "ms.csv"
    f.write_text("t,q1,q2,q3\n0,-0.1,-0.1,-0.1\n1000000,-0.1,-0.1,-0.1\n")
    with pytest.raises(UserError, match="samples"):
        load_trajectory_csv(str(f), 1000.0, ["q1", "q2", "q3"])
    p = load_trajectory_csv(_ok(tmp_path), 1000.0, ["q1", "q2", "q3"])
    with pytest.raises(UserError, match="samples"):
        p.extended(1e6)


def _ok(tmp_path):
    f = tmp_path / "ok.csv"
    f.write_text("t,q1,q2,q3\n0,-0.1,-0.1,-0.1\n1,-0.1,-0.1,-0.1\n")
    return str(f)
