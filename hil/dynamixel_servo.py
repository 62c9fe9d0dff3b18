"""One emulated Dynamixel X-series servo (XM540-W270 control table): its control table as data
(factory values, read-only addresses, the EEPROM area) and the access rules of a read or a
write (docs/emulators.md lists the addresses), its torque state and its Bus Watchdog.

Bus Watchdog (address 98, e-Manual): 0 off (writing 0 also clears its error), 1..127 armed in
units of 20 ms, 0xFF (-1) the watchdog error. A servo with torque on whose last instruction
packet (addressed to it or broadcast) is older than the watchdog time stops: 98 reads 0xFF and
the Goal values (Goal PWM 100, Goal Current 102, Goal Velocity 104, Goal Position 116) become
read-only (a Write answers Data Range Error, a Sync Write is ignored) until 98 is written 0.
The e-Manual says the servo "stops" and leaves Torque Enable as it is; in current mode this
emulator stops by applying no current. Each trip is reported with its ``time.monotonic()``
(comparable across processes), as is the time from which no servo applied torque.
"""

from __future__ import annotations

import struct

from pkrt.drivers.dynamixel_xseries import (ADDR_BUS_WATCHDOG, ADDR_CURRENT_LIMIT, ADDR_GOAL_CURRENT,
                                            ADDR_HARDWARE_ERROR, ADDR_OPERATING_MODE, ADDR_TORQUE_ENABLE,
                                            BUS_WATCHDOG_ERROR, BUS_WATCHDOG_UNIT_MS)

TABLE_SIZE = 147  # up to Present Temperature (146)
EEPROM_END = 64  # addresses below: EEPROM area, writable only with torque off
READ_ONLY = {0, 1, 2, 3, 4, 5, 6, 69, 70, 120, 121, 122, 123, *range(124, 147)}
MODEL_XM540_W270 = 1120
HW_OVERLOAD = 0x20
HW_ENCODER = 0x08  # motor encoder error: what a servo reports when the plant left its model's box
GOAL_VALUES = (*range(100, 108), *range(116, 120))  # Goal PWM, Current, Velocity, Position


class Servo:
    """One X-series servo: its control table (little-endian) and torque state."""

    def __init__(self, dxl_id: int, current_limit: int = 2047):
        t = self.table = bytearray(TABLE_SIZE)
        struct.pack_into("<H", t, 0, MODEL_XM540_W270)
        t[6] = 46  # firmware version
        t[7] = dxl_id
        t[8] = 6  # baud rate 4 Mbps
        t[11] = 3  # operating mode: position (factory default)
        struct.pack_into("<H", t, ADDR_CURRENT_LIMIT, current_limit)
        t[68] = 2  # status return level: answer every instruction
        struct.pack_into("<H", t, 144, 120)  # 12.0 V
        t[146] = 35  # degC
        self.last_instruction = 0.0  # time.monotonic() of the last instruction packet it received
        self.min_watchdog = 0.0  # s, the shortest Bus Watchdog time (stepped timing: hil/timing.py)

    @property
    def id(self) -> int:
        return self.table[7]

    @property
    def torque(self) -> bool:
        return self.table[ADDR_TORQUE_ENABLE] == 1

    @property
    def watchdog_error(self) -> bool:
        return self.table[ADDR_BUS_WATCHDOG] == BUS_WATCHDOG_ERROR

    @property
    def applies_torque(self) -> bool:
        """Torque on and not stopped by its Bus Watchdog."""
        return self.torque and not self.watchdog_error

    def watchdog_due(self) -> float | None:
        """time.monotonic() at which the armed Bus Watchdog expires, None when it cannot."""
        wd = self.table[ADDR_BUS_WATCHDOG]
        if not self.torque or not 1 <= wd <= 127:
            return None
        return self.last_instruction + max(wd * BUS_WATCHDOG_UNIT_MS * 1e-3, self.min_watchdog)

    def goal_current(self) -> int:
        return struct.unpack_from("<h", self.table, ADDR_GOAL_CURRENT)[0]

    def read(self, addr: int, n: int) -> tuple[int, bytes]:
        if n < 1 or addr + n > TABLE_SIZE:
            return 7, b""  # access error
        return 0, bytes(self.table[addr: addr + n])

    def write(self, addr: int, data: bytes) -> int:
        """Write with the X-series access rules; returns the status error number (0 = ok)."""
        n = len(data)
        if n < 1 or addr + n > TABLE_SIZE or any(a in READ_ONLY for a in range(addr, addr + n)):
            return 7
        if addr < EEPROM_END and self.torque:
            return 7  # EEPROM area locked while torque is on
        err = self._control_error(addr, data) or self._goal_error(addr, data)
        if err:
            return err
        self.table[addr: addr + n] = data
        return 0

    def _control_error(self, addr: int, data: bytes) -> int:
        """The error number of a write to Torque Enable, Operating Mode or Bus Watchdog with a
        value refused (4: out of range; 1: torque on after a hardware error), 0 when none."""
        end = addr + len(data)
        if addr <= ADDR_TORQUE_ENABLE < end:
            v = data[ADDR_TORQUE_ENABLE - addr]
            if v > 1:
                return 4
            if v == 1 and self.table[ADDR_HARDWARE_ERROR]:
                return 1  # shut down: torque cannot be enabled before a reboot
        if addr <= ADDR_OPERATING_MODE < end and data[ADDR_OPERATING_MODE - addr] not in (0, 1, 3, 4, 5, 16):
            return 4
        if addr <= ADDR_BUS_WATCHDOG < end:
            wd = data[ADDR_BUS_WATCHDOG - addr]
            if wd > 127 or (self.watchdog_error and wd):
                return 4  # 0..127 only; in the error state only 0 (clear)
        return 0

    def _goal_error(self, addr: int, data: bytes) -> int:
        """The error number of a write to the goal values refused (4: after a Bus Watchdog
        error; 6: Goal Current beyond Current Limit), 0 when none."""
        n = len(data)
        if self.watchdog_error and any(addr <= a < addr + n for a in GOAL_VALUES):
            return 4  # Goal values read-only after a Bus Watchdog error
        if addr <= ADDR_GOAL_CURRENT and addr + n >= ADDR_GOAL_CURRENT + 2:
            g = struct.unpack_from("<h", data, ADDR_GOAL_CURRENT - addr)[0]
            if abs(g) > struct.unpack_from("<H", self.table, ADDR_CURRENT_LIMIT)[0]:
                return 6  # data limit error
        return 0

    def shutdown(self, bits: int) -> None:
        """Hardware error: set the status bits and take torque off (X-series shutdown)."""
        self.table[ADDR_HARDWARE_ERROR] |= bits
        self.table[ADDR_TORQUE_ENABLE] = 0
