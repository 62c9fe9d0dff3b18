"""The stop signals of a run (SIGINT, SIGTERM, SIGHUP, SIGQUIT): a safe stop, never a
traceback."""

from __future__ import annotations

import signal
import threading

from pkrt.rt.core.errors import Stopped

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class StopSignals:
    """While a run is on, SIGINT, SIGTERM, SIGHUP and SIGQUIT stop it. Until the drives are
    enabled (``abort``) a signal raises ``Stopped`` at once: nothing moves yet, and enabling is
    undone on the way out. Then the first signal only sets ``reason``, which the loop checks
    once per cycle (torque off, log closed with the reason, summary); a second one while in the
    loop (``in_loop``: stuck in a driver call) raises ``Stopped`` there, and the loop's handler
    still takes torque off. The previous handlers are restored on exit. Outside the main thread
    (where Python cannot install handlers) it does nothing."""

    def __init__(self):
        self.reason: str | None = None
        self.abort = True
        self.in_loop = False
        self._saved: dict = {}

    def _handle(self, signum, frame) -> None:
        first = self.reason is None
        if first:
            self.reason = ("interrupted by the user" if signum == signal.SIGINT
                           else f"stopped by signal {signal.Signals(signum).name}")
        if self.abort or (self.in_loop and not first):
            self.abort = self.in_loop = False
            raise Stopped(self.reason)

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._saved[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._saved.items():
            signal.signal(sig, signal.SIG_DFL if old is None else old)
        self._saved.clear()
