"""The emulated CiA 402 drives' coupling to the simulated plant: the SYNC cycle, which applies the
drives' torques to the plant and advances it, and the plant's state in drive units.

SYNC-driven cycle: on each SYNC (COB-ID 0x080) the emulator applies the last target torque
(0x6071, per mille of 0x6076) of every drive in Operation enabled to the plant for one period,
then sends each node's TPDOs (statusword + position actual, velocity actual). Cycle k is the
k-th SYNC received (0-based). ``timing``: ``stepped`` (``pkrt hil``'s default) advances the
plant exactly one period per SYNC whatever the wall time between SYNCs, so a host pause delays
the run without changing it; ``wallclock`` advances it n periods when the SYNC's bus timestamp
shows the master skipped n - 1 after an overrun (a real-time host).

A plant that leaves its tree's box (no physics there) faults every drive (EMCY 0x7300). A contact
(``contact``: ``pkrt.drivers.contact.Contact``, its tool linearised about the planned pose of its
onset: this process loads no model) adds its force at the tool to the period from loop time
(k - 1) periods to k at SYNC k.
Units: SI at the plant (m or rad, N or N m), drive units on the bus (increments, per mille of
the rated torque 0x6076).
"""

from __future__ import annotations

import math
import time

import can

from pkrt.drivers import cia402_protocol as p
from pkrt.drivers.plant import plant_left_its_model

S = p.State
EMCY_PLANT = 0x7300  # sensor (CiA 402): sent when the simulated plant left its model's box


class PlantCoupling:
    """The plant side of ``CiA402Emulator`` (hil/cia402_emulator.py holds the state: ``plant``,
    ``rated``, ``increments``, ``period``, ``timing``, ``cycle``, ``grid``, ``tau``); each SYNC
    comes from the bus (hil/cia402_canopen.py) and acts on the drives' states
    (hil/cia402_drive.py)."""

    def _on_sync(self, now: float, stamp: float) -> None:
        """One SYNC: the plant advanced (``_sync_step``), the drives' states and torques of this
        period, then every Operational node's TPDOs (held back by the ``delay`` fault)."""
        dt = self._sync_step(stamp)
        self.cycle += 1
        self.last_sync = now
        self.sync_wait_max = max(self.sync_wait_max, time.time() - stamp)  # stamp: receipt (or send) time
        k = self.cycle
        if self.fault and self.injected_cycle is None and self.inject_cycle is not None and k >= self.inject_cycle:
            self._inject(k)
            if self.bus_dead:
                return
        for i in range(len(self.node_ids)):
            st = self.state[i]
            self.tau[i] = self.target[i] * 1e-3 * self.rated[i] if st is S.OPERATION_ENABLED else 0.0
            if st is S.FAULT_REACTION_ACTIVE:
                self._set_state(i, S.FAULT)  # transition 14 after this cycle's report
            elif st is S.QUICK_STOP_ACTIVE:
                self._set_state(i, S.SWITCH_ON_DISABLED)
        held = self.homing.on_sync(dt)  # drives homing hold or move the plant themselves
        if dt > 0.0 and self.plant_error is None and not held:
            self._advance_plant(dt)
        for i in range(len(self.node_ids)):
            if self.nodes[i].nmt.state != "OPERATIONAL":
                continue
            if self.fault == "drop" and self.injected_cycle is not None and i == 0:
                continue
            self._send_tpdos(i, k, now, stamp)
        self.response_us.append((time.perf_counter() - now) * 1e6)
        self.cpu_s = time.thread_time() - self._cpu0

    def _sync_step(self, stamp: float) -> float:
        """The plant time (s) this SYNC advances: nothing before the first SYNC (the machine
        stood still until then); in stepped timing one period; in wall-clock timing n periods
        when the bus timestamp shows the master skipped n - 1 after an overrun (a SYNC later
        than the nominal grid by less than a period is the master's wake-up jitter; the grid is
        anchored on the earliest SYNC seen)."""
        if self.cycle < 0:
            self.grid = stamp
            return 0.0
        if self.timing == "stepped":  # one period per SYNC: the loop never skips one
            self.grid = stamp
            return self.period
        late = stamp - (self.grid + self.period)
        if late < 0.0:
            self.grid += late  # earlier than any SYNC so far: move the grid back
            late = 0.0
        n = 1 + int(late / self.period)
        self.grid += n * self.period
        return n * self.period

    def _advance_plant(self, dt: float) -> None:
        """Integrate the plant period by period over ``dt`` (a gap after an overrun integrates
        like the periods it spans); a plant that leaves its tree's box faults every drive."""
        n = max(1, int(round(dt / self.period)))
        for j in range(n):
            if self.contact is None:
                st = self.plant.step(self.tau, self.period)
            else:  # the j-th of the n periods up to SYNC k (loop time k periods) starts at k - n + j
                st = self.contact.step(self.plant, self.tau, (self.cycle - n + j) * self.period, self.period)
            reason = plant_left_its_model(self.plant, st)
            if reason is not None:  # no physics here: every drive faults, the plant stops
                self.plant_error = reason
                for i in range(len(self.node_ids)):
                    if self.state[i] is not S.FAULT:
                        self._set_state(i, S.FAULT_REACTION_ACTIVE)
                        self._send(can.Message(arbitration_id=p.EMCY_BASE + self.node_ids[i],
                                               data=p.encode_emcy(EMCY_PLANT, 0x80), is_extended_id=False))
                return

    def _counts(self, x: float, i: int) -> int:
        """SI -> increments; a non-finite value reads as the invalid value 0x80000000."""
        if self.fault == "nan" and i == 0 and self.injected_cycle is not None:
            return p.INT32_INVALID
        if not math.isfinite(x):
            return p.INT32_INVALID
        return int(min(max(round(x * self.increments[i]), -0x7FFFFFFF), 0x7FFFFFFF))
