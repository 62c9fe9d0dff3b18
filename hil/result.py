"""The result of a HIL run, the same keys for every bus (`pkrt hil --bus can|serial`)."""

from __future__ import annotations

from typing import Any, TypedDict


class HilResult(TypedDict):
    """``run_session``'s summary (rt/runtime/machine/run.py: ``fault``, ``fault_cycle``, ``cycles``,
    ``overruns``, ``rms_error``, ...) plus these keys. Cycles are loop cycle indices (they count
    periods skipped by overruns) unless the name says "cycles run". A run of a planned trajectory
    (``pkrt hil --traj``) also has ``peak_force``, added by ``pkrt.rt.app.hil``."""

    bus: str  # "can" or "serial"
    interface: str  # can: "unix_pair", "udp_pair", "udp_multicast" or "virtual"; serial: "tcp" or "pty"
    timing: str  # "stepped" or "wallclock" (hil/can_hil.py)
    injected_fault: str | None  # the fault kind injected (None: no fault)
    injected_cycle: int | None  # loop cycle at which the emulator started the fault (None: not reached)
    detection_cycles: int | None  # cycles run from the injection to the fault (skipped periods not counted)
    torque_off_cycle: int | None  # loop cycle at which the emulator had every axis's torque off
    host_torque_off_cycle: int | None  # run_session's torque_off_cycle: the host's own view
    emulator_process: bool  # the emulator ran in a process of its own
    emulator_error: str | None  # an unexpected error inside the emulator
    driver: dict[str, Any]  # the driver's settings and bus figures (CAN: bus load, late frames, SYNCs ...)
    emulator: dict[str, Any]  # the emulator's report (cycles, frames, response times, drive states ...)


def cycles_run_between(ran: list[int], start: int | None, end: int | None) -> int | None:
    """Cycles run from loop cycle ``start`` to loop cycle ``end`` (``ran``: the loop cycles run,
    in order); a stall's skipped periods are not counted. None when either was not run."""
    if start is None or end is None or start not in ran or end not in ran:
        return None
    return ran.index(end) - ran.index(start)


def hil_result(summary: dict, *, bus: str, interface: str, timing: str, injected_fault: str | None,
               injected_cycle: int | None, detection_cycles: int | None, torque_off_cycle: int | None,
               emulator_process: bool, emulator_error: str | None, driver: dict, emulator: dict) -> HilResult:
    """The HIL result: the run's summary with the HIL keys."""
    out = dict(summary)
    out.update(bus=bus, interface=interface, timing=timing, injected_fault=injected_fault, injected_cycle=injected_cycle,
               detection_cycles=detection_cycles, torque_off_cycle=torque_off_cycle,
               host_torque_off_cycle=summary.get("torque_off_cycle"), emulator_process=emulator_process,
               emulator_error=emulator_error, driver=driver, emulator=emulator)
    return out  # type: ignore[return-value]
