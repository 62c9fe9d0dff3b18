"""CiA 402 homing mode (6): the master's procedure (drivers/cia402_homing.py) against the
emulated drives (hil/cia402_homing.py) on python-can's virtual bus: home on the current
position (35) and by a limit-switch search (18) end with the position actual value at the home
offset within one count, then cyclic torque; halt, timeout, the homing error bit and a drive
fault end in a ``HomingError``."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import threading
import time

import numpy as np
import pytest

from pkrt.drivers.cia402 import CiA402Drives
from pkrt.drivers.cia402_homing import HomingError, home
from pkrt.drivers.sim import Plant
from pkrt.hil.cia402_emulator import CiA402Emulator
from pkrt.rt.runtime.machine.config import load_machine

from .realtime import RUN_PRIORITY, emulator_trips, judge

RATE = 100.0
THETA0 = np.array([-0.1, -0.12, -0.08])
_ch = itertools.count()


@pytest.fixture(scope="module")
def config():
    return dataclasses.replace(load_machine("orthoglide-can"), rate_hz=RATE)


@contextlib.contextmanager
def make_pair(config):
    plant = Plant.from_config(config)
    plant.reset(THETA0)
    ch = f"test-homing-{next(_ch)}"
    drives = CiA402Drives.from_config(config, {"interface": "virtual", "channel": ch, "tpdo_timeout": 0.5 / RATE,
                                               "max_missed_cycles": 2})
    em = CiA402Emulator.from_config(config, ch, plant=plant)
    em.start()
    try:
        drives.configure()
        yield drives, em, plant
    finally:
        drives.close()
        em.stop()


@pytest.fixture
def pair(config):
    with make_pair(config) as pr:
        yield pr


# what a host pause causes (the SYNC thread or the master's heartbeat held up: the emulated drives
# leave Operation enabled by their own watchdogs): such a run is judged by the host-pause probe
STALL = ("left Operation enabled", "not in Operation enabled", "No SDO response")


def homing_error(config, probe, match: str, prepare=None, **kw) -> str:
    """The HomingError message of a homing run; one that ends by a stall instead is judged by
    the host-pause ``probe`` at the time of the drives' own watchdog trips (or of the error)."""
    def run():
        with make_pair(config) as (drives, em, plant):
            if prepare is not None:
                prepare(em)
            try:
                home(drives, **kw)
            except HomingError as e:
                msg, at = str(e), time.monotonic()
            else:
                return "no error", []
            if match in msg or not any(t in msg for t in STALL):
                return msg, []
            return msg, emulator_trips(em) or [(at, msg)]
    return judge(run, probe, find=lambda r: r[1], priority=RUN_PRIORITY)[0]


def counts(drives, x):
    return np.round(np.asarray(x) * drives.increments).astype(int)


def homed(config, probe, homing) -> tuple:
    """``homing(drives)`` (a call of ``home``) on a fresh pair, then one cycle of cyclic torque:
    (its result, the drives' increments per SI unit, the cycle's feedback freshness and
    position, the emulator). At SCHED_FIFO; the cycle's late or missing TPDOs (the driver's
    events) judged by the host-pause ``probe``."""
    def run():
        with make_pair(config) as (drives, em, plant):
            r = homing(drives)
            fb = drives.read(0.0)
            drives.write(np.zeros(drives.n_axes))
            drives.disable()
            return r, drives.increments, fb.fresh, fb.position.copy(), em, list(drives.events)
    return judge(run, probe, find=lambda x: x[5], priority=RUN_PRIORITY)[:5]


def check_cyclic_after(fresh: bool, position, offsets_si):
    """Back in cyclic torque, enabled: fresh TPDOs in the homed frame. (The horizontal axes
    stay within 1 mm of home; the vertical one falls while no torque is commanded here.)"""
    assert fresh and np.all(np.abs(position - offsets_si)[:2] < 1e-3), (position, offsets_si)


@pytest.mark.realtime
def test_home_on_the_current_position_sets_the_home_offset(config, host_probe):
    offsets = np.array([0.01, -0.02, 0.005])
    r, inc, fresh, position, _ = homed(config, host_probe,
                                       lambda drives: home(drives, 35, counts(drives, offsets), (0, 0), 0, timeout=5.0))
    assert len(r["drives"]) == 3
    assert np.all(np.abs(np.array([d["position"] for d in r["drives"]]) - np.round(offsets * inc)) <= 1)
    check_cyclic_after(fresh, position, offsets)


@pytest.mark.realtime
def test_home_by_a_limit_switch_search_with_the_0x6099_speeds(config, host_probe):
    offsets = np.array([0.0, 0.0, 0.0])

    def homing(drives):
        speeds = counts(drives, [0.2, 0.2, 0.2])[0], counts(drives, [0.01, 0.01, 0.01])[0]
        return home(drives, 18, counts(drives, offsets), speeds, 0, timeout=20.0)

    r, inc, fresh, position, em = homed(config, host_probe, homing)
    got = np.array([d["position"] for d in r["drives"]])
    assert np.all(np.abs(got - np.round(offsets * inc)) <= 1)
    # home is where the switch released, found at the zero search speed (a step of 0.01 m/s / RATE)
    assert np.all(np.abs(em.homing.zero - em.homing.switch_at) <= 0.01 / RATE + 1e-12)
    assert r["seconds"] > 0
    check_cyclic_after(fresh, position, offsets)


@pytest.mark.realtime
def test_halt_ends_homing_with_an_error(config, host_probe):
    halt = threading.Event()

    def prepare(em):
        halt.clear()
        threading.Timer(0.2, halt.set).start()
    slow = (int(0.001 * 1e6), 1)  # 1 mm/s at the Orthoglide's 1e6 increments per m
    msg = homing_error(config, host_probe, "halted", prepare, method=18, offset_counts=0, speeds_counts=slow,
                       accel_counts=0, timeout=30.0, halt=halt)
    assert "halted" in msg, msg


@pytest.mark.realtime
def test_timeout(config, host_probe):
    msg = homing_error(config, host_probe, "homing timeout", method=18, offset_counts=0, speeds_counts=(1000, 1),
                       accel_counts=0, timeout=0.3)
    assert "homing timeout" in msg, msg


@pytest.mark.realtime
def test_the_homing_error_bit(config, host_probe):
    def prepare(em):
        em.homing.switch_at = em.homing.switch_at + 10.0  # no switch within the range
    msg = homing_error(config, host_probe, "homing error", prepare, method=18, offset_counts=0,
                       speeds_counts=(500000, 1), accel_counts=0, timeout=30.0)
    assert "homing error" in msg, msg


def test_a_drive_fault_while_homing(pair):
    drives, em, plant = pair
    em.fault = "drive-fault"
    em.inject_cycle = em.cycle + 10 if em.cycle >= 0 else 10
    with pytest.raises(HomingError, match="left Operation enabled"):
        home(drives, 18, counts(drives, np.zeros(3)), (counts(drives, [0.001])[0], 1), 0, timeout=30.0)


def test_an_unsupported_method_is_refused(pair):
    drives, em, plant = pair
    with pytest.raises(HomingError, match="not supported"):
        home(drives, 1, 0, (0, 0), 0, timeout=1.0)
