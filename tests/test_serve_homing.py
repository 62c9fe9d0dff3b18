"""Homing a served machine on CiA 402 drives (the emulator on python-can's virtual bus, the
Orthoglide at 100 Hz in real time), through the socket: task-space motion refused before,
home (method 35, a home offset) -> standstill with the position at the offset; stop during a
slow limit-switch search -> error stop (halted); a homing timeout -> error stop."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import time

import numpy as np
import pytest

from pkrt.drivers.sim import Plant
from pkrt.hil.cia402_emulator import CiA402Emulator
from pkrt.rt.app.client import CommandRefused, MachineClient
from pkrt.rt.app.serve import Served
from pkrt.rt.runtime.machine.config import load_machine
from pkrt.rt.core.errors import Fault

from .realtime import RUN_PRIORITY, emulator_trips, judge

# what a host pause causes: the emulated drives' own watchdogs (SYNC, heartbeat) trip, or the
# master's TPDO timeout: such a run is judged by the host-pause probe (tests/realtime.py)
STALL = ("EMCY 0x8130", "TPDO timeout", "left Operation enabled", "watchdog", "not in Operation enabled",
         "No SDO response")


class Stalled(Exception):
    """A served run that ended by a timing fault (``STALL``) other than the one a test waits
    for: its message and the time.monotonic() it was seen."""

    def __init__(self, msg: str):
        super().__init__(msg)
        self.at = time.monotonic()


def attempt(tmp_path, probe, body) -> None:
    """``body(srv, em, c)`` on a fresh served machine; a run that a timing fault ended is
    judged by the host-pause ``probe`` at the time of the drives' own watchdog trips, else of
    the master's missing TPDOs, else of the fault."""
    def run():
        d = tmp_path / f"a{next(_ch)}"
        d.mkdir()
        with serve_can(d) as (srv, em, c):
            try:
                body(srv, em, c)
            except (Fault, CommandRefused, Stalled) as e:  # a refusal too: an enable whose SDO a stall timed out
                # a command refused because a fault put the machine in error stop: judged by that fault
                why, at = f"{e}: {srv.machine.fault_reason}", srv.machine.fault_time
                if not any(t in why for t in STALL):
                    raise AssertionError(f"{type(e).__name__}: {why}") from e  # with the fault behind a refusal
                missing = [(t, w) for t, w in getattr(srv.drives, "events", []) if "missing" in w]
                return emulator_trips(em) or missing or [(at or getattr(e, "at", None) or time.monotonic(), why)]
        return []
    judge(run, probe, find=lambda found: found, priority=RUN_PRIORITY)


RATE = 100.0
_ch = itertools.count()


@contextlib.contextmanager
def serve_can(tmp_path):
    config = dataclasses.replace(load_machine("orthoglide-can"), rate_hz=RATE)
    ch = f"serve-home-{next(_ch)}"
    plant = Plant.from_config(config)
    plant.reset(np.array([-0.1, -0.1, -0.1]))
    em = CiA402Emulator.from_config(config, ch, plant=plant)
    em.start()
    srv = Served(config, socket_path=str(tmp_path / "c.sock"), log_path=str(tmp_path / "c.pktlog"),
                 overrides={"interface": "virtual", "channel": ch, "tpdo_timeout": 0.5 / RATE, "max_missed_cycles": 2,
                            # the emulator is a thread of this process here (one GIL with the served
                            # loop and its server), not a drive of its own: SYNC loss after 300 ms
                            "sync_loss_cycles": 30})
    srv.start()
    try:
        with MachineClient(srv.socket_path) as c:
            yield srv, em, c
    finally:
        srv.close()
        em.stop()


@pytest.mark.realtime
def test_home_sets_the_offset_then_task_motion_is_allowed(tmp_path, host_probe):
    attempt(tmp_path, host_probe, home_then_move)


def home_then_move(srv, em, c):
    c.enable()
    r = c.request({"cmd": "move", "space": "task", "target": [0.0, 0.0, 0.0]})
    assert not r["ok"] and "needs the machine homed" in r["error"]
    offset = [-0.1, -0.1, -0.1]
    assert c.call("home", method=35, offset=offset)["state"] == "homing"
    st = c.wait_state("standstill", timeout=60)
    assert st["homed"]
    inc = srv.drives.increments
    # where homing ended, every drive reported the home offset (within a count)
    got = np.array([d["position"] for d in st["home_result"]["drives"]])
    assert np.all(np.abs(got - np.round(np.array(offset) * inc)) <= 1), got
    # then the machine holds where it is, in the homed frame: the drives applied the machine's
    # weight from enable until the loop's first cycle
    assert st["motion"]["kind"] == "hold" and st["torque_on"]
    assert np.abs(np.array(st["position"]) - offset).max() < 1e-3, st["position"]
    r = c.move([-0.1, -0.1, -0.1], speed=0.1)
    assert r["ok"]
    c.wait_state("standstill", timeout=60)


def ends_in_error_stop(c, word: str) -> None:
    """The machine goes to error stop with ``word`` in its reason (another timing fault: a
    stall, raised as ``Stalled`` for ``attempt`` to judge)."""
    try:
        c.wait_state("standstill", timeout=60)
        msg = "reached standstill"
    except Fault as e:
        msg = str(e)
    if word not in msg and any(t in msg for t in STALL):
        raise Stalled(msg)
    assert word in msg, msg


@pytest.mark.realtime
def test_stop_while_homing_halts_into_error_stop(tmp_path, host_probe):
    def body(srv, em, c):
        c.enable()
        c.call("home", method=18, speeds=[0.0005, 0.0005], timeout=60)
        c.stop()
        ends_in_error_stop(c, "halted")
        st = c.status()
        assert st["state"] == "error_stop" and not st["homed"]
    attempt(tmp_path, host_probe, body)


@pytest.mark.realtime
def test_a_homing_timeout_ends_in_error_stop(tmp_path, host_probe):
    def body(srv, em, c):
        c.enable()
        c.call("home", method=18, speeds=[0.0005, 0.0005], timeout=0.3)
        ends_in_error_stop(c, "homing timeout")
    attempt(tmp_path, host_probe, body)
