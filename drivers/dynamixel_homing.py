"""Dynamixel X-series "homing": the servos have absolute encoders and no homing routine; the
Homing Offset (control table address 20, 4 bytes, EEPROM area: written with torque off) is
added to the actual position in Present Position (132). Setting it makes the servo report a
chosen value at its present position, the way an incremental drive's homing sets its home
offset. Units: servo position counts (``position_resolution`` per turn) on the bus.
"""

from __future__ import annotations

import struct

import numpy as np

from pkrt.drivers import dynamixel_protocol as dxp

from .base import DriveError
from .dynamixel_xseries import ADDR_PRESENT_POSITION

ADDR_HOMING_OFFSET = 20
HOMING_OFFSET_LIMIT = 1_044_479  # the X series' range of address 20 (+/- 255 turns)


def present_counts(drives) -> np.ndarray:
    """Present Position (132) of every servo, counts (homing offset included)."""
    return np.array([struct.unpack("<i", drives.transact(i, dxp.read(i, ADDR_PRESENT_POSITION, 4), 4,
                                                         "present position read"))[0]
                     for i in drives.settings.ids])


def set_home(drives, home_counts) -> dict:
    """Make every servo of configured (torque off) ``DynamixelDrives`` report ``home_counts``
    at its present position: Homing Offset = home - (present - old offset). Returns the
    offsets written and the positions read back."""
    if drives.torque_on:
        raise DriveError("homing offset: the servos must be disabled (address 20 is in the EEPROM area)")
    ids = list(drives.settings.ids)
    home = np.broadcast_to(np.asarray(home_counts, dtype=np.int64), (len(ids),))
    old = np.array([struct.unpack("<i", drives.transact(i, dxp.read(i, ADDR_HOMING_OFFSET, 4), 4,
                                                        "homing offset read"))[0] for i in ids])
    actual = present_counts(drives) - old
    new = home - actual
    for i, (dxl_id, off) in enumerate(zip(ids, new)):
        if abs(off) > HOMING_OFFSET_LIMIT:
            raise DriveError(f"servo {dxl_id}: homing offset {off} outside +/-{HOMING_OFFSET_LIMIT} counts")
        drives.transact(dxl_id, dxp.write(dxl_id, ADDR_HOMING_OFFSET, struct.pack("<i", int(off))), 0,
                        "homing offset write")
    return {"offsets": new.tolist(), "positions": present_counts(drives).tolist()}


def home_counts(settings, home_si) -> np.ndarray:
    """The Present Position (counts) of actuator coordinates ``home_si`` (m or rad), the
    driver's conversion inverted: counts = zero + home / (direction x scale / resolution)."""
    s = len(settings.ids)
    home = np.broadcast_to(np.asarray(home_si, float), (s,))
    k = np.array([settings.direction[i] * settings.scale(i) / settings.position_resolution[i] for i in range(s)])
    return np.round(np.asarray(settings.zero, float) + home / k).astype(np.int64)


def home_here(drives, home_si) -> dict:
    """Home enabled or disabled ``DynamixelDrives`` where the machine stands: torque off (the
    EEPROM area is locked while torque is on), configured again, then the Homing Offset set so
    that the present position reads actuator coordinates ``home_si`` (m or rad). The drives
    are left configured, torque off: the caller enables them. Returns the home (counts), the
    offsets written and the Present Positions read back (counts)."""
    drives.disable()
    drives.configure()
    counts = home_counts(drives.settings, home_si)
    return {"method": "homing offset (address 20)", "home_counts": counts.tolist(), **set_home(drives, counts)}
