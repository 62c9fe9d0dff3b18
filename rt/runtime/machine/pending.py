"""A command submitted to a served machine's loop from another thread, waiting for its reply
(``pkrt.rt.runtime.machine.served.Machine.submit``)."""

from __future__ import annotations

import threading
import time


class Pending:
    """A submitted command waiting for the loop's reply."""

    def __init__(self, cmd: dict):
        self.cmd = cmd
        self.reply: dict | None = None
        self.t_submit = time.perf_counter()
        self._done = threading.Event()

    def set(self, reply: dict) -> None:
        self.reply = reply
        self._done.set()

    def wait(self, timeout: float) -> dict:
        if not self._done.wait(timeout):
            return {"ok": False, "error": f"no reply from the machine's loop within {timeout:g} s"}
        return self.reply
