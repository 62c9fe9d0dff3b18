"""CiA 402 drive emulator: one CANopen node per axis, backed by the simulated plant.

Each node is a ``canopen.LocalNode`` with a CiA 402 object dictionary (built in code below):
its SDO server and NMT slave answer real SDO/NMT frames; the PDO mapping the master writes
(0x1400/0x1600, 0x1800/0x1A00, 0x1801/0x1A01) is read back when the node goes Operational and
defines the cyclic frames. The power drive system state machine follows CiA 402 (controlword
0x6040 commands, statusword 0x6041); controlwords act on receipt (SDO or RPDO).

SYNC-driven cycle: on each SYNC (COB-ID 0x080) the emulator applies the last target torque
(0x6071, per mille of 0x6076) of every drive in Operation enabled to the plant for one period
(for n periods when the SYNC's bus timestamp shows the master skipped n - 1 after an overrun),
then sends each node's TPDOs (statusword + position actual, velocity actual). Cycle k is the
k-th SYNC received (0-based).

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
               (0x6007 = 2, disable voltage): torque off at once.
  sever        the cable is cut: the emulator neither receives nor sends. Each drive's own SYNC
               watchdog (``sync_timeout_cycles`` periods without SYNC) takes its torque off.
  nan          the first drive's position and velocity actual values become 0x80000000 (its
               encoder reading is not finite), a value the master must reject.

Torque off is measured here: the cycle at which every drive has left Operation enabled (no
further torque reaches the plant), reported as ``torque_off_cycle``.
Units: SI at the plant (m or rad, N or N m), drive units on the bus.
"""

from __future__ import annotations

import heapq
import math
import struct
import threading
import time

import can
import canopen
import numpy as np
from canopen import objectdictionary as od
from canopen.objectdictionary import datatypes as dt

from pkrt.drivers import cia402_protocol as p
from pkrt.drivers.base import DriveConfigError

FAULT_KINDS = ("drop", "delay", "drive-fault", "bus-off", "sever", "nan")
S = p.State


def _var(name: str, index: int, sub: int, data_type: int, access: str, default) -> od.ODVariable:
    v = od.ODVariable(name, index, sub)
    v.data_type, v.access_type, v.default = data_type, access, default
    return v


def build_object_dictionary(node_id: int, rated_mnm: int) -> od.ObjectDictionary:
    """The object dictionary of one emulated CiA 402 servo drive (rated torque in mN m or mN)."""
    d = od.ObjectDictionary()
    d.node_id = node_id
    for v in (_var("Device type", 0x1000, 0, dt.UNSIGNED32, "ro", 0x00020192),
              _var("Error register", 0x1001, 0, dt.UNSIGNED8, "ro", 0),
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
    return d


# objects a PDO may map here, with their struct codes
_MAPPABLE_RX = {p.MAP_CONTROLWORD: "H", p.MAP_TARGET_TORQUE: "h"}
_MAPPABLE_TX = {p.MAP_STATUSWORD: "H", p.MAP_POSITION_ACTUAL: "i", p.MAP_VELOCITY_ACTUAL: "i",
                0x60770010: "h", 0x60610008: "b"}


class CiA402Emulator:
    """CiA 402 drives (one ``LocalNode`` per axis) on a python-can bus, driving ``plant``."""

    def __init__(self, plant, node_ids: list[int], rated_torque, increments_per_unit, rate_hz: float,
                 channel: str, interface: str = "virtual", fault: str | None = None,
                 inject_cycle: int | None = None, sync_timeout_cycles: float = 3.5, delay_cycles: float = 0.7):
        if fault is not None and fault not in FAULT_KINDS:
            raise DriveConfigError(f"unknown CAN fault kind {fault!r} (known: {', '.join(FAULT_KINDS)})")
        self.plant = plant
        self.node_ids = list(node_ids)
        s = len(self.node_ids)
        self.rated = np.asarray(rated_torque, float)  # N or N m
        self.increments = np.asarray(increments_per_unit, float)  # per m or rad
        self.period = 1.0 / rate_hz
        self.fault = fault
        self.inject_cycle = inject_cycle
        self.sync_timeout = sync_timeout_cycles * self.period
        self.delay = delay_cycles * self.period
        self.bus = can.Bus(interface=interface, channel=channel)
        self.network = canopen.Network(self.bus)
        self.nodes: list[canopen.LocalNode] = []
        for i, n in enumerate(self.node_ids):
            node = canopen.LocalNode(n, build_object_dictionary(n, int(round(self.rated[i] * 1000))))
            self.network.add_node(node)
            node.add_read_callback(self._make_read_cb(i))
            node.add_write_callback(self._make_write_cb(i))
            self.nodes.append(node)
        self._index = {n: i for i, n in enumerate(self.node_ids)}
        # drive state, per axis
        self.state = [S.SWITCH_ON_DISABLED] * s
        self.cw = [0] * s
        self.mode = [0] * s
        self.target = np.zeros(s)  # per mille
        self.tau = np.zeros(s)  # applied this period, N or N m
        self.off_event: list[tuple[int, int] | None] = [None] * s  # (SYNC index, periods after it)
        self.ever_enabled = [False] * s
        self._rx_layout: dict[int, tuple[int, struct.Struct, tuple]] = {}
        self._tx_layout: list[list[tuple[int, struct.Struct, tuple]]] = [[] for _ in range(s)]
        # cycle bookkeeping and figures
        self.cycle = -1
        self.last_sync = 0.0  # perf_counter time the last SYNC was processed
        self.grid = 0.0  # nominal bus time (s) of the last SYNC: the plant's time
        self.injected_cycle: int | None = None
        self.bus_dead = False  # bus-off or severed: nothing passes either way
        self.frames_rx = 0
        self.frames_tx = 0
        self.response_us: list[float] = []
        self._late: list[tuple[float, int, can.Message]] = []
        self._seq = 0
        self._running = False
        self._thread: threading.Thread | None = None
        self.error: str | None = None  # an unexpected exception in the emulator thread

    @classmethod
    def from_config(cls, config, channel: str, interface: str = "virtual", fault: str | None = None,
                    plant=None) -> "CiA402Emulator":
        """The emulator of a machine configuration: ``[drives]`` (node ids, scaling) and
        ``[emulator]`` (plant, ``inject_after`` s, ``sync_timeout_cycles``, ``delay_cycles``)."""
        from pkrt.drivers.cia402 import CiA402Drives
        from pkrt.drivers.sim import Plant

        ref = CiA402Drives.from_config(config, {"interface": "virtual", "channel": channel})
        em = config.raw.get("emulator", {})
        where = f"{config.path}: [emulator], field"

        def num(key, default, lo, hi):
            v = em.get(key, default)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
                raise DriveConfigError(f"{where} '{key}': expected a number in [{lo:g}, {hi:g}], got {v!r}")
            return float(v)

        inject = num("inject_after", 0.5, 0.0, 1e6)
        return cls(plant if plant is not None else Plant.from_config(config), ref.node_ids, ref.rated_torque,
                   ref.increments, config.rate_hz, channel, interface, fault,
                   int(round(inject * config.rate_hz)) if fault else None,
                   num("sync_timeout_cycles", 3.5, 1.0, 1000.0), num("delay_cycles", 0.7, 0.0, 1000.0))

    # -- object dictionary callbacks (SDO server) --------------------------------------------------
    def _make_read_cb(self, i: int):
        def cb(index, subindex, od):
            if index == p.STATUSWORD:
                return p.STATUSWORD_OF[self.state[i]]
            if index == p.MODES_OF_OPERATION_DISPLAY:
                return self.mode[i]
            if index == p.POSITION_ACTUAL:
                return self._counts(self.plant.theta[i], i)
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
        return cb

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
        self.cw[i] = cw
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
                new = S.OPERATION_ENABLED if self.mode[i] == p.MODE_CST else st  # 3+4, 4, 16
        self._set_state(i, new)

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
        self._tx_layout[i] = [t for t in (layout(0x1800, 0x1A00, _MAPPABLE_TX),
                                          layout(0x1801, 0x1A01, _MAPPABLE_TX)) if t is not None]

    def _tx_value(self, i: int, entry: int) -> int:
        if entry == p.MAP_STATUSWORD:
            return p.STATUSWORD_OF[self.state[i]]
        if entry == p.MAP_POSITION_ACTUAL:
            return self._counts(self.plant.theta[i], i)
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
        try:
            while self._running:
                timeout = 0.01
                if self.cycle >= 0 and S.OPERATION_ENABLED in self.state:  # SYNC watchdog armed
                    timeout = max(0.0, min(timeout, self.last_sync + self.sync_timeout - time.perf_counter()))
                if self._late:
                    timeout = max(0.0, min(timeout, self._late[0][0] - time.perf_counter()))
                msg = self.bus.recv(timeout)
                now = time.perf_counter()
                while self._late and self._late[0][0] <= now:
                    self._send(heapq.heappop(self._late)[2])
                if msg is None:
                    self._watchdog(now)  # only with the queue empty: queued frames have arrived
                elif not self.bus_dead:
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
            self._on_sync(now, msg.timestamp)
        elif cid in self._rx_layout:
            i, fmt, entries = self._rx_layout[cid]
            if self.nodes[i].nmt.state != "OPERATIONAL" or len(msg.data) != fmt.size:
                return
            for e, v in zip(entries, fmt.unpack(msg.data)):
                if e == p.MAP_CONTROLWORD:
                    self._controlword(i, v)
                else:
                    self.target[i] = v
        else:
            was = [n.nmt.state for n in self.nodes]
            try:
                self.network.notify(cid, msg.data, msg.timestamp)
            except (struct.error, IndexError, ValueError):
                return  # a malformed frame: a real node ignores it
            for i, node in enumerate(self.nodes):
                if node.nmt.state == "OPERATIONAL" and was[i] != "OPERATIONAL":
                    self._read_mapping(i)

    def _on_sync(self, now: float, stamp: float) -> None:
        # the plant advances one period per SYNC, or n when the bus timestamp shows the master
        # skipped n - 1 periods after an overrun: a SYNC later than the nominal grid by less than
        # a period is the master's wake-up jitter. The grid is anchored on the earliest SYNC
        # seen. Nothing before the first SYNC: the machine stood still until then.
        if self.cycle < 0:
            self.grid, dt = stamp, 0.0
        else:
            late = stamp - (self.grid + self.period)
            if late < 0.0:
                self.grid += late  # earlier than any SYNC so far: move the grid back
                late = 0.0
            n = 1 + int(late / self.period)
            self.grid += n * self.period
            dt = n * self.period
        self.cycle += 1
        self.last_sync = now
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
        if dt > 0.0:  # period by period: a gap after an overrun integrates like the periods it spans
            for _ in range(max(1, int(round(dt / self.period)))):
                self.plant.step(self.tau, self.period)
        for i in range(len(self.node_ids)):
            if self.nodes[i].nmt.state != "OPERATIONAL":
                continue
            if self.fault == "drop" and self.injected_cycle is not None and i == 0:
                continue
            for cob, fmt, entries in self._tx_layout[i]:
                msg = can.Message(arbitration_id=cob, data=fmt.pack(*(self._tx_value(i, e) for e in entries)),
                                  is_extended_id=False)
                if self.fault == "delay" and self.injected_cycle is not None:
                    self._seq += 1
                    # due ``delay`` after the SYNC left the master (its bus timestamp, wall
                    # clock), one period more for every cycle since the injection
                    lag = self.delay + (k - self.injected_cycle) * self.period
                    heapq.heappush(self._late, (now + stamp + lag - time.time(), self._seq, msg))
                else:
                    self._send(msg)
        self.response_us.append((time.perf_counter() - now) * 1e6)

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
            for i in range(len(self.node_ids)):  # abort connection option code 2: disable voltage
                self._set_state(i, S.SWITCH_ON_DISABLED)
        elif self.fault == "sever":
            self.bus_dead = True

    def _watchdog(self, now: float) -> None:
        """A drive in Operation enabled that sees no SYNC for ``sync_timeout`` goes to Fault."""
        if self.cycle < 0 or now - self.last_sync <= self.sync_timeout:
            return
        for i in range(len(self.node_ids)):
            if self.state[i] is S.OPERATION_ENABLED:  # tripped at last_sync + sync_timeout
                self._set_state(i, S.FAULT, int(self.sync_timeout / self.period))
                if not self.bus_dead:  # EMCY 0x8130: life guard / heartbeat (SYNC) error
                    self._send(can.Message(arbitration_id=p.EMCY_BASE + self.node_ids[i],
                                           data=p.encode_emcy(0x8130, 0x11), is_extended_id=False))

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
        return {"injected_cycle": self.injected_cycle, "torque_off_cycle": self.torque_off_cycle,
                "torque_off_event": self.torque_off_event,
                "emulator_cycles": self.cycle + 1, "frames_rx": self.frames_rx, "frames_tx": self.frames_tx,
                "emulator_response_us": {"p50": round(float(np.percentile(r, 50)), 1),
                                         "p99": round(float(np.percentile(r, 99)), 1), "max": round(float(r.max()), 1)},
                "drive_states": [st.name for st in self.state], "emulator_error": self.error}
