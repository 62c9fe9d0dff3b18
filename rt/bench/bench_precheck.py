"""Benchmark: the whole-program check before motion (``pkrt bench --only precheck``). Prints
figures; asserts nothing.

Programs: the generated relief raster (0.36 mm segments) and dense finishing pass (0.16 mm
segments) of ``camprograms``, 10^5 and 10^6 lines each, on the Orthoglide with ``[gcode] g54 =
[-0.04, -0.04, -0.12]`` (``camprograms.placed_machine``). Each program is measured in a fresh
child process (``python -m pkrt.rt.bench.bench_precheck``): the imports and the machine's model
and tree; the first check (numba's kernels loaded from their cache, or compiled the first time
ever); then ``REPEATS`` checks (``check_gcode`` as ``pkrt plan``, ``pkrt run --gcode`` and a
served machine call it, with the preview): wall and CPU time, median, lines per second; the
fast reader alone on the same file; on the 10^5-line programs the Python interpreter alone
(``canon_stream(read_lines(path))``: the reader before) for the ratio, in the same process.
Memory: the child's resident set before the checks (after a warm-up on a short program), its
peak during them (VmHWM, reset through /proc/self/clear_refs before), and the peak of the
Python and NumPy allocations of one check (tracemalloc), against the file's size.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPEATS = 5
SIZES = (100_000, 1_000_000)


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return -1


def measure(program: str, machine: str, interpreter: bool) -> dict:
    """In the child: the figures of one program (see the module docstring)."""
    import tracemalloc

    t0 = time.perf_counter()
    from pkrt.models.planning.gcode import canon_stream, read_lines
    from pkrt.models.planning.ngc_fast import FastReader
    from pkrt.rt.app.reference import check_gcode, gcode_setup, path_planner
    from pkrt.rt.runtime.machine.config import load_machine

    config = load_machine(machine)
    planner, setup = path_planner(config), gcode_setup(config)
    ranges = config.limits.position
    out = {"imports_and_model_s": time.perf_counter() - t0}
    with tempfile.TemporaryDirectory() as d:  # the kernels loaded (or compiled) on a short program
        short = Path(d) / "short.ngc"
        short.write_text("G21 G90 G54 F600\nG0 X1 Y1 Z1\nG1 X2\nG2 X3 Y2 I0.5 J0.5\nM2\n")
        t = time.perf_counter()
        check_gcode(planner, str(short), setup=setup, ranges=ranges)
        out["first_check_s"] = time.perf_counter() - t
    rss0 = _status_kb("VmRSS")
    try:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    except OSError:
        pass
    wall, cpu = [], []
    for _ in range(REPEATS):
        t, c = time.perf_counter(), time.thread_time()
        r = check_gcode(planner, program, setup=setup, ranges=ranges)
        wall.append(time.perf_counter() - t)
        cpu.append(time.thread_time() - c)
    hwm = _status_kb("VmHWM")
    tracemalloc.start()
    check_gcode(planner, program, setup=setup, ranges=ranges)
    traced = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    reader = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        for _part in FastReader(program, setup, keep=False):
            pass
        reader.append(time.perf_counter() - t)
    lines = r.lines
    out.update(lines=lines, interpreted_lines=r.interpreted, motions=r.motions, points_checked=r.points,
               check_wall_s=float(np.median(wall)), check_cpu_s=float(np.median(cpu)),
               check_lines_per_s=lines / float(np.median(wall)), check_lines_per_cpu_s=lines / float(np.median(cpu)),
               reader_s=float(np.median(reader)), reader_lines_per_s=lines / float(np.median(reader)),
               preview_points=len(r.preview.points), preview_tolerance_mm=r.preview.tolerance * 1e3,
               rss_before_mb=rss0 / 1024, peak_rss_during_mb=hwm / 1024, peak_rss_growth_mb=(hwm - rss0) / 1024,
               traced_peak_mb=traced / 2**20, file_mb=os.path.getsize(program) / 2**20)
    if interpreter:
        t = time.perf_counter()
        n = sum(1 for _ in canon_stream(read_lines(program), setup, path=program))
        dt = time.perf_counter() - t
        out.update(interpreter_s=dt, interpreter_lines_per_s=lines / dt, interpreter_commands=n,
                   reader_vs_interpreter=dt / out["reader_s"])
    return out


def _child(program: str, machine: str, interpreter: bool) -> dict:
    r = subprocess.run([sys.executable, "-m", "pkrt.rt.bench.bench_precheck", program, machine, str(int(interpreter))],
                       capture_output=True, text=True, timeout=1800)
    if r.returncode:
        return {"error": (r.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(r.stdout)


def run_precheck_bench() -> dict:
    from pkrt.rt.bench.camprograms import finishing, placed_machine, relief

    out = {"repeats": REPEATS, "load_average": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as d:
        machine = str(placed_machine(Path(d) / "orthoglide-relief.toml"))
        for size in SIZES:
            for name, make in (("relief", lambda p, n: relief(p, lines=n)), ("finishing", lambda p, n: finishing(p, segments=n))):
                path = make(Path(d) / f"{name}-{size}.ngc", size)
                out[f"{name}_{size}"] = _child(str(path), machine, size <= 100_000)
                path.unlink()
    out["load_average_after"] = os.getloadavg()[0]
    return out


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1], sys.argv[2], sys.argv[3] == "1")))
