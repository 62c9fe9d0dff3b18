"""Live view: a run served over the Foxglove WebSocket protocol (subprotocol
``foxglove.sdk.v1``) through ``foxglove-sdk`` (``pip install pkrt[foxglove]``).

Topics and messages are those of the MCAP export (``pkrt.rt.mcapexport``: ``/pkrt/reference``,
``/pkrt/measured``, ``/pkrt/torque``, ``/pkrt/tracking_error``, ``/pkrt/safety``,
``/pkrt/timing``, JSON with a JSON Schema each); log time is the cycle's loop time in ns.

Nothing of the SDK runs in the loop. The loop's ``maybe_send`` (the telemetry hook) costs one
float comparison per cycle; at most ``rate_hz`` times per second of loop time, and only while a
client is subscribed, it copies the staged row into a preallocated ring slot and hands the
slot's index to a sender thread (lower priority), which builds the JSON and calls the SDK. When
the thread is behind and the ring is full, the row is dropped and counted, never waited for.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading

import numpy as np

from .errors import UserError
from .mcapexport import json_schema, layout, message
from .telemetry import RateGate


def parse_address(text: str) -> tuple[str, int]:
    """``[HOST:]PORT`` -> (host, port); host defaults to 127.0.0.1, port 0 picks a free one."""
    host, sep, port = text.rpartition(":")
    host = host if sep else "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) < 65536 or not host:
        raise UserError(f"--foxglove: expected [HOST:]PORT with PORT in 0..65535, got '{text}'")
    return host, int(port)


class FoxgloveLive:
    """A Foxglove WebSocket server for one run. ``channels``: the loop's row layout (name,
    width, unit), as the log's; ``axes``: actuator names."""

    def __init__(self, host: str, port: int, rate_hz: float, axes: list[str],
                 channels: list[tuple[str, int, str]], n_slots: int = 16):
        try:
            import foxglove
        except ImportError:
            raise UserError("--foxglove needs the foxglove-sdk package: pip install 'pkrt[foxglove]'") from None
        self.gate = RateGate(rate_hz)
        self.rate_hz = float(rate_hz)
        slices, c, units = {}, 0, {}
        for name, width, unit in channels:
            slices[name], c = slice(c, c + width), c + width
            units[name] = unit
        self.topics = layout(slices, units, list(axes))
        self.sent = 0  # rows sent (one message per topic each)
        self.dropped = 0  # rows the sender thread was too far behind to take
        self.subscriptions = 0  # client subscriptions now (the SDK's threads update it)
        self.clients_seen: set[int] = set()
        self._ctx = foxglove.Context()
        try:
            self.server = foxglove.start_server(name="pkrt", host=host, port=port, context=self._ctx,
                                                server_listener=_Listener(self))
        except Exception as e:  # noqa: BLE001 - address in use, bad host: the SDK raises RuntimeError
            raise UserError(f"--foxglove: cannot serve on {host}:{port}: {e}") from None
        self.host, self.port = host, int(self.server.port)
        self._channels = [foxglove.Channel(tp.topic, context=self._ctx, message_encoding="json",
                                           schema=foxglove.Schema(name=tp.schema_name, encoding="jsonschema",
                                                                  data=json.dumps(json_schema(tp)).encode()))
                          for tp in self.topics]
        self._ring = np.zeros((n_slots, c))
        self._t = np.zeros(n_slots)
        self._cycle = np.zeros(n_slots, dtype=np.int64)
        self._n = n_slots
        self._cur = 0
        self._submitted = 0  # loop's thread only
        self._done = 0  # sender thread only
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="pkrt-foxglove", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"ws://{self.host}:{self.port}"

    # -- loop's thread --------------------------------------------------------------------------
    def maybe_send(self, cycle: int, t: float, row: np.ndarray, slices: dict[str, slice]) -> bool:
        """Stage the row for the sender thread if 1/rate_hz of loop time has passed and a client
        is subscribed. Never blocks; returns True when the row was staged."""
        if t < self.gate.next_t:
            return False
        self.gate.advance(t)
        if self.subscriptions <= 0:
            return False
        if self._submitted - self._done >= self._n - 1:
            self.dropped += 1
            return False
        b = self._cur
        self._ring[b][...] = row
        self._t[b] = t
        self._cycle[b] = cycle
        self._submitted += 1
        self._cur = (b + 1) % self._n
        self._queue.put(b)
        return True

    # -- sender thread --------------------------------------------------------------------------
    def _run(self) -> None:
        try:  # below the loop's thread when the CPUs are contended (Linux: per thread)
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except (OSError, AttributeError):
            pass
        while True:
            b = self._queue.get()
            if b is None:
                return
            try:
                row, t, cyc = self._ring[b].tolist(), float(self._t[b]), int(self._cycle[b])
                ns = max(int(round(t * 1e9)), 0)
                for tp, ch in zip(self.topics, self._channels):
                    ch.log(json.dumps(message(tp, row, t, cyc)).encode(), log_time=ns)
                self.sent += 1
            finally:
                self._done += 1

    def stats(self) -> dict:
        return {"url": self.url, "rate_hz": self.rate_hz, "topics": [tp.topic for tp in self.topics],
                "sent": self.sent, "dropped": self.dropped, "clients": len(self.clients_seen)}

    def close(self) -> None:
        """Send what is staged, stop the thread and the server."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(5.0)
        for ch in self._channels:
            ch.close()
        self.server.stop()


class _Listener:
    """foxglove-sdk server listener: counts subscriptions (called from the SDK's threads)."""

    def __init__(self, live: FoxgloveLive):
        self.live = live
        self._lock = threading.Lock()

    def on_subscribe(self, client, channel) -> None:
        with self._lock:
            self.live.clients_seen.add(client.id)
            self.live.subscriptions += 1

    def on_unsubscribe(self, client, channel) -> None:
        with self._lock:
            self.live.subscriptions -= 1


def announce(live: FoxgloveLive) -> None:
    """One line on stderr: where to point Foxglove."""
    print(f"pkrt: Foxglove live view on {live.url} (Foxglove: Open connection -> Foxglove WebSocket)",
          file=sys.stderr, flush=True)
