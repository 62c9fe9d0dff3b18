"""The lifecycle of ``DynamixelDrives`` (drivers/dynamixel.py) before its cyclic path:
``configure`` (every servo pinged, checked and put in current mode, a Bus Watchdog error left
by an earlier run cleared and reported) and ``enable`` (the Bus Watchdog armed, torque on).
Functions of the drives object; transactions are ``DynamixelBus``'s.
"""

from __future__ import annotations

import struct

from . import dynamixel_protocol as dxp
from .base import DriveError
from .dynamixel_xseries import (ADDR_BUS_WATCHDOG, ADDR_CURRENT_LIMIT, ADDR_HARDWARE_ERROR, ADDR_OPERATING_MODE,
                                ADDR_TORQUE_ENABLE, BUS_WATCHDOG_ERROR, MODE_CURRENT)


def configure(d) -> None:
    """Open the port, then for every servo: ping (its model), torque off, no hardware error,
    current mode (read back), the current limit (the smaller of the configuration's and the
    servo's), the Bus Watchdog cleared; then feedback complete once."""
    if d.ser is None:
        d._open()
    d.watchdog_cleared = []
    for i, dxl_id in enumerate(d.settings.ids):
        model = d.transact(dxl_id, dxp.ping(dxl_id), 3, "ping")
        d.models[dxl_id] = model[0] | (model[1] << 8)
        d.transact(dxl_id, dxp.write(dxl_id, ADDR_TORQUE_ENABLE, b"\0"), 0, "torque disable")
        hw = d.transact(dxl_id, dxp.read(dxl_id, ADDR_HARDWARE_ERROR, 1), 1, "hardware error read")[0]
        if hw:
            raise DriveError(f"servo {dxl_id}: hardware error at configure: {dxp.hardware_error_text(hw)} "
                             f"(reboot the servo)")
        d.transact(dxl_id, dxp.write(dxl_id, ADDR_OPERATING_MODE, bytes((MODE_CURRENT,))), 0,
                      "operating mode write")
        mode = d.transact(dxl_id, dxp.read(dxl_id, ADDR_OPERATING_MODE, 1), 1, "operating mode read")[0]
        if mode != MODE_CURRENT:
            raise DriveError(f"servo {dxl_id}: operating mode is {mode} after setting current mode (0)")
        lim = struct.unpack("<H", d.transact(dxl_id, dxp.read(dxl_id, ADDR_CURRENT_LIMIT, 2), 2,
                                                "current limit read"))[0]
        d._limit[i] = min(int(d.settings.current_limit[i]), lim)
        clear_watchdog(d, dxl_id)
    for _ in range(d.settings.fail_cycles):  # feedback holds the machine's position from here on
        if d._read(0.0).fresh:
            break
    else:
        raise DriveError(f"servos on {d.settings.port}: no complete feedback at configure")
    d.stats["cycles"] = 0
    d._fail_run = d._late_hist = 0


def clear_watchdog(d, dxl_id: int) -> None:
    """Bus Watchdog off; a watchdog error left by an earlier run (Goal values read-only) is
    cleared and reported."""
    if not d.settings.bus_watchdog_ms:
        return
    try:
        wd = d.transact(dxl_id, dxp.read(dxl_id, ADDR_BUS_WATCHDOG, 1), 1, "bus watchdog read")[0]
    except DriveError as e:
        raise DriveError(f"{e} (the Bus Watchdog, address 98, needs firmware v38 or later; bus_watchdog_ms = 0 "
                         "in [drives] runs without it)") from None
    if wd:
        if wd == BUS_WATCHDOG_ERROR:
            d.watchdog_cleared.append(dxl_id)
        d.transact(dxl_id, dxp.write(dxl_id, ADDR_BUS_WATCHDOG, b"\0"), 0, "bus watchdog clear")


def enable(d) -> None:
    """Goal Current 0 with torque off, then per servo the Bus Watchdog armed and torque on."""
    d._send_goal_zero()  # with torque still off
    units = bytes((d.settings.bus_watchdog_units,))
    for dxl_id in d.settings.ids:
        if units[0]:  # armed first: it watches from the moment torque is on
            d.transact(dxl_id, dxp.write(dxl_id, ADDR_BUS_WATCHDOG, units), 0, "bus watchdog write")
        d.transact(dxl_id, dxp.write(dxl_id, ADDR_TORQUE_ENABLE, b"\x01"), 0, "torque enable")
    d._fail_run = d._late_hist = 0
