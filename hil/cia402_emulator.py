"""CiA 402 drive emulator: one CANopen node per axis, backed by the simulated plant.

Each node is a ``canopen.LocalNode`` with a CiA 402 object dictionary (built in code below):
its SDO server and NMT slave answer real SDO/NMT frames; the PDO mapping the master writes
(0x1400/0x1600, 0x1800/0x1A00, 0x1801/0x1A01) is read back when the node goes Operational and
defines the cyclic frames. The power drive system state machine follows CiA 402 (controlword
0x6040 commands, statusword 0x6041); controlwords act on receipt (SDO or RPDO).

SYNC-driven cycle: on each SYNC (COB-ID 0x080) the emulator applies the last target torque
(0x6071, per mille of 0x6076) of every drive in Operation enabled to the plant for one period,
then sends each node's TPDOs (statusword + position actual, velocity actual). Cycle k is the
k-th SYNC received (0-based). ``timing``: ``stepped`` (``pkrt hil``'s default) advances the
plant exactly one period per SYNC whatever the wall time between SYNCs, so a host pause delays
the run without changing it; ``wallclock`` advances it n periods when the SYNC's bus timestamp
shows the master skipped n - 1 after an overrun (a real-time host).

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

Fault injection (``fault``, from cycle ``inject_cycle`` on):
  drop         TPDOs of the first drive are lost (never sent).
  delay        TPDOs back up like a transmit queue behind higher-priority traffic: those of the
               injected cycle leave ``delay_cycles`` periods after their SYNC left the master (bus
               timestamp: after the master's window), each later cycle's one period later still.
               (A constant delay cannot be told from a timely answer by a SYNC-driven master once
               it exceeds a period: the late frames land in the next window.)
  drive-fault  the first drive enters Fault reaction active (torque off), sends EMCY 0x2310
               (over-current, output side), then reports Fault.
  bus-off      the bus fails (e.g. CAN_H shorted to CAN_L): the emulator sends, on the master's
               behalf, the error frame SocketCAN delivers for a bus-off controller (CAN ID class
               CAN_ERR_BUSOFF = 0x040, DLC 8), then no frame passes either way. The virtual bus has
               no controller state, so this is how python-can's ``virtual`` interface can show it.
               Every drive, itself off the bus, reacts per its abort connection option code
               (0x6007, as the master configured it): torque off at once.
  sever        the cable is cut: the emulator neither receives nor sends. Each drive whose SYNC
               monitoring the master configured (below) takes its torque off by itself.
  nan          the first drive's position and velocity actual values become 0x80000000 (its
               encoder reading is not finite), a value the master must reject.

SYNC monitoring (off by default, as on real drives): armed for a drive once the master has
written both the communication cycle period 0x1006 (u32, us; CiA 301) and the manufacturer-
specific SYNC loss limit 0x2F10 (u16: SYNCs missed in a row), both non-zero, and a SYNC has
arrived since. A drive in Operation enabled that then sees no SYNC for (limit + 0.5) x 0x1006
goes to Fault and sends EMCY 0x8130. Without that configuration a master may send SYNC at any
period, or pause, without losing its drives.

PDO mapping (CiA 301): writing the number of mapped objects (sub-index 0 of 0x1600, 0x1A00,
0x1A01) checks the entries: more than 64 bits (8 bytes) in all, or more than 8 entries, is
refused with SDO abort 0x06040042; an entry (or a count covering one) that this drive cannot
map in that direction is refused with 0x06040041. The mapping in force is read when the node
goes Operational.

Torque off is measured here: the cycle at which every drive has left Operation enabled (no
further torque reaches the plant), reported as ``torque_off_cycle``.
Units: SI at the plant (m or rad, N or N m), drive units on the bus.
"""

from __future__ import annotations

import argparse
import gc
import heapq
import json
import math
import os
import signal
import struct
import sys
import threading
import time

import can
import canopen
import numpy as np
from canopen import objectdictionary as od
from canopen.objectdictionary import datatypes as dt
from canopen.sdo import SdoAbortedError

from pkrt.drivers import cia402_protocol as p
from pkrt.drivers.base import DriveConfigError
from pkrt.drivers.plant import plant_left_its_model
from pkrt.rt.core.errors import UserError
from pkrt.rt.runtime.loop import apply_realtime

from .can_hil import FAULT_KINDS  # one list, owned by the HIL runner
from .cia402_homing import Homing, add_homing_objects
from .timing import STEPPED_DELAY, STEPPED_SYNC_SILENCE, TIMINGS

S = p.State
EMCY_PLANT = 0x7300  # sensor (CiA 402): sent when the simulated plant left its model's box


def _var(name: str, index: int, sub: int, data_type: int, access: str, default) -> od.ODVariable:
    v = od.ODVariable(name, index, sub)
    v.data_type, v.access_type, v.default = data_type, access, default
    return v


def build_object_dictionary(node_id: int, rated_mnm: int) -> od.ObjectDictionary:
    """The object dictionary of one emulated CiA 402 servo drive (rated torque in mN m or mN).
    0x2F10 (SYNC loss limit) is this drive's manufacturer-specific object; docs/emulators.md
    lists every object."""
    d = od.ObjectDictionary()
    d.node_id = node_id
    for v in (_var("Device type", 0x1000, 0, dt.UNSIGNED32, "ro", 0x00020192),
              _var("Error register", 0x1001, 0, dt.UNSIGNED8, "ro", 0),
              _var("Communication cycle period", p.COMM_CYCLE_PERIOD, 0, dt.UNSIGNED32, "rw", 0),
              _var("SYNC loss limit", p.SYNC_LOSS_LIMIT, 0, dt.UNSIGNED16, "rw", 0),
              _var("Producer heartbeat time", 0x1017, 0, dt.UNSIGNED16, "rw", 0),
              _var("Abort connection option code", p.ABORT_CONNECTION_OPTION, 0, dt.INTEGER16, "rw", 2),
              _var("Controlword", p.CONTROLWORD, 0, dt.UNSIGNED16, "rw", 0),
              _var("Statusword", p.STATUSWORD, 0, dt.UNSIGNED16, "ro", 0),
              _var("Modes of operation", p.MODES_OF_OPERATION, 0, dt.INTEGER8, "rw", 0),
              _var("Modes of operation display", p.MODES_OF_OPERATION_DISPLAY, 0, dt.INTEGER8, "ro", 0),
              _var("Position actual value", p.POSITION_ACTUAL, 0, dt.INTEGER32, "ro", 0),
              _var("Velocity actual value", p.VELOCITY_ACTUAL, 0, dt.INTEGER32, "ro", 0),
              _var("Target torque", p.TARGET_TORQUE, 0, dt.INTEGER16, "rw", 0),
              _var("Rated torque", p.RATED_TORQUE, 0, dt.UNSIGNED32, "ro", rated_mnm),
              _var("Torque actual value", p.TORQUE_ACTUAL, 0, dt.INTEGER16, "ro", 0)):
        d.add_object(v)
    hb = od.ODRecord("Consumer heartbeat time", p.HEARTBEAT_CONSUMER_TIME)
    hb.add_member(_var("Highest sub-index", p.HEARTBEAT_CONSUMER_TIME, 0, dt.UNSIGNED8, "ro", 1))
    hb.add_member(_var("Consumer heartbeat time 1", p.HEARTBEAT_CONSUMER_TIME, 1, dt.UNSIGNED32, "rw", 0))
    d.add_object(hb)
    pdos = ((0x1400, 0x1600, p.RPDO_BASE[0] + node_id, 0xFF), (0x1800, 0x1A00, p.TPDO_BASE[0] + node_id, 1),
            (0x1801, 0x1A01, p.TPDO_BASE[1] + node_id | p.PDO_COB_ID_INVALID, 1))
    for comm, mapping, cob_id, trans in pdos:
        r = od.ODRecord(f"PDO communication 0x{comm:04X}", comm)
        r.add_member(_var("Highest sub-index", comm, 0, dt.UNSIGNED8, "ro", 2))
        r.add_member(_var("COB-ID", comm, 1, dt.UNSIGNED32, "rw", cob_id))
        r.add_member(_var("Transmission type", comm, 2, dt.UNSIGNED8, "rw", trans))
        d.add_object(r)
        m = od.ODRecord(f"PDO mapping 0x{mapping:04X}", mapping)
        m.add_member(_var("Number of mapped objects", mapping, 0, dt.UNSIGNED8, "rw", 0))
        for k in range(1, 9):
            m.add_member(_var(f"Mapped object {k}", mapping, k, dt.UNSIGNED32, "rw", 0))
        d.add_object(m)
    add_homing_objects(d)
    return d


# objects a PDO may map here, with their struct codes
_MAPPABLE_RX = {p.MAP_CONTROLWORD: "H", p.MAP_TARGET_TORQUE: "h"}
_MAPPABLE_TX = {p.MAP_STATUSWORD: "H", p.MAP_POSITION_ACTUAL: "i", p.MAP_VELOCITY_ACTUAL: "i",
                0x60770010: "h", 0x60610008: "b"}
_MAPPING = {0x1600: _MAPPABLE_RX, 0x1A00: _MAPPABLE_TX, 0x1A01: _MAPPABLE_TX}  # mapping index -> table


def check_mapping(entries: list[int], table: dict) -> None:
    """CiA 301 checks of the PDO mapping ``entries`` (index << 16 | sub << 8 | bits) that a
    master validates by writing their count: SdoAbortedError 0x06040041 for an object this
    drive cannot map in that direction, 0x06040042 for more than 8 entries or 64 bits."""
    if len(entries) > p.PDO_MAX_ENTRIES:
        raise SdoAbortedError(p.ABORT_PDO_LENGTH)
    if any(e not in table for e in entries):
        raise SdoAbortedError(p.ABORT_NOT_MAPPABLE)
    if sum(e & 0xFF for e in entries) > p.PDO_MAX_BITS:
        raise SdoAbortedError(p.ABORT_PDO_LENGTH)


class CiA402Emulator:
    """CiA 402 drives (one ``LocalNode`` per axis) on a python-can bus, driving ``plant``."""

    def __init__(self, plant, node_ids: list[int], rated_torque, increments_per_unit, rate_hz: float,
                 channel: str, interface: str = "virtual", fault: str | None = None,
                 inject_cycle: int | None = None, delay_cycles: float = 0.9,
                 bus_options: dict | None = None, timing: str = "wallclock"):
        if fault is not None and fault not in FAULT_KINDS:
            raise DriveConfigError(f"unknown CAN fault kind {fault!r} (known: {', '.join(FAULT_KINDS)})")
        if timing not in TIMINGS:
            raise DriveConfigError(f"emulator timing {timing!r}: expected one of {', '.join(TIMINGS)}")
        self.timing = timing
        self.plant = plant
        self.node_ids = list(node_ids)
        s = len(self.node_ids)
        self.rated = np.asarray(rated_torque, float)  # N or N m
        self.increments = np.asarray(increments_per_unit, float)  # per m or rad
        self.period = 1.0 / rate_hz
        self.fault = fault
        self.inject_cycle = inject_cycle
        self.delay = delay_cycles * self.period
        # a drive's own SYNC monitoring takes at least this long (s) to trip: in stepped timing wall
        # time means nothing to the run (hil/timing.py)
        self.min_sync_silence = 0.0
        if timing == "stepped":
            self.min_sync_silence = STEPPED_SYNC_SILENCE
            self.delay = STEPPED_DELAY
        self.bus = can.Bus(interface=interface, channel=channel, **(bus_options or {}))
        self.network = canopen.Network(self.bus)
        self.nodes: list[canopen.LocalNode] = []
        for i, n in enumerate(self.node_ids):
            node = canopen.LocalNode(n, build_object_dictionary(n, int(round(self.rated[i] * 1000))))
            self.network.add_node(node)
            node.add_read_callback(self._make_read_cb(i))
            node.add_write_callback(self._make_write_cb(i))
            self.nodes.append(node)
        self._index = {n: i for i, n in enumerate(self.node_ids)}
        self.homing = Homing(self)  # homing mode 6 (hil/cia402_homing.py)
        # COB-IDs these nodes send (TPDOs added when mapped): a CAN controller does not receive
        # its own frames, but udp_multicast loops every datagram back to its sender too
        self._own = {base + n for n in self.node_ids for base in (p.EMCY_BASE, p.SDO_TX_BASE, p.HEARTBEAT_BASE)}
        # drive state, per axis
        self.state = [S.SWITCH_ON_DISABLED] * s
        self.cw = [0] * s
        self.mode = [0] * s
        self.target = np.zeros(s)  # per mille
        self.tau = np.zeros(s)  # applied this period, N or N m
        self.off_event: list[tuple[int, int] | None] = [None] * s  # (SYNC index, periods after it)
        self.ever_enabled = [False] * s
        self.off_at: list[float | None] = [None] * s  # time.monotonic() of leaving Operation enabled
        self.abort_code = [p.ABORT_DISABLE_VOLTAGE] * s  # 0x6007 (the dictionary's default)
        self.cycle_period_us = [0] * s  # 0x1006 as the master wrote it (0: not used)
        self.sync_loss_limit = [0] * s  # 0x2F10: SYNCs missed in a row before a fault (0: off)
        self.sync_armed = [False] * s  # both configured and a SYNC seen since: monitoring on
        self.sync_events: list[dict] = []  # SYNC losses: node, time, silence
        self.hb_consumer: list[tuple[int, float] | None] = [None] * s  # (producer id, consumer time s)
        self.hb_last: list[float | None] = [None] * s  # monotonic time of the last heartbeat; None: not armed
        self.heartbeat_events: list[dict] = []
        self._rx_layout: dict[int, tuple[int, struct.Struct, tuple]] = {}
        # per drive: (frame, layout, mapped entries); each frame is packed in place every SYNC
        self._tx_layout: list[list[tuple[can.Message, struct.Struct, tuple]]] = [[] for _ in range(s)]
        # cycle bookkeeping and figures
        self.cycle = -1
        self.last_sync = 0.0  # perf_counter time the last SYNC was processed
        self.grid = 0.0  # nominal bus time (s) of the last SYNC: the plant's time
        self.injected_cycle: int | None = None
        self.bus_dead = False  # bus-off or severed: nothing passes either way
        self.frames_rx = 0
        self.frames_tx = 0
        self.response_us: list[float] = []
        self.sync_wait_max = 0.0  # s, longest a SYNC waited in this end's receive queue (a stall here)
        self.stalls = 0  # times this process woke over a period late (see _held)
        self.stall_max = 0.0  # s, the longest of them
        self.cpu_s = 0.0  # CPU time of the emulator thread up to the last SYNC answered (s)
        self._cpu0 = 0.0
        self._late: list[tuple[float, int, can.Message]] = []
        self._seq = 0
        self._running = False
        self._thread: threading.Thread | None = None
        self.error: str | None = None  # an unexpected exception in the emulator thread
        self.plant_error: str | None = None  # the plant left its tree's box: the drives faulted

    @classmethod
    def from_config(cls, config, channel: str, interface: str = "virtual", fault: str | None = None,
                    plant=None, bus_options: dict | None = None, timing: str = "wallclock") -> "CiA402Emulator":
        """The emulator of a machine configuration: ``[drives]`` (node ids, scaling) and
        ``[emulator]`` (plant, ``inject_after`` s, ``delay_cycles``)."""
        from pkrt.drivers.cia402 import CiA402Drives
        from pkrt.drivers.plant import Plant

        ref = CiA402Drives.from_config(config, {"interface": "virtual", "channel": channel})
        em = config.emulator  # validated by the schema (pkrt.rt.core.schema.CanEmulatorTable)
        return cls(plant if plant is not None else Plant.from_config(config), ref.node_ids, ref.rated_torque,
                   ref.increments, config.rate_hz, channel, interface, fault,
                   int(round(em.inject_after * config.rate_hz)) if fault else None,
                   em.delay_cycles, bus_options, timing)

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
            elif index in _MAPPING:
                self._check_mapping_write(i, index, subindex, data)
            elif index == p.HEARTBEAT_CONSUMER_TIME and subindex == 1:
                producer, ms = p.decode_heartbeat_consumer_entry(struct.unpack("<I", data)[0])
                self.hb_consumer[i] = (producer, ms / 1000.0) if ms and producer else None
                self.hb_last[i] = None  # armed by the producer's next heartbeat
        return cb

    def _check_mapping_write(self, i: int, index: int, subindex: int, data: bytes) -> None:
        """A write to PDO mapping ``index``: an entry must be mappable (or 0, unused); the count
        validates the mapping (``check_mapping``)."""
        table = _MAPPING[index]
        if subindex == 0:
            node = self.nodes[i]
            entries = [struct.unpack("<I", node.get_data(index, k))[0] for k in range(1, min(data[0], 8) + 1)]
            check_mapping(entries + [0] * (data[0] - len(entries)), table)
        elif (e := struct.unpack("<I", data)[0]) and e not in table:
            raise SdoAbortedError(p.ABORT_NOT_MAPPABLE)

    def sync_timeout(self, i: int) -> float | None:
        """Drive i's SYNC monitoring time (s) when armed: (0x2F10 + 0.5) x 0x1006 (in stepped
        timing at least ``STEPPED_SYNC_SILENCE``); else None."""
        if not self.sync_armed[i]:
            return None
        return max((self.sync_loss_limit[i] + 0.5) * self.cycle_period_us[i] * 1e-6, self.min_sync_silence)

    def _counts(self, x: float, i: int) -> int:
        """SI -> increments; a non-finite value reads as the invalid value 0x80000000."""
        if self.fault == "nan" and i == 0 and self.injected_cycle is not None:
            return p.INT32_INVALID
        if not math.isfinite(x):
            return p.INT32_INVALID
        return int(min(max(round(x * self.increments[i]), -0x7FFFFFFF), 0x7FFFFFFF))

    # -- CiA 402 state machine ---------------------------------------------------------------------
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

        rx = layout(0x1400, 0x1600, _MAPPABLE_RX)
        if rx is not None:
            self._rx_layout[rx[0]] = (i, rx[1], rx[2])
        for t in (layout(0x1800, 0x1A00, _MAPPABLE_TX), layout(0x1801, 0x1A01, _MAPPABLE_TX)):
            if t is not None:
                self._own.add(t[0])
        self._tx_layout[i] = [(can.Message(arbitration_id=t[0], data=bytearray(t[1].size), is_extended_id=False),
                               t[1], t[2])
                              for t in (layout(0x1800, 0x1A00, _MAPPABLE_TX), layout(0x1801, 0x1A01, _MAPPABLE_TX))
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

    def _on_heartbeat(self, producer: int) -> None:
        """A heartbeat of node ``producer``: the drives consuming it saw it now."""
        t = time.monotonic()
        for i, c in enumerate(self.hb_consumer):
            if c is not None and c[0] == producer:
                self.hb_last[i] = t

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
        for _ in range(max(1, int(round(dt / self.period)))):
            reason = plant_left_its_model(self.plant, self.plant.step(self.tau, self.period))
            if reason is not None:  # no physics here: every drive faults, the plant stops
                self.plant_error = reason
                for i in range(len(self.node_ids)):
                    if self.state[i] is not S.FAULT:
                        self._set_state(i, S.FAULT_REACTION_ACTIVE)
                        self._send(can.Message(arbitration_id=p.EMCY_BASE + self.node_ids[i],
                                               data=p.encode_emcy(EMCY_PLANT, 0x80), is_extended_id=False))
                return

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

    def _inject(self, k: int) -> None:
        self.injected_cycle = k
        if self.fault == "drive-fault":
            self._set_state(0, S.FAULT_REACTION_ACTIVE)
            self._send(can.Message(arbitration_id=p.EMCY_BASE + self.node_ids[0],
                                   data=p.encode_emcy(0x2310, 0x03), is_extended_id=False))
        elif self.fault == "bus-off":
            err = can.Message(arbitration_id=p.CAN_ERR_BUSOFF, is_error_frame=True, dlc=p.CAN_ERR_DLC,
                              data=bytes(p.CAN_ERR_DLC), is_extended_id=False)
            self._send(err)
            self.bus_dead = True
            for i in range(len(self.node_ids)):  # each drive's abort connection option code
                self._abort_connection(i)
        elif self.fault == "sever":
            self.bus_dead = True

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

    def _send(self, msg: can.Message) -> None:
        if self.bus_dead:
            return
        self.bus.send(msg)
        self.frames_tx += 1

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

    def report(self) -> dict:
        r = np.asarray(self.response_us) if self.response_us else np.zeros(1)
        on = any(st is S.OPERATION_ENABLED for st in self.state)
        offs = [t for t, e in zip(self.off_at, self.ever_enabled) if e]
        return {"torque_on": on, "torque_off_at": None if on or not offs or None in offs else max(offs),
                "heartbeat_events": list(self.heartbeat_events), "sync_events": list(self.sync_events),
                "sync_monitoring": [None if t is None else round(t * 1e6) for t in map(self.sync_timeout,
                                                                                    range(len(self.node_ids)))],
                "heartbeat_consumers": [None if c is None else {"producer": c[0], "ms": round(c[1] * 1e3)}
                                        for c in self.hb_consumer],
                "abort_codes": list(self.abort_code),
                "injected_cycle": self.injected_cycle, "torque_off_cycle": self.torque_off_cycle,
                "torque_off_event": self.torque_off_event,
                "emulator_cycles": self.cycle + 1, "frames_rx": self.frames_rx, "frames_tx": self.frames_tx,
                "sync_wait_us_max": round(self.sync_wait_max * 1e6, 1),
                "stalls": self.stalls, "stall_us_max": round(self.stall_max * 1e6, 1),
                "emulator_cpu_us_per_cycle": round(self.cpu_s / (self.cycle + 1) * 1e6, 1) if self.cycle >= 0 else None,
                "emulator_response_us": {"p50": round(float(np.percentile(r, 50)), 1),
                                         "p99": round(float(np.percentile(r, 99)), 1), "max": round(float(r.max()), 1)},
                "drive_states": [st.name for st in self.state], "emulator_error": self.error,
                "plant_error": self.plant_error}


# -- the emulator as a process of its own (``pkrt hil --bus can`` over udp_multicast) -----------
def main(argv: list[str] | None = None) -> int:
    """``python -m pkrt.hil.cia402_emulator --channel GROUP [...]``: the drives on a python-can
    bus that crosses processes (udp_multicast on one host, socketcan on a vcan or real bus).
    Prints one JSON line ``{"ready": true, ...}`` once on the bus, answers ``{"cmd": "report"}``
    lines on stdin with one JSON line, and at the end of stdin (or SIGTERM) stops and prints
    its report."""
    import dataclasses

    from pkrt.rt.runtime.config import load_machine

    ap = argparse.ArgumentParser(prog="python -m pkrt.hil.cia402_emulator", description=__doc__.split("\n")[0])
    ap.add_argument("--machine", default="orthoglide-can")
    ap.add_argument("--interface", default="udp_multicast", help="python-can interface (default: %(default)s)")
    ap.add_argument("--channel", required=True, help="bus channel (udp_multicast: the multicast group)")
    ap.add_argument("--bus-options", default="{}", help='JSON object of more bus settings, e.g. {"port": 43113}')
    ap.add_argument("--rate", type=float, help="loop rate in Hz (default: the machine's)")
    ap.add_argument("--fault", choices=FAULT_KINDS)
    ap.add_argument("--theta0", help="comma-separated start position of the plant (m or rad)")
    ap.add_argument("--priority", type=int, default=0, help="SCHED_FIFO priority (0: do not ask)")
    ap.add_argument("--cpu", type=int, default=-1, help="pin to this CPU (-1: do not pin)")
    ap.add_argument("--timing", choices=TIMINGS, default="wallclock",
                    help="stepped: one plant period per SYNC; wallclock: periods by the SYNCs' bus timestamps")
    a = ap.parse_args(argv)
    try:
        config = load_machine(a.machine)
        if a.rate is not None:
            if not 1.0 <= a.rate <= 100000.0:
                raise UserError(f"--rate must be in [1, 100000] Hz, got {a.rate}")
            config = dataclasses.replace(config, rate_hz=a.rate)
        options = json.loads(a.bus_options)
        if not isinstance(options, dict):
            raise UserError(f"--bus-options: expected a JSON object, got {a.bus_options!r}")
        em = CiA402Emulator.from_config(config, a.channel, a.interface, a.fault, bus_options=options,
                                        timing=a.timing)
        if a.theta0:
            theta0 = np.array([float(x) for x in a.theta0.split(",")])
            if theta0.shape != em.plant.theta.shape or not np.all(np.isfinite(theta0)):
                raise UserError(f"--theta0: expected {em.plant.theta.shape[0]} finite numbers, got {a.theta0!r}")
            em.plant.reset(theta0)
    except (UserError, ValueError, can.CanError, OSError) as e:
        print(f"cia402_emulator: error: {e}", file=sys.stderr)
        return 2
    # before the emulator thread starts (it inherits them); memory locked with a priority: a
    # page fault in a real-time process stalls it for milliseconds on a loaded machine
    sched = apply_realtime(a.priority, a.cpu, a.priority > 0, gc_freeze=False)
    sched.pop("gc_freeze", None)
    gc.collect()  # the modules and the plant are loaded: a full collection now, none of it later
    gc.freeze()  # (gen 2 collections over numba's and canopen's objects take milliseconds)
    em.start()
    signal.signal(signal.SIGTERM, lambda *_: os.close(0))
    print(json.dumps({"ready": True, "pid": os.getpid(), "interface": a.interface, "channel": a.channel,
                      "scheduling": sched}), flush=True)
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                cmd = json.loads(line).get("cmd")
            except (ValueError, AttributeError):
                cmd = None
            out = em.report() if cmd == "report" else {"error": f"unknown command {line.strip()!r}"}
            print(json.dumps(out), flush=True)
    except (KeyboardInterrupt, OSError, ValueError):
        pass
    em.stop()
    print(json.dumps({**em.report(), "scheduling": sched}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
