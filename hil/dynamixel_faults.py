"""Fault injection of the Dynamixel servo emulator (``pkrt hil --bus serial --fault KIND``): the
fault kinds, the fault armed at its cycle (``_activate``) and the fault layer every status
packet passes through (``_send``).

Fault injection (from ``inject_cycle`` on, i.e. the reads of loop cycle ``inject_cycle``):
``drop`` status packets of ``fault_servo`` are lost (every ``fault_period``-th one),
``delay`` every answer is sent ``delay`` s late, ``corrupt`` a byte of each status packet of
``fault_servo`` is damaged, ``drive-fault`` ``fault_servo`` trips a hardware error (overload:
torque off, alert bit in its status packets), ``sever`` the servos' transmit line is cut (no
answers; instructions still arrive), ``nan`` the plant's state turns non-finite and the servos
report the register value an invalid number becomes (-2**31).
"""

from __future__ import annotations

import numpy as np

from .dynamixel_servo import HW_OVERLOAD

FAULT_KINDS = ("drop", "delay", "corrupt", "drive-fault", "sever", "nan")


class FaultInjection:
    """The fault injection of ``DynamixelEmulator`` (hil/dynamixel_emulator.py holds the state:
    ``fault``, ``inject_cycle``, ``fault_servo``, ``fault_period``, ``delay``, ``injected``,
    the ``counts``)."""

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
