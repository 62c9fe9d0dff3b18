"""Dynamixel Protocol 2.0 transactions on a serial port (pyserial): the port opened (low latency
where it can be), instruction packets sent, status packets collected within a transaction
timeout (in stepped HIL the time the host held this process is not counted:
drivers/window.py), set-up transactions retried; timeouts, CRC errors, retries, bytes and
garbage counted in ``stats``. ``DynamixelDrives`` (drivers/dynamixel.py) is built on it.
"""

from __future__ import annotations

import os
import socket
import time

import serial
import serial.rs485

from . import dynamixel_protocol as dxp
from .base import DriveError, Drives
from .dynamixel_xseries import ADDR_HARDWARE_ERROR, STATUS_FEEDBACK_BYTES
from .window import Window

READ_SLICES = 4  # the port's read timeout is timeout / READ_SLICES: a transaction lasts at most
# READ_SLICES_WORST (drivers/dynamixel_tables.py) = 1 + 1 / READ_SLICES timeouts
SETUP_TIMEOUT = 0.05  # s per transaction outside the cycle (configure, enable, fault reasons)
SETUP_ATTEMPTS = 3  # setup transactions (ping, configuration) tried at least this often: a servo
# just powered or a line just opened may miss one; the cycle's own ``retries`` fit a period


class DynamixelBus(Drives):
    """The servos' serial bus under ``DynamixelDrives``: the port, the packet parser, the
    transactions and their counters (``stats``, ``events``)."""

    def __init__(self, settings):
        super().__init__(len(settings.ids))
        self.settings = settings
        self.ser = None
        self.parser = dxp.PacketParser(max_length=64)
        self.low_latency = "not attempted"
        self.stats = dict(cycles=0, timeouts=0, crc_errors=0, retries=0, failed_cycles=0, late_answers=0,
                          status_errors=0, garbage_bytes=0, tx_bytes=0, rx_bytes=0)
        # stepped HIL (pkrt hil --timing stepped): a transaction's timeout does not count time the
        # host held this process (drivers/window.py); a real-time host keeps the strict wall timeout
        self.exclude_held = False
        self.window: float | None = None  # s, the cyclic transaction timeout when not settings.timeout
        self.held_transactions = 0  # transactions whose timeout a host hold extended
        self.held_max = 0.0  # s, the longest hold inside one transaction
        self.events: list[tuple[float, str]] = []  # (time.monotonic(), what): first anomalies
        self._last_tx = 0.0  # time.perf_counter() of the last packet sent

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
