"""Real-time tests on a host that pauses: a run may be repeated only when the independent
host-pause probe (``pkrt.rt.core.hostprobe``, the session fixture ``host_probe`` in conftest.py)
saw the host pause at the moment the run went wrong.

Every run records the wall times of its anomalies on ``time.monotonic()`` (the probe's clock):
the summary's ``fault_time`` for a fault, the drivers' ``fault_time`` and ``events`` (TPDOs
missing or late, transaction timeouts, late answers), the CiA 402 emulator's own watchdog trips
(``emulator_trips``), the servo emulator's spoilt packets (``spoilt_at``, for ``unmatched``).
``judge`` runs a test's run and lists its anomalies (``anomalies``, ``drive_anomalies`` or the
test's own ``find``); none: the run is judged by the test's assertions. Each one the probe explains (a pause of
at least ``MIN_MS`` from ``BEFORE`` s before to ``AFTER`` s after it): the run is repeated
(at most ``ATTEMPTS`` runs), with a warning that says what the probe saw; every run spoilt so:
the test is skipped with what the probe saw. One anomaly the probe does not explain: the test
FAILS with it -- a timeout, a late frame or a drive fault that no host pause explains is a
defect (of pkrt, the emulator or a tolerance), not a loaded machine. A unit test's run of a
driver against an emulator thread runs at SCHED_FIFO (``judge(..., priority=RUN_PRIORITY)``,
``realtime_threads``) as pkrt's loop does, so that the load of other processes cannot delay it.
There is no other way to repeat a run: no counter of the run's own says "the machine was slow".
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

ATTEMPTS = 3
BEFORE, AFTER = 0.03, 0.005  # s around an anomaly in which a host pause explains it
MIN_MS = 1.0  # ms, the shortest wake-up lateness of the probe that counts as a host pause
RUN_PRIORITY = 50  # SCHED_FIFO of a unit test's run (realtime_threads): under pkrt's loop (80), the probe (90)
# setup transactions (SDO, Dynamixel reads) that a host pause can time out before the loop starts
SETUP_TIMEOUTS = ("No SDO response", "no valid answer to", "Write timeout")


class HostPauseRepeat(UserWarning):
    """A real-time run repeated because the host-pause probe explained its anomaly."""


def anomalies(r: dict, expected: str | None = None) -> list[tuple[float, str]]:
    """The anomalies of a run's result ``r`` (a HIL result, a run summary or a dict with the
    same keys), as (time.monotonic(), what): a fault other than the ``expected`` one, or any
    fault before the injection of an injected one; the driver's events (missing or late feedback,
    timeouts) unless an expected fault was injected (its own symptoms are events too)."""
    out = []
    fault, inj, at = r.get("fault"), r.get("injected_cycle"), r.get("fault_cycle")
    before = r.get("injected_fault") is not None and (inj is None or (at is not None and at < inj))
    unexpected = bool(fault) and (expected is None or expected not in fault or before)
    if unexpected:
        out.append((r.get("fault_time") or r.get("error_time") or 0.0, f"fault at cycle {at}: {fault}"))
    if expected is None or unexpected:
        out += [(t, what) for t, what in (r.get("driver") or {}).get("events") or []]
    return out


def judge(run: Callable[[], T], probe, expected: str | None = None,
          find: Callable[[T], list[tuple[float, str]]] | None = None, attempts: int = ATTEMPTS,
          priority: int | None = None, injected: "HostPauses | None" = None) -> T:
    """``run()`` until a run without anomalies (``find``, default ``anomalies(r, expected)``)
    and return it; repeat only runs whose every anomaly ``probe`` explains (at most
    ``attempts``), skip when all were; fail on an anomaly the probe does not explain. A
    ``DriveError`` from a setup transaction that timed out is an anomaly at the time it was
    caught. An anomaly ``(t, what)`` is explained by a pause of at least ``MIN_MS`` from
    ``BEFORE`` s before to ``AFTER`` s after t; one that knows its own span gives
    ``(t, what, before, after, min_ms)``. ``priority``: each run with this process' threads at SCHED_FIFO ``priority``
    (``realtime_threads``; None: as they are, e.g. a run of pkrt's loop that sets its own).
    ``injected``: the run's ``HostPauses``, whose pauses that were not ones (``explain``)
    explain an anomaly as the probe's pauses do."""
    import pytest

    from pkrt.drivers.base import DriveError

    find = find or (lambda r: anomalies(r, expected))
    seen: list[str] = []
    for i in range(attempts):
        try:
            with realtime_threads(priority) if priority else contextlib.nullcontext():
                r = run()
            found = find(r)
        except DriveError as e:
            if not any(t in str(e) for t in SETUP_TIMEOUTS):
                raise
            r, found = None, [(time.monotonic(), f"setup: {e}")]
        if not found:
            return r
        said = [(a[0], a[1], _explain(probe, injected, a)) for a in found]
        blind = [(t, what) for t, what, why in said if why is None]
        if blind:
            t, what = blind[0]
            t0, t1 = min(x[0] for x in found), max(x[0] for x in found)
            near = [(p.cpu, round(p.at - t, 4), p.ms) for p in probe.pauses(t0 - 2.0, t1 + 0.1, MIN_MS)]
            pytest.fail(f"run {i + 1}: {what} at t={t:.4f} s, and the host-pause probe saw no pause >= {MIN_MS:g} ms "
                        f"from {BEFORE * 1e3:.0f} ms before to {AFTER * 1e3:.0f} ms after it; anomalies (s from "
                        f"it): {[(round(a[0] - t, 4), a[1][:80]) for a in found[:6]]}; probe's pauses from 2 s before "
                        f"(cpu, s from it, ms): {near[-12:]}" + (_spans_text(injected, t) if injected else ""))
        t, what, why = said[0]
        seen.append(f"run {i + 1}: {what[:120]} -- {why}")
        warnings.warn(HostPauseRepeat(f"real-time run repeated: {seen[-1]}"), stacklevel=2)
    pytest.skip(f"the host paused during each of {attempts} runs: " + " | ".join(seen))


def _spans_text(injected: "HostPauses", t: float) -> str:
    """The injected pauses of a run around time t, for a failure message."""
    return "; injected pauses (s from it, stopped ms, stop and continue skews ms): " + str(
        [(round(t0 - t, 4), round((t2 - t1) * 1e3, 2), round((t1 - t0) * 1e3, 2), round((t3 - t2) * 1e3, 2))
         for t0, t1, t2, t3 in injected.spans])


def _explain(probe, injected: "HostPauses | None", anomaly: tuple) -> str | None:
    """What explains ``anomaly`` ``(t, what[, before, after, min_ms])``: a host pause the probe
    saw, else an injected pause that was not one; None: nothing."""
    t, span = anomaly[0], anomaly[2:] or (BEFORE, AFTER, MIN_MS)
    return probe.explain(t, *span) or (injected.explain(t, span[0], span[1]) if injected else None)


WALLCLOCK_ATTEMPTS = 8  # runs of a strict wall-clock test the probe may explain before it is skipped
REALTIME_HOST = os.environ.get("PKRT_REALTIME_HOST") == "1"  # a host that holds wall-clock tolerances


def judge_wallclock(run: Callable[[], T], probe, **kw) -> T:
    """``judge`` for a run at the configuration's strict wall-clock tolerances (real drives'
    settings, ``timing="wallclock"``). On a host that is not real-time (a virtual machine: the
    default; ``PKRT_REALTIME_HOST=1`` says otherwise) its unexplained timing anomalies are an
    expected failure, reported with the evidence (``xfail``, shown in every pytest summary):
    such a host delays a process by less than the probe's 1 ms yet more than a 0.6 ms serial
    timeout. The stepped HIL tests hold the same paths to account on any host. A run the probe
    explains is repeated up to ``WALLCLOCK_ATTEMPTS`` times: a strict SYNC watchdog (3.5 periods
    at 1 kHz) trips on one pause of the driver's CPU alone, and this VM's pauses come in bursts
    (a quiet CI had each of 3 runs spoilt so; 2 of 12 runs spoilt beside it here)."""
    import pytest

    kw.setdefault("attempts", WALLCLOCK_ATTEMPTS)
    try:
        return judge(run, probe, **kw)
    except pytest.fail.Exception as e:
        if REALTIME_HOST:
            raise
        pytest.xfail(f"strict wall-clock tolerances on a host that is not real-time: {str(e)[:300]}")


@contextlib.contextmanager
def realtime_threads(priority: int = RUN_PRIORITY):
    """Every thread of this process -- the test's, its emulator threads, python-can's -- at
    SCHED_FIFO ``priority`` while the block runs, as pkrt's loop and the HIL emulators run
    (threads started meanwhile inherit it), when permitted (root or CAP_SYS_NICE; else as they
    are). The load of other processes then cannot delay a run's threads: only the host can,
    and the host-pause probe (above them, ``hostprobe.PRIORITY``) sees that. Threads already
    real-time (a driver's heartbeat) are left alone; every thread at ``priority`` goes back to
    normal scheduling after the block."""
    tasks = f"/proc/{os.getpid()}/task"
    raised = False
    for tid in map(int, os.listdir(tasks)):
        try:
            if os.sched_getscheduler(tid) == os.SCHED_OTHER:
                os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(priority))
                raised = True
        except (PermissionError, ProcessLookupError):  # not permitted, or the thread ended
            continue
    try:
        yield
    finally:
        for tid in map(int, os.listdir(tasks)) if raised else ():
            try:
                if os.sched_getscheduler(tid) == os.SCHED_FIFO and os.sched_getparam(tid).sched_priority == priority:
                    os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
            except (PermissionError, ProcessLookupError):
                continue


def drive_anomalies(drives, expected: str | None = None, injected: str | None = None,
                    injected_cycle: int | None = None, fault_cycle: int | None = None) -> list[tuple[float, str]]:
    """``anomalies`` of a run of ``drives`` (a driver of drivers/: its ``fault_reason`` at its
    ``fault_time``, its ``events``) that was run by a test, not by ``run_session``: the fault
    kind ``injected`` at loop cycle ``injected_cycle`` (None: not reached) and the cycle at which
    the driver faulted (``fault_cycle``)."""
    return anomalies({"fault": drives.fault_reason, "fault_time": drives.fault_time,
                      "driver": {"events": list(drives.events)}, "injected_fault": injected,
                      "injected_cycle": injected_cycle, "fault_cycle": fault_cycle}, expected)


def emulator_trips(em) -> list[tuple[float, str]]:
    """The CiA 402 emulator's (hil/cia402_emulator.py) own watchdogs that tripped -- SYNC loss
    and heartbeat consumer events -- as (time.monotonic() of the trip, what): a drive that
    leaves Operation enabled by them saw its master silent, the symptom of a host pause."""
    return [a[:2] for a in drive_trips({"sync_events": em.sync_events, "heartbeat_events": em.heartbeat_events})]


def drive_trips(report: dict) -> list[tuple]:
    """The emulated drives' own watchdogs that tripped, from an emulator's report (CiA 402: SYNC
    loss and heartbeat consumer events; Dynamixel: Bus Watchdog trips), as anomalies that know
    their span: (time.monotonic() of the trip, what, its silence + ``BEFORE``, ``AFTER``,
    ``MIN_MS``): a trip is explained by a host pause within the master's silence before it."""
    out = [(e["at"], f"node {e['node']}: no SYNC for {e['silent_s'] * 1e3:.1f} ms (SYNC watchdog)", e["silent_s"])
           for e in report.get("sync_events") or []]
    out += [(e["at"], f"node {e['node']}: no heartbeat of node {e['producer']} for {e['silent_s'] * 1e3:.1f} ms",
             e["silent_s"]) for e in report.get("heartbeat_events") or []]
    out += [(e["at"], f"servo {e['id']}: Bus Watchdog after {e['silent_s'] * 1e3:.1f} ms without an instruction",
             e["silent_s"]) for e in report.get("watchdog_trips") or []]
    return sorted((t, what, silent + BEFORE, AFTER, MIN_MS) for t, what, silent in out)


def unmatched(events: list[tuple[float, str]], causes: list[float], window: float) -> list[tuple[float, str]]:
    """The ``events`` (time.monotonic(), what) that no injected cause explains: each cause (its
    time.monotonic()) explains one event from its time to ``window`` s after it, earliest first
    (e.g. a read timeout per status packet an emulator dropped)."""
    free = sorted(causes)
    out = []
    for t, what in sorted(events):
        i = next((j for j, c in enumerate(free) if c <= t <= c + window), None)
        if i is None:
            out.append((t, what))
        else:
            free = free[i + 1:]  # causes are used in order: an earlier one can no longer match
    return out


class HostPauses:
    """A stand-in for the host pausing the CPUs: a helper process that stops this process and
    its children (the emulators; not ``spare``, e.g. the probe's processes) with SIGSTOP for
    ``ms`` milliseconds, ``count`` times, every ``every`` s from ``after`` s after this process
    switched to SCHED_FIFO (the loop's real-time settings: the loop is about to start). Every
    thread of both ends stops at once, as when the host holds the vCPUs. A context manager,
    entered once per run.

    The helper runs at SCHED_FIFO ``PRIORITY`` (above the loop and the probe): at normal
    priority the suite's other worker delayed it up to 14 ms between continuing the test
    process and its emulator, and by 0.9 s once, a one-sided pause of the emulator that no
    host makes. It records when each stop and continue began and ended (``spans``,
    time.monotonic()); ``explain`` names a pause that was not one (one end stopped or running
    alone for more than ``SKEW_MS``), e.g. because the host held the helper itself."""

    PRIORITY = 95  # SCHED_FIFO of the helper: over pkrt's loop (80) and the probe (90)
    SKEW_MS = 1.0  # ms, the longest time one end may run while the other is stopped

    def __init__(self, ms: float = 5.0, count: int = 5, every: float = 0.3, after: float = 0.5,
                 spare: list[int] = ()):
        self.args = [os.getpid(), ms, count, every, after, list(spare), self.PRIORITY]
        self.proc = None
        self.spans: list[tuple[float, float, float, float]] = []  # (stop begun, all stopped, continue begun, all running)

    def __enter__(self) -> "HostPauses":
        import subprocess
        import sys

        self.spans = []
        self.proc = subprocess.Popen([sys.executable, "-c", _PAUSER, repr(self.args)], stdout=subprocess.PIPE, text=True)
        return self

    def __exit__(self, *exc) -> None:
        self.proc.kill()
        out, _ = self.proc.communicate()
        self.spans = [tuple(map(float, line.split())) for line in out.splitlines() if len(line.split()) == 4]

    def skews(self) -> list[tuple[float, float]]:
        """The (start, end) times, time.monotonic() s, at which one end ran while the other was
        stopped for more than ``SKEW_MS``."""
        out = []
        for t0, t1, t2, t3 in self.spans:
            out += [(a, b) for a, b in ((t0, t1), (t2, t3)) if b - a > self.SKEW_MS * 1e-3]
        return out

    def explain(self, t: float, before: float, after: float) -> str | None:
        """A pause of this helper's that overlapped ``before`` s before to ``after`` s after t
        and was not one (``skews``), as one line; None if there was none."""
        for a, b in self.skews():
            if a <= t + after and b >= t - before:
                return (f"the pause helper stopped one end {(b - a) * 1e3:.1f} ms before the other at "
                        f"t={a:.4f} s ({(a - t) * 1e3:+.1f} ms from the anomaly): no host pause")
        return None


_PAUSER = r"""
import ast, os, signal, sys, time
pid, ms, count, every, after, spare, priority = ast.literal_eval(sys.argv[1])
spare = set(spare) | {os.getpid()}
try:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
except (PermissionError, OSError):
    pass
def family(p):
    out = [p]
    for task in os.listdir(f"/proc/{p}/task"):
        try:
            kids = open(f"/proc/{p}/task/{task}/children").read().split()
        except OSError:
            continue
        for c in map(int, kids):
            if c not in spare:
                out += family(c)
    return out
deadline = time.monotonic() + 120.0
while time.monotonic() < deadline:  # policy (field 41 of /proc/PID/stat) 1: SCHED_FIFO
    if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[38] == "1":
        break
    time.sleep(0.001)
time.sleep(after)
for _ in range(count):
    ps = family(pid)
    t0 = time.monotonic()
    for p in ps:
        try:
            os.kill(p, signal.SIGSTOP)
        except ProcessLookupError:  # ended meanwhile
            pass
    t1 = time.monotonic()
    time.sleep(ms / 1e3)
    t2 = time.monotonic()
    for p in ps:
        try:
            os.kill(p, signal.SIGCONT)
        except ProcessLookupError:
            pass
    print(t0, t1, t2, time.monotonic(), flush=True)
    time.sleep(every)
"""
