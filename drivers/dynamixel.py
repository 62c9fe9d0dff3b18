"""Dynamixel Protocol 2.0 drives over a serial port (pyserial): X-series servos in current mode.

Per cycle: ``read`` sends one Sync Read of one contiguous block, addresses 120..135 (Realtime
Tick, Moving, Moving Status, Present PWM, Present Current, Present Velocity 128, Present
Position 132), and collects one status packet per servo; ``write`` sends one Sync Write of
Goal Current (address 102, 2 bytes, signed), which the servos do not answer. The block starts
at the Realtime Tick (8 bytes more than velocity + position alone) because status packets
carry no sequence number: the tick tells an answer to this request from a late answer to an
older one, which would otherwise pass for fresh feedback on a line that delivers late.

Failures: missing, corrupted or late answers are asked again (a Read or Sync Read of the
missing servos, ``retries`` rounds within the cycle); an axis still without an answer is
carried on at its last velocity and the feedback is not fresh (answers to older requests are
dropped and counted, never used). ``fail_cycles`` incomplete
cycles in a row, or late answers in ``fail_cycles`` of the last 2 ``fail_cycles`` cycles, are a
fault; so is a status error, a hardware alert (with the Hardware Error Status as the reason)
and implausible feedback (position beyond the limits plus ``position_margin``, velocity
beyond ``max_velocity``). A fault takes torque off (Sync Write of Torque Enable 0, then Goal
Current 0) before ``DriveError`` is raised. Timeouts, CRC errors, late answers and retries
are counted in ``stats``.

Safety net for what no handler in this process can catch (SIGKILL, a crash, a pulled cable):
the Bus Watchdog (address 98, 1 byte, units of 20 ms, 0 = off; firmware v38+) of every servo is
set to ``bus_watchdog_ms`` just before torque on: a servo with torque on that receives no
instruction packet for that long stops by itself, its Bus Watchdog reads -1 (0xFF) and its Goal
values are read-only until 98 is written 0. Configure clears an error left by an earlier run
(reported in ``info()``), disable writes 0 after torque off.

Units (the ``[drives]`` table): ``current_unit`` A per LSB, ``torque_constant`` N m/A,
``position_resolution`` pulses per motor revolution, ``velocity_unit`` rev/min per LSB,
``lead`` m per motor revolution for a linear axis driven through a screw or belt (0: a rotary
axis, ``gear_ratio`` motor revolutions per axis revolution), ``direction`` +1/-1 and ``zero``
(pulses at actuator coordinate 0). SI at the actuator: m or rad, m/s or rad/s, N or N m.
"""

from __future__ import annotations

import math
import os
import socket
import struct
import time

from dataclasses import dataclass

import numpy as np
import serial
import serial.rs485

from . import dynamixel_protocol as dxp

from pkrt.rt.core.schema import AXES, BOOL, IDS, INTEGER, NUMBER, STRING, Context, EmulatorPlantTable, spec
from .base import DriveConfigError, DriveError, Drives, round_carried
from .window import Window

# X-series (XM430 / XM540) control table
ADDR_MODEL_NUMBER = 0
ADDR_OPERATING_MODE = 11
ADDR_CURRENT_LIMIT = 38
ADDR_TORQUE_ENABLE = 64
ADDR_HARDWARE_ERROR = 70
ADDR_BUS_WATCHDOG = 98  # 1 byte: 0 off / clear error, 1..127 x 20 ms, 0xFF (-1) watchdog error
BUS_WATCHDOG_ERROR = 0xFF
ADDR_GOAL_CURRENT = 102
ADDR_REALTIME_TICK = 120
ADDR_PRESENT_CURRENT = 126
ADDR_PRESENT_VELOCITY = 128
ADDR_PRESENT_POSITION = 132
MODE_CURRENT = 0
# the cyclic Sync Read block, addresses 120..135: Realtime Tick (2, ms, wraps at 32768), Moving,
# Moving Status, Present PWM (2), Present Current (2), Present Velocity (4), Present Position (4)
FEEDBACK_ADDR = ADDR_REALTIME_TICK
FEEDBACK_LEN = 16
FEEDBACK_FMT = "<HBBhhii"
STATUS_FEEDBACK_BYTES = 11 + FEEDBACK_LEN  # one status packet with the block, unstuffed
TICK_WRAP = 32768.0  # ms
TICK_MS = 1.0  # resolution of the Realtime Tick (ms): a stamp is up to this much before the instant
READ_SLICES = 4  # the port's read timeout is timeout / READ_SLICES: a transaction lasts at most
# READ_SLICES_WORST (pkrt.rt.core.schema) = 1 + 1 / READ_SLICES timeouts
SETUP_TIMEOUT = 0.05  # s per transaction outside the cycle (configure, enable, fault reasons)
SETUP_ATTEMPTS = 3  # setup transactions (ping, configuration) tried at least this often: a servo
# just powered or a line just opened may miss one; the cycle's own ``retries`` fit a period


def load_settings(config, overrides: dict | None = None) -> DynamixelSettings:
    """The machine configuration's ``[drives]`` table with ``overrides`` applied, validated by
    its schema (``pkrt.rt.core.schema.DynamixelSettings``)."""
    if config.backend != "dynamixel":
        raise DriveConfigError(f"{config.path}: [drives], field 'backend': expected 'dynamixel', got {config.backend!r}")
    return config.with_drives(overrides).drives



DYNAMIXEL_MAX_ID = 252
BUS_WATCHDOG_UNIT_MS = 20
READ_SLICES_WORST = 1.25  # a serial transaction lasts at most this many timeouts (drivers/dynamixel.py)


@dataclass(frozen=True, kw_only=True)
class DynamixelSettings:
    """``[drives]`` with ``backend = "dynamixel"``: Dynamixel X-series servos (Protocol 2.0) in
    current mode over a serial port."""

    backend: str = spec(STRING, "drive backend", choices=("dynamixel",))
    port: str = spec(STRING, "serial port or pyserial URL (`pkrt run --port` overrides it)")
    ids: tuple = spec(IDS, "servo IDs, actuator order", lo=0, hi=DYNAMIXEL_MAX_ID)
    torque_constant: np.ndarray = spec(AXES, "motor torque constant", unit="N m/A", lo=0.0, lo_open=True)
    baudrate: int = spec(INTEGER, "serial bit rate", 57600, unit="bit/s", lo=1)
    current_unit: np.ndarray = spec(AXES, "current per Goal/Present Current LSB", 2.69e-3, unit="A",
                                    lo=0.0, lo_open=True)
    position_resolution: np.ndarray = spec(AXES, "pulses per motor revolution", 4096.0, lo=0.0, lo_open=True)
    velocity_unit: np.ndarray = spec(AXES, "rev/min per Present Velocity LSB", 0.229, unit="rev/min",
                                     lo=0.0, lo_open=True)
    lead: np.ndarray = spec(AXES, "actuator travel per motor revolution, linear axis (0: rotary)", 0.0,
                            unit="m", lo=0.0)
    gear_ratio: np.ndarray = spec(AXES, "motor revolutions per axis revolution (rotary axes)", 1.0,
                                  lo=0.0, lo_open=True)
    direction: np.ndarray = spec(AXES, "+1: positive current pushes the actuator coordinate positive; -1",
                                 1.0, lo=-1.0, hi=1.0)
    zero: np.ndarray = spec(AXES, "Present Position at actuator coordinate 0 (from homing; signed)", 0.0,
                            unit="pulses")
    current_limit: np.ndarray = spec(AXES, "Goal Current clamp", 2047.0, unit="LSB", lo=1.0, hi=32767.0,
                                     integer=True)
    timeout: float = spec(NUMBER, "per transaction; 1.25 timeout (1 + retries) must fit a period (default "
                          "0.6 period: no retry fits)", unit="s", lo=0.0, lo_open=True, hi=1.0,
                          derive=lambda values, ctx: 0.6 / ctx.rate_hz)
    retries: int = spec(INTEGER, "extra attempts within a cycle for missing or corrupt answers", 1, lo=0)
    fail_cycles: int = spec(INTEGER, "cycles in a row without full feedback: fault", 2, lo=1)
    position_margin: float = spec(NUMBER, "beyond the position limits still plausible feedback", 0.05,
                                  unit="m or rad", lo=0.0)
    max_velocity: np.ndarray = spec(AXES, "faster reported velocity is implausible: fault (default 10 x "
                                    "[limits] velocity)", unit="m/s or rad/s", lo=0.0, lo_open=True,
                                    derive=lambda values, ctx: 10.0 * ctx.tables["limits"].velocity)
    low_latency: bool = spec(BOOL, "ASYNC_LOW_LATENCY / FTDI latency timer where possible", True)
    rs485: bool = spec(BOOL, "RTS-driven RS-485 direction", False)
    bus_watchdog_ms: int = spec(INTEGER, "servo Bus Watchdog while torque is on (multiple of 20 ms, 0: off)",
                                60, unit="ms", lo=0, hi=127 * BUS_WATCHDOG_UNIT_MS)

    def check(self, ctx: Context) -> None:
        if any(x not in (1.0, -1.0) for x in self.direction):
            raise ctx.error("direction", f"expected +1 or -1 per axis, got {self.direction.tolist()}")
        period = 1.0 / ctx.rate_hz
        worst = READ_SLICES_WORST * self.timeout * (1 + self.retries)
        if worst > period:
            raise ctx.error("timeout", f"{self.timeout} s with {self.retries} retries can take {1e3 * worst:.2f} ms, "
                                       f"more than the {1e3 * period:.2f} ms period at {ctx.rate_hz:g} Hz "
                                       f"(lower the timeout or the retries)")
        wd = self.bus_watchdog_ms
        if wd % BUS_WATCHDOG_UNIT_MS:
            raise ctx.error("bus_watchdog_ms", f"expected 0 (off) or a multiple of {BUS_WATCHDOG_UNIT_MS} ms up to "
                                               f"{127 * BUS_WATCHDOG_UNIT_MS}, got {wd}")
        if wd and wd < 2e3 * period:
            raise ctx.error("bus_watchdog_ms", f"{wd} ms is less than two loop periods ({2e3 * period:g} ms at "
                                               f"{ctx.rate_hz:g} Hz): the servos would stop in a normal run")

    @property
    def bus_watchdog_units(self) -> int:
        """The Bus Watchdog register value (units of 20 ms)."""
        return self.bus_watchdog_ms // BUS_WATCHDOG_UNIT_MS

    def scale(self, i: int) -> float:
        """Actuator units (m or rad) per motor revolution of axis i."""
        return float(self.lead[i]) if self.lead[i] > 0 else 2.0 * math.pi / float(self.gear_ratio[i])

    def force_per_lsb(self, i: int) -> float:
        """Actuator force or torque (N or N m) per Goal Current LSB of axis i (ideal
        transmission: motor torque = force * scale / 2 pi)."""
        return float(self.current_unit[i] * self.torque_constant[i]) * 2.0 * math.pi / self.scale(i)




@dataclass(frozen=True, kw_only=True)
class SerialEmulatorTable(EmulatorPlantTable):
    """``[emulator]`` of a ``dynamixel`` machine: `pkrt hil --bus serial` (servo emulator)."""

    theta0: np.ndarray = spec(AXES, "where the machine stands at power-up (default: the plant's start; signed)",
                              None, unit="m or rad")
    inject_after: float = spec(NUMBER, "time into the run at which the fault starts", 0.5, unit="s", lo=0.0, hi=1e6)
    fault_servo: int = spec(INTEGER, "servo ID hit by drop / corrupt / drive-fault (default: the second)", None,
                            lo=0, hi=DYNAMIXEL_MAX_ID)
    fault_period: int = spec(INTEGER, "drop / corrupt every n-th status packet of that servo", 1, lo=1, hi=10 ** 6)
    delay: float = spec(NUMBER, "answer delay of the `delay` fault", 0.02, unit="s", lo=0.0, hi=60.0)
    clock: str = spec(STRING, "plant clock: cycle (one period per Goal Current write) or wall", "cycle",
                      choices=("cycle", "wall"))
    priority: int = spec(INTEGER, "emulator process SCHED_FIFO priority (0: do not ask)", 0, lo=0, hi=99)

    def check(self, ctx: Context) -> None:
        super().check(ctx)
        ids = list(ctx.tables["drives"].ids)
        if self.fault_servo is not None and self.fault_servo not in ids:
            raise ctx.error("fault_servo", f"expected one of the servo IDs {ids}, got {self.fault_servo}")


class DynamixelDrives(Drives):
    """s Dynamixel X-series servos on one serial bus, in current control mode."""

    DRIVES_TABLE = DynamixelSettings  # the [drives] table of this family
    EMULATOR_TABLE = SerialEmulatorTable  # the [emulator] table of its HIL bus


    backend = "dynamixel"

    def __init__(self, settings: DynamixelSettings, position_limits: np.ndarray):
        super().__init__(len(settings.ids))
        st = self.settings = settings
        s = self.n_axes
        self.ser = None
        self.parser = dxp.PacketParser(max_length=64)
        self.low_latency = "not attempted"
        self.models: dict[int, int] = {}
        self.stats = dict(cycles=0, timeouts=0, crc_errors=0, retries=0, failed_cycles=0, late_answers=0,
                          status_errors=0, garbage_bytes=0, tx_bytes=0, rx_bytes=0)
        # stepped HIL (pkrt hil --timing stepped): a transaction's timeout does not count time the
        # host held this process (drivers/window.py); a real-time host keeps the strict wall timeout
        self.exclude_held = False
        self.window: float | None = None  # s, the cyclic transaction timeout when not settings.timeout
        self.watchdog_floor = 0.0  # s, the servos' shortest Bus Watchdog time (a stepped HIL emulator stretches it)
        self.held_transactions = 0  # transactions whose timeout a host hold extended
        self.held_max = 0.0  # s, the longest hold inside one transaction
        self.events: list[tuple[float, str]] = []  # (time.monotonic(), what): first anomalies
        self._fail_run = 0  # consecutive cycles with incomplete feedback
        self._late_hist = 0  # bit k: late answers seen k cycles ago
        # precomputed conversions: SI = k * (raw - zero)
        self._k_pos = [st.direction[i] * st.scale(i) / st.position_resolution[i] for i in range(s)]
        self._k_vel = [st.direction[i] * st.velocity_unit[i] / 60.0 * st.scale(i) for i in range(s)]
        self._k_cur = [st.direction[i] / st.force_per_lsb(i) for i in range(s)]
        self._limit = [int(x) for x in st.current_limit]
        lo = (position_limits[:, 0] - st.position_margin)
        hi = (position_limits[:, 1] + st.position_margin)
        raw = [sorted((lo[i] / self._k_pos[i] + st.zero[i], hi[i] / self._k_pos[i] + st.zero[i]))
               for i in range(s)]
        self._raw_lo = [r[0] for r in raw]
        self._raw_hi = [r[1] for r in raw]
        self._vel_max_raw = [st.max_velocity[i] / abs(self._k_vel[i]) for i in range(s)]
        self._index = {dxl_id: i for i, dxl_id in enumerate(st.ids)}
        self._sync_read = dxp.sync_read(st.ids, FEEDBACK_ADDR, FEEDBACK_LEN)
        self._reads = {i: dxp.read(i, FEEDBACK_ADDR, FEEDBACK_LEN) for i in st.ids}
        self._lag0: list[float | None] = [None] * s  # first servo-minus-host clock lag (ms)
        # lower envelope of the accepted lags, relative to _lag0; it starts one tick below the
        # first lag, whose stamp may sit anywhere in its 1 ms bin (a timeout under a tick, as
        # at 1 kHz, otherwise calls the next fresh answers that fall lower in their bin late)
        self._lag_min = [-TICK_MS] * s
        self.current = np.zeros(s)  # Present Current of the last fresh read, A
        self._got = [False] * s
        self._want: dict = dict.fromkeys(st.ids)  # this cycle's answers (id -> packet or None)
        # preallocated Sync Write of Goal Current: header(4) id len(2) inst addr(2) n(2) {id lo hi}*s crc(2)
        self._goal = bytearray(dxp.sync_write(ADDR_GOAL_CURRENT, 2, [(i, b"\0\0") for i in st.ids]))
        self._torque_off = dxp.sync_write(ADDR_TORQUE_ENABLE, 1, [(i, b"\0") for i in st.ids])
        self._watchdog_off = dxp.sync_write(ADDR_BUS_WATCHDOG, 1, [(i, b"\0") for i in st.ids])
        self.watchdog_cleared: list[int] = []  # servos found with a Bus Watchdog error at configure
        self._last_tx = 0.0  # time.perf_counter() of the last packet sent
        self._goal_fmt = "<" + "Bh" * s
        self._goal_args = [0] * (2 * s)
        self._carry = [0.0] * s  # LSB, Goal Current rounding left over for the next write (see write)
        for i, dxl_id in enumerate(st.ids):
            self._goal_args[2 * i] = dxl_id

    @classmethod
    def from_config(cls, config, overrides: dict) -> "DynamixelDrives":
        """Drives from the ``[drives]`` table; ``overrides`` (e.g. ``{"port": "/dev/pts/3"}``)
        replace its entries."""
        return cls(load_settings(config, overrides), config.limits.position)

    # -- transport ----------------------------------------------------------------------------
    def _send(self, pkt) -> None:
        try:
            self.ser.write(pkt)
        except (serial.SerialException, OSError) as e:
            raise DriveError(f"serial write on {self.settings.port} failed: {e}") from None
        self._last_tx = time.perf_counter()
        self.stats["tx_bytes"] += len(pkt)

    def _flush_input(self) -> None:
        try:
            self.ser.reset_input_buffer()
        except (serial.SerialException, OSError) as e:
            raise DriveError(f"serial port {self.settings.port}: {e}") from None
        self.parser.clear()
        self.stats["garbage_bytes"] = self.parser.garbage

    def _waiting_bytes(self) -> bytes:
        """Every byte already received, without waiting. pyserial's socket:// says 1 for
        ``in_waiting`` whenever anything is there (select), so its socket is read directly: a
        drain that read 1 byte of late answers left the rest to be taken as the next cycle's."""
        sock = getattr(self.ser, "_socket", None)
        if sock is None:
            n = self.ser.in_waiting
            return self.ser.read(n) if n else b""
        out = b""
        while True:
            try:
                chunk = sock.recv(65536, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return out
            if not chunk:
                raise serial.SerialException("socket disconnected")
            out += chunk

    def _drain(self) -> int:
        """Take in what arrived unasked (before a request) and empty the parser; returns the
        number of status packets in it (late answers)."""
        try:
            data = self._waiting_bytes()
        except (serial.SerialException, OSError) as e:
            raise DriveError(f"serial read on {self.settings.port} failed: {e}") from None
        self.stats["rx_bytes"] += len(data)
        self.parser.feed(data)
        crc0 = self.parser.crc_errors
        n = 0
        while (p := self.parser.next()) is not None:
            n += p.instruction == dxp.STATUS
        self.stats["crc_errors"] += self.parser.crc_errors - crc0
        self.parser.clear()
        self.stats["garbage_bytes"] = self.parser.garbage
        return n

    def _receive(self, want: dict, n_bytes: int, timeout: float | None = None) -> dict:
        """Collect status packets from the IDs in ``want`` whose value is None (filled in
        place) until all arrived or the transaction timeout; returns ``want``. Packets from
        other IDs, other instructions (an adapter's echo) and damaged bytes are skipped and
        counted. ``n_bytes``: the expected size of the answers (bytes); ``timeout`` (s) defaults
        to the cyclic one."""
        parser, ser = self.parser, self.ser
        w = Window((self.window or self.settings.timeout) if timeout is None else timeout, self.exclude_held).open()
        missing = sum(1 for v in want.values() if v is None)
        crc0 = parser.crc_errors
        while missing:
            pkt = parser.next()
            if pkt is None:
                asked = time.perf_counter() + (ser.timeout or 0.0)
                try:
                    chunk = ser.read(max(n_bytes - len(parser.buf), 1))
                except (serial.SerialException, OSError) as e:
                    raise DriveError(f"serial read on {self.settings.port} failed: {e}") from None
                if chunk:
                    self.stats["rx_bytes"] += len(chunk)
                    parser.feed(chunk)
                    w.touch()
                elif w.remaining(asked) <= 0.0:  # give up only when nothing is there
                    break
                continue
            if pkt.instruction != dxp.STATUS or pkt.id not in want or want[pkt.id] is not None:
                continue
            want[pkt.id] = pkt
            missing -= 1
            n_bytes -= STATUS_FEEDBACK_BYTES
        self.stats["crc_errors"] += parser.crc_errors - crc0
        self.stats["garbage_bytes"] = parser.garbage
        if w.held:
            self.held_transactions += 1
            self.held_max = max(self.held_max, w.held_max)
        if missing:
            self.stats["timeouts"] += 1
            self._event(f"timeout: {missing} of {len(want)} answers missing")
        return want

    def _event(self, what: str) -> None:
        """Record an anomaly with its time.monotonic() (the host-pause probe's clock)."""
        if len(self.events) < 50:
            self.events.append((time.monotonic(), what))

    def _check_status(self, pkt: dxp.Packet, what: str) -> bool:
        """Raise on a servo-reported error; False for a retryable one (the servo saw a CRC
        error in our packet)."""
        err = pkt.error
        if err == 0:
            return True
        self.stats["status_errors"] += 1
        if err & 0x7F == 3:
            return False
        if err & dxp.ERR_ALERT and err & 0x7F == 0:
            raise DriveError(f"servo {pkt.id}: hardware alert during {what}: {self._hardware_error(pkt.id)}")
        raise DriveError(f"servo {pkt.id}: {dxp.error_text(err)} during {what}")

    def _hardware_error(self, dxl_id: int) -> str:
        """The servo's Hardware Error Status as text (one extra transaction, fault path only)."""
        try:
            self._flush_input()
            self._send(dxp.read(dxl_id, ADDR_HARDWARE_ERROR, 1))
            pkt = self._receive({dxl_id: None}, 12)[dxl_id]
        except DriveError as e:
            return f"hardware error status unreadable ({e})"
        if pkt is None or len(pkt.params) != 1:
            return "hardware error status unreadable (no answer)"
        return f"{dxp.hardware_error_text(pkt.params[0])} (hardware error status 0x{pkt.params[0]:02X})"

    def transact(self, dxl_id: int, pkt: bytes, n_params: int, what: str) -> bytes:
        """Send an instruction to one servo and return the parameters of its status packet,
        with retries (outside the cycle: at least ``SETUP_ATTEMPTS`` of ``SETUP_TIMEOUT`` each,
        whatever the cycle's ``retries``); raise DriveError when it never answers correctly."""
        attempts = max(SETUP_ATTEMPTS, self.settings.retries + 1)
        for attempt in range(attempts):
            if attempt:
                self.stats["retries"] += 1
            self._flush_input()
            self._send(pkt)
            ans = self._receive({dxl_id: None}, 11 + n_params, SETUP_TIMEOUT)[dxl_id]
            if ans is None or not self._check_status(ans, what):
                continue
            if len(ans.params) != n_params:
                continue
            return ans.params
        raise DriveError(f"servo {dxl_id} on {self.settings.port}: no valid answer to {what} "
                         f"after {attempts} attempts")

    # -- lifecycle ----------------------------------------------------------------------------
    def _open(self) -> None:
        st = self.settings
        try:
            self.ser = serial.serial_for_url(st.port, baudrate=st.baudrate, timeout=st.timeout / READ_SLICES,
                                             write_timeout=max(st.timeout, 0.05))
        except (serial.SerialException, OSError, ValueError) as e:
            raise DriveError(f"cannot open serial port {st.port!r}: {e}") from None
        self.low_latency = _apply_low_latency(self.ser, st.port) if st.low_latency else "not requested"
        if st.rs485:
            try:
                self.ser.rs485_mode = serial.rs485.RS485Settings()
            except (ValueError, OSError, serial.SerialException, AttributeError) as e:
                raise DriveError(f"serial port {st.port!r}: RS-485 mode not available: {e}") from None
        self._flush_input()

    def _do_configure(self) -> None:
        if self.ser is None:
            self._open()
        self.watchdog_cleared = []
        for i, dxl_id in enumerate(self.settings.ids):
            model = self.transact(dxl_id, dxp.ping(dxl_id), 3, "ping")
            self.models[dxl_id] = model[0] | (model[1] << 8)
            self.transact(dxl_id, dxp.write(dxl_id, ADDR_TORQUE_ENABLE, b"\0"), 0, "torque disable")
            hw = self.transact(dxl_id, dxp.read(dxl_id, ADDR_HARDWARE_ERROR, 1), 1, "hardware error read")[0]
            if hw:
                raise DriveError(f"servo {dxl_id}: hardware error at configure: {dxp.hardware_error_text(hw)} "
                                 f"(reboot the servo)")
            self.transact(dxl_id, dxp.write(dxl_id, ADDR_OPERATING_MODE, bytes((MODE_CURRENT,))), 0,
                          "operating mode write")
            mode = self.transact(dxl_id, dxp.read(dxl_id, ADDR_OPERATING_MODE, 1), 1, "operating mode read")[0]
            if mode != MODE_CURRENT:
                raise DriveError(f"servo {dxl_id}: operating mode is {mode} after setting current mode (0)")
            lim = struct.unpack("<H", self.transact(dxl_id, dxp.read(dxl_id, ADDR_CURRENT_LIMIT, 2), 2,
                                                    "current limit read"))[0]
            self._limit[i] = min(int(self.settings.current_limit[i]), lim)
            self._clear_watchdog(dxl_id)
        for _ in range(self.settings.fail_cycles):  # feedback holds the machine's position from here on
            if self._read(0.0).fresh:
                break
        else:
            raise DriveError(f"servos on {self.settings.port}: no complete feedback at configure")
        self.stats["cycles"] = 0
        self._fail_run = self._late_hist = 0

    def _clear_watchdog(self, dxl_id: int) -> None:
        """Bus Watchdog off; a watchdog error left by an earlier run (Goal values read-only) is
        cleared and reported."""
        if not self.settings.bus_watchdog_ms:
            return
        try:
            wd = self.transact(dxl_id, dxp.read(dxl_id, ADDR_BUS_WATCHDOG, 1), 1, "bus watchdog read")[0]
        except DriveError as e:
            raise DriveError(f"{e} (the Bus Watchdog, address 98, needs firmware v38 or later; bus_watchdog_ms = 0 "
                             "in [drives] runs without it)") from None
        if wd:
            if wd == BUS_WATCHDOG_ERROR:
                self.watchdog_cleared.append(dxl_id)
            self.transact(dxl_id, dxp.write(dxl_id, ADDR_BUS_WATCHDOG, b"\0"), 0, "bus watchdog clear")

    def _do_enable(self) -> None:
        self._send_goal_zero()  # with torque still off
        units = bytes((self.settings.bus_watchdog_units,))
        for dxl_id in self.settings.ids:
            if units[0]:  # armed first: it watches from the moment torque is on
                self.transact(dxl_id, dxp.write(dxl_id, ADDR_BUS_WATCHDOG, units), 0, "bus watchdog write")
            self.transact(dxl_id, dxp.write(dxl_id, ADDR_TORQUE_ENABLE, b"\x01"), 0, "torque enable")
        self._fail_run = self._late_hist = 0

    def _send_goal_zero(self) -> None:
        for i in range(self.n_axes):
            self._goal_args[2 * i + 1] = 0
            self._carry[i] = 0.0
        self._send(self._pack_goal())

    def _do_disable(self) -> None:
        """Torque Enable 0 on every servo, then Goal Current 0, then Bus Watchdog 0: broadcast
        Sync Writes, no answers awaited (fast; a failing port is reported by ``disable``)."""
        if self.ser is None:
            return
        try:
            self._send(self._torque_off)
        finally:
            self._send_goal_zero()
            if self.settings.bus_watchdog_ms:
                self._send(self._watchdog_off)

    def _do_close(self) -> None:
        if self.ser is not None:
            try:
                self.ser.close()
            except (serial.SerialException, OSError):
                pass
            self.ser = None

    # -- cyclic -------------------------------------------------------------------------------
    def read(self, t: float):
        """One Sync Read (then a Read / Sync Read of the missing axes, up to ``retries`` rounds) ->
        ``self.feedback`` in SI at loop time t (s); an axis without a valid answer is carried on
        at its last velocity and the feedback is not fresh. A fault takes torque off before
        DriveError is raised."""
        try:
            return self._read(t)
        except DriveError as e:
            self.fault(str(e))
            raise

    def _read(self, t: float):
        fb = self.feedback
        self._check_bus_watchdog()
        self.stats["cycles"] += 1
        want = self._want
        late = self._collect(want)
        dt = t - fb.stamp
        for dxl_id, pkt in want.items():
            self._apply(dxl_id, pkt, dt)
        complete = all(self._got)
        # the answers kept are this cycle's request's (Realtime Tick checked): fresh when all
        # came. Answers to older requests (drained, or seen in the window) count in the late
        # history below; they used to spoil a complete cycle too, so one transaction delayed
        # 2 ms made 3 cycles without fresh feedback at 1 kHz (the timeout and the leftovers)
        fb.fresh = complete
        fb.stamp = t
        self._judge(late, complete)
        return fb

    def _check_bus_watchdog(self) -> None:
        """DriveError when the servos' Bus Watchdog has run out since the last send (torque on)."""
        st = self.settings
        silent = time.perf_counter() - self._last_tx
        if self.torque_on and st.bus_watchdog_ms and silent > max(1e-3 * st.bus_watchdog_ms, self.watchdog_floor):
            raise DriveError(f"servos on {st.port}: nothing sent for {silent * 1e3:.0f} ms, longer than their Bus "
                             f"Watchdog ({st.bus_watchdog_ms} ms): they have stopped themselves (this process stalled)")

    def _collect(self, want: dict) -> int:
        """This cycle's Sync Read, then the missing axes asked again (up to ``retries`` rounds):
        ``want`` id -> status packet or None. Returns the late answers seen this cycle."""
        st = self.settings
        # answers still arriving for an earlier cycle's request: the line delivers late
        late = self._drain()
        self.stats["late_answers"] += late
        for dxl_id in st.ids:
            want[dxl_id] = None
        late += self._request(self._sync_read, want, st.ids)
        for _ in range(st.retries):
            missing = [i for i, p in want.items() if p is None]
            if not missing:
                break
            self.stats["retries"] += 1
            # answers that missed the window are dropped (counted); the missing axes asked again
            self.stats["late_answers"] += self._drain()
            late += self._request(self._reads[missing[0]] if len(missing) == 1 else
                                  dxp.sync_read(missing, FEEDBACK_ADDR, FEEDBACK_LEN), want, missing)
        return late

    def _apply(self, dxl_id: int, pkt, dt: float) -> None:
        """One servo's answer (None: none) into the feedback in SI; dt (s) since the last read."""
        fb, st = self.feedback, self.settings
        i = self._index[dxl_id]
        self._got[i] = pkt is not None
        if pkt is None:  # no news: the axis is carried on at its last velocity
            fb.position[i] += fb.velocity[i] * dt
            return
        _, _, _, _, cur, vel, pos = struct.unpack_from(FEEDBACK_FMT, pkt.params)
        if not (self._raw_lo[i] <= pos <= self._raw_hi[i]) or abs(vel) > self._vel_max_raw[i]:
            raise DriveError(f"servo {dxl_id}: implausible feedback (present position {pos} pulses, "
                             f"present velocity {vel} LSB)")
        fb.position[i] = self._k_pos[i] * (pos - st.zero[i])
        fb.velocity[i] = self._k_vel[i] * vel
        self.current[i] = cur * st.current_unit[i]

    def _judge(self, late: int, complete: bool) -> None:
        """Update the late and failed histories; DriveError when the line delivers late or the
        servos do not answer (late answers in fail_cycles of the last 2 fail_cycles cycles;
        incomplete feedback in fail_cycles cycles in a row)."""
        st, got = self.settings, self._got
        if late:
            self._event(f"{late} late answers")
        self._late_hist = ((self._late_hist << 1) | bool(late)) & ((1 << (2 * st.fail_cycles)) - 1)
        self._fail_run = 0 if complete else self._fail_run + 1
        if not self.feedback.fresh:
            self.stats["failed_cycles"] += 1
        if self._fail_run >= st.fail_cycles or self._late_hist.bit_count() >= st.fail_cycles:
            lost = [st.ids[i] for i in range(self.n_axes) if not got[i]] or list(st.ids)
            why = (f"no valid feedback in {self._fail_run} cycles" if self._fail_run >= st.fail_cycles else
                   f"answers arriving late in {self._late_hist.bit_count()} of {2 * st.fail_cycles} cycles")
            raise DriveError(
                f"servo{'s' if len(lost) > 1 else ''} {', '.join(map(str, lost))} on {st.port}: {why} "
                f"(timeouts {self.stats['timeouts']}, CRC errors {self.stats['crc_errors']}, "
                f"late answers {self.stats['late_answers']}, retries {self.stats['retries']})")

    def _request(self, pkt: bytes, want: dict, ids) -> int:
        """Send one feedback request for ``ids`` and collect the answers into ``want``; drop
        those of the wrong size, with a retryable error, or stamped (Realtime Tick) before the
        request was sent: answers to an older request. Returns how many were that late."""
        t_ms = time.perf_counter() * 1e3
        self._send(pkt)
        self._receive(want, STATUS_FEEDBACK_BYTES * len(ids))
        late = self._take_newer(want)
        for dxl_id in ids:
            p = want[dxl_id]
            if p is None:
                continue
            if (p.error and not self._check_status(p, "sync read")) or len(p.params) != FEEDBACK_LEN:
                want[dxl_id] = None
            elif self._stale(self._index[dxl_id], p.params[0] | (p.params[1] << 8), t_ms):
                want[dxl_id] = None
                late += 1
        self.stats["late_answers"] += late
        return late

    def _take_newer(self, want: dict) -> int:
        """Status packets already in behind the ones taken for ``want``: the line delivered an
        older request's answers late and this one's right behind them (after a stall the servo
        emulator answered both at once, same Realtime Tick, positions a period apart). The
        later answer of a servo replaces the earlier, which is counted late; returns how many."""
        data = self._waiting_bytes()
        if not data:
            return 0
        self.stats["rx_bytes"] += len(data)
        self.parser.feed(data)
        replaced = 0
        while (pkt := self.parser.next()) is not None:
            if pkt.instruction == dxp.STATUS and pkt.id in want:
                replaced += want[pkt.id] is not None
                want[pkt.id] = pkt
        return replaced

    def _stale(self, i: int, tick: int, t_ms: float) -> bool:
        """True when servo i stamped this answer (``tick``, ms) well before the request went
        out at host time ``t_ms``: the servo-minus-host clock lag dropped by more than the
        timeout below its lower envelope over accepted answers (modulo the tick's wrap)."""
        lag = (tick - t_ms) % TICK_WRAP
        if self._lag0[i] is None:
            self._lag0[i] = lag
            return False
        rel = (lag - self._lag0[i] + TICK_WRAP / 2) % TICK_WRAP - TICK_WRAP / 2
        if rel < self._lag_min[i] - 1e3 * self.settings.timeout:
            return True
        if rel < self._lag_min[i]:
            self._lag_min[i] = rel
        return False

    def write(self, tau: np.ndarray) -> None:
        """Sync Write of Goal Current for actuator forces/torques ``tau`` (N or N m), clamped to
        the current limit. Nothing is sent unless the drives are enabled.

        Goal Current is an integer (2.69 mA, 0.75 N on the Orthoglide's belt axis): rounded with
        its remainder carried to the next write (``round_carried``)."""
        if not self.torque_on:
            return
        args = self._goal_args
        for i in range(self.n_axes):
            x = tau[i] * self._k_cur[i]
            if not math.isfinite(x):
                reason = f"non-finite torque command on axis {i} (servo {self.settings.ids[i]})"
                self.fault(reason)
                raise DriveError(reason)
            args[2 * i + 1] = round_carried(x, self._carry, i, self._limit[i])
        try:
            self._send(self._pack_goal())
        except DriveError as e:
            self.fault(str(e))
            raise

    def _pack_goal(self) -> bytes | bytearray:
        buf = self._goal
        struct.pack_into(self._goal_fmt, buf, 12, *self._goal_args)
        end = len(buf) - 2
        if buf.find(dxp.STUFF_FROM, 7, end) >= 0:  # only with unusual IDs; general encoder
            return dxp.sync_write(ADDR_GOAL_CURRENT, 2, [(self._goal_args[2 * i], struct.pack("<h", self._goal_args[2 * i + 1]))
                                                         for i in range(self.n_axes)])
        c = dxp.crc16(memoryview(buf)[:end])
        buf[end] = c & 0xFF
        buf[end + 1] = c >> 8
        return buf

    def describe(self) -> dict:
        return {"backend": self.backend, **self.info(), "drive_watchdog": self.watchdog_text()}

    def watchdog_text(self) -> str:
        """The drive-side safety net in use, one line (for the run summary and log header)."""
        ms = self.settings.bus_watchdog_ms
        if not ms:
            return "Bus Watchdog off (bus_watchdog_ms = 0): servos do not notice a lost master"
        return (f"Bus Watchdog (address 98) = {self.settings.bus_watchdog_units} x 20 ms = {ms} ms while torque is on"
                + (f"; cleared a watchdog error left on servo(s) {self.watchdog_cleared}" if self.watchdog_cleared
                   else ""))

    def info(self) -> dict:
        """Port, settings applied and counters, for reports."""
        return dict(port=self.settings.port, baudrate=self.settings.baudrate, ids=list(self.settings.ids),
                    models=dict(self.models), low_latency=self.low_latency, current_limit=list(self._limit),
                    bus_watchdog_ms=self.settings.bus_watchdog_ms, watchdog_cleared=list(self.watchdog_cleared),
                    exclude_held=self.exclude_held, held_transactions=self.held_transactions,
                    held_us_max=round(self.held_max * 1e6, 1), events=[list(e) for e in self.events], **self.stats)


def _apply_low_latency(ser, port: str) -> str:
    """ASYNC_LOW_LATENCY through TIOCSSERIAL (Linux) and, for FTDI USB adapters, the sysfs
    latency timer at 1 ms. Returns what was applied or why not."""
    out = []
    sock = getattr(ser, "_socket", None)  # pyserial's socket:// (a serial device server, a HIL link)
    if sock is not None:
        try:  # each instruction packet leaves at once (Nagle would hold it for the last one's ACK)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return "TCP_NODELAY applied (socket:// port)"
        except OSError as e:
            return f"TCP_NODELAY not applied ({e})"
    if hasattr(ser, "set_low_latency_mode"):
        try:
            ser.set_low_latency_mode(True)
            out.append("ASYNC_LOW_LATENCY applied")
        except (ValueError, OSError) as e:
            out.append(f"ASYNC_LOW_LATENCY not applied ({str(e).split(': ', 1)[-1]})")
    else:
        out.append(f"ASYNC_LOW_LATENCY not available for {type(ser).__name__}")
    timer = f"/sys/bus/usb-serial/devices/{os.path.basename(os.path.realpath(port))}/latency_timer"
    if os.path.exists(timer):
        try:
            with open(timer) as f:
                ms = int(f.read().strip())
            if ms > 1:
                with open(timer, "w") as f:
                    f.write("1")
                ms = 1
            out.append(f"FTDI latency timer {ms} ms")
        except (OSError, ValueError) as e:
            out.append(f"FTDI latency timer not set ({e})")
    return "; ".join(out)
