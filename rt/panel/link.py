"""The panel's connections to the served machine's control socket (``pkrt.rt.app.client``),
each in a thread of its own:

- ``Poller``: one for the whole panel, asks ``status`` at a fixed rate (and ``events`` when
  the journal moved on, ``info`` once per connection) and hands each view to ``publish``. The
  machine's load does not depend on how many pages are open; the task-space readout (forward
  kinematics, ~0.1 ms each) is computed only while a page is open.
- ``PageLink``: one per page, its commands one at a time in order; a jog it starts belongs to
  it, so closing it (the page went away) releases the jog (the machine's dead-man), and a page
  that stops sending keep-alives is released by the machine after ``deadman_s``.
- ``EstopLink``: the emergency stop's own connection, never behind another command.

A lost machine is retried every ``RETRY_S``; the views say so meanwhile.
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

from pkrt.rt.app.client import MachineClient
from pkrt.rt.core.errors import Fault, UserError
from pkrt.rt.panel import programs as progs
from pkrt.rt.panel.view import link_down, view_of

RETRY_S = 0.5
LOST = (UserError, Fault, OSError, ValueError, KeyError)  # a machine gone, or a reply that is not one


def connect(socket_path: str, timeout: float = 5.0) -> MachineClient:
    return MachineClient(socket_path, timeout=timeout)


class Poller(threading.Thread):
    """Polls the machine at ``hz`` and publishes the page's view (``publish(view)``, from this
    thread); ``poke`` asks for a poll now (after a command)."""

    def __init__(self, socket_path: str, publish, programs: Path | None, hz: float = 20.0, readout: bool = True,
                 watched=lambda: True):
        super().__init__(name="pkrt-panel-poller", daemon=True)
        self.path, self.publish, self.folder, self.period = socket_path, publish, programs, 1.0 / hz
        self.watched = watched  # () -> bool: a page is open
        self.want_readout = readout
        self._poke, self._stop = threading.Event(), threading.Event()
        self.readouts: dict[str, tuple] = {}  # configuration path -> (ToolReadout or None, why)
        self.polls = 0
        self.config: str | None = None  # the machine's configuration file (its ``info``)

    def poke(self) -> None:
        self._poke.set()

    def stop(self) -> None:
        self._stop.set()
        self._poke.set()

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                with connect(self.path) as c:
                    self._serve(c)
            except LOST as e:
                self.publish(link_down({"up": False, "error": str(e), "socket": self.path}, progs.listing(self.folder)))
                self._stop.wait(RETRY_S)

    def _readout(self, config: str):
        if not self.want_readout:
            return None
        if config not in self.readouts:
            from pkrt.rt.panel.readout import ToolReadout

            self.readouts[config] = ToolReadout.load(config)
        return self.readouts[config][0]

    def _serve(self, c: MachineClient) -> None:
        info = c.call("info")["info"]
        self.config = info.get("config")
        link = {"up": True, "error": None, "socket": self.path}
        events: list[dict] = []
        seen = -1
        text: dict | None = None
        readout = None
        listing, listed_at = progs.listing(self.folder), time.monotonic()
        while not self._stop.is_set():
            t0 = time.monotonic()
            st = c.status()
            self.polls += 1
            last = st["events"]["last"]
            if last != seen:  # the journal moved on (or this is the first poll)
                r = c.call("events", seq=max(seen, 0))
                events = (events + r["events"])[-256:] if seen >= 0 else r["events"]
                seen = last
            prog = st.get("program")
            if prog is not None and (text is None or text["file"] != prog["file"]):
                text = progs.text_of(self.folder, prog["file"]) or {"file": prog["file"], "name": Path(prog["file"]).name,
                                                                  "lines": None, "truncated": False}
            if t0 - listed_at > 2.0:
                listing, listed_at = progs.listing(self.folder), t0
            self.publish(view_of(st, link, info, readout if self.watched() else None, events, listing, text))
            if readout is None and self.want_readout:  # after the first view: the model takes a second or two
                readout = self._readout(info["config"])
                self.want_readout = readout is not None or info["config"] not in self.readouts
            if self._poke.wait(max(0.0, self.period - (time.monotonic() - t0))):
                self._poke.clear()  # (a poke after a timed-out wait stays set: the next wait returns at once)


class PageLink(threading.Thread):
    """One page's commands to the machine, in order, over the page's own connection; each
    reply to ``reply(request, reply)``; ``after()`` once a command is done (poke the poller)."""

    def __init__(self, socket_path: str, reply, after, depth: int = 64):
        super().__init__(name="pkrt-panel-page", daemon=True)
        self.path, self.reply, self.after = socket_path, reply, after
        self.q: queue.Queue = queue.Queue(maxsize=depth)
        self.client: MachineClient | None = None

    def submit(self, req: dict) -> bool:
        """Queue a request (False: this page has too many waiting)."""
        try:
            self.q.put_nowait(req)
            return True
        except queue.Full:
            return False

    def close(self) -> None:
        while True:
            try:
                self.q.put_nowait(None)
                return
            except queue.Full:
                try:
                    self.q.get_nowait()
                except queue.Empty:
                    pass

    def run(self) -> None:
        try:
            while (req := self.q.get()) is not None:
                self.reply(req, self._request({k: v for k, v in req.items() if k != "_id"}))
                self.after()
        finally:
            if self.client is not None:
                self.client.close()  # the machine releases this page's jog

    def _request(self, req: dict) -> dict:
        for attempt in (0, 1):
            try:
                if self.client is None:
                    self.client = connect(self.path)
                return self.client.request(req)
            except LOST as e:
                if self.client is not None:
                    self.client.close()
                    self.client = None
                if attempt or req.get("cmd") in ("jog", "alive"):  # a jog is never re-sent on a new connection
                    return {"ok": False, "error": f"machine not reachable: {e}"}
        return {"ok": False, "error": "machine not reachable"}


class EstopLink(threading.Thread):
    """The emergency stop's own connection: ``press(done)`` sends ``estop`` at once (a new
    connection if the last one broke) and calls ``done(reply)``."""

    def __init__(self, socket_path: str):
        super().__init__(name="pkrt-panel-estop", daemon=True)
        self.path = socket_path
        self.q: queue.SimpleQueue = queue.SimpleQueue()
        self.client: MachineClient | None = None

    def press(self, done) -> None:
        self.q.put(done)

    def stop(self) -> None:
        self.q.put(None)

    def run(self) -> None:
        self.warm()
        while (done := self.q.get()) is not None:
            done(self._send())
        if self.client is not None:
            self.client.close()

    def _send(self) -> dict:
        err = None
        for _ in range(2):
            try:
                if self.client is None:
                    self.client = connect(self.path)
                return self.client.request({"cmd": "estop"})
            except LOST as e:
                err = e
                if self.client is not None:
                    self.client.close()
                self.client = None
        return {"ok": False, "error": f"emergency stop not delivered: machine not reachable: {err}"}

    def warm(self) -> None:
        """Open the connection now (the first press then costs no connect)."""
        try:
            self.client = self.client or connect(self.path)
        except LOST:
            self.client = None
