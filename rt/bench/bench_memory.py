"""Benchmark: the loop process' memory (``pkrt bench --only memory``). Prints figures; asserts
nothing.

Each figure is measured on ``pkrt run`` as a child process, side by side for this code and for
the code before the memory change (the parent of the commit that added ``rt/runtime/machine/refstream.py``,
extracted from this package's git repository with ``git archive`` and run from a temporary
directory; reported unavailable outside a git checkout). The child's ``/proc/PID/status``
(VmLck, VmRSS) and its main thread's minor faults (``/proc/PID/task/PID/stat``) are sampled
every 50 ms while it runs; "in the loop" is while VmLck > 0 (real time: mlockall is applied
for the loop only, so the window also holds the run's start and stop, and the old code's
mlockall faulting every page in) or, in lockstep, from the largest RSS on. The loop's own
count is the run's ``memory.loop_minor_faults`` (this code only).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

FIRST_FILE = "rt/runtime/machine/refstream.py"  # the commit that added it is the first of the change
SAMPLE_S = 0.05


def previous_code(dest: str) -> str | None:
    """The package before the memory change, extracted under ``dest`` as ``pkrt/...`` (a
    PYTHONPATH entry); its commit, or None without a git checkout."""
    root = Path(__file__).resolve().parents[2]
    try:
        added = subprocess.run(["git", "-C", str(root), "log", "--diff-filter=A", "--format=%H", "--", FIRST_FILE],
                               capture_output=True, text=True, timeout=30, check=True).stdout.split()
        if not added:
            return None
        base = f"{added[-1]}^"
        tar = Path(dest) / "old.tar"
        subprocess.run(["git", "-C", str(root), "archive", "-o", str(tar), base, "rt", "models", "drivers", "hil"],
                       check=True, timeout=60, capture_output=True)
        with tarfile.open(tar) as t:
            t.extractall(Path(dest) / "pkrt", filter="data")
        return subprocess.run(["git", "-C", str(root), "rev-parse", "--short", base], capture_output=True,
                              text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def _proc(pid: int) -> tuple[int, int, int] | None:
    """(VmLck kB, VmRSS kB, main thread's minor faults) or None once the process is gone."""
    try:
        st = Path(f"/proc/{pid}/status").read_text()
        stat = Path(f"/proc/{pid}/task/{pid}/stat").read_text()
    except OSError:
        return None
    f = {line.split(":")[0]: line.split()[1] for line in st.splitlines() if line.startswith(("VmLck", "VmRSS"))}
    minflt = int(stat.rsplit(")", 1)[1].split()[7])  # field 10 of stat
    return int(f.get("VmLck", 0)), int(f.get("VmRSS", 0)), minflt


def measured_run(argv: list[str], pythonpath: str | None = None) -> dict:
    """``pkrt run ARGV --json`` in a child process, sampled while it runs."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.Popen([sys.executable, "-m", "pkrt.rt.cli", "run", *argv, "--json"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    samples: list[tuple[int, int, int]] = []

    def sample():
        while p.poll() is None:
            s = _proc(p.pid)
            if s is not None:
                samples.append(s)
            time.sleep(SAMPLE_S)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out, err = p.communicate(timeout=7200)
    th.join()
    if p.returncode not in (0, 1):
        return {"error": err.strip().splitlines()[-1] if err.strip() else f"exit {p.returncode}"}
    r = json.loads(out)
    a = np.array(samples, dtype=float) if samples else np.zeros((0, 3))
    locked = np.flatnonzero(a[:, 0] > 0) if len(a) else np.array([], int)
    loop = a[locked[0]:locked[-1] + 1] if len(locked) else a[int(np.argmax(a[:, 1])):] if len(a) else a
    mid = loop[len(loop) // 2] if len(loop) else [np.nan] * 3
    return {"vmlck_mb_mid": round(mid[0] / 1024, 1), "vmrss_mb_mid": round(mid[1] / 1024, 1),
            "vmrss_mb_peak": round(float(a[:, 1].max()) / 1024, 1) if len(a) else None,
            "main_thread_minor_faults_in_loop": int(loop[-1, 2] - loop[0, 2]) if len(loop) > 1 else None,
            "reported": r.get("memory"), "cycles": r.get("cycles"), "fault": r.get("fault")}


def _csv(path: Path, seconds: float, rate_hz: float = 100.0) -> str:
    """An actuator CSV for the Orthoglide: slow strokes from its centre, 20 s each (``seconds`` a
    multiple of 20: at rest at both ends)."""
    from pkrt.rt.runtime.machine.config import load_machine

    lim = load_machine("orthoglide").limits.position
    t = np.arange(0.0, seconds + 1e-9, 1.0 / rate_hz)
    mid, amp = lim.mean(axis=1), (lim[:, 1] - lim[:, 0]) / 8
    q = mid + amp * np.sin(np.pi * t / 20.0)[:, None] ** 2 * np.array([1.0, -0.5, 0.3])
    np.savetxt(path, np.column_stack([t, q]), delimiter=",", header="t,q1,q2,q3", comments="")
    return str(path)


def run_memory_bench(duration: float = 10.0, long_s: float = 600.0) -> dict:
    """Real time (the configuration's settings, mlockall where permitted), ``duration`` s of the
    demo, logged: VmLck and VmRSS at the loop's middle and the loop's minor faults, this code
    against the previous; lockstep, an actuator CSV of 60 s and of ``long_s`` s at 100 Hz, no
    log (the plot after a run reads its whole log): resident memory at the loop's middle and
    its peak, both codes."""
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        old = previous_code(tmp)
        out["previous_code"] = old or "unavailable (not a git checkout)"
        codes = {"now": None, **({"before": tmp} if old else {})}
        for name, path in codes.items():
            out[f"realtime_{name}"] = measured_run(["--duration", str(duration), "--log", f"{tmp}/rt-{name}.pktlog",
                                                    "--plot", f"{tmp}/rt-{name}.png"], path)
        for secs in (60.0, long_s):
            traj = _csv(Path(tmp) / f"q{secs:g}.csv", secs)
            for name, path in codes.items():
                out[f"lockstep_csv_{secs:g}s_{name}"] = measured_run(["--lockstep", "--traj", traj, "--no-log"], path)
    return out
