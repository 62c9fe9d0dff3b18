"""Dynamixel Homing Offset (address 20): written with torque off through the real driver over
a pseudo-terminal to the servo emulator, the servos then report the chosen home counts at
their present position (Present Position = actual + offset), within one count; refused with
torque on (EEPROM area)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from pkrt.drivers.base import DriveError
from pkrt.drivers.dynamixel import DynamixelDrives
from pkrt.drivers.dynamixel_homing import ADDR_HOMING_OFFSET, present_counts, set_home
from pkrt.rt.runtime.machine.config import load_machine

from .test_dynamixel import ThreadEmulator


@pytest.fixture
def pair():
    config = load_machine("orthoglide-serial")
    emu = ThreadEmulator()
    emu.emu.arm(None, 0, config.rate_hz)
    drives = DynamixelDrives.from_config(config, {"port": emu.port})
    try:
        yield drives, emu.emu
    finally:
        drives.close()
        emu.stop()


def test_homing_offset_makes_the_present_position_the_home(pair):
    drives, emu = pair
    drives.configure()
    before = present_counts(drives)
    home = np.array([1000, -2000, 0])
    r = set_home(drives, home)
    assert np.all(np.abs(np.array(r["positions"]) - home) <= 1)
    assert np.all(np.abs(present_counts(drives) - home) <= 1)
    for i, sv in zip(range(3), emu.servos.values()):  # the offset is in the servo's table (EEPROM)
        assert struct.unpack_from("<i", sv.table, ADDR_HOMING_OFFSET)[0] == r["offsets"][i]
    assert np.all(np.array(r["offsets"]) == home - before)
    drives.enable()  # cyclic feedback is in the homed frame
    fb = drives.read(0.0)
    assert fb.fresh
    drives.disable()


def test_homing_offset_is_refused_with_torque_on(pair):
    drives, emu = pair
    drives.configure()
    drives.enable()
    with pytest.raises(DriveError, match="disabled"):
        set_home(drives, [0, 0, 0])
    drives.disable()
