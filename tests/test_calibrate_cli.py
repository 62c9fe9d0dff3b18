"""``pkrt calibrate plan``, ``pkrt run --measure`` and ``pkrt calibrate`` end to end on an
Orthoglide whose geometry differs from its description everywhere (the simulated plant runs the
truth, lockstep at 250 Hz), and every refusal in one line (exit 2)."""

from __future__ import annotations

import contextlib
import io
import json
import tomllib
from pathlib import Path

import numpy as np
import pytest

from pkrt.models.calibration.output import random_change
from pkrt.models.calibration.problem import Problem
from pkrt.models.kinematics.description import load_description
from pkrt.models.kinematics.mechanism import load_mechanism
from pkrt.rt.bench.bench_calibrate import NOISE, truth_machine, truth_of
from pkrt.rt.cli import main

POSE = [1.2, -0.8, 0.5, 0.05, -0.1, 2.0]  # the simulated tracker, unknown to the fit


def _run(argv, capsys) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _error(argv, capsys) -> str:
    code, _, err = _run(argv, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("pkrt: error:"), (code, err)
    return lines[0]


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """A 30-pose plan run on the truth plant with the simulated instrument: (folder, the truth's
    machine configuration, log, readings, plan report, run summary, truth's change, problem)
    (capsys is per test: the module's runs print into buffers)."""
    folder = tmp_path_factory.mktemp("calibrate")
    mech = load_mechanism("orthoglide")
    problem = Problem(mech, False, *NOISE)
    change = random_change(problem.params, np.random.default_rng(17))
    truth = folder / "truth.toml"
    truth_of(problem, change, truth)
    cfg = truth_machine("orthoglide", folder, truth, POSE, seed=3)
    poses = folder / "poses.csv"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["calibrate", "plan", str(cfg), "-o", str(poses), "--poses", "30", "--candidates", "150",
                     "--json"]) == 0
    plan = json.loads(buf.getvalue())
    log, meas = folder / "run.pktlog", folder / "measured.csv"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["run", "--machine", str(cfg), "--traj", str(poses), "--log", str(log), "--no-rt", "--rate", "250",
                     "--measure", str(meas), "--json"]) == 0
    run = json.loads(buf.getvalue())
    return folder, cfg, log, meas, plan, run, change, problem


def test_plan_run_and_calibrate(measured, capsys):
    folder, cfg, log, meas, plan, run, change, problem = measured
    assert plan["poses"] == 30 and len(plan["dwells"]) == 30 and plan["base_parameters"] == 30
    assert plan["observability"]["o1_over_random"] > 1.0
    assert run["measure"]["readings"] == 30 and not run["fault"]
    head = [ln for ln in meas.read_text().splitlines() if not ln.startswith("#")]
    assert head[0] == "dwell,t,x,y,z" and len(head) == 31
    for d, row in zip(plan["dwells"], head[1:]):  # the reading at the end of each planned rest
        t = float(row.split(",")[1])
        assert d["t_start"] < t <= d["t_end"]
    out = folder / "calibrated.toml"
    code, text, err = _run(["calibrate", str(log), str(meas), "--machine", str(cfg), "-o", str(out), "--json",
                            "--plot", str(folder / "cal.png")], capsys)
    assert code == 0, err
    r = json.loads(text)
    assert r["fit_poses"] == 24 and r["held_out_poses"] == 6 and r["base_parameters"] == 30
    ho = r["rms"]["held_out"]
    # six held-out readings, each with the instrument's noise: calibrated within a few times it,
    # the description over ten times further
    assert ho["calibrated"]["position_m"] < 4 * NOISE[0], ho
    assert ho["cad"]["position_m"] > 10 * ho["calibrated"]["position_m"], ho
    assert r["rms"]["fit"]["calibrated"]["position_m"] < 2 * NOISE[0]
    assert np.allclose(r["tracker_pose"][:3], POSE[:3], atol=0.02)  # the frame found, to the machine's gauge
    assert r["written_reproduces_fit_m"] < 1e-9
    desc = load_description(str(out))
    assert [b.mass for b in desc.bodies] == [b.mass for b in load_description("orthoglide").bodies]
    table = tomllib.loads(out.read_text())["calibration"]
    assert table["software"] == "pkrt calibrate" and len(table["parameters"]) == 24
    machine = tomllib.loads((folder / "calibrated-machine.toml").read_text())
    assert machine["machine"]["model"] == str(out.resolve()) and machine["machine"]["tree"].endswith("calibrated.pkt")
    assert (folder / "cal.png").stat().st_size > 10000
    code, text, _ = _run(["calibrate", str(log), str(meas), "--machine", str(cfg), "-o", str(folder / "c2.toml")],
                         capsys)
    assert code == 0 and "held out: position RMS" in text and "not identifiable" in text


def _rows(meas: Path) -> list[str]:
    return meas.read_text().splitlines()


def test_readings_that_do_not_match_the_log(measured, capsys, tmp_path):
    folder, cfg, log, meas, *_ = measured
    base = ["calibrate", str(log), None, "--machine", str(cfg), "-o", str(tmp_path / "x.toml")]
    lines = _rows(meas)
    bad = tmp_path / "m.csv"

    def attempt(text: str) -> str:
        bad.write_text(text)
        return _error([*base[:2], str(bad), *base[3:]], capsys)

    last = lines[-1].split(",")
    assert "do not match the log's dwells" in attempt("\n".join(lines + ["99," + ",".join(last[1:])]) + "\n")
    moved = lines[-1].split(",")
    moved[1] = "0.001"
    assert "outside that dwell" in attempt("\n".join(lines[:-1] + [",".join(moved)]) + "\n")
    assert "read twice" in attempt("\n".join(lines + [lines[-1]]) + "\n")
    assert "expected the header" in attempt("a,b,c\n1,2,3\n")
    assert "not a number" in attempt("dwell,t,x,y,z\n1,0.5,x,0,0\n")
    assert "too few poses" in attempt("\n".join(lines[:8]) + "\n")
    with_rpy = [lines[i] if not lines[i][0].isdigit() else lines[i] + ",0,0,0" for i in range(len(lines))]
    with_rpy = [ln.replace("dwell,t,x,y,z", "dwell,t,x,y,z,roll,pitch,yaw") for ln in with_rpy]
    assert "position coordinates only" in attempt("\n".join(with_rpy) + "\n")


def test_a_fit_that_ends_on_a_bound(measured, capsys, tmp_path):
    """The truth's scales differ by up to 2e-3: bounded to 1e-4, the fit stops on one (named)."""
    folder, cfg, log, meas, *_ = measured
    msg = _error(["calibrate", str(log), str(meas), "--machine", str(cfg), "-o", str(tmp_path / "x.toml"),
                  "--max-scale", "1e-4"], capsys)
    assert "the fit ends on a bound: parameter q" in msg and ".scale moved 0.0001 (scale)" in msg


def test_a_log_without_dwells(capsys, tmp_path):
    """A run log whose reference never rests (a Fourier motion)."""
    from tests.identify_data import write_log

    mech = load_mechanism("orthoglide")
    log = tmp_path / "moving.pktlog"
    write_log(log, mech, mech, duration=1.0)
    meas = tmp_path / "m.csv"
    meas.write_text("dwell,t,x,y,z\n" + "".join(f"{i},0.5,0,0,0\n" for i in range(1, 20)))
    msg = _error(["calibrate", str(log), str(meas), "--machine", "orthoglide", "-o", str(tmp_path / "x.toml")], capsys)
    assert "no dwells" in msg


def test_measure_needs_the_simulated_plant_and_a_log(capsys, tmp_path):
    msg = _error(["run", "--machine", "orthoglide-can", "--measure", str(tmp_path / "m.csv")], capsys)
    assert "--measure" in msg and "cia402" in msg
    msg = _error(["run", "--lockstep", "--no-log", "--measure", str(tmp_path / "m.csv")], capsys)
    assert "drop --no-log" in msg
    msg = _error(["calibrate", "plan", "orthoglide", "-o", str(tmp_path / "p.csv"), "--poses", "10", "--candidates",
                  "150"], capsys)
    assert "ask for at least" in msg
