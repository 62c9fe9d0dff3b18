"""The Delta under control (issue 10): its shipped configuration (delta-sim.toml: the Adept
cycle at 0.5 s as its demo, the reference's friction and 20 N m torque limit), in lockstep on
the simulated plant (the plant tree, 44x more accurate in tau than the controller's), through
`pkrt run` as a user runs it; and the Orthoglide's [demo] table planned from the model equals
its closed-form demo (the oracle of the reference)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pkrt.rt.cli import main
from pkrt.rt.runtime.record.logfile import read_log
from tests.orthoglide_oracle import orthoglide_demo
from tests.test_delta_hexapod import delta_fk

from .plans import demo_reference


def _run(capsys, *args) -> dict:
    code = main(["run", "--machine", "delta", "--lockstep", "--json", *args])
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


def test_orthoglide_demo_table_is_the_closed_form_demo():
    """The [demo] of orthoglide-sim.toml, planned by the model's inverse kinematics, is the
    demo the closed forms planned (so the Orthoglide's lockstep figures stay)."""
    from pkrt.rt.runtime.machine.config import load_machine

    plan, oracle = demo_reference(load_machine("orthoglide")), orthoglide_demo(1000.0)
    assert plan.n == oracle.n
    assert np.abs(plan.pos - oracle.pos).max() < 1e-10
    assert np.abs(plan.vel - oracle.vel).max() < 1e-9
    assert np.abs(plan.acc - oracle.acc).max() < 1e-8


def test_delta_adept_cycle_computed_torque_beats_pd_tenfold(capsys):
    """Same gains (10 Hz bandwidth), same plant: computed torque tracks the 0.5 s Adept cycle
    more than 10x better than PD plus gravity (measured 57x: 0.12 vs 6.9 mrad RMS); with the
    plant 10 % heavier both still run (measured 1.16 vs 7.6 mrad: the model mismatch costs
    computed torque its margin)."""
    ct, pd = _run(capsys, "--no-log"), _run(capsys, "--controller", "pd", "--no-log")  # no log or plot to write
    for r in (ct, pd):
        assert r["fault"] is None and r["saturated_cycles"] == 0 and r["cycles"] == 2301
    assert ct["rms_error"] * 10 < pd["rms_error"], (ct["rms_error"], pd["rms_error"])
    heavy_ct = _run(capsys, "--mass-scale", "1.1", "--no-log")
    heavy_pd = _run(capsys, "--controller", "pd", "--mass-scale", "1.1", "--no-log")
    assert heavy_ct["fault"] is None and heavy_pd["fault"] is None
    assert heavy_ct["rms_error"] < heavy_pd["rms_error"]


def test_delta_tool_error_is_the_closed_form_forward_kinematics_of_the_log(tmp_path, capsys):
    """The summary's tool error (mm at the platform) is the distance between the reference's
    closed-form forward kinematics (shared/reference-models.md) and the logged positions'."""
    log = tmp_path / "d.pktlog"
    r = _run(capsys, "--log", str(log))
    assert r["saturated_cycles"] == 0 and r["fault"] is None
    data = read_log(str(log))
    pos, ref = data.get("pos")[::50], data.get("ref_pos")[::50]
    e = np.linalg.norm(np.array([delta_fk(p) - delta_fk(q) for p, q in zip(pos, ref)]), axis=1)
    te = r["tool_error"]
    assert te["samples"] == r["cycles"]
    assert 0 < te["max_m"] < 0.5e-3  # under half a millimetre (measured 0.11 mm)
    assert np.max(e) <= te["max_m"] * (1 + 1e-9)
    assert abs(np.sqrt(np.mean(e**2)) - te["rms_m"]) < 0.3 * te["rms_m"]  # every 50th sample of the same error


@pytest.mark.parametrize("edit,message", [
    (lambda t: t[:t.index("[demo]")] + t[t.index("[limits]"):], "no demo for this machine (no [demo] table)"),
    (lambda t: t.replace("start = [-0.1525, 0.0, -0.8]", "start = [0.0, 0.0, -2.0]"), "task path refused: at t = "),
])
def test_a_demo_the_machine_cannot_run_is_one_line(tmp_path, capsys, edit, message):
    from pkrt.rt.runtime.machine.config import MACHINES_DIR

    text = (MACHINES_DIR / "delta-sim.toml").read_text()
    for name in ('"delta"', '"delta.pkt"', '"delta-plant.pkt"'):
        text = text.replace(name, '"' + str(MACHINES_DIR / name.strip('"')) + ('.toml"' if name == '"delta"' else '"'))
    path = tmp_path / "d.toml"
    path.write_text(edit(text))
    code = main(["run", "--machine", str(path), "--lockstep", "--no-log"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err


def test_delta_on_the_exact_model_in_the_loop(capsys):
    """`--model exact`: the exact reduction in the loop (warm-started from the last cycle) tracks
    as the tree does (same plant: within 5 % RMS; measured 0.1212 vs 0.1213 mrad), its cost per
    call measured before the loop and in it (controller_us)."""
    tree, exact = _run(capsys), _run(capsys, "--model", "exact")
    assert exact["model"] == "exact" and tree["model"] == "tree" and exact["fault"] is None
    assert abs(exact["rms_error"] - tree["rms_error"]) < 0.05 * tree["rms_error"]
    e = exact["exact_model_us"]
    assert e["samples"] == 200 and 0 < e["p50"] <= e["p99"]
    assert exact["controller_us"]["p50"] > tree["controller_us"]["p50"]  # a reduction costs more than a tree


def test_exact_model_refused_when_its_p99_exceeds_the_period():
    """In real time the exact model is refused up front (one line) when 200 warm evaluations
    along the reference say its p99 exceeds the period (here 10 us at 100 kHz); lockstep runs it;
    the runtime refuses model = "exact" without the model built outside it."""
    import dataclasses

    from pkrt.drivers import open_drives
    from pkrt.rt.app.reference import exact_model
    from pkrt.rt.runtime.machine.config import load_machine
    from pkrt.rt.core.errors import UserError
    from pkrt.rt.core.plan import Planned
    from pkrt.rt.runtime.machine.run import run_session

    config = load_machine("delta")
    plan = demo_reference(config)
    fast = dataclasses.replace(config, rate_hz=100000.0)
    short = Planned(100000.0, plan.pos[:400], plan.vel[:400], plan.acc[:400])
    with pytest.raises(UserError, match=r"model = \"exact\": its p99 is .* more than the 10 us loop period"):
        exact_model(fast, short, lockstep=False)
    model, figures = exact_model(fast, short, lockstep=True)
    assert figures["p99"] > 10.0
    exact = dataclasses.replace(config, controller=dataclasses.replace(config.controller, model="exact"))
    with pytest.raises(UserError, match="needs the exact model"):
        run_session(exact, open_drives(exact), trajectory=plan, lockstep=True)
