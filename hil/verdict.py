"""One verdict for a HIL run (``pkrt hil`` and the tests alike).

A run without an injected fault passes when it completed without a fault. A fault-injection
run passes when the injected fault was detected within ``DETECT_CYCLES`` cycles run of its
injection, torque was off (measured in the emulator) within ``TORQUE_OFF_CYCLES`` cycle of the
detection, and the fault's reason was logged (``fault`` in the summary, the event in the log).
Cycles are loop cycles; detection is counted in cycles run (hil/result.py), so periods a
wall-clock run skipped after an overrun do not count. In stepped timing (the default) no
period is skipped and the injection itself is a cycle (SYNC or Goal Current write) count.
"""

from __future__ import annotations

from dataclasses import dataclass

DETECT_CYCLES = 3  # injection -> detection, cycles run
TORQUE_OFF_CYCLES = 1  # detection -> torque off (the emulator's view), loop cycles


@dataclass(frozen=True)
class Verdict:
    """``ok``; ``reason``: one line saying what failed (empty when ok); ``kind``: "completed",
    "detected", "stopped" (a fault in a run without injection, or before the injection),
    "not-injected", "not-detected", "late-detection", "late-torque-off" or "no-reason"."""

    ok: bool
    kind: str
    reason: str = ""


def hil_verdict(r: dict, fault: str | None) -> Verdict:
    """The verdict of HIL result ``r`` (hil/result.py) for the ``fault`` kind injected (None:
    none)."""
    got = r.get("fault")
    at, inj = r.get("fault_cycle"), r.get("injected_cycle")
    if fault is None:
        if got:
            return Verdict(False, "stopped", f"HIL run stopped at cycle {at}: {got}")
        return Verdict(True, "completed")
    if got and (inj is None or (at is not None and at < inj)):
        return Verdict(False, "stopped", f"the run stopped at cycle {at}, before the injected fault '{fault}': {got}")
    if inj is None:
        return Verdict(False, "not-injected",
                       f"fault '{fault}' was never injected: the run ended after {r.get('cycles')} cycles, before "
                       f"the emulator's injection time ([emulator] inject_after); give a longer --duration")
    if not got:
        return Verdict(False, "not-detected", f"injected fault '{fault}' (cycle {inj}) was not detected")
    if not str(got).strip():
        return Verdict(False, "no-reason", f"injected fault '{fault}': the run stopped without a reason")
    det = r.get("detection_cycles")
    if det is None or not 0 <= det <= DETECT_CYCLES:
        return Verdict(False, "late-detection",
                       f"injected fault '{fault}' at cycle {inj} detected {det} cycles run later (at cycle {at}), "
                       f"more than {DETECT_CYCLES}: {got}")
    off = r.get("torque_off_cycle")
    if off is None or at is None or off - at > TORQUE_OFF_CYCLES:
        return Verdict(False, "late-torque-off",
                       f"injected fault '{fault}': torque not off within {TORQUE_OFF_CYCLES} cycle of the detection "
                       f"(fault cycle {at}, torque off cycle {off})")
    return Verdict(True, "detected")
