"""The operator panel's protocol without a browser (Starlette's test client against the panel's
application, a lockstep Delta served on a real Unix socket): the one-time token and its cookie,
the Host and Origin allowlists, malformed frames (one error each, the connection stays open),
programs chosen by name only, the snapshot then changed fields at most 20 times a second, the
emergency stop's POST, a page's jog released when the page goes away; and ``pkrt panel`` as a
process: loopback only by default, bad options refused with one line."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time

import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from pkrt.rt.app.client import MachineClient
from pkrt.rt.app.serve import Served
from pkrt.rt.panel.app import Panel
from pkrt.rt.runtime.machine.settings import ServeSettings

PORT = 8765  # the port the panel believes it has (the test client needs no socket)
BASE = f"http://127.0.0.1:{PORT}"
ORIGIN = {"origin": BASE}
WS = f"ws://127.0.0.1:{PORT}/ws"


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    d = tmp_path_factory.mktemp("panel")
    srv = Served("delta", socket_path=str(d / "m.sock"), lockstep=True, log_path=None, plan_process=False,
                 settings=ServeSettings(deadman_s=60.0))
    srv.start()
    (d / "programs").mkdir()
    (d / "programs" / "slow.csv").write_text("t,theta1,theta2,theta3\n0,0.1,0.1,0.1\n200,0.3,0.1,0.05\n400,0.1,0.1,0.1\n")
    (d / "programs" / "notes.txt").write_text("not a program\n")
    (d / "secret.csv").write_text("t,theta1,theta2,theta3\n0,0,0,0\n")
    with MachineClient(srv.socket_path, timeout=60) as c:
        yield srv, c, d
    srv.close()


@pytest.fixture
def panel(machine):
    srv, _, d = machine
    p = Panel(srv.socket_path, str(d / "programs"), "127.0.0.1", PORT, readout=False)
    with TestClient(p.app, base_url=BASE) as client:
        yield p, client


@contextlib.contextmanager
def page(panel, machine):
    """A page connected to the panel, the machine at standstill and homed: (socket, client, view)."""
    p, client = panel
    _, c, _ = machine
    ready(c)
    session(p, client)
    with client.websocket_connect(WS, headers=ORIGIN) as ws:
        yield ws, c, snapshot(ws)


def session(p: Panel, client: TestClient) -> None:
    r = client.get(f"/?token={p.access.token}", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/"


def snapshot(ws) -> dict:
    while True:
        m = ws.receive_json()
        if m["type"] == "snapshot" and m["view"].get("state"):
            return m["view"]


def reply(ws, rid) -> dict:
    while True:
        m = ws.receive_json()
        if m["type"] in ("reply", "error") and m.get("id", rid) == rid:
            return m


def ready(c) -> None:
    st = c.status()
    if st["state"] in ("moving", "holding", "stopping"):
        c.estop()
    if c.status()["state"] == "error_stop":
        c.reset()
    if c.status()["state"] == "disabled":
        c.enable()
    c.wait_state("standstill")
    c.home()


def test_token_is_used_once_for_a_cookie(panel):
    p, client = panel
    assert client.get("/").status_code == 403
    assert client.get("/?token=wrong").status_code == 403
    token = p.access.token
    r = client.get(f"/?token={token}", follow_redirects=False)
    assert r.status_code == 303
    cookie = r.headers["set-cookie"]
    assert cookie.startswith(f"pkrt_panel_{PORT}=") and "HttpOnly" in cookie and "SameSite=strict" in cookie
    page = client.get("/")
    assert page.status_code == 200 and "EMERGENCY" in page.text
    assert "default-src 'self'" in page.headers["content-security-policy"] and page.headers["x-frame-options"] == "DENY"
    fresh = TestClient(p.app, base_url=BASE)  # another browser with the same (used) token
    assert fresh.get(f"/?token={token}").status_code == 403
    assert fresh.get("/").status_code == 403
    assert client.get("/static/panel.js").status_code == 200


@pytest.mark.parametrize("host", ["testserver", "evil.example:8765", f"127.0.0.1:{PORT + 1}", ""])
def test_other_hosts_are_refused(panel, host):
    p, client = panel
    session(p, client)
    r = client.get("/", headers={"host": host})
    assert r.status_code == 403 and "is not one of this panel's names" in r.text
    with pytest.raises(WebSocketDisconnect) as e:
        with client.websocket_connect(WS, headers={"host": host, **ORIGIN}):
            pass
    assert e.value.code == 1008 and e.value.reason == "bad Host"
    assert client.post("/estop", headers={"host": host, **ORIGIN}).status_code == 403


@pytest.mark.parametrize("headers", [{}, {"origin": "http://evil.example"}, {"origin": f"http://127.0.0.1:{PORT + 1}"},
                                     {"origin": "null"}])
def test_websocket_needs_this_origin(panel, headers):
    p, client = panel
    session(p, client)
    with pytest.raises(WebSocketDisconnect) as e:
        with client.websocket_connect(WS, headers=headers):
            pass
    assert e.value.code == 1008 and e.value.reason.startswith("Origin ") and "is not this panel" in e.value.reason


def test_websocket_and_estop_need_the_session(panel, machine):
    p, client = panel
    _, c, _ = machine
    with pytest.raises(WebSocketDisconnect) as e:
        with client.websocket_connect(WS, headers=ORIGIN):
            pass
    assert e.value.code == 1008 and e.value.reason.startswith("no session")
    r = client.post("/estop", headers=ORIGIN)
    assert r.status_code == 403 and "no session" in r.json()["error"]
    ready(c)
    assert c.status()["state"] == "standstill"  # nothing reached the machine
    session(p, client)
    assert client.post("/estop").status_code == 403  # no Origin
    r = client.post("/estop", headers=ORIGIN)
    assert r.status_code == 200 and r.json()["ok"] is True
    assert c.status()["state"] == "error_stop" and c.status()["fault"] == "emergency stop"


BAD_FRAMES = [
    ("not json", "not JSON"),
    ("[1, 2]", "a JSON object with \"cmd\""),
    ('{"id": 1}', "a JSON object with \"cmd\""),
    ('{"cmd": 3}', "a JSON object with \"cmd\""),
    ('{"cmd": "enable", "id": [1]}', "\"id\" must be"),
    ("{\"cmd\": \"enable\", \"pad\": \"" + "x" * 9000 + "\"}", "at most 8192 bytes"),
]


def test_malformed_frames_get_one_error_each(panel, machine):
    with page(panel, machine) as (ws, c, _):
        for text, expected in BAD_FRAMES:
            ws.send_text(text)
            m = reply(ws, None)
            assert m["type"] == "error" and expected in m["error"], (text[:40], m)
        ws.send_bytes(b"\x00\x01")
        m = reply(ws, None)
        assert m["type"] == "error" and "as text" in m["error"]
        ws.send_json({"id": 7, "cmd": "fly"})
        m = reply(ws, 7)
        assert m["ok"] is False and m["error"].startswith("unknown command 'fly'")
        ws.send_json({"id": 8, "cmd": "override", "value": "fast"})  # the machine's own check
        m = reply(ws, 8)
        assert m["ok"] is False and m["error"] == "'value' must be a number in [0, 1.2], got 'fast'"
        ws.send_json({"id": 9, "cmd": "override", "value": 0.8})  # still open and working
        assert reply(ws, 9)["ok"] is True
    assert c.status()["override"] == 0.8
    c.override(1.0)


@pytest.mark.parametrize("program", ["../secret.csv", "/etc/passwd", "notes.txt", None, ["slow.csv"]])
def test_programs_are_chosen_by_name_from_the_directory(panel, machine, program):
    with page(panel, machine) as (ws, c, view):
        assert view["programs"] == ["demo", "slow.csv"]
        ws.send_json({"id": 1, "cmd": "run", "program": program, "file": "/etc/passwd"})
        m = reply(ws, 1)
        assert m["ok"] is False and m["error"].startswith("no program"), m
        ws.send_json({"id": 2, "cmd": "read", "name": "slow.csv"})
        m = reply(ws, 2)
        assert m["ok"] and m["reply"]["text"]["lines"][0] == "t,theta1,theta2,theta3"
    assert c.status()["state"] == "standstill"


def test_snapshot_then_changes_at_most_20_per_second(panel, machine):
    with page(panel, machine) as (ws, c, view):
        assert view["link"]["up"] and view["info"]["machine"] == "delta-sim" and view["state"] == "standstill"
        assert set(view) >= {"joint", "torque", "events", "alarms", "program", "override", "motion"}
        ws.send_json({"id": 1, "cmd": "run", "program": "slow.csv"})
        assert reply(ws, 1)["ok"]
        t0, updates, fields = time.monotonic(), 0, set()
        progress = []
        while time.monotonic() - t0 < 2.0:
            m = ws.receive_json()
            if m["type"] == "update":
                updates += 1
                fields |= set(m["changes"])
                assert "info" not in m["changes"] and "programs" not in m["changes"]  # only what changed
                if m["changes"].get("program"):
                    progress.append(m["changes"]["program"]["progress"])
        assert 10 <= updates <= 2.0 * 20 + 1, updates
        assert {"joint", "program"} <= fields
        assert progress == sorted(progress) and progress[-1] > progress[0]
        assert view["program"] is None or progress[0] >= 0
    c.stop()


def test_a_pages_jog_ends_with_the_page(panel, machine):
    with page(panel, machine) as (ws, c, _):
        ws.send_json({"id": 1, "cmd": "jog", "axis": 0, "velocity": 0.05})
        assert reply(ws, 1)["ok"]
        assert c.status()["motion"]["kind"] == "jog"
        ws.send_json({"id": 2, "cmd": "alive"})  # keep-alives are not answered when they go through
        ws.send_json({"id": 3, "cmd": "status"})  # not a page command
        m = reply(ws, 3)
        assert m["id"] == 3 and m["ok"] is False
    # the page is gone: its connection closed, the machine's dead-man released the jog (deadman_s is 60 s here)
    end = time.monotonic() + 10
    while c.status()["state"] != "standstill" and time.monotonic() < end:
        time.sleep(0.01)
    st = c.status()
    assert st["state"] == "standstill"
    ev = c.call("events", seq=max(0, st["events"]["last"] - 10))["events"]
    assert any("dead-man: the client went away" in e["text"] for e in ev)


def test_a_restarted_panel_shows_the_machine_as_it_is(machine):
    """The panel keeps nothing: a new one shows the state, the program and the journal."""
    srv, c, d = machine
    ready(c)
    c.estop()
    for _ in range(2):
        p = Panel(srv.socket_path, str(d / "programs"), "127.0.0.1", PORT, readout=False)
        with TestClient(p.app, base_url=BASE) as client:
            session(p, client)
            with client.websocket_connect(WS, headers=ORIGIN) as ws:
                view = snapshot(ws)
    assert view["state"] == "error_stop" and view["fault"] == "emergency stop"
    alarm = c.status()["events"]["last_alarm"]
    assert view["alarms"]["unacked_alarm"] and view["alarms"]["last_alarm"] == alarm
    assert [e["text"] for e in view["events"] if e["seq"] == alarm] == ["emergency stop"]
    c.reset()


def pkrt(*args, timeout=30):
    return subprocess.run([sys.executable, "-m", "pkrt.rt.cli", *args], capture_output=True, text=True, timeout=timeout)


def test_pkrt_panel_listens_on_loopback_only(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "pkrt.rt.cli", "panel", "--socket", str(tmp_path / "none.sock"),
                             "--port", "0", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        start = json.loads(proc.stdout.readline())
        assert start["bind"] == "127.0.0.1" and start["url"].startswith(f"http://127.0.0.1:{start['port']}/?token=")
        listening = [line.split() for line in open("/proc/net/tcp").read().splitlines()[1:]]
        ours = [r[1] for r in listening if r[3] == "0A" and int(r[1].split(":")[1], 16) == start["port"]]
        assert ours == [f"0100007F:{start['port']:04X}"]  # 127.0.0.1 only
        v6 = [line.split() for line in open("/proc/net/tcp6").read().splitlines()[1:]]
        assert not [r for r in v6 if r[3] == "0A" and int(r[1].split(":")[1], 16) == start["port"]]
    finally:
        proc.terminate()
        proc.wait(10)
    assert proc.returncode == 0


@pytest.mark.parametrize("args,expected", [
    (["--programs", "/nonexistent"], "--programs: /nonexistent: not a directory"),
    (["--bind", "somewhere"], "--bind: expected an IP address, got 'somewhere'"),
    (["--port", "70000"], "--port: expected 0..65535, got 70000"),
    (["--poll-hz", "0"], "--poll-hz"),
])
def test_bad_options_are_one_line(args, expected):
    r = pkrt("panel", *args)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("pkrt: error: ") and expected in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_a_port_in_use_is_one_line():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        r = pkrt("panel", "--port", str(s.getsockname()[1]))
    assert r.returncode == 2 and r.stderr.startswith("pkrt: error: cannot listen on 127.0.0.1:") and r.stderr.count("\n") == 1


def test_a_gcode_programs_tool_path_preview_by_name(machine, tmp_path):
    """``preview``: a listed G-code program checked whole in the panel's process (its points and
    their lines), the check's refusal in one line naming the line, none for a CSV path or the
    demo, a name not in the directory refused."""
    srv, c, _ = machine
    folder = tmp_path / "programs"
    folder.mkdir()
    (folder / "square.ngc").write_text("G21 G90 F600\nG1 X10\nG1 Y10\nG2 X0 Y0 R10\nG0 Z5\nM2\n")
    (folder / "far.ngc").write_text("G21 G90 F600\nG1 X10\nG1 X900\nM2\n")
    (folder / "p.csv").write_text("t,theta1,theta2,theta3\n0,0,0,0\n1,0.1,0.1,0.1\n")
    p = Panel(srv.socket_path, str(folder), "127.0.0.1", PORT, readout=False)
    with TestClient(p.app, base_url=BASE) as client:
        session(p, client)
        with client.websocket_connect(WS, headers=ORIGIN) as ws:
            snapshot(ws)
            ws.send_json({"id": 1, "cmd": "preview", "name": "square.ngc"})
            m = reply(ws, 1)
            pv = m["reply"]["preview"]
            assert m["ok"] and pv["lines_total"] == 6 and pv["motions"] == {"traverse": 1, "feed": 2, "arc": 1}
            assert len(pv["points_um"]) == 3 * len(pv["lines"]) == 3 * len(pv["kinds"]) and set(pv["lines"]) <= {2, 3, 4, 5}
            assert pv["kinds"][-1] == 0 and max(pv["kinds"]) == 1  # the last piece a traverse, feeds before
            ws.send_json({"id": 2, "cmd": "preview", "name": "far.ngc"})
            m = reply(ws, 2)
            assert m["ok"] is False and m["error"].startswith(f"{folder / 'far.ngc'}: line 3: "), m
            for i, name in enumerate(("p.csv", "demo"), start=3):
                ws.send_json({"id": i, "cmd": "preview", "name": name})
                m = reply(ws, i)
                assert m["ok"] and m["reply"]["preview"] is None
            ws.send_json({"id": 5, "cmd": "preview", "name": "../far.ngc"})
            m = reply(ws, 5)
            assert m["ok"] is False and m["error"].startswith("no program")
