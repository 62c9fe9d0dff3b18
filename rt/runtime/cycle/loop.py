"""Fixed-rate timing: absolute deadlines on the monotonic clock, sleep then a short spin;
real-time settings (SCHED_FIFO, CPU affinity, mlockall, gc.freeze), each reported applied or
not; a virtual clock for lockstep runs. Times in seconds unless named _us.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import sys
import threading
import time
from typing import Callable, TypeVar

import numpy as np

T = TypeVar("T")

SPIN_S = 150e-6  # spin the last part of each period (the kernel throttles a FIFO task that spins for good)
# While the loop runs, a thread waiting for the GIL asks its holder to let go after this long
# (CPython's default is 5 ms): shorter than the spin, so a loop that wakes while another thread
# (the log writer, the CAN heartbeat task) holds the GIL still has it back before its deadline.
SWITCH_INTERVAL_S = SPIN_S / 3


class RealClock:
    """Wall clock: ``wait_until(t)`` sleeps to ``t - SPIN_S`` then spins; returns the wake
    latency (s) past the deadline."""

    lockstep = False

    def __init__(self):
        self.t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def wait_until(self, t: float) -> float:
        t_abs = self.t0 + t
        rest = t_abs - time.monotonic() - SPIN_S
        if rest > 0:
            time.sleep(rest)
        while True:
            now = time.monotonic()
            if now >= t_abs:
                return now - t_abs


class VirtualClock:
    """Lockstep clock: time is the deadline; no sleeping."""

    lockstep = True

    def __init__(self):
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def wait_until(self, t: float) -> float:
        self.t = t
        return 0.0


def apply_realtime(priority: int = 0, cpu: int = -1, mlockall: bool = False,
                   gc_freeze: bool = True) -> dict:
    """Apply what is asked and permitted; report each setting as applied, skipped or why not."""
    rep: dict[str, str] = {}
    if priority > 0:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
            rep["sched_fifo"] = f"applied (priority {priority})"
        except (PermissionError, OSError, AttributeError) as e:
            rep["sched_fifo"] = f"not applied: {e}"
    else:
        rep["sched_fifo"] = "not requested"
    if cpu >= 0:
        try:
            before = os.sched_getaffinity(0)
            os.sched_setaffinity(0, {cpu})
            rep["cpu_affinity_before"] = ",".join(map(str, sorted(before)))
            rep["cpu_affinity"] = f"applied (cpu {cpu})"
            rep["other_threads"] = _other_threads_off(cpu, before)
        except (OSError, ValueError, AttributeError) as e:
            rep["cpu_affinity"] = f"not applied: {e}"
    else:
        rep["cpu_affinity"] = "not requested"
    if mlockall:  # what the process has touched and will touch, not every mapped page (memory.py)
        from pkrt.rt.runtime.cycle.memory import lock_memory

        rep["mlockall"] = lock_memory()
        rep["compaction"] = _compaction()
    else:
        rep["mlockall"] = "not requested"
    rep["switch_interval"] = f"applied ({SWITCH_INTERVAL_S * 1e6:.0f} us, was {sys.getswitchinterval() * 1e6:.0f} us)"
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    if gc_freeze:
        gc.collect()
        gc.freeze()
        gc.disable()
        rep["gc_freeze"] = "applied (collector frozen and disabled during the loop)"
    else:
        rep["gc_freeze"] = "not requested"
    return rep


def _compaction() -> str:
    """Whether the kernel's memory compaction may move locked pages (a thread touching one as it
    moves takes a page fault: ``/proc/sys/vm/compact_unevictable_allowed``, 1 on most
    distributions' kernels, 0 on PREEMPT_RT ones)."""
    try:
        with open("/proc/sys/vm/compact_unevictable_allowed") as f:
            allowed = f.read().strip()
    except OSError:
        return "unknown (no /proc/sys/vm/compact_unevictable_allowed)"
    if allowed == "0":
        return "locked pages stay in place (vm.compact_unevictable_allowed = 0)"
    return "may move locked pages (vm.compact_unevictable_allowed = 1; 0 keeps them in place)"


def _other_threads_off(cpu: int, cpus: set[int]) -> str:
    """Pin this process' other threads (the log writer, telemetry) to ``cpus`` but ``cpu``, the
    loop's. Unpinned, the scheduler ran the log writer on the loop's CPU while the loop slept;
    the loop woke, preempted it holding the GIL, and waited for it: wake latency p99 21.6 µs
    against 0.054 µs for a bare loop in the same bench (docs/runtime.md, runtime figures). Threads started
    later (a CAN heartbeat task) inherit the loop's CPU and priority, as they should."""
    others = set(cpus) - {cpu}
    if not others:
        return "not applied: no other CPU"
    moved = []
    for th in threading.enumerate():
        if th is threading.current_thread() or th.native_id is None or not th.is_alive():
            continue
        try:
            os.sched_setaffinity(th.native_id, others)
            moved.append(th.name)
        except OSError:  # ended meanwhile
            pass
    return f"applied ({', '.join(moved)} on cpu {','.join(map(str, sorted(others)))})" if moved else "none running"


def restore_realtime(report: dict) -> None:
    """Undo what ``apply_realtime`` changed that would outlive the loop."""
    if report.get("switch_interval", "").startswith("applied"):
        sys.setswitchinterval(float(report["switch_interval"].split("was ")[1].split()[0]) * 1e-6)
    if report.get("gc_freeze", "").startswith("applied"):
        gc.enable()
        gc.unfreeze()
    if report.get("sched_fifo", "").startswith("applied"):
        try:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        except OSError:
            pass
    if report.get("cpu_affinity_before"):  # children started later (emulators) must not inherit the pin
        before = {int(c) for c in report["cpu_affinity_before"].split(",")}
        for th in threading.enumerate():  # this thread, and the others moved off the loop's CPU
            try:
                os.sched_setaffinity(0 if th is threading.current_thread() else th.native_id, before)
            except (OSError, TypeError):
                pass
    if report.get("mlockall", "").startswith("applied"):
        try:
            ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").munlockall()
        except OSError:
            pass


def normal_scheduling(nice: int = 0) -> None:
    """This thread at normal scheduling (SCHED_OTHER, ``nice`` added), whatever it inherited.
    A process started from a SCHED_FIFO thread inherits its policy: a helper process of the
    loop's (planning, live views) must not run at the loop's priority."""
    try:
        if os.sched_getscheduler(0) != os.SCHED_OTHER:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        if nice:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0) + nice)
    except (OSError, AttributeError):
        pass


def at_normal_priority(start: Callable[[], T]) -> T:
    """``start()`` in a short-lived thread at normal scheduling: the processes it starts inherit
    that, not the caller's SCHED_FIFO. (Under ``realtime_threads`` in the tests, a served
    machine's planning worker was spawned at SCHED_FIFO 50: its import and warm-up, about 1 s of
    CPU, held both CPUs from the loop and the drives' emulator at the same priority for 100 ms
    after an enable, and the vertical axis fell out of its following-error limit.)"""
    box: dict = {}

    def run() -> None:
        normal_scheduling()
        try:
            box["value"] = start()
        except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread
            box["error"] = e

    th = threading.Thread(target=run, name="pkrt-start-normal", daemon=True)
    th.start()
    th.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def percentiles_us(x: np.ndarray) -> dict:
    """p50, p99, p99.9 and max of a sample in seconds, as microseconds."""
    if len(x) == 0:
        return {"p50": None, "p99": None, "p99.9": None, "max": None}
    q = np.percentile(x, [50, 99, 99.9]) * 1e6
    return {"p50": float(q[0]), "p99": float(q[1]), "p99.9": float(q[2]), "max": float(x.max() * 1e6)}


def bare_loop_latency(period: float, cycles: int) -> np.ndarray:
    """Wake latencies (s) of a bare sleep-then-spin loop, for comparison with the runtime's."""
    clock = RealClock()
    out = np.empty(cycles)
    for k in range(cycles):
        out[k] = clock.wait_until((k + 1) * period)
    return out
