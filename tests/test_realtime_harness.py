"""The real-time tests' own harness (tests/realtime.py): the injected host pauses are what a
host does -- both ends stopped together by a helper above every real-time thread -- and a
pause that was not one (one end stopped alone) explains an anomaly instead of failing pkrt."""

from __future__ import annotations

import os
import time

import pytest

from .realtime import HostPauses, _explain


class _NoProbe:
    def explain(self, *a):
        return None


def test_a_pause_that_stopped_one_end_alone_explains_what_it_overlaps():
    hp = HostPauses(ms=6.0)
    hp.spans = [(10.0, 10.0001, 10.006, 10.0061),  # both ends stopped and continued within 0.1 ms
                (20.0, 20.0001, 20.006, 20.9)]  # the test process continued 0.9 s before its emulator
    assert hp.skews() == [(20.006, 20.9)]
    assert hp.explain(10.003, 0.03, 0.005) is None
    assert hp.explain(20.5, 0.03, 0.005).startswith("the pause helper stopped one end 894.0 ms before the other")
    assert hp.explain(21.0, 0.03, 0.005) is None  # 100 ms after it
    assert _explain(_NoProbe(), hp, (20.95, "TPDOs missing", 0.06, 0.005, 1.0)) is not None
    assert _explain(_NoProbe(), None, (20.95, "TPDOs missing")) is None


@pytest.mark.realtime
def test_the_pause_helper_stops_this_process_from_above_its_real_time_threads():
    """The helper waits for this process to go SCHED_FIFO (a loop starting), then stops it
    ``count`` times for at least ``ms``, at SCHED_FIFO ``HostPauses.PRIORITY`` when permitted."""
    hp = HostPauses(ms=2.0, count=2, every=0.05, after=0.0)
    with hp:
        time.sleep(0.2)
        policy = open(f"/proc/{hp.proc.pid}/stat").read().rsplit(")", 1)[1].split()[38]
        root = os.geteuid() == 0
        if root:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        try:
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline and hp.proc.poll() is None:
                time.sleep(0.01)  # the helper ends after its last pause
        finally:
            if root:
                os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    assert policy == ("1" if root else "0"), policy  # 1: SCHED_FIFO
    if root:
        assert len(hp.spans) == 2, hp.spans
        assert all(t2 - t1 >= 2e-3 for t0, t1, t2, t3 in hp.spans), hp.spans


def test_a_drives_own_watchdog_trip_is_judged_over_the_silence_before_it():
    """``drive_trips``: each emulator's watchdog trip, from its report, with the master's silence
    before it as its span (a pause anywhere in that silence explains it)."""
    from .realtime import AFTER, BEFORE, MIN_MS, drive_trips

    report = {"watchdog_trips": [{"id": 2, "at": 20.0, "silent_s": 0.065, "cycle": 38}],
              "sync_events": [{"node": 1, "at": 10.0, "silent_s": 0.0035, "timeout_s": 0.0035}],
              "heartbeat_events": []}
    trips = drive_trips(report)
    assert [t[0] for t in trips] == [10.0, 20.0]
    assert trips[1][1] == "servo 2: Bus Watchdog after 65.0 ms without an instruction"
    assert trips[1][2:] == (0.065 + BEFORE, AFTER, MIN_MS)
    assert drive_trips({}) == []
