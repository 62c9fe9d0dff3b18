"""Receive windows that do not count time the host held this process.

A driver waits a bounded time for its cycle's answers (a CAN TPDO window, a Dynamixel status
packet timeout). On a virtual machine the host stops both CPUs for milliseconds now and then
(docs/hil.md): a window measured on the wall clock then closes while neither the driver nor the
drives could run, and a host pause becomes a timeout. ``Window`` measures this process' own
wake-up lateness instead -- a gap between two polls, or a wake-up later than the time asked,
longer than ``HELD_MIN`` -- and extends its deadline by it (``held``). A drive that does not
answer still times out after ``length`` s of this process' own time.

Times are ``time.perf_counter()`` seconds.
"""

from __future__ import annotations

import time

HELD_MIN = 200e-6  # s: a poll gap or wake-up lateness beyond this is time the host held the process


class Window:
    """One receive window of ``length`` s; with ``exclude_held`` its deadline moves by the
    time the host held this process while it waited (``held``, s)."""

    __slots__ = ("length", "exclude_held", "deadline", "held", "held_max", "_last")

    def __init__(self, length: float, exclude_held: bool = False):
        self.length = float(length)
        self.exclude_held = bool(exclude_held)
        self.deadline = self.held = self.held_max = self._last = 0.0

    def open(self, now: float | None = None) -> "Window":
        """Start the window at ``now`` (default: the present)."""
        now = time.perf_counter() if now is None else now
        self.deadline, self.held, self._last = now + self.length, 0.0, now
        return self

    def touch(self) -> None:
        """A blocking receive returned data: the time it waited was no hold."""
        self._last = time.perf_counter()

    def remaining(self, asked: float | None = None) -> float:
        """Seconds left (<= 0: closed). Call it once per poll; ``asked``: the time this process
        asked to wake at (a receive that timed out), else the previous call's time."""
        now = time.perf_counter()
        gap = now - (self._last if asked is None else asked)
        self._last = now
        if self.exclude_held and gap > HELD_MIN:
            self.deadline += gap
            self.held += gap
            self.held_max = max(self.held_max, gap)
        return self.deadline - now
