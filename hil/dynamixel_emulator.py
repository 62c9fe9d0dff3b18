"""Dynamixel X-series servo emulator on a pseudo-terminal, driving the simulated plant.

One process holds the master side of a pty (``os.openpty()``); the driver opens the slave
path with pyserial as if it were a USB-serial adapter. The emulator answers Protocol 2.0 Ping,
Read, Write, Sync Read, Sync Write, Bulk Read, Bulk Write, Fast Sync Read and Fast Bulk Read
for its servos, each with an X-series control table (current mode only moves the plant);
other instructions to one servo get an Instruction Error status (docs/emulators.md).
Bulk Read answers like Sync Read: one status packet per servo, in the order asked. A Bulk
Write whose entries all write the same address and length acts as that Sync Write (a Goal
Current one is a loop cycle); the fast reads answer with one status packet (ID 0xFE) holding
every servo's block.

Plant clock (``clock``): ``step`` (``pkrt hil``'s default, ``--timing stepped``) advances the
plant exactly one period (1 / rate) per Goal Current write with torque on, whatever the wall
time between writes: a host pause delays the run without changing it. ``cycle`` runs the plant on the loop's period grid: each
Goal Current write advances it by one period (1 / rate) under the new currents, the sequence
of a lockstep simulation whatever the jitter of the messages; periods the loop skipped after
an overrun are added under the old currents before the next write is applied, counted on the
wall clock on a period grid anchored at the earliest-arriving write. A write that the pty
delivers more than a period late looks like a skip; the next write then lands in the same
period and undoes it (the plant holds for that write), so message jitter never leaves the
plant ahead of the loop (at 1 kHz the pty's delivery delay reaches a period: p99 0.9 ms). ``wall`` advances it to the present wall-clock time before each Read / Sync Read is
answered and before each Goal Current write takes effect (torques piecewise constant in
between), so message jitter shows up as motion. In both, a holding brake keeps the machine
still while every servo's torque is off, and releases at the first Goal Current write after
torque on (the loop's first cycle), as drives with a brake do.

Cycle index: a Sync Write of Goal Current while some servo has torque on is one loop cycle
(the driver zeroes Goal Current only with torque off, at enable and after disable): cycle k
is the loop cycle whose Goal Current write is the (k+1)-th such write.

Fault injection (from ``inject_cycle`` on, i.e. the reads of loop cycle ``inject_cycle``):
``drop`` status packets of ``fault_servo`` are lost (every ``fault_period``-th one),
``delay`` every answer is sent ``delay`` s late, ``corrupt`` a byte of each status packet of
``fault_servo`` is damaged, ``drive-fault`` ``fault_servo`` trips a hardware error (overload:
torque off, alert bit in its status packets), ``sever`` the servos' transmit line is cut (no
answers; instructions still arrive), ``nan`` the plant's state turns non-finite and the servos
report the register value an invalid number becomes (-2**31).

Bus Watchdog (address 98, e-Manual): 0 off (writing 0 also clears its error), 1..127 armed in
units of 20 ms, 0xFF (-1) the watchdog error. A servo with torque on whose last instruction
packet (addressed to it or broadcast) is older than the watchdog time stops: 98 reads 0xFF and
the Goal values (Goal PWM 100, Goal Current 102, Goal Velocity 104, Goal Position 116) become
read-only (a Write answers Data Range Error, a Sync Write is ignored) until 98 is written 0.
The e-Manual says the servo "stops" and leaves Torque Enable as it is; in current mode this
emulator stops by applying no current. Each trip is reported with its ``time.monotonic()``
(comparable across processes), as is the time from which no servo applied torque.

Run: ``python -m pkrt.hil.dynamixel_emulator [--machine M] [--fault KIND] [--inject-cycle N]``.
It prints one JSON line ``{"port": "/dev/pts/N"}``, serves until stdin closes (or SIGTERM),
then prints one JSON line with its report (cycles, injected_cycle, torque_off_cycle, ...).
JSON lines on stdin re-arm it between runs or ask for the report (see ``serve``).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import select
import socket
import signal
import struct
import sys
import time
import tty

import numpy as np

from pkrt.drivers import dynamixel_protocol as dxp
from pkrt.drivers.dynamixel import (ADDR_BUS_WATCHDOG, ADDR_CURRENT_LIMIT, ADDR_GOAL_CURRENT, ADDR_HARDWARE_ERROR,
                                    ADDR_OPERATING_MODE, ADDR_PRESENT_POSITION, ADDR_PRESENT_VELOCITY,
                                    ADDR_TORQUE_ENABLE, BUS_WATCHDOG_ERROR, BUS_WATCHDOG_UNIT_MS, MODE_CURRENT,
                                    DynamixelSettings, load_settings)
from pkrt.drivers.dynamixel_homing import ADDR_HOMING_OFFSET
from pkrt.drivers.plant import plant_left_its_model
from pkrt.rt.core.errors import UserError
from pkrt.rt.runtime.loop import apply_realtime

from .timing import STEPPED_DELAY, STEPPED_SYNC_SILENCE

FAULT_KINDS = ("drop", "delay", "corrupt", "drive-fault", "sever", "nan")
HELD_MIN = 1e-3  # s: a wake-up this much later than asked is the host holding this process
CLOCKS = ("step", "cycle", "wall")  # plant clocks (module docstring)
TABLE_SIZE = 147  # up to Present Temperature (146)
EEPROM_END = 64  # addresses below: EEPROM area, writable only with torque off
READ_ONLY = {0, 1, 2, 3, 4, 5, 6, 69, 70, 120, 121, 122, 123, *range(124, 147)}
MODEL_XM540_W270 = 1120
HW_OVERLOAD = 0x20
HW_ENCODER = 0x08  # motor encoder error: what a servo reports when the plant left its model's box
INT32_MIN = -(2 ** 31)
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


class DynamixelEmulator:
    """Servos + plant + fault injection; ``handle(bytes) -> list of (due time, bytes)``."""

    def __init__(self, settings: DynamixelSettings, plant, rate_hz: float, fault: str | None = None,
                 inject_cycle: int = 0, fault_servo: int | None = None, fault_period: int = 1,
                 delay: float = 0.02, clock: str = "cycle", theta0=None):
        if clock not in CLOCKS:
            raise UserError(f"emulator clock must be one of {', '.join(CLOCKS)}, got {clock!r}")
        self.st = settings
        self.plant = plant
        self.priority = 0  # SCHED_FIFO priority of the emulator process (0: do not ask)
        self.clock = clock
        self.theta0 = np.array(plant.theta if theta0 is None else theta0, dtype=float)
        self.fault_servo = settings.ids[min(1, len(settings.ids) - 1)] if fault_servo is None else fault_servo
        if self.fault_servo not in settings.ids:
            raise UserError(f"fault servo {self.fault_servo} is not one of the IDs {list(settings.ids)}")
        self.fault_period = max(1, int(fault_period))
        self.delay = float(delay) if clock != "step" else max(float(delay), STEPPED_DELAY)  # hil/timing.py
        s = len(settings.ids)
        self._tau = np.zeros(s)
        self._f_per_lsb = [settings.direction[i] * settings.force_per_lsb(i) for i in range(s)]
        self.parser = dxp.PacketParser(max_length=1024)
        self.pending: list[tuple[float, bytes]] = []  # answers not sent yet (due time, bytes)
        self.arm(fault, inject_cycle, rate_hz)

    def arm(self, fault: str | None, inject_cycle: int, rate_hz: float) -> None:
        """Power-cycle: servos at factory state, plant at rest at ``theta0``, counters zero,
        the given fault armed for cycle ``inject_cycle`` of a loop at ``rate_hz``."""
        if fault is not None and fault not in FAULT_KINDS:
            raise UserError(f"unknown serial HIL fault '{fault}' (known: {', '.join(FAULT_KINDS)})")
        if not rate_hz > 0:
            raise UserError(f"emulator rate must be positive, got {rate_hz}")
        self.dt = 1.0 / rate_hz
        self.fault = fault
        self.inject_cycle = int(inject_cycle)
        self.plant.reset(self.theta0)
        self.servos = {i: Servo(i, int(lim)) for i, lim in zip(self.st.ids, self.st.current_limit)}
        if self.clock == "step":  # the host may hold the master's vCPU alone: hil/timing.py
            for sv in self.servos.values():
                sv.min_watchdog = STEPPED_SYNC_SILENCE
        self.parser.clear()
        self.pending.clear()
        self._t_plant: float | None = None  # wall clock (s) the plant state belongs to
        self.brake = True  # holding brake engaged: the plant does not move
        self._t0: float | None = None  # cycle clock: the writes' period grid origin (earliest arrival)
        self._k_plant = 0  # cycle clock: the plant is at the start of this period
        self._unconfirmed = 0  # cycle clock: skips not yet confirmed by a write on the new phase
        self.skipped_periods = 0  # cycle clock: loop periods skipped (overruns)
        self.late_writes = 0  # cycle clock: skips undone (a write delivered over a period late)
        self.skips: list = []  # (cycle, periods, phase) of the first 20 skips
        self.plant_error: str | None = None  # the plant left its tree's box (the servos stopped)
        self.cycles = 0  # Sync Writes of Goal Current with torque on seen on the line
        self.max_gap = 0.0  # s, longest silence on the line while cycling (a stall of either end)
        self.stalls = 0  # times this process woke over HELD_MIN late (see held)
        self.stall_max = 0.0  # s, the longest of them
        self._last_rx: float | None = None
        self.injected = False
        self.injected_cycle: int | None = None
        self.torque_off_cycle: int | None = None
        self.nonzero_after_off = 0
        self.watchdog_trips: list[dict] = []  # Bus Watchdog expiries: servo, time.monotonic(), cycle
        self.torque_off_at: float | None = None  # time.monotonic() from which no servo applied torque
        self._status_count = 0
        self.counts = dict(instructions=0, answers=0, dropped=0, corrupted=0, delayed=0, suppressed=0)
        self.spoilt_at: list[float] = []  # time.monotonic() of each status packet dropped or corrupted (first 1000)
        self._update_present()
        self._activate()  # a fault armed for cycle 0 is there from the start

    # -- plant <-> registers ------------------------------------------------------------------
    def _update_present(self) -> None:
        st = self.st
        for i, dxl_id in enumerate(st.ids):
            th, thd = float(self.plant.theta[i]), float(self.plant.theta_dot[i])
            scale = st.scale(i)
            t = self.servos[dxl_id].table
            pos = (th / scale * st.position_resolution[i] * st.direction[i] + st.zero[i]
                   + struct.unpack_from("<i", t, ADDR_HOMING_OFFSET)[0])  # Present = actual + Homing Offset
            vel = thd / scale * 60.0 / st.velocity_unit[i] * st.direction[i]
            struct.pack_into("<i", t, ADDR_PRESENT_VELOCITY, _int32(vel))
            struct.pack_into("<i", t, ADDR_PRESENT_POSITION, _int32(pos))
            cur = self.servos[dxl_id].goal_current() if self._drives_plant(dxl_id) else 0
            struct.pack_into("<h", t, 126, cur)

    def _catch_up(self, now: float) -> None:
        """Before answering a read: the plant moves to the present (wall clock; the cycle
        clock moves it at writes only)."""
        if self.clock == "wall":
            self._advance(now)

    def _tick(self, now: float) -> None:
        """Realtime Tick (ms, wraps at 32768) and Moving of every servo at time ``now``."""
        tick = int(now * 1000.0) % 32768
        for sv in self.servos.values():
            struct.pack_into("<H", sv.table, 120, tick)
            sv.table[122] = int(abs(struct.unpack_from("<i", sv.table, ADDR_PRESENT_VELOCITY)[0]) > 0)

    def _drives_plant(self, dxl_id: int) -> bool:
        sv = self.servos[dxl_id]
        return sv.applies_torque and sv.table[ADDR_OPERATING_MODE] == MODE_CURRENT

    def _advance(self, now: float, dt: float | None = None) -> None:
        """Move the plant to wall time ``now`` (or by ``dt``) under the present torques, in
        steps of at most one loop period; frozen while every servo's torque is off."""
        if dt is None:
            dt = 0.0 if self._t_plant is None else now - self._t_plant
        self._t_plant = now
        if not any(self._drives_plant(i) for i in self.servos):
            self.brake = True
        if dt <= 0.0 or self.brake:
            return
        for i, dxl_id in enumerate(self.st.ids):
            self._tau[i] = self.servos[dxl_id].goal_current() * self._f_per_lsb[i] if self._drives_plant(dxl_id) else 0.0
        if np.all(np.isfinite(self.plant.x)) and self.plant_error is None:
            n = max(1, math.ceil(dt / self.dt - 1e-9))
            for _ in range(n):
                if plant_left_its_model(self.plant, self.plant.step(self._tau, dt / n)):
                    self.plant_error = plant_left_its_model(self.plant, self.plant.status)
                    for sv in self.servos.values():  # no physics here: every servo stops
                        sv.shutdown(HW_ENCODER)
                    self._check_torque_off()
                    break
        self._update_present()

    def _periods_at_write(self, now: float) -> int:
        """Cycle clock, at a Goal Current write: the periods the loop skipped before it (added
        under the old currents), 0 normally, or -1 when the plant is already past this write's
        period (an earlier write arrived over a period late and was taken for a skip: undone,
        the plant holds for this write). Grid anchored at the earliest-arriving write."""
        if self._t0 is None:
            self._t0 = now - self._k_plant * self.dt
            return 0
        k = math.floor((now - self._t0) / self.dt + 1e-6)  # an arrival on the anchor's phase: its period
        d = k - self._k_plant
        if d > 0:
            self._unconfirmed += d
            self.skipped_periods += d
            if len(self.skips) < 20:
                self.skips.append((self.cycles, d, round((now - self._t0) / self.dt - self._k_plant, 3)))
            return d
        if d == 0:
            self._unconfirmed = 0
            return 0
        if self._unconfirmed > 0:  # two writes in one period: the last skip was a late write
            self._unconfirmed -= 1
            self.skipped_periods -= 1
            self.late_writes += 1
            return -1
        self._t0 = now - self._k_plant * self.dt  # the grid's origin was a late arrival: re-anchor
        return 0

    # -- faults -------------------------------------------------------------------------------
    def _activate(self) -> None:
        if self.fault is None or self.injected or self.cycles < self.inject_cycle:
            return
        self.injected = True
        self.injected_cycle = self.cycles
        if self.fault == "drive-fault":
            self.servos[self.fault_servo].shutdown(HW_OVERLOAD)
        elif self.fault == "nan":
            self.plant.x[:] = np.nan
            self._update_present()

    def _check_torque_off(self) -> None:
        if all(not sv.applies_torque for sv in self.servos.values()):
            if self.torque_off_cycle is None and (self.injected or self.fault is None) and self.cycles > 0:
                self.torque_off_cycle = self.cycles
            if self.torque_off_at is None and self.cycles > 0:
                self.torque_off_at = time.monotonic()
        else:
            self.torque_off_cycle = None  # torque came back on: not off yet
            self.torque_off_at = None

    def held(self, late: float) -> None:
        """This process woke ``late`` s after the time it asked for. Over ``HELD_MIN`` s the host
        held it (on a virtual machine the host stops a vCPU for milliseconds, up to hundreds
        of ms seen): a servo's own clock would not have stopped, so that time does not count as
        the master's silence for the Bus Watchdog. Counted in ``stalls``."""
        if late <= HELD_MIN:
            return
        self.stalls += 1
        self.stall_max = max(self.stall_max, late)
        for sv in self.servos.values():
            sv.last_instruction += late

    def watchdog_due(self) -> float | None:
        """The earliest Bus Watchdog expiry (time.monotonic()), None when none is armed."""
        due = [d for d in (sv.watchdog_due() for sv in self.servos.values()) if d is not None]
        return min(due) if due else None

    def watchdog(self, now: float) -> None:
        """Stop every servo whose Bus Watchdog expired at ``now`` (time.monotonic())."""
        for sv in self.servos.values():
            due = sv.watchdog_due()
            if due is not None and now > due:
                sv.table[ADDR_BUS_WATCHDOG] = BUS_WATCHDOG_ERROR
                struct.pack_into("<h", sv.table, 126, 0)  # Present Current: stopped
                self.watchdog_trips.append({"id": sv.id, "at": now, "silent_s": round(now - sv.last_instruction, 4),
                                            "cycle": self.cycles})
        self._check_torque_off()

    def _alert(self, dxl_id: int, error: int) -> int:
        """The status error byte with the alert bit of a servo that has a hardware error."""
        return error | dxp.ERR_ALERT if self.servos[dxl_id].table[ADDR_HARDWARE_ERROR] else error

    def _out(self, dxl_id: int, error: int, params: bytes, now: float, out: list) -> None:
        """Queue one status packet through the fault layer."""
        self._send(dxp.status(dxl_id, self._alert(dxl_id, error), params), (dxl_id,), now, out)

    def _send(self, pkt: bytes, ids, now: float, out: list) -> None:
        """Queue ``pkt`` (the status of servos ``ids``) through the fault layer."""
        due = now
        if self.injected:
            if self.fault == "sever":
                self.counts["suppressed"] += 1
                return
            if self.fault_servo in ids and self.fault in ("drop", "corrupt"):
                self._status_count += 1
                if self._status_count % self.fault_period == 0:
                    if len(self.spoilt_at) < 1000:
                        self.spoilt_at.append(now)
                    if self.fault == "drop":
                        self.counts["dropped"] += 1
                        return
                    b = bytearray(pkt)
                    b[len(b) // 2] ^= 0x5A
                    pkt = bytes(b)
                    self.counts["corrupted"] += 1
            if self.fault == "delay":
                due = now + self.delay
                self.counts["delayed"] += 1
        self.counts["answers"] += 1
        out.append((due, pkt))

    # -- instructions -------------------------------------------------------------------------
    def handle(self, data: bytes, now: float | None = None) -> list[tuple[float, bytes]]:
        """Feed bytes from the line; return the answers as (due time, bytes)."""
        now = time.monotonic() if now is None else now
        self.parser.feed(data)
        out: list[tuple[float, bytes]] = []
        while (pkt := self.parser.next()) is not None:
            if pkt.instruction == dxp.STATUS:
                continue  # our own answers echoed on a shared line
            self.counts["instructions"] += 1
            self.watchdog(now)  # an expiry before this packet arrived happened first
            for sv in self.servos.values():
                if pkt.id in (sv.id, dxp.BROADCAST_ID):
                    sv.last_instruction = now
            self._instruction(pkt, now, out)
        return out

    def _instruction(self, pkt: dxp.Packet, now: float, out: list) -> None:
        targets = list(self.servos) if pkt.id == dxp.BROADCAST_ID else ([pkt.id] if pkt.id in self.servos else [])
        handler = self._INSTRUCTIONS.get(pkt.instruction)
        if handler is not None and handler(self, pkt, targets, now, out):
            return
        if targets and pkt.id != dxp.BROADCAST_ID:
            self._out(targets[0], 2, b"", now, out)  # instruction error

    # Each handler: (packet, target IDs, now, answers) -> False when the packet is not one it
    # takes (a broadcast where none is allowed, parameters too short): an instruction error.
    def _on_ping(self, pkt: dxp.Packet, targets: list, now: float, out: list) -> bool:
        for i in targets:
            self._out(i, 0, self.servos[i].read(0, 2)[1] + bytes((self.servos[i].table[6],)), now, out)
        return True

    def _reading(self, now: float) -> None:
        """Before answering with the table: the plant brought up to now."""
        self._catch_up(now)
        self._tick(now)

    def _answer_read(self, i: int, addr: int, n: int, now: float, out: list) -> None:
        err, data = self.servos[i].read(addr, n)
        self._out(i, err, data, now, out)

    def _on_read(self, pkt: dxp.Packet, targets: list, now: float, out: list) -> bool:
        if pkt.id == dxp.BROADCAST_ID:
            return False
        self._reading(now)
        for i in targets:
            if len(pkt.params) < 4:
                self._out(i, 5, b"", now, out)  # data length error
            else:
                self._answer_read(i, *struct.unpack_from("<HH", pkt.params), now, out)
        return True

    def _on_write(self, pkt: dxp.Packet, targets: list, now: float, out: list) -> bool:
        if pkt.id == dxp.BROADCAST_ID:
            return False
        self._reading(now)
        p = pkt.params
        for i in targets:
            if len(p) < 3:
                self._out(i, 5, b"", now, out)  # data length error
                continue
            addr = struct.unpack_from("<H", p)[0]
            err = self.servos[i].write(addr, p[2:])
            if not err and addr <= ADDR_HOMING_OFFSET < addr + len(p) - 2:
                self._update_present()  # a new Homing Offset shows in Present Position at once
            self._check_torque_off()
            self._out(i, err, b"", now, out)
        return True

    def _on_sync_read(self, pkt: dxp.Packet, targets: list, now: float, out: list) -> bool:
        p = pkt.params
        if len(p) < 4:
            return False
        self._reading(now)
        addr, n = struct.unpack_from("<HH", p)
        for i in p[4:]:
            if i in self.servos:
                self._answer_read(i, addr, n, now, out)
        return True

    def _on_sync_write(self, pkt: dxp.Packet, targets: list, now: float, out: list) -> bool:
        p = pkt.params
        if len(p) < 4:
            return False
        addr, n = struct.unpack_from("<HH", p)
        if n < 1 or (len(p) - 4) % (n + 1):
            return True
        goal = addr == ADDR_GOAL_CURRENT and n == 2
        if self.clock == "wall":
            self._advance(now)  # the old currents act up to now
        hold = False
        if goal and not self.brake and self.clock == "cycle":
            skipped = self._periods_at_write(now)
            hold = skipped < 0
            self._advance(now, max(skipped, 0) * self.dt)  # periods the loop skipped
            self._k_plant += max(skipped, 0)
        for k in range(4, len(p), n + 1):
            if p[k] in self.servos:
                self.servos[p[k]].write(addr, p[k + 1: k + 1 + n])
        if goal:
            self._goal_written(now, hold)
        self._check_torque_off()
        return True

    def _goal_written(self, now: float, hold: bool) -> None:
        """After a Sync Write of Goal Current: a plant period (unless ``hold``) when torque is
        on; with torque off, a nonzero goal after the torque-off cycle is counted (unless the
        servo refused it: after a Bus Watchdog error its table keeps the last goal)."""
        if any(sv.torque for sv in self.servos.values()):
            if self.brake:
                self.brake = False
                self._t0 = now
                self._k_plant = 0
                self._unconfirmed = 0
            if self.clock in ("cycle", "step") and not hold:
                self._advance(now, self.dt)
                self._k_plant += 1
            self.cycles += 1
            self._activate()
        elif self.torque_off_cycle is not None and any(sv.goal_current() and not sv.watchdog_error
                                                       for sv in self.servos.values()):
            self.nonzero_after_off += 1  # (a servo stopped by its Bus Watchdog refuses goal writes: not commanded)

    def _on_bulk_read(self, pkt: dxp.Packet, targets: list, now: float, out: list) -> bool:
        items = dxp.parse_bulk_read(pkt.params)
        if items is None:
            return False
        self._reading(now)
        for i, addr, n in items:
            if i in self.servos:
                self._answer_read(i, addr, n, now, out)
        return True

    def _on_bulk_write(self, pkt: dxp.Packet, targets: list, now: float, out: list) -> bool:
        items = dxp.parse_bulk_write(pkt.params)
        if items is None:
            return False
        if len({(a, len(d)) for _, a, d in items}) == 1:  # one address and length: a Sync Write
            a, n = items[0][1], len(items[0][2])
            params = struct.pack("<HH", a, n) + b"".join(bytes((i,)) + d for i, _, d in items)
            self._instruction(dxp.Packet(pkt.id, dxp.SYNC_WRITE, -1, params), now, out)
            return True
        if self.clock == "wall":
            self._advance(now)  # the old values act up to now
        for i, a, d in items:
            if i in self.servos:
                self.servos[i].write(a, d)
        self._check_torque_off()
        return True

    def _on_fast_read(self, pkt: dxp.Packet, targets: list, now: float, out: list) -> bool:
        """Fast Sync Read and Fast Bulk Read (broadcast only): one status packet of blocks."""
        if pkt.id != dxp.BROADCAST_ID:
            return False
        p = pkt.params
        if pkt.instruction == dxp.FAST_BULK_READ:
            items = dxp.parse_bulk_read(p)
        elif len(p) >= 5:
            addr, n = struct.unpack_from("<HH", p)
            items = [(i, addr, n) for i in p[4:]]
        else:
            items = None
        items = [it for it in items or () if it[0] in self.servos]
        if items:
            self._reading(now)
            blocks = []
            for i, addr, n in items:
                err, data = self.servos[i].read(addr, n)
                blocks.append((i, self._alert(i, err), data))  # an error: no data in its block
            self._send(dxp.fast_status(blocks), [i for i, _, _ in items], now, out)
        return True

    # instruction -> handler (a plain function of the class body: called with self)
    _INSTRUCTIONS = {
        dxp.PING: _on_ping, dxp.READ: _on_read, dxp.WRITE: _on_write,
        dxp.SYNC_READ: _on_sync_read, dxp.SYNC_WRITE: _on_sync_write,
        dxp.BULK_READ: _on_bulk_read, dxp.BULK_WRITE: _on_bulk_write,
        dxp.FAST_SYNC_READ: _on_fast_read, dxp.FAST_BULK_READ: _on_fast_read,
    }

    def report(self) -> dict:
        return dict(fault=self.fault, cycles=self.cycles, injected_cycle=self.injected_cycle,
                    torque_off_cycle=self.torque_off_cycle, nonzero_after_off=self.nonzero_after_off,
                    torque_on=[sv.applies_torque for sv in self.servos.values()], torque_off_at=self.torque_off_at,
                    bus_watchdog=[sv.table[ADDR_BUS_WATCHDOG] for sv in self.servos.values()],
                    watchdog_trips=list(self.watchdog_trips),
                    plant_error=self.plant_error, clock=self.clock, skipped_periods=self.skipped_periods, late_writes=self.late_writes, skips=self.skips,
                    max_gap_us=round(self.max_gap * 1e6, 1), stalls=self.stalls,
                    stall_us_max=round(self.stall_max * 1e6, 1),
                    garbage_bytes=self.parser.garbage, crc_errors=self.parser.crc_errors,
                    theta=[float(x) if math.isfinite(x) else None for x in self.plant.theta],
                    **self.counts)

    # -- serving ------------------------------------------------------------------------------
    def serve(self, master: int | None, control: int, reply=None, listener=None) -> None:
        """Answer on the pty master until ``control`` (a readable fd) reaches end of file.
        With ``listener`` (a listening TCP socket) instead: answer on the connection it accepts,
        the next one when the driver closes it (``master`` None until then).

        ``control`` also takes JSON lines: ``{"cmd": "arm", "fault": KIND|null, "inject_cycle":
        N, "rate_hz": R}`` (power-cycle and re-arm) and ``{"cmd": "report"}``; each is answered
        with one JSON line through ``reply(dict)``."""
        pending = self.pending
        lines = b""
        while True:
            timeout, due = self._wait_time()
            fds = [control] + ([master] if master is not None else []) + ([listener] if listener else [])
            asked = None if timeout is None else time.monotonic() + timeout
            r, _, _ = select.select(fds, [], [], timeout)
            if asked is not None:
                self.held(time.monotonic() - asked)
            if due is not None and time.monotonic() > due:
                self.watchdog(time.monotonic())
            if listener is not None and listener in r:
                master = self._accept(listener, master)
                continue
            if master is not None and master in r:
                master = self._take_line(master, listener is not None)
            if control in r:
                lines = self._take_control(control, lines, reply)
                if lines is None:
                    return
            if pending:
                self._flush(master)

    def _wait_time(self) -> tuple[float | None, float | None]:
        """(select timeout in s until the next answer or Bus Watchdog expiry, None: none due;
        the watchdog's expiry time, None when it cannot expire)."""
        timeout = None
        if self.pending:
            timeout = max(0.0, min(d for d, _ in self.pending) - time.monotonic())
        due = self.watchdog_due()
        if due is not None:
            timeout = max(0.0, due - time.monotonic() if timeout is None else min(timeout, due - time.monotonic()))
        return timeout, due

    @staticmethod
    def _accept(listener, master: int | None) -> int:
        """The fd of the connection ``listener`` accepts (the previous one closed)."""
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if master is not None:
            os.close(master)
        return conn.detach()

    def _take_line(self, master: int, closes: bool) -> int | None:
        """Read what the driver sent and queue the answers; the fd, or None when the driver
        closed the link (``closes``: a TCP connection, the next one awaited)."""
        try:
            data = os.read(master, 4096)
        except OSError:
            data = b""
        if not data and closes:  # the driver closed the link
            os.close(master)
            return None
        if data:
            t = time.monotonic()
            if self.cycles and self._last_rx is not None:
                self.max_gap = max(self.max_gap, t - self._last_rx)
            self._last_rx = t
            self.pending.extend(self.handle(data))
        return master

    def _take_control(self, control: int, lines: bytes, reply) -> bytes | None:
        """Answer the complete control lines read; the incomplete rest, None at end of file."""
        data = os.read(control, 4096)
        if not data:
            return None
        lines += data
        while b"\n" in lines:
            line, lines = lines.split(b"\n", 1)
            if line.strip() and reply is not None:
                reply(self.command(line))
        return lines

    def _flush(self, master: int | None) -> None:
        """Write the answers now due to the line (dropped while no driver is connected)."""
        now = time.monotonic()
        due = [x for x in self.pending if x[0] <= now]
        if due:
            self.pending[:] = [x for x in self.pending if x[0] > now]
            if master is not None:
                os.write(master, b"".join(b for _, b in due))

    def command(self, line: bytes) -> dict:
        """One control command (see ``serve``); errors come back as ``{"error": ...}``."""
        try:
            c = json.loads(line)
            if c.get("cmd") == "report":
                return self.report()
            if c.get("cmd") == "arm":
                self.arm(c.get("fault"), int(c.get("inject_cycle", 0)), float(c.get("rate_hz", 1.0 / self.dt)))
                return {"armed": True, "fault": self.fault, "inject_cycle": self.inject_cycle}
            return {"error": f"unknown command {c.get('cmd')!r}"}
        except (ValueError, TypeError, AttributeError, UserError) as e:
            return {"error": str(e)}


def _int32(x: float) -> int:
    """The register value of a physical quantity: saturated int32, -2**31 for NaN."""
    if not math.isfinite(x):
        return INT32_MIN
    return int(max(min(round(x), 2 ** 31 - 1), INT32_MIN))


def open_pty() -> tuple[int, int, str]:
    """A raw pseudo-terminal: (master fd, slave fd kept open, slave path)."""
    master, slave = os.openpty()
    tty.setraw(slave)
    return master, slave, os.ttyname(slave)


def build(machine: str, fault: str | None = None, inject_cycle: int | None = None, rate_hz: float | None = None,
          fault_servo: int | None = None, fault_period: int | None = None,
          clock: str | None = None) -> DynamixelEmulator:
    """An emulator for a machine configuration (its ``[drives]`` and ``[emulator]`` tables)."""
    from pkrt.drivers.plant import Plant
    from pkrt.rt.runtime.config import load_machine

    config = load_machine(machine)
    em = serial_emulator_table(config)
    rate = float(rate_hz or config.rate_hz)
    settings = load_settings(config, {"port": "emulator"})
    plant = Plant.from_config(config)
    theta0 = np.array(plant.theta if em.theta0 is None else em.theta0, dtype=float)
    if inject_cycle is None:
        inject_cycle = int(round(em.inject_after * rate))
    emu = DynamixelEmulator(settings, plant, rate, fault, inject_cycle,
                            fault_servo if fault_servo is not None else em.fault_servo,
                            fault_period if fault_period is not None else em.fault_period,
                            em.delay, clock or em.clock, theta0)
    emu.priority = em.priority  # the process's SCHED_FIFO priority (applied by main)
    return emu


def serial_emulator_table(config):
    """The validated ``[emulator]`` table of a serial machine configuration
    (``pkrt.rt.core.schema.SerialEmulatorTable``)."""
    if config.drives.backend != "dynamixel":
        raise UserError(f"{config.path}: [drives], field 'backend': the servo emulator needs 'dynamixel', "
                        f"got {config.drives.backend!r}")
    return config.emulator


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pkrt.hil.dynamixel_emulator", description=__doc__.split("\n")[0])
    ap.add_argument("--machine", default="orthoglide-serial")
    ap.add_argument("--fault", choices=FAULT_KINDS)
    ap.add_argument("--inject-cycle", type=int, help="cycle of the fault (default: [emulator] inject_after * rate)")
    ap.add_argument("--rate", type=float, help="loop rate in Hz (default: the machine's)")
    ap.add_argument("--fault-servo", type=int)
    ap.add_argument("--fault-period", type=int)
    ap.add_argument("--clock", choices=CLOCKS, help="plant clock (default: [emulator] clock or cycle)")
    ap.add_argument("--priority", type=int, help="SCHED_FIFO priority (default: [emulator] priority, 0 = none)")
    ap.add_argument("--cpu", type=int, default=-1, help="pin to this CPU (-1: do not pin)")
    ap.add_argument("--link", help="also make this path a symlink to the pty")
    ap.add_argument("--tcp", action="store_true",
                    help="serve on a TCP port on 127.0.0.1 (pyserial socket://) instead of a pty")
    a = ap.parse_args(argv)
    try:
        emu = build(a.machine, a.fault, a.inject_cycle, a.rate, a.fault_servo, a.fault_period, a.clock)
    except UserError as e:
        print(f"dynamixel_emulator: error: {e}", file=sys.stderr)
        return 2
    prio = a.priority if a.priority is not None else emu.priority
    # memory locked with a priority: a page fault stalls a real-time process for milliseconds
    sched = apply_realtime(prio, a.cpu, prio > 0, gc_freeze=False)
    sched.pop("gc_freeze", None)
    gc.collect()  # everything is loaded: one full collection now, none over it later
    gc.freeze()
    listener = None
    if a.tcp:
        listener = socket.create_server(("127.0.0.1", 0))
        master = slave = None
        path = f"socket://127.0.0.1:{listener.getsockname()[1]}"
    else:
        master, slave, path = open_pty()
    if a.link and not a.tcp:
        if os.path.islink(a.link):
            os.unlink(a.link)
        os.symlink(path, a.link)
    signal.signal(signal.SIGTERM, lambda *_: os.close(0))
    print(json.dumps({"port": path}), flush=True)
    try:
        emu.serve(master, sys.stdin.fileno(), reply=lambda d: print(json.dumps(d), flush=True),
                  listener=listener)
    except (KeyboardInterrupt, OSError):
        pass
    finally:
        if a.link and os.path.islink(a.link):
            os.unlink(a.link)
    print(json.dumps({**emu.report(), "scheduling": sched}), flush=True)
    if listener is not None:
        listener.close()
    else:
        os.close(slave)
        os.close(master)
    return 0


if __name__ == "__main__":
    sys.exit(main())
