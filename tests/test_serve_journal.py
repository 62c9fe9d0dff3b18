"""What a served machine's clients read besides the status (``pkrt.rt.runtime.machine.journal``),
through the real socket of a lockstep Delta: ``info``, the event journal (``events`` after a
number, alarms and their acknowledgement with ``ack``), the program's progress in ``status``
(file, kind, progress, line) and the commanded torques."""

from __future__ import annotations

import pytest

from pkrt.rt.app.client import MachineClient
from pkrt.rt.app.serve import Served
from pkrt.rt.runtime.machine.journal import Journal


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    d = tmp_path_factory.mktemp("journal")
    srv = Served("delta", socket_path=str(d / "m.sock"), lockstep=True, log_path=None, plan_process=False)
    srv.start()
    csv = d / "prog.csv"
    csv.write_text("t,theta1,theta2,theta3\n0,0.1,0.1,0.1\n1,0.15,0.1,0.05\n2,0.1,0.1,0.1\n")
    with MachineClient(srv.socket_path, timeout=60) as c:
        yield srv, c, str(csv)
    srv.close()


def test_info_describes_the_machine(machine):
    srv, c, _ = machine
    info = c.call("info")["info"]
    assert info["machine"] == srv.config.name and info["config"] == str(srv.config.path)
    assert info["axes"] == ["theta1", "theta2", "theta3"] and info["rate_hz"] == 1000.0
    assert all(lo < hi for lo, hi in zip(info["soft_lo"], info["soft_hi"]))
    assert info["jog_cap"] == pytest.approx([0.25 * v for v in info["vmax"]])


def test_events_alarm_and_acknowledgement(machine):
    _, c, _ = machine
    before = c.status()["events"]["last"]
    if c.status()["state"] == "error_stop":
        c.reset()
    c.enable()
    c.estop()
    st = c.status()
    assert st["events"]["unacked_alarm"] and st["events"]["last_alarm"] > before
    new = c.call("events", seq=before)["events"]
    assert [e["seq"] for e in new] == list(range(before + 1, st["events"]["last"] + 1))
    kinds = [(e["kind"], e["text"]) for e in new]
    assert ("fault", "emergency stop") in kinds and ("state", "standstill -> error_stop: emergency stop") in kinds
    assert all(e["time"] > 1e9 and e["t"] >= 0 for e in new)  # wall time (epoch s), loop time (s)
    assert c.call("ack", seq=10**9)["acked"] == st["events"]["last"]  # never past the last event
    assert not c.status()["events"]["unacked_alarm"]
    for bad in ({"cmd": "ack", "seq": -1}, {"cmd": "ack", "seq": "x"}, {"cmd": "events", "seq": float("inf")}):
        r = c.request(bad)
        assert r["ok"] is False and r["error"].startswith("'seq' must be a number"), r
    c.reset()


def test_program_progress_in_the_status(machine):
    _, c, csv = machine
    if c.status()["state"] == "error_stop":
        c.reset()
    c.enable()
    c.home()
    assert c.status()["torque"] != [0.0, 0.0, 0.0]  # holding against gravity
    c.run(csv)
    seen = []
    while (st := c.status())["state"] == "moving":
        seen.append(st["program"]["progress"])
    assert st["state"] == "standstill"
    assert st["program"] == {"file": csv, "kind": "csv", "progress": 1.0, "line": None}
    assert seen == sorted(seen) and 0 <= seen[0] < 1
    c.disable()
    assert c.status()["torque"] == [0.0, 0.0, 0.0]


def test_journal_keeps_the_last_events():
    j = Journal(size=3)
    for k in range(5):
        j.add(0.001 * k, "fault" if k == 1 else "state", f"e{k}")
    assert [e["text"] for e in j.since(0)] == ["e2", "e3", "e4"]
    assert j.status() == {"last": 5, "acked": 0, "last_alarm": 2, "unacked_alarm": True}
    assert j.ack(2) == 2 and j.ack(1) == 2  # the mark never goes back
