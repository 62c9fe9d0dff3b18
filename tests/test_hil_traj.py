"""``pkrt hil --traj``: a planned trajectory (the Delta's time-optimal Adept cycle, written by
``pkrt plan -o``) run over CAN at 1 kHz in the default stepped timing, through the CiA 402 driver
and the drive emulator in its own process: no fault, every commanded force within the limit,
tracking within 1.2x of the lockstep simulation of the same file; bad options are one line."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from pkrt.drivers.sim import Plant, SimDrives
from pkrt.rt.runtime.machine.config import load_machine
from pkrt.rt.runtime.machine.runsetup import load_controller_tree, plan_trajectory
from pkrt.rt.runtime.machine.run import run_session

from .realtime import judge

MACHINE = "delta-can"


def _pkrt(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "pkrt.rt.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    path = tmp_path_factory.mktemp("hil-traj") / "planned.csv"
    out = _pkrt("plan", "--machine", MACHINE, "--adept", "-o", str(path))
    assert out.returncode == 0, out.stderr
    return str(path)


@pytest.mark.realtime
def test_planned_adept_cycle_in_hil_within_the_force_limit(planned, host_probe):
    def run():
        out = _pkrt("hil", "--bus", "can", "--machine", MACHINE, "--traj", planned, "--json")
        r = json.loads(out.stdout)
        r["returncode"], r["stderr"] = out.returncode, out.stderr
        return r

    r = judge(run, host_probe)
    assert r["returncode"] == 0, r["stderr"]
    assert r["fault"] is None and r["emulator_error"] is None and r["timing"] == "stepped"
    rows = len(np.loadtxt(planned, delimiter=",", skiprows=1))
    assert r["cycles"] == rows == r["driver"]["syncs"]  # the trajectory's own length, not the demo's 5 s
    config = load_machine(MACHINE)
    tau_max = config.controller.tau_max
    assert r["saturated_cycles"] == 0
    assert len(r["peak_force"]) == 3 and np.all(np.array(r["peak_force"]) <= tau_max)
    tree = load_controller_tree(config)
    plan = plan_trajectory(config, tree, planned, None)
    sim = run_session(config, SimDrives(Plant.from_config(config)), trajectory=plan, tree=tree, lockstep=True)
    assert sim["fault"] is None
    assert r["rms_error"] <= 1.2 * sim["rms_error"], (r["rms_error"], sim["rms_error"])
    assert r["max_error"] <= 1.2 * sim["max_error"] + 1e-5, (r["max_error"], sim["max_error"])


@pytest.mark.parametrize("args, message", [
    (["--traj", "no-such.csv"], "--traj no-such.csv: no such file"),
    (["--traj", "PLANNED", "--gcode", "PLANNED"], "give --traj or --gcode, not both"),
    (["--traj", "GARBLED"], "GARBLED"),
])
def test_bad_trajectory_options_are_one_line(planned, tmp_path, args, message):
    garbled = tmp_path / "garbled.csv"
    garbled.write_bytes(b"t,theta1,theta2,theta3\n0,1,2\n\x00\xff,nan\n")
    sub = {"PLANNED": planned, "GARBLED": str(garbled)}
    out = _pkrt("hil", "--bus", "can", "--machine", MACHINE, *[sub.get(a, a) for a in args], timeout=120)
    assert out.returncode == 2, (out.returncode, out.stderr)
    err = out.stderr.strip()
    assert err.startswith("pkrt: error: ") and "\n" not in err and "Traceback" not in err, err
    assert message.replace("GARBLED", str(garbled)) in err or (message == "GARBLED" and str(garbled) in err), err
