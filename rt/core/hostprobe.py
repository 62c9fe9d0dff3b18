"""An independent host-pause probe: one process per CPU, at SCHED_FIFO, that wakes before each
1 ms deadline and records its own wake-up lateness.

A virtual machine's host stops its CPUs for milliseconds now and then (docs/hil.md). A
real-time run cannot tell such a pause from its own fault by its own counters; this probe,
started beside it, can: each probe process, pinned to one CPU at a priority above every pkrt
thread (``PRIORITY``), sleeps to ``spin_us`` before each deadline of a 1 ms grid, spins the rest,
and writes every wake-up later than ``record_us`` -- (deadline, lateness) on ``time.monotonic()``,
the clock pkrt's runs stamp their anomalies with -- into a ring in a shared file. Without the
permission for SCHED_FIFO (not root, no CAP_SYS_NICE) it runs at normal priority and says so
(``scheduling``): it then also sees the load of the machine, not only the host's pauses.

    with HostProbe() as probe:
        ...  # a real-time run
        probe.pauses(t_from, t_to, min_ms=1.0)   # [Pause(cpu, at, ms), ...]
        probe.explain(t, before=0.02, after=0.005)  # "host paused 3.2 ms at t=..., probe on both CPUs"

``python -m pkrt.rt.core.hostprobe --seconds 30`` runs it alone and prints its statistics.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

PERIOD = 1e-3  # s, the probe's grid
SPIN_US = 0.0  # us spun before each deadline: none (a FIFO sleep wakes some 50-100 us late here, under
# RECORD_US; spinning 150 us a period took 15 % of both CPUs at the top priority, which delayed the
# very runs the probe watches: a 1 kHz serial run with 0.6 ms timeouts failed beside it)
RECORD_US = 200.0  # us: wake-ups later than this are recorded
PRIORITY = 90  # SCHED_FIFO, above the loop (80), its heartbeat thread (81) and the emulators (70)
CAPACITY = 65536  # records per CPU in the ring
_HEADER = struct.Struct("<qqqdd")  # records written, wake-ups, state (1 running), max lateness s, start
_RECORD = struct.Struct("<dd")  # deadline (time.monotonic() s), lateness s


@dataclass(frozen=True)
class Pause:
    """A wake-up of the probe on ``cpu`` that came ``ms`` late; the host held that CPU from
    about ``at`` (time.monotonic() s, the missed deadline) to ``at + ms / 1e3``."""

    cpu: int
    at: float
    ms: float


def _probe(path: str, cpu: int, priority: int, spin_us: float, record_us: float) -> None:
    """The probe loop (in its own process) until the file's state is set to 0."""
    sched = "normal priority"
    try:
        os.sched_setaffinity(0, {cpu})
    except OSError as e:
        sched += f", not pinned ({e})"
    if priority > 0:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
            sched = f"SCHED_FIFO {priority} on cpu {cpu}"
        except (PermissionError, OSError) as e:
            sched = f"normal priority on cpu {cpu} (SCHED_FIFO not permitted: {e})"
    print(json.dumps({"cpu": cpu, "scheduling": sched}), flush=True)
    size = _HEADER.size + CAPACITY * _RECORD.size
    with open(path, "r+b") as f:
        m = mmap.mmap(f.fileno(), size)
    spin, rec = spin_us * 1e-6, record_us * 1e-6
    n = wakes = 0
    worst = 0.0
    mono, sleep = time.monotonic, time.sleep
    t = mono()
    deadline = (int(t / PERIOD) + 1) * PERIOD
    _HEADER.pack_into(m, 0, 0, 0, 1, 0.0, t)
    while True:
        rest = deadline - mono() - spin
        if rest > 0:
            sleep(rest)
        now = mono()
        while now < deadline:
            now = mono()
        late = now - deadline
        wakes += 1
        if late > rec:
            _RECORD.pack_into(m, _HEADER.size + (n % CAPACITY) * _RECORD.size, deadline, late)
            n += 1
        if late > worst:
            worst = late
        if wakes % 100 == 0 or late > rec:
            if struct.unpack_from("<q", m, 16)[0] == 0:
                break
            _HEADER.pack_into(m, 0, n, wakes, 1, worst, t)
        # the next deadline after now: a pause longer than a period is one late wake-up
        deadline = (int(now / PERIOD) + 1) * PERIOD
    m.close()


class HostProbe:
    """Probe processes on ``cpus`` (default: every CPU this process may use); a context
    manager (``start`` / ``stop``). ``scheduling``: what each probe got, per CPU."""

    def __init__(self, cpus: list[int] | None = None, priority: int = PRIORITY, spin_us: float = SPIN_US,
                 record_us: float = RECORD_US):
        self.cpus = sorted(os.sched_getaffinity(0)) if cpus is None else list(cpus)
        self.priority, self.spin_us, self.record_us = priority, spin_us, record_us
        self.scheduling: dict[int, str] = {}
        self._procs: dict[int, subprocess.Popen] = {}
        self._maps: dict[int, mmap.mmap] = {}
        self._dir: tempfile.TemporaryDirectory | None = None

    @property
    def pids(self) -> list[int]:
        """The probe processes' ids."""
        return [p.pid for p in self._procs.values()]

    def start(self) -> "HostProbe":
        self._dir = tempfile.TemporaryDirectory(prefix="pkrt-hostprobe-")
        size = _HEADER.size + CAPACITY * _RECORD.size
        for cpu in self.cpus:
            path = os.path.join(self._dir.name, f"cpu{cpu}")
            with open(path, "wb") as f:
                f.truncate(size)
            with open(path, "r+b") as f:
                self._maps[cpu] = mmap.mmap(f.fileno(), size)
            struct.pack_into("<q", self._maps[cpu], 16, 1)
            self._procs[cpu] = subprocess.Popen(
                [sys.executable, "-c", "import sys; from pkrt.rt.core.hostprobe import _probe; "
                 f"_probe({path!r}, {cpu}, {self.priority}, {self.spin_us!r}, {self.record_us!r})"],
                stdout=subprocess.PIPE, text=True)
        for cpu, p in self._procs.items():
            line = p.stdout.readline()
            self.scheduling[cpu] = json.loads(line)["scheduling"] if line else f"did not start (exit {p.poll()})"
        return self

    def stop(self) -> None:
        for cpu, m in self._maps.items():
            struct.pack_into("<q", m, 16, 0)
        for p in self._procs.values():
            try:
                p.wait(2.0)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            p.stdout.close()
        self._procs.clear()
        for m in self._maps.values():
            m.close()
        self._maps.clear()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> "HostProbe":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- reading -------------------------------------------------------------------------------
    def _records(self, cpu: int) -> list[tuple[float, float]]:
        m = self._maps[cpu]
        n = _HEADER.unpack_from(m, 0)[0]
        lo = max(0, n - CAPACITY)
        return [_RECORD.unpack_from(m, _HEADER.size + (i % CAPACITY) * _RECORD.size) for i in range(lo, n)]

    def stats(self) -> dict:
        """Per CPU: wake-ups, those later than 1, 2 and 3 ms, the worst (ms), the scheduling."""
        out = {}
        for cpu in self.cpus:
            _, wakes, _, worst, _ = _HEADER.unpack_from(self._maps[cpu], 0)
            lates = [late for _, late in self._records(cpu)]
            out[cpu] = {"wakeups": wakes, "over_1ms": sum(x > 1e-3 for x in lates),
                        "over_2ms": sum(x > 2e-3 for x in lates), "over_3ms": sum(x > 3e-3 for x in lates),
                        "max_ms": round(worst * 1e3, 3), "scheduling": self.scheduling.get(cpu)}
        return out

    def pauses(self, t_from: float, t_to: float, min_ms: float = 1.0) -> list[Pause]:
        """Pauses of at least ``min_ms`` that overlap [t_from, t_to] (time.monotonic() s), by time."""
        out = []
        for cpu in self.cpus:
            for at, late in self._records(cpu):
                if late * 1e3 >= min_ms and at <= t_to and at + late >= t_from:
                    out.append(Pause(cpu, at, round(late * 1e3, 3)))
        return sorted(out, key=lambda p: p.at)

    def explain(self, t: float, before: float = 0.02, after: float = 0.005, min_ms: float = 1.0) -> str | None:
        """What the probe saw around time t (time.monotonic() s) -- the host pauses of at least
        ``min_ms`` from ``before`` s before to ``after`` s after it -- as one line, e.g. "host
        paused 3.2 ms at t=1234.5678 s, probe on both CPUs"; None when it saw none."""
        ps = self.pauses(t - before, t + after, min_ms)
        if not ps:
            return None
        worst = max(ps, key=lambda p: p.ms)
        cpus = sorted({p.cpu for p in ps if abs(p.at - worst.at) < 2e-3})
        where = ("probe on both CPUs" if len(cpus) == 2 == len(self.cpus) else
                 f"probe on CPU{'s' if len(cpus) > 1 else ''} {', '.join(map(str, cpus))} of {len(self.cpus)}")
        return (f"host paused {worst.ms:.1f} ms at t={worst.at:.4f} s ({(worst.at - t) * 1e3:+.1f} ms from the "
                f"anomaly), {where}" + (f"; {len(ps)} pauses >= {min_ms:g} ms in the window" if len(ps) > 1 else ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pkrt.rt.core.hostprobe", description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    with HostProbe() as probe:
        time.sleep(a.seconds)
        st = probe.stats()
    if a.json:
        print(json.dumps(st))
    else:
        for cpu, s in st.items():
            print(f"cpu {cpu}: {s['wakeups']} wake-ups, > 1 ms {s['over_1ms']}, > 2 ms {s['over_2ms']}, "
                  f"> 3 ms {s['over_3ms']}, worst {s['max_ms']:.2f} ms ({s['scheduling']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
