"""Real-time tests on a shared machine: tell a run that a stall disturbed from one that failed.

A stall of this process, of the emulator or of the machine (overruns, periods skipped, answers
or frames arriving late, a timing fault that is not the one injected) is detected from the
run's own figures, never guessed from wall time; such a run is repeated (``repeat``), and the
test asserts on the first run without one (or on what a stall cannot change, e.g. cycles run).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# faults a stall can cause by itself: feedback late or missing, a drive's own watchdog
TIMING_FAULTS = ("TPDO timeout", "EMCY 0x8130", "stale feedback", "no valid feedback", "answers arriving late",
                 "this process stalled")
ATTEMPTS = 5


def timing_fault(fault: str | None, expected: str | None = None) -> bool:
    """A fault a stall can cause that is not the ``expected`` (injected) one."""
    return bool(fault) and (expected is None or expected not in fault) and any(t in fault for t in TIMING_FAULTS)


def hil_stalled(r: dict, expected: str | None = None) -> bool:
    """A HIL result (hil/result.py) that a stall disturbed: overruns, periods the emulator
    skipped or writes it saw over a period late, an emulator held over a period, frames or
    answers late or missing (a timeout), or a timing fault other than the ``expected`` one."""
    emu, drv = r.get("emulator") or {}, r.get("driver") or {}
    return (r.get("overruns", 0) > 0 or emu.get("skipped_periods", 0) > 0 or bool(emu.get("skips"))
            or (emu.get("stalls") or 0) > 0
            or emu.get("late_writes", 0) > 0 or drv.get("late_frames", 0) > 0 or drv.get("late_answers", 0) > 0
            or drv.get("timeouts", 0) > 0 or timing_fault(r.get("fault"), expected))


def fault_preempted(r: dict, expected: str) -> bool:
    """A fault-injection run that a stall stopped first: a timing fault other than the
    ``expected`` one, or any fault before the injection."""
    fault, inj, at = r.get("fault"), r.get("injected_cycle"), r.get("fault_cycle")
    return bool(fault) and (timing_fault(fault, expected) or inj is None or (at is not None and at < inj))


# setup transactions a stall can time out (the drives were never enabled: nothing to judge)
SETUP_TIMEOUTS = ("No SDO response", "no valid answer to", "Write timeout")


def repeat(run: Callable[[], T], stalled: Callable[[T], bool], attempts: int = ATTEMPTS,
           skip: bool = True) -> T:
    """``run()`` until a run without a stall (at most ``attempts``). When every run was spoilt by
    a stall the machine is too loaded to judge: the test is skipped with the last run's evidence
    (``skip``), or the last run is returned (the test's assertions then say what happened). A
    ``DriveError`` from a setup transaction that timed out is a stall too; on the last attempt
    it is raised."""
    import pytest

    from pkrt.drivers.base import DriveError

    for i in range(attempts):
        try:
            r = run()
        except DriveError as e:
            if i + 1 < attempts and any(t in str(e) for t in SETUP_TIMEOUTS):
                continue
            raise
        if not stalled(r):
            return r
    if skip:
        evidence = ({k: r.get(k) for k in ("fault", "overruns", "injected_cycle") if k in r}
                    if isinstance(r, dict) else r)
        pytest.skip(f"machine too loaded for a real-time run: a stall in each of {attempts} runs "
                    f"(last: {str(evidence)[:200]})")
    return r
