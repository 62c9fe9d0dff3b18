"""A served machine's pacing in real time: on the simulated plant (pacing ``delay``) late
cycles in a row (a host pause, injected here as a sleep in the loop's thread) delay the run
and are counted, they do not stop a live-target stream on the watchdog; with pacing ``skip``
(real drives) the same pause is a watchdog fault."""

from __future__ import annotations

import time

import numpy as np
import pytest

from pkrt.rt.app.serve import Served
from pkrt.rt.runtime.machine.states import State

PAUSED = 12  # cycles in a row that end late (the Delta's watchdog: 5)


def stream_through_a_pause(tmp_path, pacing: str | None) -> dict:
    srv = Served("delta", socket_path=str(tmp_path / "p.sock"), log_path=None)
    m = srv.machine
    if pacing is not None:
        m.pacing = pacing
    seen: dict = {}
    period = m.period

    def hook(m):
        k = m.cycles
        if k == 1:
            m.submit({"cmd": "enable"})
        elif 20 <= k < 400 and m.state in (State.STANDSTILL, State.MOVING):
            m.submit({"cmd": "stream", "target": (0.05 + 0.05 * np.sin(k * period * 4.0) * np.ones(3)).tolist()})
            if m.state is State.MOVING and "pause" not in seen:
                seen["pause"] = k
        if "pause" in seen and seen["pause"] <= k < seen["pause"] + PAUSED:
            time.sleep(3 * period)  # the host holds the loop: every one of these cycles ends late
        if k >= 400 and m.state is not State.MOVING and m.state is not State.STOPPING:
            m.shutdown("test done")
    try:
        summary = m.run(max_cycles=3000, on_cycle=hook)
    finally:
        srv.close()
    return summary


@pytest.mark.realtime
def test_a_host_pause_delays_a_stream_on_the_simulated_plant(tmp_path):
    s = stream_through_a_pause(tmp_path, None)
    assert s["pacing"] == "delay"
    assert s["fault"] is None, s
    assert s["host_delays"]["count"] >= PAUSED
    assert s["state"] != "error_stop"


@pytest.mark.realtime
def test_the_same_pause_trips_the_watchdog_with_pacing_skip(tmp_path):
    s = stream_through_a_pause(tmp_path, "skip")
    assert s["fault"] is not None and "watchdog" in s["fault"], s
