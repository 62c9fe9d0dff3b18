"""Protocol 2.0 instruction handling of the Dynamixel servo emulator: every instruction packet
read from the line is answered (or not) by the servos it addresses.

The emulator answers Protocol 2.0 Ping, Read, Write, Sync Read, Sync Write, Bulk Read, Bulk
Write, Fast Sync Read and Fast Bulk Read for its servos, each with an X-series control table
(current mode only moves the plant); other instructions to one servo get an Instruction Error
status (docs/emulators.md).
Bulk Read answers like Sync Read: one status packet per servo, in the order asked. A Bulk
Write whose entries all write the same address and length acts as that Sync Write (a Goal
Current one is a loop cycle); the fast reads answer with one status packet (ID 0xFE) holding
every servo's block.
"""

from __future__ import annotations

import struct
import time

from pkrt.drivers import dynamixel_protocol as dxp
from pkrt.drivers.dynamixel_homing import ADDR_HOMING_OFFSET
from pkrt.drivers.dynamixel_xseries import ADDR_GOAL_CURRENT, ADDR_HARDWARE_ERROR


class InstructionHandling:
    """The protocol side of ``DynamixelEmulator`` (hil/dynamixel_emulator.py holds the state:
    ``servos``, ``parser``, ``counts``); answers pass through the fault layer
    (hil/dynamixel_faults.py), reads and Goal Current writes move the plant
    (hil/dynamixel_plant.py)."""

    def _alert(self, dxl_id: int, error: int) -> int:
        """The status error byte with the alert bit of a servo that has a hardware error."""
        return error | dxp.ERR_ALERT if self.servos[dxl_id].table[ADDR_HARDWARE_ERROR] else error

    def _out(self, dxl_id: int, error: int, params: bytes, now: float, out: list) -> None:
        """Queue one status packet through the fault layer."""
        self._send(dxp.status(dxl_id, self._alert(dxl_id, error), params), (dxl_id,), now, out)

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
