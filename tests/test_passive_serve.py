"""The passive joints on a served Delta (simulated plant, lockstep): the loop's guard stops a
velocity jog and a streamed target short of a ball joint's cone (every logged reference inside
it), the planner refuses moves and streamed targets beyond it with the cause, and ``check
move`` / ``check travel`` answer without moving (socket and ``pkrt ctl``)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from pkrt.rt.app.client import CommandRefused, MachineClient
from pkrt.rt.app.serve import Served
from pkrt.rt.cli import main
from pkrt.rt.runtime.record.logfile import read_log
from pkrt.rt.runtime.machine.states import State

BEYOND = [0.95, 0.0, 0.0]  # theta1 alone past about 0.81 rad: chains 2 and 3 lean past 18 deg


def _run_until_standstill(srv: Served, go: dict, every: int | None) -> list[dict]:
    """Run the loop in this thread: enable, home, then ``go`` (again every ``every`` cycles
    while the motion runs, as a stream's client does), until the machine is at standstill
    again; the replies."""
    replies = []

    def hook(m):
        k = m.cycles
        cmd = {1: {"cmd": "enable"}, 2: {"cmd": "home"}, 3: go}.get(k)
        if cmd is None and every and k > 3 and (k - 3) % every == 0 and m.state is State.MOVING \
                and not m.source.stopping:
            cmd = go
        if cmd is not None:
            replies.append(m.submit(cmd))
        if k > 8 and m.state is State.STANDSTILL:
            m.shutdown("done")

    srv.machine.run(max_cycles=30000, on_cycle=hook)
    return [p.wait(0) for p in replies]


def _margins_along(srv: Served, log_path: str) -> tuple[np.ndarray, np.ndarray]:
    """The logged references and their smallest margin (rad or m) at every 4th cycle and the last."""
    ref = read_log(log_path).channels["ref_pos"]
    rows = np.r_[np.arange(0, len(ref), 4), len(ref) - 1]
    return ref, srv.planner.passive.margins_at(ref[rows]).min(axis=1)


@pytest.mark.parametrize("how", ["jog", "stream"])
def test_the_loop_stops_a_jog_and_a_streamed_target_short_of_a_cone(tmp_path, how):
    """The stream is submitted to the loop directly (the server's own check of the target
    would refuse it: next test); the loop's guard alone stops both."""
    log = str(tmp_path / f"{how}.pktlog")
    srv = Served("delta", socket_path=str(tmp_path / f"{how}.sock"), lockstep=True, log_path=log, plan_process=False)
    m = srv.machine
    go = ({"cmd": "jog", "velocity": [m.vmax[0], 0.0, 0.0]} if how == "jog"  # no owner: no dead-man in wall time
          else {"cmd": "stream", "target": BEYOND})
    try:
        replies = _run_until_standstill(srv, go, None if how == "jog" else 10)  # a target every 10 ms
        assert all(r["ok"] for r in replies), replies
        assert m.fault_reason is None
        assert m.state_reason.startswith("stopped short of a limit: at its stopping point joint ")
        assert "its cone 0.3142 rad (18.0 deg)" in m.state_reason
        ref, margin = _margins_along(srv, log)
    finally:
        srv.close()
    assert margin.min() >= 0.0  # never past the cone, not even for one cycle
    assert margin[-1] < np.radians(1.0)  # and it got near: stopped by the limit, not far short of it
    assert 0.75 < ref[-1, 0] < BEYOND[0]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    d = tmp_path_factory.mktemp("passive")
    srv = Served("delta", socket_path=str(d / "m.sock"), lockstep=True, log_path=str(d / "m.pktlog")).start()
    with MachineClient(srv.socket_path, timeout=60) as c:
        c.enable()
        c.home()
    yield srv
    srv.close()


@pytest.fixture
def c(served):
    with MachineClient(served.socket_path, timeout=60) as cl:
        yield cl


def test_check_move_and_move_and_stream_name_the_joint_and_nothing_moves(c):
    before = c.status()
    r = c.call("check", what="move", target=BEYOND)
    assert r["possible"] is False
    assert re.match(r"trajectory refused: at t = .* joint (elbow|wrist)", r["reason"])
    with pytest.raises(CommandRefused, match="trajectory refused: at t = .* joint (elbow|wrist).* its cone"):
        c.move(BEYOND)
    with pytest.raises(CommandRefused, match=r"stream: target refused: joint (elbow|wrist).*tilted 0\.3[4-9]"):
        c.stream(BEYOND)
    ok = c.call("check", what="move", target=[0.5, 0.1, 0.0])
    assert ok["possible"] is True and ok["duration_s"] > 0 and ok["space"] == "joint"
    task = c.call("check", what="move", target=[-0.1, 0.05, -0.75], space="task")
    assert task["possible"] is True and task["space"] == "task"
    after = c.status()
    assert after["state"] == "standstill" and after["cycle"] >= before["cycle"]
    assert after["reference"] == before["reference"]  # nothing moved


def test_check_travel_along_a_direction_stops_at_the_first_limit(c):
    r = c.call("check", what="travel", direction="-x")
    assert r["unit"] == "m" and r["direction"] == [-1.0, 0.0, 0.0]
    assert 0.2 < r["travel"] < 0.3 and re.match("joint (elbow|wrist)", r["limited_by"])  # the cone, at about 0.28 m
    up = c.call("check", what="travel", direction=[0, 0, 1], most=0.02)
    assert up["travel"] == 0.02 and up["limited_by"] is None  # 2 mm up: nothing in the way
    with pytest.raises(CommandRefused, match=r"'direction' needs 3 values \(x, y, z\)"):
        c.call("check", what="travel", direction=[1, 0])
    with pytest.raises(CommandRefused, match="'direction': 'w' is not a task coordinate"):
        c.call("check", what="travel", direction="w")
    with pytest.raises(CommandRefused, match="check: 'what' must be move or travel"):
        c.call("check", what="jump")


def test_ctl_check(served, capsys):
    sock = ["--socket", served.socket_path]
    assert main(["ctl", "check", "move", "--target", "0.95,0,0", *sock]) == 1
    out, err = capsys.readouterr()
    assert out.startswith("check move: not possible: trajectory refused: at t = ")
    assert err.startswith("pkrt: error: check move: trajectory refused") and err.count("\n") == 1
    assert main(["ctl", "check", "move", "--target", "0.2,0.2,0.2", *sock]) == 0
    assert capsys.readouterr().out.startswith("check move: possible (joint space, ")
    assert main(["ctl", "check", "travel", "--direction=-x", *sock]) == 0
    out = capsys.readouterr().out
    assert re.match(r"check travel: 0\.2\d+ m along \[-1\.0, 0\.0, 0\.0\] \(limited by joint (elbow|wrist)", out)
    for argv, msg in ((["check", "travel"], "check travel needs --direction"),
                      (["check", "spin"], "check: expected 'move' or 'travel'"),
                      (["check", "move"], "check move needs --target")):
        assert main(["ctl", *argv, *sock]) == 2
        assert msg in capsys.readouterr().err
