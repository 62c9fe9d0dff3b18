"""Live view: a run served over the Foxglove WebSocket protocol (subprotocol
``foxglove.sdk.v1``) through ``foxglove-sdk`` (``pip install pkrt[foxglove]``).

Topics and messages are those of the MCAP export (``pkrt.rt.runtime.logs.mcapexport``: ``/pkrt/reference``,
``/pkrt/measured``, ``/pkrt/torque``, ``/pkrt/tracking_error``, ``/pkrt/safety``,
``/pkrt/timing``, JSON with a JSON Schema each); log time is the cycle's loop time in ns.

Nothing of the SDK runs in the loop's process: the server, the JSON and the SDK's ``log`` calls
live in a child process, ``python -m pkrt.rt.runtime.logs.foxglovelive`` (measured: with them in a thread of
the loop's process, ``log`` held the GIL long enough to delay the loop's wake-ups by
milliseconds). The loop's ``maybe_send`` (the telemetry hook) costs one float comparison per
cycle; at most ``rate_hz`` times per second of loop time, and only while a client is
subscribed (the child says so), it copies the staged row into a preallocated ring slot and
hands the slot's index to a sender thread, which writes the row's bytes to the child's standard
input (the GIL is released while writing). When the ring is full the row is dropped and
counted, never waited for. The child reports on its standard output, one JSON object a line:
the port it serves on (or why it cannot), every change of the number of subscriptions, and its
counts at the end; it ignores Ctrl-C and stops when its input ends.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading

import numpy as np

from pkrt.rt.core.errors import UserError
from pkrt.rt.runtime.record.logfile import channel_slices
from pkrt.rt.runtime.cycle.loop import normal_scheduling
from pkrt.rt.runtime.logs.mcapexport import json_schema, layout, message
from pkrt.rt.runtime.record.telemetry import RateGate


def parse_address(text: str) -> tuple[str, int]:
    """``[HOST:]PORT`` -> (host, port); host defaults to 127.0.0.1, port 0 picks a free one."""
    host, sep, port = text.rpartition(":")
    host = host if sep else "127.0.0.1"
    if not (port.isascii() and port.isdigit()) or not 0 <= int(port) < 65536 or not host:
        raise UserError(f"--foxglove: expected [HOST:]PORT with PORT in 0..65535, got {text!r}")
    return host, int(port)


class FoxgloveLive:
    """A Foxglove WebSocket server for one run, in a child process. ``channels``: the loop's
    row layout (name, width, unit), as the log's; ``axes``: actuator names."""

    def __init__(self, host: str, port: int, rate_hz: float, axes: list[str],
                 channels: list[tuple[str, int, str]], n_slots: int = 16, start_timeout: float = 60.0):
        import importlib.util

        if importlib.util.find_spec("foxglove") is None:
            raise UserError("--foxglove needs the foxglove-sdk package: pip install 'pkrt[foxglove]'")
        self.gate = RateGate(rate_hz)
        self.rate_hz = float(rate_hz)
        self.host = host
        width = sum(int(w) for _, w, _ in channels)
        self.topics = _topics(axes, channels)
        self.dropped = 0  # rows the sender was too far behind to take
        self.subscriptions = 0  # client subscriptions now, as the child reports them
        self.result: dict = {}  # the child's counts, after close()
        self._started = threading.Event()
        self._start: dict = {}
        spec = json.dumps({"host": host, "port": port, "axes": list(axes), "channels": [list(c) for c in channels]})
        self._proc = subprocess.Popen([sys.executable, "-m", "pkrt.rt.runtime.logs.foxglovelive", spec], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, bufsize=0)
        self._reader = threading.Thread(target=self._read, name="pkrt-foxglove-status", daemon=True)
        self._reader.start()
        if not self._started.wait(start_timeout) or "ok" not in self._start:
            self._stop_child()
            why = self._start.get("error", "the server process did not start")
            raise UserError(f"--foxglove: cannot serve on {host}:{port}: {why}")
        self.port = int(self._start["ok"])
        self._ring = np.zeros((n_slots, width + 2))  # t, cycle, row
        self._n = n_slots
        self._cur = 0
        self._submitted = 0  # loop's thread only
        self._done = 0  # sender thread only
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._send, name="pkrt-foxglove-sender", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"ws://{self.host}:{self.port}"

    # -- loop's thread --------------------------------------------------------------------------
    def maybe_send(self, cycle: int, t: float, row: np.ndarray, slices: dict[str, slice]) -> bool:
        """Stage the row for the sender if 1/rate_hz of loop time has passed and a client is
        subscribed. Never blocks; returns True when the row was staged."""
        if t < self.gate.next_t:
            return False
        self.gate.advance(t)
        if self.subscriptions <= 0:
            return False
        if self._submitted - self._done >= self._n - 1:
            self.dropped += 1
            return False
        b = self._cur
        slot = self._ring[b]
        slot[0] = t
        slot[1] = cycle
        slot[2:] = row
        self._submitted += 1
        self._cur = (b + 1) % self._n
        self._queue.put(b)
        return True

    # -- threads --------------------------------------------------------------------------------
    def _send(self) -> None:
        """Rows to the child's standard input, one float64 record each."""
        fd = self._proc.stdin.fileno()
        while True:
            b = self._queue.get()
            if b is None:
                return
            try:
                os.write(fd, self._ring[b].astype("<f8", copy=False).tobytes())
            except OSError:  # the child is gone: nothing more to send
                pass
            finally:
                self._done += 1

    def _read(self) -> None:
        """The child's reports: start, subscriptions, counts."""
        for line in self._proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "subscriptions" in msg:
                self.subscriptions = int(msg["subscriptions"])
            elif "done" in msg:
                self.result = msg["done"]
            else:
                self._start = msg
                self._started.set()
        self.subscriptions = 0  # the child is gone: stage nothing more
        self._started.set()

    def stats(self) -> dict:
        return {"url": self.url, "rate_hz": self.rate_hz, "topics": [tp.topic for tp in self.topics],
                "staged": self._submitted, "dropped": self.dropped, **self.result}

    def close(self) -> None:
        """Send what is staged, then stop the sender, the server and the child."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(10.0)
        self._stop_child()

    def _stop_child(self) -> None:
        try:
            self._proc.stdin.close()  # end of the stream: the child stops its server and exits
        except OSError:
            pass
        try:
            self._proc.wait(10.0)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(5.0)
        self._reader.join(5.0)
        self._proc.stdout.close()


def _topics(axes: list[str], channels: list[tuple[str, int, str]]):
    slices = channel_slices((name, width) for name, width, _ in channels)
    return layout(slices, {name: unit for name, _, unit in channels}, list(axes))


def _report(msg: dict) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def serve(spec: dict) -> None:
    """The child process: serve the topics; log each row read from standard input (t, cycle,
    row as little-endian float64) until its end; report on standard output."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the loop's; the end of input stops this
    normal_scheduling(nice=10)  # started by the loop's process: never at its real-time priority
    import foxglove

    topics = _topics(spec["axes"], spec["channels"])
    size = 8 * (2 + sum(int(c[1]) for c in spec["channels"]))
    clients: set[int] = set()
    lock = threading.Lock()
    count = [0]

    class Listener:
        def on_subscribe(self, client, channel) -> None:
            with lock:
                clients.add(client.id)
                count[0] += 1
                _report({"subscriptions": count[0]})

        def on_unsubscribe(self, client, channel) -> None:
            with lock:
                count[0] -= 1
                _report({"subscriptions": count[0]})

    ctx = foxglove.Context()
    try:
        server = foxglove.start_server(name="pkrt", host=spec["host"], port=spec["port"], context=ctx,
                                       server_listener=Listener())
    except Exception as e:  # noqa: BLE001 - address in use, bad host: the SDK raises RuntimeError
        _report({"error": str(e)})
        return
    chans = [foxglove.Channel(tp.topic, context=ctx, message_encoding="json",
                              schema=foxglove.Schema(name=tp.schema_name, encoding="jsonschema",
                                                     data=json.dumps(json_schema(tp)).encode()))
             for tp in topics]
    _report({"ok": int(server.port)})
    sent = 0
    inp = sys.stdin.buffer
    try:
        while True:
            data = inp.read(size)
            if len(data) < size:
                break
            a = np.frombuffer(data, dtype="<f8")
            t, cyc, row = float(a[0]), int(a[1]), a[2:].tolist()
            ns = max(int(round(t * 1e9)), 0)
            for tp, ch in zip(topics, chans):
                ch.log(json.dumps(message(tp, row, t, cyc)).encode(), log_time=ns)
            sent += 1
        with lock:
            _report({"done": {"sent": sent, "clients": len(clients)}})
    finally:
        server.stop()


def announce(live: FoxgloveLive) -> None:
    """One line on stderr: where to point Foxglove."""
    print(f"pkrt: Foxglove live view on {live.url} (Foxglove: Open connection -> Foxglove WebSocket)",
          file=sys.stderr, flush=True)


if __name__ == "__main__":
    serve(json.loads(sys.argv[1]))
