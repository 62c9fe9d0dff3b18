"""The one HIL verdict (hil/verdict.py) that `pkrt hil --fault` and the tests share, the
receive window that does not count a host hold (drivers/window.py), and the independent
host-pause probe (pkrt.rt.core.hostprobe)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from pkrt.drivers.window import HELD_MIN, Window
from pkrt.hil.verdict import DETECT_CYCLES, TORQUE_OFF_CYCLES, hil_verdict


def _r(**kw) -> dict:
    r = {"fault": "drive: TPDO timeout", "fault_cycle": 502, "injected_cycle": 500, "detection_cycles": 2,
         "torque_off_cycle": 502, "cycles": 503}
    r.update(kw)
    return r


@pytest.mark.parametrize("kw, fault, kind", [
    ({}, "drop", "detected"),
    ({"fault": None, "fault_cycle": None, "injected_cycle": None}, None, "completed"),
    ({"injected_cycle": None}, None, "stopped"),
    ({"fault_cycle": 120, "injected_cycle": None, "detection_cycles": None}, "drop", "stopped"),
    ({"fault": None, "fault_cycle": None, "injected_cycle": None}, "drop", "not-injected"),
    ({"fault": None, "fault_cycle": None}, "drop", "not-detected"),
    ({"detection_cycles": DETECT_CYCLES + 1, "fault_cycle": 504, "torque_off_cycle": 504}, "drop", "late-detection"),
    ({"detection_cycles": None}, "drop", "late-detection"),
    ({"torque_off_cycle": 502 + TORQUE_OFF_CYCLES + 1}, "drop", "late-torque-off"),
    ({"torque_off_cycle": None}, "drop", "late-torque-off"),
    ({"fault": "  "}, "drop", "no-reason"),
])
def test_verdict(kw, fault, kind):
    v = hil_verdict(_r(**kw), fault)
    assert v.kind == kind and v.ok == (kind in ("detected", "completed")), v
    assert (v.reason == "") == v.ok and "\n" not in v.reason


def test_the_cli_used_to_pass_a_fault_detected_50_cycles_late():
    v = hil_verdict(_r(fault_cycle=550, detection_cycles=50, torque_off_cycle=550), "drop")
    assert not v.ok and "detected 50 cycles run later" in v.reason


def test_a_window_does_not_count_a_hold_of_this_process():
    w = Window(0.002, exclude_held=True).open()
    left = w.remaining(asked=time.perf_counter() - 0.005)  # woke 5 ms after the time it asked for
    assert w.held == pytest.approx(0.005, abs=1e-3) and left > 0.0015
    strict = Window(0.002).open()
    assert strict.remaining(asked=time.perf_counter() - 0.005) < 0.0021 and strict.held == 0.0
    w = Window(0.002, exclude_held=True).open()
    w.remaining(asked=time.perf_counter() - HELD_MIN / 2)  # jitter, not a hold
    assert w.held == 0.0


@pytest.mark.realtime
def test_the_probe_sees_its_process_held():
    """SIGSTOP of one probe process for 8 ms is a pause >= 5 ms on that CPU, at that time."""
    from pkrt.rt.core.hostprobe import HostProbe

    with HostProbe(cpus=sorted(os.sched_getaffinity(0))[:1]) as probe:
        assert "on cpu" in probe.scheduling[probe.cpus[0]]
        time.sleep(0.2)
        pid = probe.pids[0]
        t = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        time.sleep(0.008)
        os.kill(pid, signal.SIGCONT)
        deadline = time.monotonic() + 5.0
        while not probe.pauses(t - 0.01, t + 0.05, min_ms=5.0) and time.monotonic() < deadline:
            time.sleep(0.01)
        ps = probe.pauses(t - 0.01, t + 0.05, min_ms=5.0)
        assert ps and ps[0].cpu == probe.cpus[0] and ps[0].ms >= 7.0, ps
        text = probe.explain(t + 0.01)
        assert text.startswith("host paused") and "ms from the anomaly" in text, text
        assert probe.explain(t + 5.0, before=0.01, after=0.01, min_ms=1000.0) is None
        st = probe.stats()[probe.cpus[0]]
        assert st["wakeups"] > 100 and st["max_ms"] >= 7.0
