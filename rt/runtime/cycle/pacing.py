"""How the loop goes on after a cycle that ended past the next deadline (the host held the
process, or the cycle overran): ``next_cycle`` with pacing ``skip`` (real drives: the missed
periods are not made up, the watchdog counts them) or ``delay`` (a plant that pauses with the
loop: the schedule moves), and ``HostDelays``, what those late cycles were. Units: seconds.
"""

from __future__ import annotations

import math

from pkrt.drivers.base import Drives


def next_cycle(clock, k: int, period: float, pacing: str = "skip") -> tuple[int, float]:
    """The cycle after k and how late k ended (s past the next deadline; 0.0 on time). On a
    real clock past the next deadline: pacing ``skip`` goes on at the next boundary (skipped
    periods are not made up), ``delay`` re-anchors the clock so that the next cycle runs now
    and every later one as late (a run delayed, not broken). A lockstep clock never runs late."""
    nxt = k + 1
    if clock.lockstep:
        return nxt, 0.0
    now = clock.now()
    late = now - nxt * period
    if late <= 0.0:
        return nxt, 0.0
    if pacing == "delay":
        clock.t0 += late
        return nxt, late
    return int(math.floor(now / period)) + 1, late


PACINGS = ("skip", "delay")


def default_pacing(drives: Drives) -> str:
    """``delay`` for the simulated plant (it runs in the loop's process and pauses with it: a
    host pause is no plant event), ``skip`` for every real drive (the machine does not pause)."""
    return "delay" if drives.backend == "sim" else "skip"




class HostDelays:
    """Cycles that ended past the next deadline (the host held the process, or the cycle
    overran): how many, the longest, and the first ``KEEP`` with their loop cycle and
    ``time.monotonic()`` (the clock of the host-pause probe, rt/core/hostprobe.py)."""

    KEEP = 50

    def __init__(self):
        self.count = 0
        self.longest = 0.0  # s
        self.longest_at: tuple[int, float] | None = None
        self.first: list[tuple[int, float, float]] = []  # (cycle, monotonic time at the cycle's end, delay s)

    def add(self, k: int, delay: float, at: float) -> None:
        self.count += 1
        if delay > self.longest:
            self.longest, self.longest_at = delay, (k, at)
        if len(self.first) < self.KEEP:
            self.first.append((k, at, delay))

    def summary(self) -> dict:
        """count, longest_ms, longest_cycle, longest_at (monotonic s) and ``at``: [cycle,
        monotonic s, ms] of the first delays."""
        return {"count": self.count, "longest_ms": round(self.longest * 1e3, 3),
                "longest_cycle": self.longest_at[0] if self.longest_at else None,
                "longest_at": self.longest_at[1] if self.longest_at else None,
                "at": [[k, round(t, 6), round(d * 1e3, 3)] for k, t, d in self.first]}

    def text(self) -> str:
        """One line for a summary: 'none' or 'N (longest X ms at cycle K)'."""
        if not self.count:
            return "none"
        return f"{self.count} (longest {self.longest * 1e3:.1f} ms at cycle {self.longest_at[0]})"
