"""Homing of a served machine (``pkrt.rt.runtime.machine.served.Machine``), in its loop's thread:
``home`` runs the command (the simulated plant: at once; Dynamixel: the Homing Offset written
within the cycle; CiA 402: homing mode 6 in a helper thread while the loop waits in
``homing``), ``home_cycle`` ends a CiA 402 homing when the drives are done. Units: actuator
units (m or rad), seconds.
"""

from __future__ import annotations

import json
import threading

import numpy as np

from pkrt.rt.runtime.machine.motion import Hold
from pkrt.rt.runtime.machine.states import State


def home(m, cmd: dict) -> dict:
    d = m.drives
    if getattr(d, "absolute", d.backend == "sim"):
        m.homed = True
        m.event("homed", "absolute encoders: position known")
        return {"ok": True, "homed": True, "method": "absolute"}
    if d.backend == "dynamixel":
        return home_dynamixel(m, cmd)
    if d.backend != "cia402":
        return {"ok": False, "error": f"home refused: homing {d.backend} drives is not supported"}
    from pkrt.drivers import cia402_homing as ch

    method = int(cmd.get("method", 35))
    if method not in ch.METHODS:
        return {"ok": False, "error": f"home: method {method} not supported ({', '.join(map(str, ch.METHODS))})"}
    offset = np.broadcast_to(np.asarray(cmd.get("offset", 0.0), float), (m.s,)).copy()
    speeds = tuple(float(x) for x in cmd.get("speeds", (0.0, 0.0)))
    timeout = float(cmd.get("timeout", 30.0))
    m.homing = {"halt": threading.Event(), "done": threading.Event(), "result": None, "error": None}
    h = m.homing
    pos, z = d.feedback.position.copy(), np.zeros(m.s)
    m.ctrl.update(pos, z, pos, z, z)  # the torque that holds the machine here (its weight)
    hold = m.ctrl.tau.copy()
    ch.leave_cyclic(d)  # torque off: the drives home themselves, the loop does no drive I/O meanwhile

    def work():
        try:
            h["result"] = ch.home_si(d, method, offset, speeds, timeout, h["halt"], hold)
        except Exception as e:  # noqa: BLE001 - any failure ends in error stop with its reason
            h["error"] = str(e)
        h["done"].set()

    threading.Thread(target=work, name="pkrt-homing", daemon=True).start()
    m.set_state(State.HOMING, f"home (CiA 402 method {method})")
    return {"ok": True, "method": method}


def home_dynamixel(m, cmd: dict) -> dict:
    """Dynamixel servos (absolute encoders): the Homing Offset (address 20) set so that
    where the machine stands reads ``offset`` (actuator units, default 0), with torque off
    for the few transactions it takes (the EEPROM area's rule); then enabled again, holding
    there in the homed frame. Done within this cycle (the loop's only blocking command)."""
    from pkrt.drivers.dynamixel_homing import home_here

    d = m.drives
    home = np.broadcast_to(np.asarray(cmd.get("offset", 0.0), float), (m.s,)).copy()
    lim = m.config.limits.position
    if np.any(home < lim[:, 0]) or np.any(home > lim[:, 1]):
        return {"ok": False, "error": f"home: offset {home.tolist()} outside the actuator ranges {lim.tolist()}"}
    try:
        result = home_here(d, home)
        d.enable()
        fb = d.read(m.t)
    except Exception as e:  # noqa: BLE001 - a servo that refuses or does not answer: error stop
        m.fault(f"homing: {e}")
        return {"ok": False, "error": f"homing failed: {e}"}
    homed(m, result, fb.position)
    return {"ok": True, "homed": True, **result}


def home_cycle(m) -> None:
    """While the drives home: nothing to do until the procedure ends; then the machine
    holds where it is (homed) or goes to error stop with the reason."""
    h = m.homing
    if h is None or not h["done"].is_set():
        return
    m.homing = None
    if h["error"] is not None:
        m.fault(h["error"])
        return
    try:
        fb = m.drives.read(m.t)
    except Exception as e:  # noqa: BLE001
        m.fault(f"after homing: {e}")
        return
    homed(m, h["result"], fb.position)
    m.set_state(State.STANDSTILL, "homed")


def homed(m, result: dict, position: np.ndarray) -> None:
    """The machine homed where it stands (``position``, the homed frame), holding there."""
    m.homed = True
    m.home_result = result
    m.sup.stale = m.sup.late = 0
    m.source = Hold(position.copy())
    m.event("homed", json.dumps(result, default=str))


def abort(m, why: str) -> None:
    """Halt the drives' homing (controlword bit 8); the homing ends in error stop."""
    if m.homing is not None:
        m.homing["halt"].set()
        m.homing["why"] = why
