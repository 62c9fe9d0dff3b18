"""Homing a served Delta on Dynamixel servos (``Served(hil="serial")``, ``pkrt serve --bus
serial``: the real driver against the servo emulator in a process of its own, stepped
timing) through the control socket: ``home`` with an offset sets each servo's Homing Offset
(address 20, EEPROM: torque off meanwhile, as the emulator enforces) so that where the machine
stands reads the offset; the Present Position then equals the home within one count, the
machine holds there enabled and homed, and task-space motion is allowed; an offset outside
the actuator ranges is refused with one line."""

from __future__ import annotations

import numpy as np
import pytest

from pkrt.drivers.dynamixel_homing import home_counts
from pkrt.rt.app.client import MachineClient
from pkrt.rt.app.serve import Served


@pytest.mark.realtime
def test_home_sets_the_homing_offset_through_the_socket(tmp_path):
    srv = Served("delta-serial", socket_path=str(tmp_path / "d.sock"), log_path=str(tmp_path / "d.pktlog"),
                 hil="serial")
    srv.start()
    try:
        with MachineClient(srv.socket_path, timeout=120) as c:
            c.enable()
            r = c.request({"cmd": "move", "space": "task", "target": [0.0, 0.0, -0.8]})
            assert not r["ok"] and "needs the machine homed" in r["error"]
            p0 = np.array(c.status()["position"])
            r = c.request({"cmd": "home", "offset": [5.0, 0.0, 0.0]})
            assert not r["ok"] and "outside the actuator ranges" in r["error"] and "\n" not in r["error"]
            offset = p0 + np.array([0.02, -0.03, 0.01])  # rad: the machine stands here, it shall read offset
            r = c.call("home", offset=offset.tolist())
            assert r["homed"] and r["state"] == "standstill"
            want = home_counts(srv.drives.settings, offset)
            assert want.tolist() == r["home_counts"]
            assert np.all(np.abs(np.array(r["positions"]) - want) <= 1), (r["positions"], want)
            st = c.status()
            assert st["homed"] and st["torque_on"] and st["motion"]["kind"] == "hold"
            ds = srv.drives.settings
            count = np.array([ds.scale(i) / ds.position_resolution[i] for i in range(3)])  # rad per count
            assert np.all(np.abs(np.array(st["reference"]) - offset) <= count * 1.01), (st["reference"], offset)
            assert np.abs(np.array(st["position"]) - offset).max() < 1e-3
            target = (offset + 0.05).tolist()
            c.move(target, speed=0.2)
            st = c.wait_state("standstill", timeout=120)
            assert np.abs(np.array(st["reference"]) - target).max() < 1e-9
    finally:
        srv.close()
    assert srv.summary["fault"] is None, srv.summary


@pytest.mark.realtime
def test_pkrt_serve_bus_serial_and_ctl_home(tmp_path, capsys):
    """``pkrt serve --bus serial`` in a process of its own (it starts the servo emulator),
    ``pkrt ctl enable`` and ``pkrt ctl home --offset``, then SIGTERM: a clean end."""
    import json
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from pkrt.rt.cli import main

    sock = str(tmp_path / "cli.sock")
    proc = subprocess.Popen([sys.executable, "-m", "pkrt.rt.cli", "serve", "--machine", "delta-serial", "--bus",
                             "serial", "--socket", sock, "--no-log", "--no-rt", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not Path(sock).exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "pkrt serve did not create its socket"
            time.sleep(0.05)
        assert main(["ctl", "enable", "--socket", sock]) == 0
        assert main(["ctl", "home", "--offset", "0.01,0.01,0.01", "--socket", sock, "--json"]) == 0
        r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert r["homed"] and np.all(np.abs(np.array(r["positions"]) - np.array(r["home_counts"])) <= 1)
        assert main(["ctl", "status", "--socket", sock, "--json"]) == 0
        st = json.loads(capsys.readouterr().out)
        assert st["homed"] and st["state"] == "standstill"
        assert np.abs(np.array(st["position"]) - 0.01).max() < 1e-3
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert summary["fault"] is None and summary["pacing"] == "delay", summary
    assert "serial HIL emulator, stepped" in err


@pytest.mark.parametrize("args, message", [
    (["--machine", "delta-serial", "--bus", "can"], "not 'cia402'"),
    (["--machine", "delta-can", "--bus", "serial"], "serial HIL needs 'dynamixel'"),
    (["--machine", "delta-can", "--bus", "can", "--lockstep"], "not with --lockstep"),
])
def test_pkrt_serve_bus_refuses_a_mismatch_with_one_line(tmp_path, capsys, args, message):
    from pkrt.rt.cli import main

    assert main(["serve", *args, "--socket", str(tmp_path / "x.sock"), "--no-log"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
