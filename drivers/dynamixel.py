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
import struct
import time

import numpy as np
import serial

from . import dynamixel_lifecycle as lifecycle
from . import dynamixel_protocol as dxp
from .base import DriveError, round_carried
# the names below were defined here before the bus, the control table and the configuration
# tables had modules of their own: importable from here as before
from .dynamixel_bus import READ_SLICES, SETUP_ATTEMPTS, SETUP_TIMEOUT, DynamixelBus  # noqa: F401
from .dynamixel_tables import (DYNAMIXEL_MAX_ID, READ_SLICES_WORST, DynamixelSettings,  # noqa: F401
                               SerialEmulatorTable, load_settings)
from .dynamixel_xseries import (ADDR_BUS_WATCHDOG, ADDR_CURRENT_LIMIT, ADDR_GOAL_CURRENT,  # noqa: F401
                                ADDR_HARDWARE_ERROR, ADDR_MODEL_NUMBER, ADDR_OPERATING_MODE, ADDR_PRESENT_CURRENT,
                                ADDR_PRESENT_POSITION, ADDR_PRESENT_VELOCITY, ADDR_REALTIME_TICK, ADDR_TORQUE_ENABLE,
                                BUS_WATCHDOG_ERROR, BUS_WATCHDOG_UNIT_MS, FEEDBACK_ADDR, FEEDBACK_FMT, FEEDBACK_LEN,
                                MODE_CURRENT, STATUS_FEEDBACK_BYTES, TICK_MS, TICK_WRAP)


class DynamixelDrives(DynamixelBus):
    """s Dynamixel X-series servos on one serial bus, in current control mode (the bus, its
    transactions and counters: ``DynamixelBus``, drivers/dynamixel_bus.py)."""

    DRIVES_TABLE = DynamixelSettings  # the [drives] table of this family
    EMULATOR_TABLE = SerialEmulatorTable  # the [emulator] table of its HIL bus

    backend = "dynamixel"

    def __init__(self, settings: DynamixelSettings, position_limits: np.ndarray):
        super().__init__(settings)
        st = settings
        s = self.n_axes
        self.models: dict[int, int] = {}
        self.watchdog_floor = 0.0  # s, the servos' shortest Bus Watchdog time (a stepped HIL emulator stretches it)
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

    # -- lifecycle ----------------------------------------------------------------------------
    def _do_configure(self) -> None:
        lifecycle.configure(self)

    def _do_enable(self) -> None:
        lifecycle.enable(self)

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


