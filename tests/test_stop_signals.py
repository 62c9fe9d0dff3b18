"""Every way out of a run takes torque off first: SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to
a real ``pkrt run`` process (simulated plant, real time and lockstep) stop it at the next cycle
boundary with the drives disabled, the log complete with the reason and every cycle run, the
summary printed and exit 1 with one line; the handlers exist only during the run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from pkrt.drivers import open_drives
from pkrt.rt.app.reference import plan_reference
from pkrt.rt.runtime.record.logfile import read_log
from pkrt.rt.core.errors import Stopped
from pkrt.rt.runtime.machine.run import run_session
from pkrt.rt.runtime.cycle.stopsignals import STOP_SIGNALS, StopSignals
from tests.processes import child, log_has_cycles, stop, wait_until
from tests.realtime import judge

pytestmark = pytest.mark.realtime  # wall-clock threads and processes (tests/realtime.py)

PKRT = [sys.executable, "-m", "pkrt.rt.cli"]


def stop_run(tmp_path, probe, sig: int, *args: str) -> tuple[subprocess.CompletedProcess, dict, object]:
    """``pkrt run`` with ``args``, sent ``sig`` once its first block is in the log. A run that
    stops by itself first (a fault: none is expected on the simulated plant, whose late cycles
    delay the run without feeding the watchdog) is judged by the host-pause ``probe`` at the
    time of its fault."""
    log = tmp_path / "run.pktlog"

    def run():
        log.unlink(missing_ok=True)
        with child(PKRT + ["run", "--log", str(log), "--json", *args]) as proc:
            running = wait_until(proc, log_has_cycles(log, 256), poll_s=0.05)
            out, err = stop(proc, sig if running else None)
        return running, proc, out, err

    def found(r) -> list[tuple[float, str]]:
        running, _, out, err = r
        if running:
            return []
        try:
            s = json.loads(out)
        except ValueError:
            s = {}
        return [(s.get("fault_time") or time.monotonic(), f"the run stopped by itself: {s.get('fault') or err[-300:]}")]

    running, proc, out, err = judge(run, probe, find=found)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), json.loads(out), read_log(log)


def check_stopped(r, summary, log, name: str) -> None:
    reason = "interrupted by the user" if name == "SIGINT" else f"stopped by signal {name}"
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip().splitlines() == [f"pkrt: error: run stopped at cycle {summary['fault_cycle']}: {reason}"]
    assert summary["fault"] == reason
    assert summary["torque_off_cycle"] == summary["fault_cycle"] is not None  # drives disabled at once
    assert summary["log_error"] is None and summary["log_rows_written"] == summary["cycles"]
    # the log: complete, every cycle run, the reason in an event and in the end record's summary
    assert not log.truncated and log.problems == [] and log.summary is not None
    assert log.n_cycles == summary["cycles"] >= 256
    assert log.summary["fault"] == reason and log.summary["torque_off_cycle"] == summary["fault_cycle"]
    assert [(e["cycle"], e["message"]) for e in log.events] == [(summary["fault_cycle"], reason)]
    assert not os.path.exists(str(log.path) + ".lock")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGINT],
                         ids=lambda s: signal.Signals(s).name)
def test_signal_to_a_real_time_run(tmp_path, sig, host_probe):
    """SIGTERM with the configuration's real-time settings (SCHED_FIFO, affinity, mlockall as
    root), the others without (--no-rt): the stop path is the same."""
    rt = [] if sig == signal.SIGTERM else ["--no-rt"]
    r, summary, log = stop_run(tmp_path, host_probe, sig, "--duration", "30", *rt)
    check_stopped(r, summary, log, signal.Signals(sig).name)
    assert not summary["lockstep"] and summary["cycles"] < 29000


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: signal.Signals(s).name)
def test_signal_to_a_lockstep_run(tmp_path, sig, host_probe):
    r, summary, log = stop_run(tmp_path, host_probe, sig, "--lockstep", "--duration", "3600")
    check_stopped(r, summary, log, signal.Signals(sig).name)
    assert summary["lockstep"] and summary["cycles"] < 3_599_000 and summary["compiled_cycles"] > 0


def test_signal_inside_a_cycle_stops_at_the_next_boundary(config, tree, tmp_path):
    """The handler only asks; the loop stops at the top of the next cycle, before reading
    the drives, so no cycle is cut in half. Handlers are restored afterwards."""
    before = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    seen = {}

    def kill_at_100(k, t):
        if k == 100:
            os.kill(os.getpid(), signal.SIGTERM)
            seen.update({s: signal.getsignal(s) for s in STOP_SIGNALS})

    drives = open_drives(config)
    r = run_session(config, drives, trajectory=plan_reference(config), lockstep=True, tree=tree, duration=0.5,
                    on_cycle=kill_at_100,
                    log_path=str(tmp_path / "k.pktlog"))
    assert r["fault"] == "stopped by signal SIGTERM" and r["fault_cycle"] == 101 == r["cycles"]
    assert r["torque_off_cycle"] == 101 and not drives.torque_on
    assert all(seen[s] is not before[s] for s in STOP_SIGNALS)  # installed during the run
    assert {s: signal.getsignal(s) for s in STOP_SIGNALS} == before  # and restored
    log = read_log(tmp_path / "k.pktlog")
    assert log.n_cycles == 101 and log.summary["fault"] == r["fault"]


def test_second_signal_interrupts_at_once(config, tree):
    """A loop stuck inside a cycle (a driver call that does not return): the second signal
    raises there; torque is still taken off and the first signal's reason reported."""
    def twice_at_50(k, t):
        if k == 50:
            os.kill(os.getpid(), signal.SIGHUP)
            os.kill(os.getpid(), signal.SIGHUP)
            raise AssertionError("not interrupted")

    drives = open_drives(config)
    r = run_session(config, drives, trajectory=plan_reference(config), lockstep=True, tree=tree, duration=0.5,
                    on_cycle=twice_at_50)
    assert r["fault"] == "stopped by signal SIGHUP" and r["fault_cycle"] == 50 == r["torque_off_cycle"]
    assert not drives.torque_on


def test_outside_the_main_thread_no_handlers_are_installed(config, tree):
    before = signal.getsignal(signal.SIGTERM)
    out = {}

    def run():
        out["r"] = run_session(config, open_drives(config), trajectory=plan_reference(config), lockstep=True,
                               tree=tree, duration=0.1)

    th = threading.Thread(target=run)
    th.start()
    th.join()
    assert out["r"]["fault"] is None and signal.getsignal(signal.SIGTERM) is before


def test_before_the_drives_are_enabled_a_signal_aborts_at_once():
    """Planning, kernel warm-up, enabling: nothing to wait for, so the signal ends the run at
    once (the enabling path disables the drives and closes the log on its way out); once the
    drives may be on, it only asks."""
    with StopSignals() as stop:
        with pytest.raises(Stopped, match="^stopped by signal SIGTERM$"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        stop.abort = False
        os.kill(os.getpid(), signal.SIGQUIT)  # no exception: the reason stays the first one
        assert stop.reason == "stopped by signal SIGTERM"


def test_signal_as_soon_as_the_log_exists(tmp_path):
    """Wherever the signal lands once the run has its log (warm-up, enabling, first cycles):
    exit 1, one line, the log closed with the reason."""
    log = tmp_path / "early.pktlog"
    with child(PKRT + ["run", "--lockstep", "--duration", "3600", "--log", str(log)]) as proc:
        assert wait_until(proc, log.exists, poll_s=0.001), proc.communicate()
        out, err = stop(proc, signal.SIGTERM)
    assert proc.returncode == 1 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("pkrt: error: ") and "stopped by signal SIGTERM" in err
    lg = read_log(log)
    assert lg.summary is not None and "stopped by signal SIGTERM" in lg.summary["fault"] and not lg.truncated
    assert lg.n_cycles == lg.summary["cycles"] and not os.path.exists(f"{log}.lock")
