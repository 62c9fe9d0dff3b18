"""G-code programs run: the shipped CAM example (models/machines/orthoglide-cam.ngc: G54, T1 M6,
S M3, G43 H1, lines, an arc, a G81 drilling cycle, M5, M30) on the Orthoglide's simulated plant
by ``pkrt run --gcode`` in lockstep and in real time, its tool change and spindle events in the
log and on the drives' outputs; and by a served machine (``pkrt ctl run PROGRAM.ngc``, planned in
its planning process), which holds at the tool change until resumed and reports the program,
its line, the spindle, coolant and tool in ``status``."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from pkrt.rt.cli import main
from pkrt.rt.runtime.record.logfile import read_log
from tests.realtime import judge
from tests.serving import ready_client, serving

CAM = str(resources.files("pkrt.models") / "machines" / "orthoglide-cam.ngc")
EVENTS = ["line 5: tool change to T1 (M6): hold until resumed", "line 6: spindle speed S10000 (stopped)",
          "line 6: spindle clockwise at S10000", "line 12: spindle stopped"]
OUTPUTS = [{"tool": 1}, {"spindle": "off", "spindle_speed": 10000.0}, {"spindle": "cw", "spindle_speed": 10000.0},
           {"spindle": "off", "spindle_speed": 10000.0}]


def _program_events(log) -> list[tuple[int, str]]:
    return [(e["cycle"], e["message"]) for e in read_log(log).events if e["kind"] in ("tool", "spindle", "coolant")]


def _check_run(r: dict, log: Path) -> None:
    assert r["fault"] is None and r["saturated_cycles"] == 0 and r["program_events"] == 4, r["fault"]
    assert r["max_error"] < 1e-4 and r["trajectory"] == "gcode"
    ev = _program_events(log)
    assert [m.replace(" (pkrt run does not hold)", "") for _, m in ev] == EVENTS
    assert [c for c, _ in ev] == [0, 0, 0, r["cycles"] - 1]  # at the start, and at the end at rest
    assert [{k: v for k, v in o.items() if k != "t"} for o in r["outputs"]] == OUTPUTS


def test_cam_example_runs_in_lockstep_with_its_events_in_the_log(tmp_path, capsys):
    log = tmp_path / "cam.pktlog"
    assert main(["run", "--gcode", CAM, "--lockstep", "--log", str(log), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    _check_run(r, log)
    assert r["compiled_cycles"] >= r["cycles"] - 2  # the compiled loop stopped only at the events


@pytest.mark.realtime
def test_cam_example_runs_in_real_time(tmp_path, host_probe):
    from pkrt.drivers import open_drives
    from pkrt.rt.app.reference import plan_reference
    from pkrt.rt.runtime.machine.config import load_machine
    from pkrt.rt.runtime.machine.run import run_session

    config = load_machine("orthoglide")
    plan = plan_reference(config, gcode=CAM)
    log = tmp_path / "cam-rt.pktlog"

    def run():
        log.unlink(missing_ok=True)
        return run_session(config, open_drives(config), trajectory=plan, log_path=str(log), realtime=False)

    r = judge(run, host_probe)
    _check_run(r, log)
    assert not r["lockstep"] and r["realtime_factor"] > 0.5


# -- a served machine ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    with serving("orthoglide", tmp_path_factory.mktemp("gcode-serve"), lockstep=True) as s:
        yield s


@pytest.fixture
def c(srv):
    with ready_client(srv, 120) as cl:
        yield cl


def _until(c, pred, timeout=300.0, poll=0.002) -> list[dict]:
    """Statuses polled until ``pred(status)``; all of them."""
    import time

    seen, end = [], time.monotonic() + timeout
    while time.monotonic() < end:
        st = c.status()
        seen.append(st)
        if pred(st):
            return seen
        time.sleep(poll)
    raise AssertionError(f"timed out; last status {seen[-1]['state']} {seen[-1]['program']}")


def test_served_cam_program_holds_at_the_tool_change_and_reports_its_line(srv, c, capsys):
    assert main(["ctl", "run", CAM, "--socket", srv.socket_path, "--json"]) == 0  # waits for the planning
    started = json.loads(capsys.readouterr().out)
    assert started["ok"] and started["duration_s"] == pytest.approx(7.973, abs=0.05)
    held = _until(c, lambda st: st["state"] == "holding")[-1]
    assert held["program"] == {"file": CAM, "kind": "gcode", "progress": 0.0, "line": 5}
    assert held["tool"] == 1 and held["spindle"] == {"state": "off", "speed": 0.0}
    assert held["motion"]["waiting"] == EVENTS[0]
    assert main(["ctl", "status", "--socket", srv.socket_path]) == 0
    text = capsys.readouterr().out
    assert f"program {CAM} (gcode): 0.0 %, line 5" in text and "spindle off (S0), coolant off, tool T1" in text
    c.resume()
    seen = _until(c, lambda st: st["state"] == "standstill")
    moving = [st for st in seen if st["state"] == "moving" and st["program"]]
    lines = [st["program"]["line"] for st in moving]  # a lockstep machine outruns the polling: some
    assert set(lines) <= {7, 8, 9, 10, 11} and len(set(lines)) >= 2 and lines == sorted(lines)  # in order
    progress = [st["program"]["progress"] for st in moving]
    assert progress == sorted(progress) and 0 <= progress[0] and progress[-1] <= 1
    assert any(st["spindle"] == {"state": "cw", "speed": 10000.0} for st in moving)
    done = seen[-1]
    assert done["program"]["progress"] == 1.0 and done["spindle"]["state"] == "off" and done["tool"] == 1
    tail = [o for o in srv.drives.output_changes][-4:]
    assert [{k: v for k, v in o.items() if k != "t"} for o in tail] == OUTPUTS


def test_a_program_reports_each_line_in_order_and_holds_at_its_tool_change():
    """The served machine's program source stepped by hand: every motion line of the program in
    order, the hold at the tool change (line 5) until resumed, the events passed in order."""
    from pkrt.rt.app.reference import plan_reference
    from pkrt.rt.runtime.machine.config import load_machine
    from pkrt.rt.runtime.machine.motion import Program

    config = load_machine("orthoglide")
    plan = plan_reference(config, gcode=CAM)
    lim = config.limits
    src = Program(plan, lim.velocity * np.ones(3), lim.acceleration * np.ones(3), info={"file": CAM, "kind": "gcode"})
    lines, fired, holds = [], [], 0
    for _ in range(3 * plan.n):
        src.step(1.0 / config.rate_hz)
        fired += [e["text"] for e in src.fired]
        src.fired.clear()
        st = src.program_status()
        if src.waiting is not None:
            holds += 1
            assert st["line"] == 5 and src.at_rest and np.all(src.vel == 0)
            src.resume()
        elif st["line"] and (not lines or lines[-1] != st["line"]):
            lines.append(st["line"])
        if src.done:
            break
    assert src.done and holds == 1 and lines == [7, 8, 9, 10, 11] and fired == EVENTS
    assert src.program_status()["progress"] == 1.0


def test_served_stops_m0_m1_and_a_stop_turns_the_spindle_off(srv, c, tmp_path):
    prog = tmp_path / "stops.ngc"
    prog.write_text("G21 G90 G54\nM3 S5000 M8\nG1 X-5 F1200\nM0\nG1 Y-5\nM1\nG1 X-20 Y-20 Z-20\nG0 X0 Y0 Z0\nM30\n")
    r = c.run(str(prog))
    assert c.wait_planned(r["job"])["ok"]
    st = _until(c, lambda s: s["state"] == "holding")[-1]
    assert st["program"]["line"] == 4 and st["motion"]["waiting"] == "line 4: program stop (M0): hold until resumed"
    assert st["spindle"] == {"state": "cw", "speed": 5000.0} and st["coolant"] == {"mist": False, "flood": True}
    c.resume()
    st = _until(c, lambda s: s["state"] == "holding")[-1]
    assert st["program"]["line"] == 6
    c.resume()
    _until(c, lambda s: s["state"] == "moving" and (s["program"] or {}).get("line") == 7)
    c.call("stop")
    st = c.wait_state("standstill", timeout=60)
    assert st["program"]["progress"] < 1 and st["spindle"]["state"] == "off" and not st["coolant"]["flood"]
    last = {k: v for k, v in srv.drives.output_changes[-1].items() if k != "t"}
    assert last == {"spindle": "off", "mist": False, "flood": False}  # the stop turned them off


def test_served_csv_program_reports_its_kind_and_no_line(srv, c, tmp_path):
    p = tmp_path / "q.csv"
    p.write_text("t,q1,q2,q3\n0,0,0,0\n0.5,-0.02,-0.02,-0.02\n1.0,0,0,0\n")
    r = c.run(str(p))
    assert r["ok"], r
    st = _until(c, lambda s: s["program"] is not None)[-1]
    assert st["program"]["kind"] == "csv" and st["program"]["line"] is None and st["program"]["file"] == str(p)
    assert c.wait_state("standstill", timeout=60)["program"]["progress"] == 1.0  # the last run, ended


def test_served_gcode_refused_in_one_line(srv, c, tmp_path):
    p = tmp_path / "bad.ngc"
    p.write_text("G21\nG0 X1\nG41 X2\nM2\n")
    r = c.run(str(p))
    out = c.wait_planned(r["job"])
    assert not out["ok"] and out["error"].endswith("bad.ngc: line 3: G41 is not supported (cutter radius compensation)")
    assert c.status()["state"] == "standstill" and np.isfinite(c.status()["position"]).all()
