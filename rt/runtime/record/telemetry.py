"""Live telemetry: msgpack maps over UDP at a bounded rate, for PlotJuggler or any listener.

Each datagram is one msgpack map of flat names to numbers: ``timestamp`` (loop time, s),
``cycle``, and one entry per logged value, ``<channel>`` for width-1 channels and
``<channel>/<axis>`` for per-axis ones (e.g. ``pos/q1``, ``tau/q3``, ``wake_us``; axes are
numbered from 0 when no names are given). Units are the
log's (SI at the actuators, microseconds for timing).

PlotJuggler: Streaming -> "UDP Server", port 9870 (or the one given), Message Protocol
"msgpack", tick "use field as timestamp if available" and pick ``timestamp``.

Rate is bounded in loop time: at most one datagram per 1/rate_hz seconds of the loop's clock
(so a lockstep run sends rate_hz datagrams per simulated second). The socket is non-blocking;
a datagram the kernel will not take right now is dropped and counted, never waited for.
"""

from __future__ import annotations

import socket

import msgpack
import numpy as np

from pkrt.rt.core.errors import UserError

PER_AXIS = frozenset({"ref_pos", "ref_vel", "ref_acc", "pos", "vel", "tau", "tau_model"})  # 1 column per axis


class RateGate:
    """At most one send per 1/rate_hz s of loop time, on the grid t0 + n / rate_hz from the
    first send, skipping slots missed (no burst after a pause). Callers test
    ``t < gate.next_t`` themselves (the per-cycle cost: one float comparison) and call
    ``advance(t)`` when it is time."""

    def __init__(self, rate_hz: float):
        if not rate_hz > 0:
            raise UserError(f"telemetry: rate must be positive, got {rate_hz!r} Hz")
        self.rate_hz = float(rate_hz)
        self.period = 1.0 / float(rate_hz)
        self.next_t = -np.inf
        self._t0 = 0.0
        self._n = -1

    def advance(self, t: float) -> None:
        """Take the slot at loop time t (s); the next opens at the following grid point."""
        if self._n < 0:
            self._t0, self._n = float(t), 0
        self._n = max(self._n + 1, int((t - self._t0) / self.period) + 1)
        # a slot is due a millionth of a period early so float rounding of t never skips one
        self.next_t = self._t0 + (self._n - 1e-6) * self.period


class Fanout:
    """Several telemetry sinks (UDP, Foxglove) behind the one ``maybe_send`` the loop calls."""

    def __init__(self, sinks: list):
        self.sinks = list(sinks)

    def maybe_send(self, cycle: int, t: float, row: np.ndarray, slices: dict[str, slice]) -> bool:
        sent = False
        for s in self.sinks:
            sent = s.maybe_send(cycle, t, row, slices) or sent
        return sent


class Telemetry:
    """UDP msgpack sender. ``maybe_send`` is called every cycle; when it is not time to send
    it costs one float comparison."""

    def __init__(self, host: str = "127.0.0.1", port: int = 9870, rate_hz: float = 50.0,
                 axes: list[str] | None = None):
        if not (isinstance(port, int) and 0 < port < 65536):
            raise UserError(f"telemetry: port must be in 1..65535, got {port!r}")
        self.gate = RateGate(rate_hz)
        try:
            info = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        except (socket.gaierror, UnicodeError) as e:
            raise UserError(f"telemetry: cannot resolve host '{host}': {e}") from None
        self.address = info[4]
        self.rate_hz = float(rate_hz)
        self.axes = list(axes) if axes else None
        self.sent = 0
        self.dropped = 0
        self._keys: list[tuple[str, int]] | None = None
        self._sock = socket.socket(info[0], socket.SOCK_DGRAM)
        self._sock.setblocking(False)
        self._packer = msgpack.Packer(use_bin_type=True)

    def _layout(self, slices: dict[str, slice]) -> list[tuple[str, int]]:
        keys = []
        for name, sl in slices.items():
            n = sl.stop - sl.start
            if n == 1 and not (name in PER_AXIS and self.axes and len(self.axes) == 1):
                keys.append((name, sl.start))
            else:
                for i in range(n):
                    ax = self.axes[i] if self.axes and len(self.axes) == n else str(i)
                    keys.append((f"{name}/{ax}", sl.start + i))
        return keys

    def maybe_send(self, cycle: int, t: float, row: np.ndarray, slices: dict[str, slice]) -> bool:
        """Send the row if 1/rate_hz of loop time (s) has passed since the last send. Never
        blocks; returns True when a datagram left."""
        if t < self.gate.next_t:
            return False
        self.gate.advance(t)
        if self._keys is None:
            self._keys = self._layout(slices)
        msg = {"timestamp": float(t), "cycle": int(cycle)}
        for key, i in self._keys:
            msg[key] = float(row[i])
        try:
            self._sock.sendto(self._packer.pack(msg), self.address)
        except OSError:  # EAGAIN (buffer full), ECONNREFUSED, ENETUNREACH: drop
            self.dropped += 1
            return False
        self.sent += 1
        return True

    def stats(self) -> dict:
        return {"address": f"{self.address[0]}:{self.address[1]}", "rate_hz": self.rate_hz,
                "sent": self.sent, "dropped": self.dropped}

    def close(self) -> None:
        self._sock.close()
