"""The emulated Dynamixel servos' coupling to the simulated plant: the plant advanced under the
servos' Goal Currents on its clock, and its state written into their Present registers.

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

Units: SI at the plant; servo units (pulses, velocity LSB, current LSB) in the registers.
"""

from __future__ import annotations

import math
import struct

import numpy as np

from pkrt.drivers.dynamixel_homing import ADDR_HOMING_OFFSET
from pkrt.drivers.dynamixel_xseries import ADDR_OPERATING_MODE, ADDR_PRESENT_POSITION, ADDR_PRESENT_VELOCITY, MODE_CURRENT
from pkrt.drivers.plant import plant_left_its_model

from .dynamixel_servo import HW_ENCODER

INT32_MIN = -(2 ** 31)  # the register value of a number that is not finite


class PlantCoupling:
    """The plant side of ``DynamixelEmulator`` (hil/dynamixel_emulator.py holds the state:
    ``plant``, ``st`` (the ``[drives]`` settings), ``servos``, ``clock``, ``dt``, ``brake``, the
    cycle clock's grid); the instructions (hil/dynamixel_instructions.py) call it."""

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
                if self.contact is None:
                    st = self.plant.step(self._tau, dt / n)
                else:  # its force on the plant's clock (from the first period under torque)
                    st = self.contact.step(self.plant, self._tau, self._t_run, dt / n)
                self._t_run += dt / n
                if plant_left_its_model(self.plant, st):
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


def _int32(x: float) -> int:
    """The register value of a physical quantity: saturated int32, -2**31 for NaN."""
    if not math.isfinite(x):
        return INT32_MIN
    return int(max(min(round(x), 2 ** 31 - 1), INT32_MIN))
