"""A served Delta (simulated plant, lockstep) commanded through its real Unix socket: every
allowed and refused transition of the state machine, the dead-man, the socket's permissions,
the TCP token, bad requests (one line each) and ``pkrt ctl``."""

from __future__ import annotations

import json
import os
import socket
import stat
import time

import numpy as np
import pytest

from pkrt.rt.app.client import CommandRefused, MachineClient
from pkrt.rt.app.serve import Served
from pkrt.rt.runtime.machine.settings import ServeSettings

SLOW = 0.002  # a move at 0.2 % of the limits: tens of seconds of loop time


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    d = tmp_path_factory.mktemp("serve")
    srv = Served("delta", socket_path=str(d / "m.sock"), lockstep=True, log_path=str(d / "m.pktlog"),
                 settings=ServeSettings(deadman_s=60.0, ramp_s=10.0), tcp_port=0, token="t" * 32)
    srv.start()
    csv = d / "prog.csv"
    csv.write_text("t,theta1,theta2,theta3\n0,0.1,0.1,0.1\n1,0.15,0.1,0.05\n2,0.1,0.1,0.1\n")
    yield srv, str(csv)
    srv.close()


@pytest.fixture
def c(machine):
    srv, _ = machine
    with MachineClient(srv.socket_path, timeout=60) as cl:
        yield cl


def fresh_standstill(c) -> dict:
    st = c.status()
    if st["state"] in ("moving", "holding", "stopping", "homing"):
        c.estop()
        st = c.status()
    if st["state"] == "error_stop":
        c.reset()
    if c.status()["state"] == "disabled":
        c.enable()
    st = c.wait_state("standstill")
    if not st["homed"]:  # programs and task-space motion need it
        c.home()
    return c.status()


def slow_move(c) -> None:
    st = fresh_standstill(c)
    target = np.array(st["reference"])
    target[0] = 0.4 if target[0] < 0.2 else 0.0
    c.move(target.tolist(), speed=SLOW)


def reach(c, state: str) -> None:
    """Bring the machine into ``state`` (from wherever it is)."""
    if state == "disabled":
        fresh_standstill(c)
        c.disable()
    elif state == "standstill":
        fresh_standstill(c)
    elif state == "moving":
        slow_move(c)
    elif state == "holding":
        slow_move(c)
        c.hold()
        c.wait_state("holding")
    elif state == "stopping":
        slow_move(c)
        c.stop()
    elif state == "error_stop":
        fresh_standstill(c)
        c.estop()
    assert c.status()["state"] == state


def args_of(cmd: str, csv: str) -> dict:
    return {"jog": {"axis": 0, "velocity": 0.01}, "move": {"target": [0.05, 0.05, 0.05], "speed": SLOW},
            "run": {"file": csv}, "stream": {"target": [0.02, 0.0, 0.0]}, "override": {"value": 0.5}}.get(cmd, {})


COMMANDS = ("status", "alive", "enable", "disable", "home", "jog", "release", "move", "run", "stream", "hold",
            "resume", "override", "stop", "estop", "reset")
# state -> {allowed command: the state in its reply}; every other command is refused there
ALLOWED = {
    "disabled": {"status": "disabled", "alive": "disabled", "release": "disabled", "enable": "standstill",
                 "override": "disabled", "estop": "error_stop"},
    "standstill": {"status": "standstill", "alive": "standstill", "release": "standstill", "disable": "disabled",
                   "home": "standstill", "jog": "moving", "move": "moving", "run": "moving", "stream": "moving",
                   "override": "standstill", "estop": "error_stop"},
    "moving": {"status": "moving", "alive": "moving", "release": "moving", "hold": "moving", "override": "moving",
               "stop": "stopping", "estop": "error_stop"},
    "holding": {"status": "holding", "alive": "holding", "release": "holding", "disable": "disabled",
                "resume": "moving", "override": "holding", "stop": "stopping", "estop": "error_stop"},
    "stopping": {"status": "stopping", "alive": "stopping", "release": "stopping", "override": "stopping",
                 "estop": "error_stop"},
    "error_stop": {"status": "error_stop", "alive": "error_stop", "release": "error_stop", "reset": "disabled",
                   "estop": "error_stop"},
}
REASON = {"disabled": "disabled", "standstill": "standstill", "moving": "moving", "holding": "holding",
          "stopping": "stopping", "error_stop": "error_stop"}  # the state as status names it


@pytest.mark.parametrize("state", list(ALLOWED))
def test_every_refused_command_names_the_state(c, machine, state):
    _, csv = machine
    reach(c, state)
    refused = [cmd for cmd in COMMANDS if cmd not in ALLOWED[state]]
    assert refused
    for cmd in refused:
        r = c.request({"cmd": cmd, **args_of(cmd, csv)})
        assert r["ok"] is False, (state, cmd, r)
        assert "\n" not in r["error"] and r["error"].startswith(f"{cmd} refused:"), (state, cmd, r)
        assert REASON[state] in r["error"] or "is running" in r["error"], (state, cmd, r["error"])
        assert c.status()["state"] == state, (state, cmd)


@pytest.mark.parametrize("state,cmd", [(s, cmd) for s, allowed in ALLOWED.items() for cmd in allowed])
def test_every_allowed_transition(c, machine, state, cmd):
    _, csv = machine
    reach(c, state)
    r = c.request({"cmd": cmd, **args_of(cmd, csv)})
    assert r["ok"] is True, (state, cmd, r)
    assert r["state"] == ALLOWED[state][cmd], (state, cmd, r)


def test_hold_ramps_to_rest_and_resume_finishes_the_move(c):
    fresh_standstill(c)
    st = c.status()
    target = np.array(st["reference"]) + [0.1, -0.05, 0.0]
    c.move(target.tolist(), speed=SLOW)  # slower than the fixture's 10 s ramp of the scaling
    c.hold()
    held = c.wait_state("holding")
    assert held["motion"]["rate"] == 0.0 and 0 < held["motion"]["path_time_s"] < held["motion"]["duration_s"]
    c.resume()
    done = c.wait_state("standstill")
    assert np.allclose(done["reference"], target, atol=1e-12)



def test_home_then_task_move(c):
    fresh_standstill(c)
    c.home()
    st = c.status()
    assert st["homed"]
    r = c.move([0.02, 0.0, -0.68], space="task", task_speed=0.2)
    assert r["ok"]
    c.wait_state("standstill")


def test_a_jog_whose_client_goes_away_stops(machine, c):
    srv, _ = machine
    fresh_standstill(c)
    other = MachineClient(srv.socket_path)
    other.jog(axis=1, velocity=0.05)
    assert c.status()["state"] == "moving"
    other.close()  # no release, no keep-alive: the connection is gone
    st = c.wait_state("standstill", timeout=30)
    assert st["motion"]["kind"] == "hold"


def test_a_jog_without_keep_alives_is_released(tmp_path):
    with Served("delta", socket_path=str(tmp_path / "d.sock"), lockstep=True, log_path=str(tmp_path / "d.pktlog"),
                settings=ServeSettings(deadman_s=0.3)) as srv:
        srv.start()
        with MachineClient(srv.socket_path) as cl:
            cl.enable()
            cl.jog(axis=0, velocity=0.01)
            cl.wait_state("standstill", timeout=30)  # the client stays connected but silent
    from pkrt.rt.runtime.record.logfile import read_log

    msgs = [e["message"] for e in read_log(str(tmp_path / "d.pktlog")).events]
    assert any("dead-man: no keep-alive" in m for m in msgs), msgs


def test_the_socket_is_owner_only_and_tcp_needs_the_token(machine):
    srv, _ = machine
    assert stat.S_IMODE(os.stat(srv.socket_path).st_mode) == 0o600
    host, port = srv.server.tcp.getsockname()
    assert host == "127.0.0.1"
    with pytest.raises(Exception, match="token"):
        MachineClient(tcp=(host, port), token="wrong")
    with MachineClient(tcp=(host, port), token="t" * 32) as cl:
        assert cl.status()["state"]


@pytest.mark.parametrize("line,message", [
    (b"not json\n", "not a JSON object"),
    (b"[1, 2]\n", "a request must be a JSON object"),
    (b"{}\n", "needs \"cmd\""),
    (b'{"cmd": "fly"}\n', "unknown command 'fly'"),
    (b'{"cmd": "jog", "axis": 0, "velocity": "fast"}\n', "'velocity' must be a number"),
    (b'{"cmd": "move", "target": [1, 2]}\n', "'target' needs 3 values"),
    (b'{"cmd": "move", "target": [0.1, 0.1, 9]}\n', "outside its soft limits"),
    (b'{"cmd": "override", "value": 2}\n', "'value' must be a number in [0, 1.2]"),
    (b'{"cmd": "run", "file": "/nonexistent.csv"}\n', "no such file"),
])
def test_a_bad_request_gets_one_line_and_the_connection_stays(machine, c, line, message):
    srv, _ = machine
    fresh_standstill(c)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    s.connect(srv.socket_path)
    f = s.makefile("rb")
    s.sendall(line)
    r = json.loads(f.readline())
    assert r["ok"] is False and message in r["error"] and "\n" not in r["error"], r
    s.sendall(b'{"cmd": "status", "id": 7}\n')
    r = json.loads(f.readline())
    assert r["ok"] and r["id"] == 7
    s.close()


def test_ctl_cli(machine, capsys):
    from pkrt.rt.cli import main

    srv, _ = machine
    with MachineClient(srv.socket_path) as cl:
        fresh_standstill(cl)
        cl.estop()
    assert main(["ctl", "status", "--socket", srv.socket_path, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "error_stop"
    assert main(["ctl", "enable", "--socket", srv.socket_path]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "pkrt: error: enable refused: the machine is in error stop, error_stop (reset first)"
    assert main(["ctl", "reset", "--socket", srv.socket_path]) == 0
    assert main(["ctl", "enable", "--socket", srv.socket_path]) == 0
    assert main(["ctl", "override", "130", "--socket", srv.socket_path]) == 2
    assert "percentage in [0, 120]" in capsys.readouterr().err
    assert main(["ctl", "jog", "--axis", "0", "--velocity", "-0.02", "--for", "0.2", "--socket", srv.socket_path,
                 "--wait"]) == 0
    assert main(["ctl", "status", "--socket", str(srv.socket_path) + ".missing"]) == 2
    assert "no machine is served there" in capsys.readouterr().err


def test_task_space_motion_is_refused_until_homed_and_joint_jog_is_slow_before(tmp_path):
    st = ServeSettings()
    with Served("delta", socket_path=str(tmp_path / "h.sock"), lockstep=True, settings=st) as srv:
        srv.start()
        vmax = srv.config.limits.velocity * (1 - st.limit_margin)  # the references keep this below the limits
        with MachineClient(srv.socket_path) as cl:
            cl.enable()
            for req in ({"cmd": "move", "space": "task", "target": [0.0, 0.0, -0.7]},
                        {"cmd": "jog", "space": "task", "direction": [1, 0, 0]},
                        {"cmd": "jog", "space": "task", "step": [0.01, 0, 0]},
                        {"cmd": "stream", "space": "task", "target": [0.0, 0.0, -0.7]}):
                r = cl.request(req)
                assert not r["ok"] and "needs the machine homed" in r["error"], r
            r = cl.jog(axis=0, velocity=100.0)
            assert np.allclose(r["speed_cap"], st.unhomed_speed * vmax)
            cl.release()
            cl.wait_state("standstill")
            cl.home()
            r = cl.jog(axis=0, velocity=100.0)
            assert np.allclose(r["speed_cap"], st.jog_speed * vmax)
            cl.release()
            cl.wait_state("standstill")
            assert cl.jog(space="task", step=[0.01, 0.0, 0.0])["ok"]
            cl.wait_state("standstill")


def test_the_state_reaches_telemetry(tmp_path):
    import msgpack

    from pkrt.rt.runtime.machine.states import STATE_CODES
    from pkrt.rt.runtime.machine.states import State
    from pkrt.rt.runtime.record.telemetry import Telemetry

    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(30)
    tel = Telemetry("127.0.0.1", rx.getsockname()[1], 200.0)
    with Served("delta", socket_path=str(tmp_path / "t.sock"), lockstep=True, telemetry=tel) as srv:
        srv.start()
        with MachineClient(srv.socket_path) as cl:
            cl.enable()
            want = STATE_CODES[State.STANDSTILL]
            for _ in range(1000):  # datagrams from before the enable may come first
                msg = msgpack.unpackb(rx.recv(65536))
                if msg["state"] == want:
                    break
            assert msg["state"] == want
    tel.close()
    rx.close()


def test_ctl_stream_reads_targets_from_stdin(machine, monkeypatch, capsys):
    import io

    from pkrt.rt.cli import main

    srv, _ = machine
    with MachineClient(srv.socket_path) as cl:
        fresh_standstill(cl)
    monkeypatch.setattr("sys.stdin", io.StringIO("# targets\n0.05,0.05,0.05\n0.06,0.05,0.05\n"))
    assert main(["ctl", "stream", "--socket", srv.socket_path, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["targets"] == 2
    with MachineClient(srv.socket_path) as cl:
        st = cl.wait_state("standstill", timeout=60)  # the stream went stale: controlled stop
        assert np.allclose(st["reference"], [0.06, 0.05, 0.05], atol=1e-3)
    monkeypatch.setattr("sys.stdin", io.StringIO("0.1,abc\n"))
    assert main(["ctl", "stream", "--socket", srv.socket_path]) == 2
    assert "expected comma-separated numbers" in capsys.readouterr().err
