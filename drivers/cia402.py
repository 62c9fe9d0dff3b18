"""CiA 402 drives over CANopen (python-can + canopen), Cyclic Synchronous Torque mode.

Configuration (once, before the loop) uses the ``canopen`` package: NMT, SDO transfers, the
check of the device type (0x1000, profile 402), of the rated torque (0x6076), the mode of
operation (0x6060 = 10, confirmed in 0x6061) and the PDO mapping, then the CiA 402 state machine
to Operation enabled through the controlword (0x6040: 0x0006 -> 0x0007 -> 0x000F; a Fault is
reset with the 0x0080 edge). The cyclic path then uses raw python-can frames and precompiled
``struct`` layouts only:

  read(t):  drain frames that arrived since the last cycle (EMCY, error frames, late TPDOs),
            send SYNC (COB-ID 0x080), collect TPDO1 (0x180+id: statusword 0x6041, position
            actual 0x6064) and TPDO2 (0x280+id: velocity actual 0x606C) of every drive until
            ``tpdo_timeout`` after the SYNC.
  write(tau): RPDO1 (0x200+id: controlword 0x000F, target torque 0x6071) per drive.

RPDOs are asynchronous (transmission type 255: the drive acts on receipt, so a disable takes
effect at once); TPDOs are synchronous (type 1: sampled and sent on every SYNC).

Units: SI at the actuator (m or rad, m/s or rad/s, N or N m). Drive units: position in
increments (``increments_per_unit`` per m or rad), velocity in increments/s, torque in per mille
of the rated torque or force (0x6076, stored in mN m or mN).

Safety net for what no handler in this process can catch (SIGKILL, a crash, a pulled cable):
pkrt produces the master's heartbeat (CiA 301: COB-ID 0x700 + ``master_node_id``, one byte,
NMT state 0x05, every ``heartbeat_ms``) from the moment the bus is open, through python-can's
periodic send task (a thread, or the kernel's broadcast manager on SocketCAN; either ends
with the process). At configuration every drive gets a heartbeat consumer entry (0x1016 sub
1 = master node id << 16 | ``consumer_timeout_ms``, written through 0 as CiA 301 asks) and
the abort connection option code (0x6007 = ``abort_connection``: 3 quick stop, 2 disable
voltage, 1 fault), so a drive that hears no heartbeat for the consumer time takes its torque
off by itself and reports EMCY 0x8130. ``heartbeat_ms = 0`` turns the heartbeat off.
The drives' SYNC monitoring is configured too (CiA 301 0x1006 = the loop period in us, and the
manufacturer-specific SYNC loss limit 0x2F10 = ``sync_loss_cycles``): a drive that misses that
many SYNCs in a row (a cut cable, a master that stopped cycling) faults on its own and reports
EMCY 0x8130. ``sync_loss_cycles = 0`` turns it off (for drives without 0x2F10).

Faults (each one a ``DriveError`` with the reason, torque off first): an EMCY frame, a drive
leaving Operation enabled (Fault, Quick stop, ...), TPDOs missing after the SYNC for more than
``max_missed_cycles`` cycles in a row, an invalid feedback value (0x80000000), a python-can
error frame (bus-off included: SocketCAN reports it as an error frame with class 0x040), a
failed send (a bus-off controller refuses frames).
"""

from __future__ import annotations

import math
import time

import can
import canopen

import numpy as np

from . import cia402_lifecycle as lifecycle
from . import cia402_protocol as p
from .base import DriveError, Drives, round_carried
# the family's configuration tables, importable from here as before they had a module of their own
from .cia402_tables import ABORT_CONNECTION, CanEmulatorTable, CiA402DrivesTable  # noqa: F401
from .window import Window

_TPDO1, _TPDO2, _EMCY, _OTHER = 1, 2, 3, 0


def _frame_bits(n_bytes: int) -> int:
    """Nominal length of a standard-ID data frame on the wire, without bit stuffing."""
    return 47 + 8 * n_bytes


class CiA402Drives(Drives):
    """s CiA 402 drives on one CAN bus, one node id per actuator (actuator order)."""

    DRIVES_TABLE = CiA402DrivesTable  # the [drives] table of this family
    EMULATOR_TABLE = CanEmulatorTable  # the [emulator] table of its HIL bus

    backend = "cia402"

    def __init__(self, node_ids: list[int], rated_torque: np.ndarray, increments_per_unit: np.ndarray,
                 rate_hz: float, interface: str = "socketcan", channel: str = "can0", bitrate: int = 1000000,
                 tpdo_timeout: float | None = None, max_missed_cycles: int = 1, sdo_timeout: float = 0.3,
                 enable_timeout: float = 2.0, heartbeat_ms: int = 10, consumer_timeout_ms: int = 50,
                 abort_connection: str = "quick-stop", master_node_id: int = 127,
                 bus_options: dict | None = None, sync_loss_cycles: int = 3):
        super().__init__(len(node_ids))
        self.node_ids = list(node_ids)
        self.rated_torque = np.asarray(rated_torque, float)  # N or N m (0x6076 / 1000)
        self.increments = np.asarray(increments_per_unit, float)  # increments per m or rad
        self.period = 1.0 / rate_hz
        self.interface, self.channel, self.bitrate = interface, channel, int(bitrate)
        self.tpdo_timeout = 0.5 * self.period if tpdo_timeout is None else float(tpdo_timeout)
        self.max_missed_cycles = int(max_missed_cycles)
        self.sdo_timeout = float(sdo_timeout)
        self.enable_timeout = float(enable_timeout)
        self.heartbeat_ms = int(heartbeat_ms)  # master heartbeat period (ms), 0 = no heartbeat
        self.consumer_timeout_ms = int(consumer_timeout_ms)  # each drive's consumer time (ms)
        self.abort_connection = abort_connection  # a key of p.ABORT_CODES (0x6007)
        self.master_node_id = int(master_node_id)
        self.sync_loss_cycles = int(sync_loss_cycles)  # each drive's SYNC loss limit (0x2F10), 0 = off
        self.bus_options = dict(bus_options or {})  # more keyword arguments for can.Bus
        # a window under a millisecond (1 kHz) is polled, not slept in: a blocked receiver must
        # be woken for every frame (on this VM ~10 us more of the sender's time per frame, 6
        # frames a cycle). Not on an in-process bus (virtual): its peer thread needs the GIL
        self.busy_poll = interface != "virtual" and self.tpdo_timeout <= 1e-3
        s = self.n_axes
        self.bus_load = ((_frame_bits(0) + s * (_frame_bits(4) + _frame_bits(6) + _frame_bits(4))) * rate_hz
                         + (_frame_bits(1) * 1000.0 / self.heartbeat_ms if self.heartbeat_ms else 0.0)) / self.bitrate
        # precomputed scalings and per-cycle state (nothing allocated per cycle)
        self._permille_per_si = 1000.0 / self.rated_torque
        self._si_per_increment = 1.0 / self.increments
        self._pos_raw = np.zeros(s, dtype=np.int64)
        self._vel_raw = np.zeros(s, dtype=np.int64)
        self._got = np.zeros(2 * s, dtype=bool)
        self._age = np.zeros(s)  # loop time (s) since each axis' position sample (0: this one)
        self._window_dt = self.period  # loop time since the previous SYNC (more after an overrun)
        self._last_t: float | None = None  # loop time of the last read
        self._need = 0
        self._missed = 0
        self._sync_wall = 0.0
        self.cycle = -1  # index of the last SYNC sent (0 = first cycle)
        self.late_frames = 0
        # stepped HIL (pkrt hil --timing stepped): the TPDO window does not count time the host
        # held this process (drivers/window.py); a real-time host keeps the strict wall window
        self.exclude_held = False
        self.held_windows = 0  # windows extended by a host hold
        self.held_max = 0.0  # s, the longest hold inside one window
        self.events: list[tuple[float, str]] = []  # (time.monotonic(), what): first anomalies (late, missed)
        self.states = [p.State.UNKNOWN] * s
        self._route: dict[int, tuple[int, int]] = {}
        for i, n in enumerate(self.node_ids):
            self._route[p.TPDO_BASE[0] + n] = (_TPDO1, i)
            self._route[p.TPDO_BASE[1] + n] = (_TPDO2, i)
            self._route[p.EMCY_BASE + n] = (_EMCY, i)
            self._route[p.SDO_TX_BASE + n] = (_OTHER, i)
        self._sync = can.Message(arbitration_id=p.SYNC_COB_ID, data=b"", is_extended_id=False)
        self._rpdo = [can.Message(arbitration_id=p.RPDO_BASE[0] + n, data=bytearray(4), is_extended_id=False)
                      for n in self.node_ids]
        self._bus: can.BusABC | None = None
        self._heartbeat: can.broadcastmanager.CyclicSendTaskABC | None = None
        self.heartbeat_scheduling = "not started"
        self._network: canopen.Network | None = None
        self._nodes: list[canopen.RemoteNode] = []
        self._cyclic = False  # configured and enabled: the cyclic path owns the bus
        self._started = False  # NMT started: RPDOs reach the drives

    def describe(self) -> dict:
        return {"backend": self.backend, "interface": self.interface, "channel": self.channel,
                "bitrate": self.bitrate, "node_ids": self.node_ids, "bus_load": self.bus_load,
                "bus_options": self.bus_options, "drive_watchdog": self.watchdog_text(),
                "heartbeat_thread": self.heartbeat_scheduling}

    def watchdog_text(self) -> str:
        """The drive-side safety net in use, one line (for the run summary and log header)."""
        return lifecycle.watchdog_text(self)

    @property
    def cycle_period_us(self) -> int:
        """The communication cycle period written to 0x1006 (us): the loop period."""
        return max(1, round(self.period * 1e6))

    @classmethod
    def from_config(cls, config, overrides: dict) -> "CiA402Drives":
        """The drives of a machine configuration's ``[drives]`` table; ``overrides`` (e.g.
        ``interface``, ``channel``, ``bitrate``) replace its keys."""
        return lifecycle.from_config(cls, config, overrides)

    # -- lifecycle hooks ---------------------------------------------------------------------------
    def _do_configure(self) -> None:
        lifecycle.configure(self)

    def _do_enable(self) -> None:
        lifecycle.enable(self)

    def _do_disable(self) -> None:
        """Torque off: controlword 'disable operation' (0x0007) and zero target torque to every
        drive, sent at once (asynchronous RPDO). Never raises: base.disable() guards it."""
        if self._bus is None or not self._started:
            return
        for msg in self._rpdo:
            p.RPDO1.pack_into(msg.data, 0, p.CW_DISABLE_OPERATION, 0)
        err = None
        for msg in self._rpdo:
            try:
                self._bus.send(msg, 0.001)
            except (can.CanError, OSError, ValueError) as e:  # keep trying the other drives
                err = e
        if err is not None:
            raise DriveError(f"CAN send failed while disabling: {err}")

    def _do_close(self) -> None:
        lifecycle.close(self)

    # -- cyclic path -------------------------------------------------------------------------------
    def read(self, t: float):
        """Send SYNC, collect every drive's TPDOs; fill ``self.feedback`` (SI, actuator order)."""
        if not self._cyclic:
            raise DriveError(f"cannot read drives in state {self.state.value}")
        # loop time since the last SYNC: more than a period when the loop skipped periods
        dt = self.period if self._last_t is None else t - self._last_t
        self._window_dt = dt if dt > 0.0 else self.period
        self._last_t = t
        self.drain()
        self.sync()
        self.collect(time.perf_counter() + self.tpdo_timeout)
        return self.publish(t)

    def _event(self, what: str) -> None:
        """Record an anomaly with its time.monotonic() (the host-pause probe's clock)."""
        if len(self.events) < 50:
            self.events.append((time.monotonic(), what))

    # the steps of read(), public for the benchmark (pkrt.rt.bench.bench_can)
    def drain(self) -> None:
        """Handle frames that arrived since the last window (EMCY, error frames, late TPDOs)."""
        try:
            msg = self._bus.recv(0.0)
            while msg is not None:
                self._on_frame(msg, False)
                msg = self._bus.recv(0.0)
        except (can.CanError, OSError, ValueError) as e:
            self._fail(f"CAN bus error: {e}")

    def sync(self) -> None:
        """Open this cycle's window: send SYNC (COB-ID 0x080, no data)."""
        self._got[:] = False
        self._need = 2 * self.n_axes
        try:
            self._bus.send(self._sync, 0.001)
        except (can.CanError, OSError, ValueError) as e:
            self._fail(f"CAN send failed (SYNC): {e}")
        self._sync_wall = time.time()  # bus timestamps are wall-clock seconds
        self._age += self._window_dt
        self.cycle += 1

    def collect(self, deadline: float) -> None:
        """Receive and decode frames until every TPDO of this window is in or ``deadline``
        (``time.perf_counter()`` s) passes."""
        bus = self._bus
        poll = self.busy_poll
        w = Window(deadline - time.perf_counter(), self.exclude_held).open()
        try:
            asked = None
            while self._need:
                remaining = w.remaining(asked)
                if remaining <= 0.0:
                    break
                asked = None if poll else time.perf_counter() + remaining
                msg = bus.recv(0.0 if poll else remaining)
                if msg is None:
                    continue
                if not poll:
                    w.touch()
                    asked = None
                self._on_frame(msg, True)
            # frames already queued: those that reached the bus within the window (their bus
            # timestamp says so) count, though this thread was too late to take them; and with
            # the window complete, a TPDO right behind its twin is the newer sample (after a
            # stall the drives answered two SYNCs at once: the first set, a period old, had
            # filled the window), which replaces the older (counted late: _mark)
            if w.held:
                self.held_windows += 1
                self.held_max = max(self.held_max, w.held_max)
            wall_deadline = self._sync_wall + self.tpdo_timeout + w.held
            msg = bus.recv(0.0)
            while msg is not None:
                self._on_frame(msg, msg.timestamp <= wall_deadline)
                msg = bus.recv(0.0)
        except (can.CanError, OSError, ValueError) as e:
            self._fail(f"CAN bus error: {e}")

    def publish(self, t: float):
        """Scale the last raw values to SI into ``self.feedback``; a window with TPDOs missing
        makes it stale (an old position is carried forward at its velocity), more than
        ``max_missed_cycles`` such windows in a row is a fault."""
        fb = self.feedback
        for i in range(self.n_axes):
            # a position sample from an earlier window is carried forward at its velocity
            fb.velocity[i] = self._vel_raw[i] * self._si_per_increment[i]
            fb.position[i] = (self._pos_raw[i] * self._si_per_increment[i]
                              + fb.velocity[i] * self._age[i])
        fb.stamp = t
        if self._need:
            fb.fresh = False
            self._missed += 1
            self._event(f"TPDOs missing at SYNC {self.cycle}: {self._missing_text()}")
            if self._missed > self.max_missed_cycles:
                self._fail(f"TPDO timeout: {self._missing_text()} not received within "
                           f"{self.tpdo_timeout * 1e6:.0f} us of SYNC for {self._missed} cycles in a row")
        else:
            fb.fresh = True
            self._missed = 0
        return fb

    def write(self, tau: np.ndarray) -> None:
        """Target torque (N or N m, actuator order) to every drive in one RPDO each, in 0.1 %
        of the rated torque, rounded with the remainder carried to the next write
        (``round_carried``)."""
        if not self._cyclic or not self.torque_on:
            return
        try:
            for i, msg in enumerate(self._rpdo):
                v = tau[i] * self._permille_per_si[i]
                if not math.isfinite(v):
                    self._fail(f"non-finite torque command {tau[i]!r} for node {self.node_ids[i]}")
                p.RPDO1.pack_into(msg.data, 0, p.CW_ENABLE_OPERATION, round_carried(v, self._carry, i, p.INT16_MAX))
                self._bus.send(msg, 0.001)
        except (can.CanError, OSError, ValueError) as e:
            self._fail(f"CAN send failed: {e}")

    def _on_frame(self, msg: can.Message, in_window: bool) -> None:
        """Decode one received frame; raises DriveError (after torque off) on a fault."""
        if msg.is_error_frame:
            self._fail(p.error_frame_text(msg.arbitration_id))
        if msg.is_remote_frame or msg.is_extended_id:
            return
        route = self._route.get(msg.arbitration_id)
        if route is None:
            return
        kind, i = route
        data = msg.data
        n = self.node_ids[i]
        if kind == _TPDO1:
            if len(data) != p.TPDO1.size:
                self._fail(f"node {n}: TPDO1 of {len(data)} bytes, expected {p.TPDO1.size}")
            sw, pos = p.TPDO1.unpack_from(data)
            state = p.decode_statusword(sw)
            self.states[i] = state
            if state is not p.State.OPERATION_ENABLED:
                self._fail(f"node {n}: drive left Operation enabled, state {state.name} (statusword 0x{sw:04X})")
            if pos == p.INT32_INVALID:
                self._pos_raw[i] = 0
                self.feedback.position[i] = math.nan
                self._fail(f"node {n}: invalid position actual value 0x80000000")
            self._pos_raw[i] = pos
            self._age[i] = 0.0  # the newest sample (sync() ages it by the loop time per SYNC)
            self._mark(2 * i, in_window)
        elif kind == _TPDO2:
            if len(data) != p.TPDO2.size:
                self._fail(f"node {n}: TPDO2 of {len(data)} bytes, expected {p.TPDO2.size}")
            vel, = p.TPDO2.unpack_from(data)
            if vel == p.INT32_INVALID:
                self.feedback.velocity[i] = math.nan
                self._fail(f"node {n}: invalid velocity actual value 0x80000000")
            self._vel_raw[i] = vel
            self._mark(2 * i + 1, in_window)
        elif kind == _EMCY:
            if len(data) != p.EMCY.size:
                self._fail(f"node {n}: malformed EMCY frame of {len(data)} bytes: {bytes(data).hex()}")
            code, reg, _ = p.EMCY.unpack_from(data)
            if code != 0:  # 0x0000: error reset / no error
                self._fail(f"node {n}: {p.emcy_text(code, reg)}")

    def _mark(self, k: int, in_window: bool) -> None:
        """TPDO k (2 i + j) taken; one arriving late, or replacing its twin in this window (the
        twin was an older SYNC's answer), counts in ``late_frames``."""
        if not in_window or self._got[k]:
            self.late_frames += 1
            self._event(f"TPDO{1 + k % 2} of node {self.node_ids[k // 2]} late (SYNC {self.cycle})")
        else:
            self._got[k] = True
            self._need -= 1

    def _missing_text(self) -> str:
        names = [f"TPDO{1 + k % 2} of node {self.node_ids[k // 2]}" for k in range(2 * self.n_axes)
                 if not self._got[k]]
        return ", ".join(names)

    def _fail(self, reason: str) -> None:
        self.fault(reason)
        raise DriveError(reason)
