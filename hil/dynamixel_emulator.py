"""Dynamixel X-series servo emulator on a pseudo-terminal, driving the simulated plant.

One process holds the master side of a pty (``os.openpty()``), or a TCP port; the driver opens
the other end with pyserial as if it were a USB-serial adapter. Each servo has an X-series
control table, and current mode moves the plant. ``DynamixelEmulator`` holds the state of the
servos, the plant's clock and the faults; its parts hold the behaviour:

- hil/dynamixel_servo.py: one servo, its control table as data and its access rules;
- hil/dynamixel_instructions.py: the Protocol 2.0 instructions and their answers;
- hil/dynamixel_plant.py: the plant's clock (``clock``: ``step``, ``cycle``, ``wall``) and the
  servos' Present registers;
- hil/dynamixel_faults.py: fault injection (``FAULT_KINDS``);
- hil/dynamixel_line.py: the serving loop on the pty or TCP line and the control commands.

Here: the servos' Bus Watchdog trips (the host holding this process does not count as the
master's silence), torque off and the report.

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
import signal
import socket
import struct
import sys
import time

import numpy as np

from pkrt.drivers import dynamixel_protocol as dxp
from pkrt.drivers.contact import Contact
from pkrt.drivers.dynamixel_tables import DynamixelSettings, load_settings
from pkrt.drivers.dynamixel_xseries import ADDR_BUS_WATCHDOG, BUS_WATCHDOG_ERROR
from pkrt.rt.core.errors import UserError
from pkrt.rt.runtime.cycle.loop import apply_realtime

from .dynamixel_faults import FAULT_KINDS, FaultInjection
from .dynamixel_instructions import InstructionHandling
# open_pty, _int32 and the servo's names, importable from here as before they had modules of their own
from .dynamixel_line import LineServing, open_pty  # noqa: F401
from .dynamixel_plant import INT32_MIN, PlantCoupling, _int32  # noqa: F401
from .dynamixel_servo import (EEPROM_END, GOAL_VALUES, HW_ENCODER, HW_OVERLOAD, MODEL_XM540_W270,  # noqa: F401
                              READ_ONLY, TABLE_SIZE, Servo)
from .timing import STEPPED_DELAY, STEPPED_SYNC_SILENCE

HELD_MIN = 1e-3  # s: a wake-up this much later than asked is the host holding this process
CLOCKS = ("step", "cycle", "wall")  # plant clocks (hil/dynamixel_plant.py)


class DynamixelEmulator(LineServing, InstructionHandling, PlantCoupling, FaultInjection):
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

    def arm(self, fault: str | None, inject_cycle: int, rate_hz: float, contact: dict | None = None) -> None:
        """Power-cycle: servos at factory state, plant at rest at ``theta0``, counters zero,
        the given fault armed for cycle ``inject_cycle`` of a loop at ``rate_hz``; ``contact``:
        an external force at the tool (``pkrt.drivers.contact.Contact.data``) on the plant's
        clock from the first period it moves."""
        if fault is not None and fault not in FAULT_KINDS:
            raise UserError(f"unknown serial HIL fault '{fault}' (known: {', '.join(FAULT_KINDS)})")
        if not rate_hz > 0:
            raise UserError(f"emulator rate must be positive, got {rate_hz}")
        self.dt = 1.0 / rate_hz
        self.fault = fault
        self.inject_cycle = int(inject_cycle)
        self.plant.reset(self.theta0)
        self.contact = None if contact is None else Contact.from_data(contact, len(self.st.ids))
        self._t_run = 0.0  # s the plant has moved under torque since the arming (a contact's clock)
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

    # -- Bus Watchdog and torque off -----------------------------------------------------------
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
                    contact=None if self.contact is None else self.contact.truth(),
                    **self.counts)


def build(machine: str, fault: str | None = None, inject_cycle: int | None = None, rate_hz: float | None = None,
          fault_servo: int | None = None, fault_period: int | None = None,
          clock: str | None = None) -> DynamixelEmulator:
    """An emulator for a machine configuration (its ``[drives]`` and ``[emulator]`` tables)."""
    from pkrt.drivers.plant import Plant
    from pkrt.rt.runtime.machine.config import load_machine

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
