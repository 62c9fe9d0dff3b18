"""The emulated CiA 402 drives on the CAN bus: one ``canopen.LocalNode`` per axis (its SDO server
and NMT slave answer real SDO / NMT frames; the object dictionary: hil/cia402_objects.py), the
SDO callbacks that read and write the drives' state, the PDO mapping the master wrote (read
back when a node goes Operational; it defines the cyclic frames), and the emulator's thread,
which receives every frame and hands it on: SYNC to the cycle (hil/cia402_plant.py),
heartbeats to the consumers and RPDOs to the state machine (hil/cia402_drive.py), the rest to
the canopen nodes.
"""

from __future__ import annotations

import heapq
import struct
import threading
import time

import can
from canopen.sdo import SdoAbortedError

from pkrt.drivers import cia402_protocol as p

from .cia402_objects import MAPPABLE_RX, MAPPABLE_TX, MAPPING, check_mapping

S = p.State


class CanopenProtocol:
    """The bus side of ``CiA402Emulator`` (hil/cia402_emulator.py holds the state: ``bus``,
    ``network``, ``nodes``, ``_own``, the PDO layouts, the frame counters, the ``delay``
    fault's queue ``_late``)."""

    # -- object dictionary callbacks (SDO server) --------------------------------------------------
    def _make_read_cb(self, i: int):
        def cb(index, subindex, od):
            if index == p.STATUSWORD:
                return p.STATUSWORD_OF[self.state[i]] | self.homing.status_bits(i)
            if index == p.MODES_OF_OPERATION_DISPLAY:
                return self.mode[i]
            if index == p.POSITION_ACTUAL:
                return self._counts(self.homing.position(i, self.plant.theta[i]), i)
            if index == p.VELOCITY_ACTUAL:
                return self._counts(self.plant.theta_dot[i], i)
            if index == p.TORQUE_ACTUAL:
                return int(round(self.tau[i] / self.rated[i] * 1000))
            return None
        return cb

    def _make_write_cb(self, i: int):
        def cb(index, subindex, od, data):
            if index == p.CONTROLWORD:
                self._controlword(i, struct.unpack("<H", data)[0])
            elif index == p.MODES_OF_OPERATION:
                self.mode[i] = struct.unpack("<b", data)[0]
            elif index == p.TARGET_TORQUE:
                self.target[i] = struct.unpack("<h", data)[0]
            elif index == p.ABORT_CONNECTION_OPTION:
                code = struct.unpack("<h", data)[0]
                if not 0 <= code <= p.ABORT_QUICK_STOP:
                    raise SdoAbortedError(p.ABORT_VALUE_RANGE)
                self.abort_code[i] = code
            elif index == p.COMM_CYCLE_PERIOD:
                self.cycle_period_us[i] = struct.unpack("<I", data)[0]
                self.sync_armed[i] = False  # armed again by the next SYNC
            elif index == p.SYNC_LOSS_LIMIT:
                self.sync_loss_limit[i] = struct.unpack("<H", data)[0]
                self.sync_armed[i] = False
            elif index in MAPPING:
                self._check_mapping_write(i, index, subindex, data)
            elif index == p.HEARTBEAT_CONSUMER_TIME and subindex == 1:
                producer, ms = p.decode_heartbeat_consumer_entry(struct.unpack("<I", data)[0])
                self.hb_consumer[i] = (producer, ms / 1000.0) if ms and producer else None
                self.hb_last[i] = None  # armed by the producer's next heartbeat
        return cb

    def _check_mapping_write(self, i: int, index: int, subindex: int, data: bytes) -> None:
        """A write to PDO mapping ``index``: an entry must be mappable (or 0, unused); the count
        validates the mapping (``check_mapping``)."""
        table = MAPPING[index]
        if subindex == 0:
            node = self.nodes[i]
            entries = [struct.unpack("<I", node.get_data(index, k))[0] for k in range(1, min(data[0], 8) + 1)]
            check_mapping(entries + [0] * (data[0] - len(entries)), table)
        elif (e := struct.unpack("<I", data)[0]) and e not in table:
            raise SdoAbortedError(p.ABORT_NOT_MAPPABLE)

    # -- PDO mapping -------------------------------------------------------------------------------
    def _read_mapping(self, i: int) -> None:
        """Build this node's cyclic frame layouts from the PDO objects the master wrote."""
        node = self.nodes[i]

        def u32(index, sub):
            return struct.unpack("<I", node.get_data(index, sub))[0]

        def layout(comm, mapping, table):
            cob = u32(comm, 1)
            if cob & p.PDO_COB_ID_INVALID:
                return None
            n = node.get_data(mapping, 0)[0]
            entries = tuple(u32(mapping, k) for k in range(1, n + 1))
            if not all(e in table for e in entries):
                return None  # an object this drive cannot map: PDO stays off
            return cob & 0x7FF, struct.Struct("<" + "".join(table[e] for e in entries)), entries

        rx = layout(0x1400, 0x1600, MAPPABLE_RX)
        if rx is not None:
            self._rx_layout[rx[0]] = (i, rx[1], rx[2])
        for t in (layout(0x1800, 0x1A00, MAPPABLE_TX), layout(0x1801, 0x1A01, MAPPABLE_TX)):
            if t is not None:
                self._own.add(t[0])
        self._tx_layout[i] = [(can.Message(arbitration_id=t[0], data=bytearray(t[1].size), is_extended_id=False),
                               t[1], t[2])
                              for t in (layout(0x1800, 0x1A00, MAPPABLE_TX), layout(0x1801, 0x1A01, MAPPABLE_TX))
                              if t is not None]

    def _tx_value(self, i: int, entry: int) -> int:
        if entry == p.MAP_STATUSWORD:
            return p.STATUSWORD_OF[self.state[i]] | self.homing.status_bits(i)
        if entry == p.MAP_POSITION_ACTUAL:
            return self._counts(self.homing.position(i, self.plant.theta[i]), i)
        if entry == p.MAP_VELOCITY_ACTUAL:
            return self._counts(self.plant.theta_dot[i], i)
        if entry == 0x60610008:
            return self.mode[i]
        return int(round(self.tau[i] / self.rated[i] * 1000))

    def _send_tpdos(self, i: int, k: int, now: float, stamp: float) -> None:
        """Drive i's TPDOs of SYNC k, packed in place; under the ``delay`` fault queued to leave
        ``delay`` after the SYNC left the master (its bus timestamp, wall clock), one period more
        for every cycle since the injection."""
        for msg, fmt, entries in self._tx_layout[i]:
            if len(entries) == 1:
                fmt.pack_into(msg.data, 0, self._tx_value(i, entries[0]))
            else:
                fmt.pack_into(msg.data, 0, *[self._tx_value(i, e) for e in entries])
            if self.fault == "delay" and self.injected_cycle is not None:
                msg = can.Message(arbitration_id=msg.arbitration_id, data=bytes(msg.data), is_extended_id=False)
                self._seq += 1
                lag = self.delay + (k - self.injected_cycle) * self.period
                heapq.heappush(self._late, (now + stamp + lag - time.time(), self._seq, msg))
            else:
                self._send(msg)

    # -- thread ------------------------------------------------------------------------------------
    def start(self) -> None:
        for n, node in zip(self.node_ids, self.nodes):
            node.nmt.send_command(p.NMT_PRE_OPERATIONAL)
            self.bus.send(can.Message(arbitration_id=p.HEARTBEAT_BASE + n, data=[0], is_extended_id=False))
        self._running = True
        self._thread = threading.Thread(target=self._run, name="cia402-emulator", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._running = False
        if self._thread is not None:
            self._thread.join(2.0)
        self.bus.shutdown()

    def _run(self) -> None:
        self._cpu0 = time.thread_time()
        try:
            while self._running:
                timeout = 0.01
                sync_due = self._sync_due()
                if sync_due is not None:  # SYNC monitoring of a drive in Operation enabled
                    timeout = max(0.0, min(timeout, sync_due - time.perf_counter()))
                if self._late:
                    timeout = max(0.0, min(timeout, self._late[0][0] - time.perf_counter()))
                hb_due = self._heartbeat_due()
                if hb_due is not None:
                    timeout = max(0.0, min(timeout, hb_due - time.monotonic()))
                asked = time.perf_counter() + timeout
                msg = self.bus.recv(timeout)
                now = time.perf_counter()
                while self._late and self._late[0][0] <= now:
                    self._send(heapq.heappop(self._late)[2])
                if msg is None:  # only with the queue empty: a heartbeat queued behind other
                    self._held(now - asked)  # frames has reached the drive (a real one reads at once)
                    self._watchdog(now)
                    self._heartbeat_check(time.monotonic())
                elif not self.bus_dead and msg.arbitration_id not in self._own:
                    self.frames_rx += 1
                    self._dispatch(msg, now)
        except Exception as e:  # noqa: BLE001 - reported by the HIL run, never silent
            self.error = f"emulator thread: {type(e).__name__}: {e}"
            self._running = False

    def _dispatch(self, msg: can.Message, now: float) -> None:
        if msg.is_error_frame or msg.is_remote_frame or msg.is_extended_id:
            return
        cid = msg.arbitration_id
        if cid == p.SYNC_COB_ID:
            for i, (t, n) in enumerate(zip(self.cycle_period_us, self.sync_loss_limit)):
                self.sync_armed[i] = bool(t and n)  # SYNC monitoring starts with a SYNC
            self._on_sync(now, msg.timestamp)
        elif p.HEARTBEAT_BASE < cid <= p.HEARTBEAT_BASE + 0x7F and len(msg.data) == 1:
            self._on_heartbeat(cid - p.HEARTBEAT_BASE)
        elif cid in self._rx_layout:
            self._on_rpdo(cid, msg.data)
        else:
            self._on_other(msg)

    def _on_rpdo(self, cid: int, data: bytes) -> None:
        """A receive PDO of its mapping: controlword and targets (ignored unless Operational
        and of the mapped length)."""
        i, fmt, entries = self._rx_layout[cid]
        if self.nodes[i].nmt.state != "OPERATIONAL" or len(data) != fmt.size:
            return
        for e, v in zip(entries, fmt.unpack(data)):
            if e == p.MAP_CONTROLWORD:
                self._controlword(i, v)
            else:
                self.target[i] = v

    def _on_other(self, msg: can.Message) -> None:
        """NMT, SDO and the rest to the canopen nodes; a node entering Operational reads its
        PDO mapping."""
        was = [n.nmt.state for n in self.nodes]
        try:
            self.network.notify(msg.arbitration_id, msg.data, msg.timestamp)
        except (struct.error, IndexError, ValueError):
            return  # a malformed frame: a real node ignores it
        for i, node in enumerate(self.nodes):
            if node.nmt.state == "OPERATIONAL" and was[i] != "OPERATIONAL":
                self._read_mapping(i)

    def _send(self, msg: can.Message) -> None:
        if self.bus_dead:
            return
        self.bus.send(msg)
        self.frames_tx += 1
