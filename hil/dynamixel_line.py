"""The Dynamixel servo emulator's line: the serving loop on a pseudo-terminal's master side or a
TCP connection (pyserial ``socket://``), answers written when due, the Bus Watchdog timed
between packets, and the control commands (JSON lines) of the process that runs it.
"""

from __future__ import annotations

import json
import os
import select
import socket
import time
import tty

from pkrt.rt.core.errors import UserError


class LineServing:
    """The serving loop of ``DynamixelEmulator`` (hil/dynamixel_emulator.py): bytes read from the
    line go to ``handle`` (hil/dynamixel_instructions.py), control lines to ``command``."""

    def serve(self, master: int | None, control: int, reply=None, listener=None) -> None:
        """Answer on the pty master until ``control`` (a readable fd) reaches end of file.
        With ``listener`` (a listening TCP socket) instead: answer on the connection it accepts,
        the next one when the driver closes it (``master`` None until then).

        ``control`` also takes JSON lines: ``{"cmd": "arm", "fault": KIND|null, "inject_cycle":
        N, "rate_hz": R, "contact": DATA|null}`` (power-cycle and re-arm) and ``{"cmd": "report"}``; each is answered
        with one JSON line through ``reply(dict)``."""
        pending = self.pending
        lines = b""
        while True:
            timeout, due = self._wait_time()
            fds = [control] + ([master] if master is not None else []) + ([listener] if listener else [])
            asked = None if timeout is None else time.monotonic() + timeout
            r, _, _ = select.select(fds, [], [], timeout)
            if asked is not None:
                self.held(time.monotonic() - asked)
            if due is not None and time.monotonic() > due:
                self.watchdog(time.monotonic())
            if listener is not None and listener in r:
                master = self._accept(listener, master)
                continue
            if master is not None and master in r:
                master = self._take_line(master, listener is not None)
            if control in r:
                lines = self._take_control(control, lines, reply)
                if lines is None:
                    return
            if pending:
                self._flush(master)

    def _wait_time(self) -> tuple[float | None, float | None]:
        """(select timeout in s until the next answer or Bus Watchdog expiry, None: none due;
        the watchdog's expiry time, None when it cannot expire)."""
        timeout = None
        if self.pending:
            timeout = max(0.0, min(d for d, _ in self.pending) - time.monotonic())
        due = self.watchdog_due()
        if due is not None:
            timeout = max(0.0, due - time.monotonic() if timeout is None else min(timeout, due - time.monotonic()))
        return timeout, due

    @staticmethod
    def _accept(listener, master: int | None) -> int:
        """The fd of the connection ``listener`` accepts (the previous one closed)."""
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if master is not None:
            os.close(master)
        return conn.detach()

    def _take_line(self, master: int, closes: bool) -> int | None:
        """Read what the driver sent and queue the answers; the fd, or None when the driver
        closed the link (``closes``: a TCP connection, the next one awaited)."""
        try:
            data = os.read(master, 4096)
        except OSError:
            data = b""
        if not data and closes:  # the driver closed the link
            os.close(master)
            return None
        if data:
            t = time.monotonic()
            if self.cycles and self._last_rx is not None:
                self.max_gap = max(self.max_gap, t - self._last_rx)
            self._last_rx = t
            self.pending.extend(self.handle(data))
        return master

    def _take_control(self, control: int, lines: bytes, reply) -> bytes | None:
        """Answer the complete control lines read; the incomplete rest, None at end of file."""
        data = os.read(control, 4096)
        if not data:
            return None
        lines += data
        while b"\n" in lines:
            line, lines = lines.split(b"\n", 1)
            if line.strip() and reply is not None:
                reply(self.command(line))
        return lines

    def _flush(self, master: int | None) -> None:
        """Write the answers now due to the line (dropped while no driver is connected)."""
        now = time.monotonic()
        due = [x for x in self.pending if x[0] <= now]
        if due:
            self.pending[:] = [x for x in self.pending if x[0] > now]
            if master is not None:
                os.write(master, b"".join(b for _, b in due))

    def command(self, line: bytes) -> dict:
        """One control command (see ``serve``); errors come back as ``{"error": ...}``."""
        try:
            c = json.loads(line)
            if c.get("cmd") == "report":
                return self.report()
            if c.get("cmd") == "arm":
                self.arm(c.get("fault"), int(c.get("inject_cycle", 0)), float(c.get("rate_hz", 1.0 / self.dt)),
                         c.get("contact"))
                return {"armed": True, "fault": self.fault, "inject_cycle": self.inject_cycle}
            return {"error": f"unknown command {c.get('cmd')!r}"}
        except (ValueError, TypeError, AttributeError, UserError) as e:
            return {"error": str(e)}


def open_pty() -> tuple[int, int, str]:
    """A raw pseudo-terminal: (master fd, slave fd kept open, slave path)."""
    master, slave = os.openpty()
    tty.setraw(slave)
    return master, slave, os.ttyname(slave)
