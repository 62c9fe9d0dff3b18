"""One writer per log: a second ``pkrt run --log SAME`` while the first runs is refused (one
line, exit 2) and the first log stays intact; the lock of a killed run does not get in the
way; the log appears under its name only with a complete header."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from pkrt.rt.runtime.record.logfile import LogFileError, LogWriter, read_log
from tests.processes import child, log_has_cycles, stop, wait_until

PKRT = [sys.executable, "-m", "pkrt.rt.cli"]


def test_second_run_on_the_same_log_is_refused(tmp_path):
    log = tmp_path / "same.pktlog"
    # the first run in real time, without real-time settings: it lives as long as the test needs
    # it (a lockstep run fills hundreds of thousands of rows a second, which the stopped run then
    # spends tens of seconds on: its plot; a run of 400 s ended before the second run started),
    # and the simulated plant's runs are paced as delays (no watchdog stops it on a loaded machine)
    with child(PKRT + ["run", "--no-rt", "--duration", "600", "--log", str(log), "--json"]) as first:
        assert wait_until(first, log_has_cycles(log, 1), poll_s=0.05), first.communicate()
        run_id = read_log(log).header["run_id"]
        second = subprocess.run(PKRT + ["run", "--lockstep", "--duration", "0.5", "--log", str(log), "--json"],
                                capture_output=True, text=True, timeout=120)
        assert second.returncode == 2 and second.stdout == ""
        assert second.stderr.strip().splitlines() == [
            f"pkrt: error: {log}: another pkrt process (pid {first.pid}) is writing this log "
            f"(lock {log}.lock); give another log file"]
        # the first goes on, its log untouched
        assert first.poll() is None and read_log(log).header["run_id"] == run_id
        out, err = stop(first, signal.SIGTERM)
    summary = json.loads(out)
    lg = read_log(log)
    assert lg.header["run_id"] == run_id and not lg.truncated and lg.problems == []
    assert lg.n_cycles == summary["cycles"] and lg.summary["cycles"] == summary["cycles"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["same.pktlog", "same.png"]


_HOLD = r"""
import sys, time
from pkrt.rt.runtime.record.logfile import LogWriter
w = LogWriter(sys.argv[1], {}, [("t", 1, "s")], block_cycles=4)
for i in range(10):
    w.row[0] = i
    w.commit()
while w.blocks_written < 2:  # two complete blocks in the file
    time.sleep(0.001)
print("open", flush=True)
time.sleep(60)
"""


def test_lock_of_a_killed_writer_is_taken_over(tmp_path):
    """SIGKILL leaves the lock file behind (nothing can remove it), but the kernel released
    the lock with the process: the next writer takes the file over."""
    p = tmp_path / "k.pktlog"
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(p)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "open\n"
        with pytest.raises(LogFileError, match=f"pid {proc.pid}"):
            LogWriter(p, {}, [("t", 1, "s")])
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert os.path.exists(f"{p}.lock") and read_log(p).n_cycles == 8  # two complete blocks
    w = LogWriter(p, {"rate_hz": 1.0}, [("t", 1, "s")])
    w.commit()
    w.close({"ok": True})
    lg = read_log(p)
    assert lg.summary == {"ok": True} and lg.n_cycles == 1 and not os.path.exists(f"{p}.lock")


def test_one_writer_per_log_in_one_process_too(tmp_path):
    p = tmp_path / "a.pktlog"
    w = LogWriter(p, {}, [("t", 1, "s")])
    with pytest.raises(LogFileError, match="another pkrt process"):
        LogWriter(p, {}, [("t", 1, "s")])
    w.close({})
    LogWriter(p, {}, [("t", 1, "s")]).close({})  # free again


def test_header_appears_complete_under_the_log_name(tmp_path):
    """The log is renamed to its name once its header is written: a reader finds a complete
    header at once, and no temporary file is left; an older log there is replaced only then."""
    p = tmp_path / "h.pktlog"
    p.write_bytes(b"previous run's log")
    w = LogWriter(p, {}, [("t", 1, "s")])
    assert read_log(p).header["run_id"] == w.run_id
    assert sorted(x.name for x in tmp_path.iterdir()) == ["h.pktlog", "h.pktlog.lock"]
    w.close({})
    assert sorted(x.name for x in tmp_path.iterdir()) == ["h.pktlog"]
