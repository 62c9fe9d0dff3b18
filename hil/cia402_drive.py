"""The behaviour of the emulated CiA 402 drives, per axis: the power drive system state machine
(CiA 402: controlword 0x6040 commands, statusword 0x6041; controlwords act on receipt, SDO or
RPDO), the drives' own watchdogs (SYNC monitoring, heartbeat consumer), their abort
connection option, and when each left Operation enabled.

Heartbeat consumer (CiA 301 7.2.8.3.2, object 0x1016 sub 1: producer node id << 16 | time in
ms): monitoring of a producer starts with its first heartbeat after the entry is written; no
heartbeat for the consumer time is a heartbeat event: EMCY 0x8130 (life guard or heartbeat
error, error register 0x11), the NMT state falls back to Pre-operational (0x1029 default
behaviour) and a drive in Operation enabled carries out its abort connection option code
(0x6007, CiA 402): 1 fault (Fault reaction active -> Fault), 2 disable voltage (Switch on
disabled), 3 quick stop (Quick stop active, torque ramped to zero at once in this torque mode,
then Switch on disabled), 0 nothing. Monitoring resumes with the producer's next heartbeat.
The same code is the drive's reaction to bus-off. The time each drive leaves Operation enabled
is recorded on ``time.monotonic()`` (``torque_off_at``, comparable across processes).

SYNC monitoring (off by default, as on real drives): armed for a drive once the master has
written both the communication cycle period 0x1006 (u32, us; CiA 301) and the manufacturer-
specific SYNC loss limit 0x2F10 (u16: SYNCs missed in a row), both non-zero, and a SYNC has
arrived since. A drive in Operation enabled that then sees no SYNC for (limit + 0.5) x 0x1006
goes to Fault and sends EMCY 0x8130. Without that configuration a master may send SYNC at any
period, or pause, without losing its drives.

Torque off is measured here: the cycle at which every drive has left Operation enabled (no
further torque reaches the plant), reported as ``torque_off_cycle``.
"""

from __future__ import annotations

import time

import can

from pkrt.drivers import cia402_protocol as p

from .timing import STEPPED_SYNC_SILENCE

S = p.State


class DriveLogic:
    """The drives' behaviour in ``CiA402Emulator`` (hil/cia402_emulator.py holds the state:
    ``state``, ``cw``, ``mode``, ``target``, ``abort_code``, the watchdogs' settings and
    events, ``off_event``/``off_at``); it sends through the bus (``_send``,
    hil/cia402_canopen.py) and tells the homing mode (``homing``, hil/cia402_homing.py)."""

    def _controlword(self, i: int, cw: int) -> None:
        cmd = p.decode_controlword(cw, self.cw[i])
        previous, self.cw[i] = self.cw[i], cw
        st = self.state[i]
        C = p.Command
        new = st
        if cmd is C.FAULT_RESET:
            if st is S.FAULT:
                new = S.SWITCH_ON_DISABLED  # transition 15
        elif st in (S.FAULT, S.FAULT_REACTION_ACTIVE, S.NOT_READY_TO_SWITCH_ON):
            pass
        elif cmd is C.DISABLE_VOLTAGE:
            new = S.SWITCH_ON_DISABLED  # 7, 9, 10, 12
        elif cmd is C.QUICK_STOP:
            new = S.QUICK_STOP_ACTIVE if st is S.OPERATION_ENABLED else (
                st if st is S.QUICK_STOP_ACTIVE else S.SWITCH_ON_DISABLED)  # 11; 7, 10
        elif cmd is C.SHUTDOWN:
            if st in (S.SWITCH_ON_DISABLED, S.SWITCHED_ON, S.OPERATION_ENABLED):
                new = S.READY_TO_SWITCH_ON  # 2, 6, 8
        elif cmd is C.SWITCH_ON:
            if st is S.READY_TO_SWITCH_ON or st is S.OPERATION_ENABLED:
                new = S.SWITCHED_ON  # 3, 5
        elif cmd is C.ENABLE_OPERATION:
            if st in (S.READY_TO_SWITCH_ON, S.SWITCHED_ON, S.QUICK_STOP_ACTIVE):
                new = S.OPERATION_ENABLED if self.mode[i] == p.MODE_CST or self.homing.enable_allowed(self.mode[i]) \
                    else st  # 3+4, 4, 16
        self._set_state(i, new)
        self.homing.on_controlword(i, cw, previous)

    def _set_state(self, i: int, new: S, later: int = 0) -> None:
        """Enter state ``new``; leaving Operation enabled records the torque-off event: the
        current SYNC plus ``later`` periods (a watchdog trips between SYNCs)."""
        old = self.state[i]
        self.state[i] = new
        if new is S.OPERATION_ENABLED and old is not S.OPERATION_ENABLED:
            self.off_event[i] = None
            self.ever_enabled[i] = True
        elif old is S.OPERATION_ENABLED and new is not S.OPERATION_ENABLED:
            self.off_event[i] = (max(self.cycle, 0), later)
            self.off_at[i] = time.monotonic()
            self.target[i] = 0.0

    def sync_timeout(self, i: int) -> float | None:
        """Drive i's SYNC monitoring time (s) when armed: (0x2F10 + 0.5) x 0x1006 (in stepped
        timing at least ``STEPPED_SYNC_SILENCE``); else None."""
        if not self.sync_armed[i]:
            return None
        return max((self.sync_loss_limit[i] + 0.5) * self.cycle_period_us[i] * 1e-6, self.min_sync_silence)

    def _held(self, late: float) -> None:
        """This process woke ``late`` s after the time it asked for. Over a period, the host
        held it (on this VM both CPUs stop together for 2-5 ms now and then): a drive's own
        clock would not have stopped, so that time does not count as the master's silence for
        the SYNC watchdog, nor for the heartbeat consumers (the master's heartbeat thread was
        held as well). Counted in ``stalls``."""
        if late <= self.period:
            return
        self.stalls += 1
        self.stall_max = max(self.stall_max, late)
        self.last_sync += late
        self.hb_last = [None if t is None else t + late for t in self.hb_last]

    def _sync_due(self) -> float | None:
        """The earliest perf_counter() time at which an armed SYNC monitoring of a drive in
        Operation enabled trips, or None."""
        due = [self.last_sync + t for i, st in enumerate(self.state)
               if st is S.OPERATION_ENABLED and (t := self.sync_timeout(i)) is not None]
        return min(due) if due else None

    def _watchdog(self, now: float) -> None:
        """A drive in Operation enabled whose armed SYNC monitoring saw no SYNC for its
        ``sync_timeout`` goes to Fault (EMCY 0x8130)."""
        if self.cycle < 0:
            return
        for i in range(len(self.node_ids)):
            t = self.sync_timeout(i)
            if self.state[i] is S.OPERATION_ENABLED and t is not None and now - self.last_sync > t:
                self._set_state(i, S.FAULT, int(t / self.period))  # tripped at last_sync + t
                self.sync_events.append({"node": self.node_ids[i], "at": time.monotonic(),
                                         "silent_s": round(now - self.last_sync, 6), "timeout_s": t})
                if not self.bus_dead:  # EMCY 0x8130: life guard / heartbeat (SYNC) error
                    self._send(can.Message(arbitration_id=p.EMCY_BASE + self.node_ids[i],
                                           data=p.encode_emcy(p.EMCY_SYNC_LOSS, 0x11), is_extended_id=False))

    # -- heartbeat consumer and abort connection option ---------------------------------------
    def _consumer_time(self, c: tuple[int, float]) -> float:
        """The consumer time (s) of entry ``c``; in stepped timing at least the SYNC silence
        (hil/timing.py): the host may hold the master's vCPU alone for tens of ms."""
        return c[1] if self.timing != "stepped" else max(c[1], STEPPED_SYNC_SILENCE)

    def _heartbeat_due(self) -> float | None:
        """The earliest time.monotonic() at which an armed consumer times out, or None."""
        due = [last + self._consumer_time(c) for c, last in zip(self.hb_consumer, self.hb_last)
               if c is not None and last is not None]
        return min(due) if due else None

    def _heartbeat_check(self, now: float) -> None:
        """Heartbeat events of the consumers whose producer went silent (CiA 301)."""
        for i, (c, last) in enumerate(zip(self.hb_consumer, self.hb_last)):
            if c is None or last is None or now - last <= self._consumer_time(c):
                continue
            self.hb_last[i] = None  # one event; monitoring resumes with the next heartbeat
            before = self.state[i]
            if not self.bus_dead:
                self._send(can.Message(arbitration_id=p.EMCY_BASE + self.node_ids[i],
                                       data=p.encode_emcy(p.EMCY_HEARTBEAT, 0x11), is_extended_id=False))
            self._abort_connection(i)
            if self.nodes[i].nmt.state == "OPERATIONAL":  # 0x1029 sub 1 = 0: to Pre-operational
                self.nodes[i].nmt.send_command(p.NMT_PRE_OPERATIONAL)
            self.heartbeat_events.append({"node": self.node_ids[i], "producer": c[0], "at": now,
                                          "silent_s": round(now - last, 4), "state_before": before.name,
                                          "state_after": self.state[i].name, "abort_code": self.abort_code[i]})

    def _on_heartbeat(self, producer: int) -> None:
        """A heartbeat of node ``producer``: the drives consuming it saw it now."""
        t = time.monotonic()
        for i, c in enumerate(self.hb_consumer):
            if c is not None and c[0] == producer:
                self.hb_last[i] = t

    def _abort_connection(self, i: int) -> None:
        """The abort connection option code (0x6007) of drive i, from Operation enabled."""
        if self.state[i] is not S.OPERATION_ENABLED:
            return
        code = self.abort_code[i]
        later = int((time.perf_counter() - self.last_sync) / self.period) if self.cycle >= 0 else 0
        if code == p.ABORT_FAULT:
            self._set_state(i, S.FAULT_REACTION_ACTIVE, later)  # the reaction: torque off
            self._set_state(i, S.FAULT, later)
        elif code == p.ABORT_DISABLE_VOLTAGE:
            self._set_state(i, S.SWITCH_ON_DISABLED, later)
        elif code == p.ABORT_QUICK_STOP:  # quick stop option 2: ramp (torque: at once), then disabled
            self._set_state(i, S.QUICK_STOP_ACTIVE, later)
            self._set_state(i, S.SWITCH_ON_DISABLED, later)

    # -- results -----------------------------------------------------------------------------------
    @property
    def torque_off_event(self) -> tuple[int, int] | None:
        """(SYNC index, periods after it) from which no drive applies torque; None while any
        drive is in Operation enabled."""
        if any(st is S.OPERATION_ENABLED for st in self.state):
            return None
        offs = [ev for ev, e in zip(self.off_event, self.ever_enabled) if e]
        if not offs or any(ev is None for ev in offs):
            return None
        return max(offs, key=lambda ev: ev[0] + ev[1])

    @property
    def torque_off_cycle(self) -> int | None:
        """The torque-off event in emulator cycles (SYNC index + periods)."""
        ev = self.torque_off_event
        return None if ev is None else ev[0] + ev[1]
