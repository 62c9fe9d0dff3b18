"""Lockstep cycles in one compiled loop (rt/runtime/cycle/lockstep.py): the same run as through the
Python cycle to the bit -- log, tracking error, saturation, fault cycle and reason, final plant
state -- with and without a log; what it cannot do goes through the Python cycle."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time

import numpy as np
import pytest

from pkrt.drivers import open_drives
from pkrt.rt.app.reference import plan_reference
from pkrt.rt.runtime.machine.config import load_machine
from pkrt.rt.runtime.record.logfile import LogWriter, read_log
from pkrt.rt.runtime.machine.runsetup import load_controller_tree
from pkrt.rt.runtime.machine.run import run_session
from tests.processes import log_has_cycles

_CACHE: dict = {}
SAME = ("t", "ref_pos", "ref_vel", "ref_acc", "pos", "vel", "tau", "tau_model", "wake_us", "flags")


def _machine(name="orthoglide"):
    if name not in _CACHE:
        config = load_machine(name)
        _CACHE[name] = (config, load_controller_tree(config), plan_reference(config))
    return _CACHE[name]


def _pair(tmp_path, *, name="orthoglide", config=None, log=True, overrides=None, **kw):
    """The same lockstep run compiled and through the Python cycle: [(summary, drives, log)]."""
    base, tree, demo = _machine(name)
    config = config or base
    out = []
    for compiled in (True, False):
        drives = open_drives(config, overrides or {})
        path = str(tmp_path / f"{name}{compiled}.pktlog") if log else None
        r = run_session(config, drives, trajectory=demo, lockstep=True, tree=tree, log_path=path,
                        compiled=compiled, **kw)
        out.append((r, drives, read_log(path) if log else None))
    return out


def _same(a, b) -> None:
    (ra, da, la), (rb, db, lb) = a, b
    for key in ("fault", "fault_cycle", "torque_off_cycle", "cycles", "rms_error", "max_error", "rms_error_axes",
                "max_error_axes", "saturated_cycles", "duration_s"):
        assert ra[key] == rb[key], key
    assert np.array_equal(da.plant.x, db.plant.x)
    assert np.array_equal(da.feedback.position, db.feedback.position)
    assert ra["cycle_parts"]["cycles"] == rb["cycle_parts"]["cycles"] == ra["cycles"]
    if la is not None:
        assert la.n_cycles == lb.n_cycles == ra["cycles"] and np.array_equal(la.cycles, lb.cycles)
        for ch in SAME:
            assert np.array_equal(la.get(ch), lb.get(ch), equal_nan=True), ch
        assert [(e["cycle"], e["message"]) for e in la.events] == [(e["cycle"], e["message"]) for e in lb.events]
        assert la.problems == lb.problems == []


@pytest.mark.parametrize("name,controller", [("orthoglide", "ct"), ("orthoglide", "pd"), ("delta", "ct")])
def test_compiled_lockstep_is_the_python_cycle(tmp_path, name, controller):
    """The demo: every cycle but the first compiled (the plant is not yet stepped ahead of it),
    the same log and results as every cycle in Python; its parts all measured."""
    a, b = _pair(tmp_path, name=name, controller=controller)
    _same(a, b)
    ra, rb = a[0], b[0]
    assert ra["fault"] is None and ra["cycles"] > 2000
    assert ra["compiled_cycles"] == ra["cycles"] - 1 and rb["compiled_cycles"] == 0
    assert controller == "pd" or ra["saturated_cycles"] == 0
    parts = ra["cycle_parts"]
    assert all(parts["p50_p99_max_us"][p][0] > 0.0 for p in ("safety", "tree", "law", "plant"))
    assert sum(parts["mean_us"][p] for p in ("read", "safety", "tree", "law", "write", "bookkeeping", "stage")) \
        == pytest.approx(parts["mean_us"]["compute"], abs=0.01)


def test_compiled_lockstep_without_a_log(tmp_path):
    a, b = _pair(tmp_path, log=False)
    _same(a, b)
    assert a[0]["compiled_cycles"] == a[0]["cycles"] - 1


def test_a_fault_in_a_compiled_stretch_is_the_python_cycles_fault(tmp_path):
    """A following-error limit the demo exceeds (its largest error is 14.7 um): the compiled
    loop stops before the cycle that trips it, which the Python cycle runs and ends the run
    with: the same cycle, reason, log and plant state."""
    config, _, _ = _machine()
    tight = dataclasses.replace(config, limits=dataclasses.replace(
        config.limits, following_error=np.full(3, 1e-5)))
    a, b = _pair(tmp_path, config=tight)
    _same(a, b)
    ra = a[0]
    assert ra["fault"].startswith("following error: axis") and 100 < ra["fault_cycle"] < 5000
    assert ra["compiled_cycles"] == ra["fault_cycle"] - 1  # the first and the tripping cycle in Python
    assert not a[1].torque_on


def test_a_plant_leaving_its_box_in_a_compiled_stretch(tmp_path):
    """A plant six times heavier than the model, the safety limits opened wide: the plant's
    step ahead of a compiled cycle leaves its tree's box, the compiled loop stops there and the
    next read (in Python) stops the run, at the same cycle and with the same reason as in
    Python."""
    config, _, _ = _machine()
    pos = config.limits.position.copy()
    pos[:, 0] -= 0.2
    pos[:, 1] += 0.2
    wide = dataclasses.replace(config, limits=dataclasses.replace(
        config.limits, position=pos, velocity=np.full(3, 100.0), following_error=np.full(3, 1.0)))
    a, b = _pair(tmp_path, config=wide, overrides={"mass_scale": 6.0})
    _same(a, b)
    ra = a[0]
    assert ra["fault"].startswith("drive: simulated plant left its tree's box") and ra["fault_cycle"] > 100
    assert ra["compiled_cycles"] == ra["fault_cycle"] - 1


def test_what_the_compiled_loop_cannot_do_runs_in_python(tmp_path):
    """Sensor noise, an injected fault or a per-cycle hook: every cycle in the Python cycle."""
    r = run_session(*_machine()[:1], open_drives(_machine()[0], {"noise": 1e-6}), trajectory=_machine()[2],
                    lockstep=True, tree=_machine()[1], duration=0.2)
    assert r["fault"] is None and r["compiled_cycles"] == 0
    seen = []
    r = run_session(_machine()[0], open_drives(_machine()[0]), trajectory=_machine()[2], lockstep=True,
                    tree=_machine()[1], duration=0.2, on_cycle=lambda k, t: seen.append(k))
    assert r["compiled_cycles"] == 0 and seen == list(range(r["cycles"]))


def test_a_stop_signal_stops_a_compiled_run_at_a_cycle_boundary(tmp_path):
    """SIGTERM while compiled cycles run: the run stops between two compiled calls, with the
    drives off, every cycle logged and the reason in the log."""
    config, tree, demo = _machine()
    drives = open_drives(config)
    log = tmp_path / "s.pktlog"
    running = log_has_cycles(log, 256)
    done = threading.Event()

    def signal_once_running():  # the handler is the run's only while its loop runs
        while not done.is_set():
            if running():
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.01)

    sender = threading.Thread(target=signal_once_running, daemon=True)
    sender.start()
    try:
        r = run_session(config, drives, trajectory=demo, lockstep=True, tree=tree, duration=3600.0,
                        log_path=str(log))
    finally:
        done.set()
        sender.join()
    assert r["fault"] == "stopped by signal SIGTERM" and not drives.torque_on
    assert 256 <= r["cycles"] < 3_600_000 and r["compiled_cycles"] >= r["cycles"] - 2
    got = read_log(log)
    assert got.n_cycles == r["cycles"] and got.problems == [] and got.summary["fault"] == r["fault"]


def test_writer_rows_written_in_place(tmp_path):
    """``LogWriter.free_rows`` / ``committed``: rows written into the ring count as commits;
    more than were free is refused."""
    w = LogWriter(str(tmp_path / "w.pktlog"), {"lockstep": True}, [("t", 1, "s"), ("x", 2, "m")], block_cycles=4)
    for k in range(6):  # a block and a half: 4 then 2 in place
        rows = w.free_rows()
        rows[0] = (k, 2 * k, 3 * k)
        w.committed(1)
    with pytest.raises(ValueError, match="2 rows were free"):
        w.committed(3)
    w.close({"cycles": 6})
    got = read_log(tmp_path / "w.pktlog")
    assert got.get("t").tolist() == list(range(6)) and got.get("x")[:, 1].tolist() == [3 * k for k in range(6)]
