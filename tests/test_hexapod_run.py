"""The hexapod under control (issues 10 and 11): its shipped configuration (hexapod-sim.toml:
the controller on the hexapod tree, the simulated plant on the exact reduction at every RK4
stage, the reference's friction and 2000 N force limit, a circle with a roll oscillation as
its demo), in lockstep as its configuration asks. The reference is planned once (the model's
inverse kinematics: about 6 s) and every run uses the real plant through ``open_drives``, as
``pkrt run`` does; one run goes through ``pkrt run`` itself."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from pkrt.rt.cli import main
from pkrt.rt.runtime.machine.config import MACHINES_DIR, load_machine
from pkrt.rt.runtime.record.logfile import read_log

from .plans import demo_reference


@pytest.fixture(scope="module")
def hexapod():
    from pkrt.rt.app.reference import machine_mechanism

    config = load_machine("hexapod")
    mech = machine_mechanism(config)
    return config, mech, demo_reference(config, mech)


def _run(hexapod, tmp_path, name: str, controller: str = "ct", mass_scale: float = 1.0, model: str = "tree"):
    """A lockstep run on the exact plant; the summary with the tool error (mm) from its log."""
    from pkrt.drivers import open_drives
    from pkrt.rt.app.reference import ExactInLoop, exact_model
    from pkrt.rt.app.toolchannels import tool_channels, tool_error
    from pkrt.rt.runtime.machine.run import run_session

    config, mech, plan = hexapod
    loop_model = None
    if model == "exact":
        config = dataclasses.replace(config, controller=dataclasses.replace(config.controller, model="exact"))
        loop_model, _ = exact_model(config, plan, lockstep=True)
    drives = open_drives(config, {"mass_scale": mass_scale}, plant_model=ExactInLoop(mech))
    log = tmp_path / f"{name}.pktlog"
    r = run_session(config, drives, trajectory=plan, lockstep=True, log_path=str(log), controller=controller,
                    model=loop_model)
    r["tool_error"] = tool_error(tool_channels(read_log(str(log)))[0])
    return r


@pytest.fixture(scope="module")
def runs(hexapod, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hexapod")
    out = {}
    for name, kw in {"ct": {}, "pd": {"controller": "pd"}, "ct_heavy": {"mass_scale": 1.1},
                     "pd_heavy": {"controller": "pd", "mass_scale": 1.1}, "exact": {"model": "exact"}}.items():
        out[name] = _run(hexapod, tmp, name, **kw)
    return out


def test_the_demo_stays_well_inside_the_box_and_the_limits(hexapod):
    """The planned demo (2601 cycles) keeps the legs within a third of the +/-0.08 m box and its
    peak velocity and acceleration under 75 % of [limits] (measured 0.21 m/s, 2.1 m/s^2)."""
    config, _, plan = hexapod
    assert plan.n == 2601
    assert np.abs(plan.pos).max() < 0.08 / 3
    assert np.abs(plan.vel).max() < 0.75 * config.limits.velocity.min()
    assert np.abs(plan.acc).max() < 0.75 * config.limits.acceleration.min()


def test_the_plant_is_the_exact_model(runs):
    r = runs["ct"]
    assert r["drives"]["plant"] == "exact" and r["drives"]["plant_model"].endswith("hexapod.toml")
    assert "plant_tree" not in r["drives"] and r["drives"]["force_limit"] == 2000.0
    assert r["drives"]["viscous"] == 50.0 and r["drives"]["coulomb"] == 10.0


def test_computed_torque_beats_pd_tenfold(runs):
    """Same gains (10 Hz bandwidth), same plant, the whole demo (2601 cycles), no saturation:
    computed torque on the tree tracks more than 10x better than PD plus gravity (RMS over the
    legs; measured 31x: 0.0045 vs 0.137 mm); with the plant 10 % heavier both still run, and
    the mismatch costs computed torque its margin: a gravity offset (measured 0.231 mm against
    PD's 0.163 mm; reported, not ordered)."""
    for r in runs.values():
        assert r["fault"] is None and r["saturated_cycles"] == 0 and r["cycles"] == 2601, r["fault"]
    ct, pd = runs["ct"], runs["pd"]
    assert ct["rms_error"] * 10 < pd["rms_error"], (ct["rms_error"], pd["rms_error"])
    assert ct["tool_error"]["rms_m"] * 10 < pd["tool_error"]["rms_m"]
    heavy_ct, heavy_pd = runs["ct_heavy"], runs["pd_heavy"]
    assert heavy_ct["rms_error"] > 10 * ct["rms_error"] and heavy_pd["rms_error"] > pd["rms_error"]
    assert max(heavy_ct["max_error"], heavy_pd["max_error"]) < 0.1 * 0.01  # a tenth of the following-error limit


def test_tree_tracks_within_twice_the_exact_model_in_the_loop(runs):
    """Issue 11: the hexapod tree as the model in the loop tracks within 2x of the exact
    reduction in the loop (same plant, same reference), at the legs and at the tool (measured
    1.9x at the legs: 0.0045 vs 0.0023 mm RMS; 1.4x at the tool)."""
    tree, exact = runs["ct"], runs["exact"]
    assert exact["model"] == "exact" and tree["model"] == "tree" and exact["fault"] is None
    assert tree["rms_error"] <= 2.0 * exact["rms_error"], (tree["rms_error"], exact["rms_error"])
    assert tree["tool_error"]["rms_m"] <= 2.0 * exact["tool_error"]["rms_m"]


def test_the_exact_plant_is_converged_in_its_substeps(hexapod, tmp_path):
    """Twice the RK4 substeps of the shipped plant (2 -> 4) change the computed-torque tracking
    by less than 2 % RMS over the first 0.8 s (the approach and the start of the circle)."""
    from pkrt.drivers import open_drives
    from pkrt.rt.app.reference import ExactInLoop
    from pkrt.rt.core.plan import Planned
    from pkrt.rt.runtime.machine.run import run_session

    config, mech, plan = hexapod
    short = Planned(plan.rate_hz, plan.pos[:800], plan.vel[:800], plan.acc[:800])
    rms = []
    for substeps in (2, 4):
        drives = open_drives(config, {"substeps": substeps}, plant_model=ExactInLoop(mech))
        rms.append(run_session(config, drives, trajectory=short, lockstep=True)["rms_error"])
    assert abs(rms[0] - rms[1]) < 0.02 * rms[1], rms


def test_pkrt_run_machine_hexapod_end_to_end(tmp_path, capsys):
    """`pkrt run --machine hexapod` without --lockstep: lockstep by its configuration (said in the
    summary and the text), the exact plant, the tool error at the platform centre reported."""
    log = tmp_path / "h.pktlog"
    code = main(["run", "--machine", "hexapod", "--duration", "0.1", "--log", str(log)])  # the text: short
    out = capsys.readouterr().out
    assert code == 0, out
    assert "lockstep (by the configuration: [drives] lockstep = true)" in out
    assert "at the tool (forward kinematics of the log): RMS" in out
    code = main(["run", "--machine", "hexapod", "--duration", "1.0", "--log", str(log), "--json", "--no-rt"])
    r = json.loads(capsys.readouterr().out)
    assert code == 0 and r["lockstep"] and r["lockstep_by"] == "[drives] lockstep = true"
    assert r["cycles"] == 1001 and r["fault"] is None and r["drives"]["plant"] == "exact"
    te = r["tool_error"]
    assert te["samples"] == 1001 and 0 < te["rms_m"] <= te["max_m"] < 1e-3


def _hexapod_file(tmp_path, edit) -> str:
    text = (MACHINES_DIR / "hexapod-sim.toml").read_text()
    text = text.replace('"hexapod"', f'"{MACHINES_DIR / "hexapod.toml"}"')
    text = text.replace('"hexapod.pkt"', f'"{MACHINES_DIR / "hexapod.pkt"}"')
    path = tmp_path / "h.toml"
    path.write_text(edit(text))
    return str(path)


@pytest.mark.parametrize("edit,message", [
    (lambda t: t.replace('plant = "exact"', f'plant = "exact"\nplant_tree = "{MACHINES_DIR / "hexapod.pkt"}"'),
     "[drives], field 'plant': give plant = \"exact\" or plant_tree, not both"),
    (lambda t: t.replace('plant = "exact"', ""), "[drives], field 'plant': missing: give plant_tree = FILE"),
    (lambda t: t.replace('plant = "exact"', 'plant = "tree"'), "[drives], field 'plant': expected one of 'exact'"),
])
def test_plant_field_errors_are_one_line(tmp_path, capsys, edit, message):
    code = main(["run", "--machine", _hexapod_file(tmp_path, edit), "--no-log", "--duration", "0.1"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err and "Traceback" not in err, err


def test_exact_plant_without_its_model_is_one_line(tmp_path):
    """The drivers never build the exact model: without it (pkrt replay, a bench) the plant is
    refused with the reason."""
    from pkrt.drivers import open_drives
    from pkrt.drivers.base import DriveConfigError

    with pytest.raises(DriveConfigError, match=r"\[drives\], field 'plant': \"exact\" needs the exact model"):
        open_drives(load_machine(_hexapod_file(tmp_path, lambda t: t)))


def test_exact_plant_for_a_hil_emulator_is_one_line(tmp_path, capsys):
    """The HIL emulators run on trees: [emulator] plant = "exact" is refused when the file loads."""
    text = (MACHINES_DIR / "orthoglide-can.toml").read_text()
    assert 'plant_tree = "orthoglide-plant.pkt"' in text
    text = text.replace('plant_tree = "orthoglide-plant.pkt"', 'plant = "exact"')
    text = text.replace('"orthoglide.pkt"', f'"{MACHINES_DIR / "orthoglide.pkt"}"')
    text = text.replace('model = "orthoglide"', f'model = "{MACHINES_DIR / "orthoglide.toml"}"')
    path = tmp_path / "can.toml"
    path.write_text(text)
    code = main(["hil", "--bus", "can", "--interface", "virtual", "--machine", str(path), "--duration", "0.2"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "[emulator], field 'plant': the HIL emulators run their plant on a tree: give plant_tree" in err


def test_fault_injection_on_the_exact_plant(capsys):
    """The exact plant takes the sim faults as the tree plant does: 300 N pushed on every leg from
    t = 0.3 s drives the platform past a limit, a safe stop, exit 1 with one line."""
    code = main(["run", "--machine", "hexapod", "--no-log", "--duration", "0.8", "--inject", "push@0.3=300"])
    captured = capsys.readouterr()
    assert code == 1 and len(captured.err.strip().splitlines()) == 1, captured.err
    assert "run stopped at cycle" in captured.err and "limit" in captured.err
    assert "fault: " in captured.out
