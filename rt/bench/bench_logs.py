"""Run logs and telemetry: per-cycle cost on the loop's thread, writer throughput, read speed,
and whether the background writer disturbs a 1 kHz sleep-then-spin loop. Figures only.

Run: ``.venv/bin/python -m pkrt.rt.bench.bench_logs`` (about 15 s).
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time

import numpy as np

from pkrt.rt.runtime.record.logfile import LogWriter, read_log
from pkrt.rt.runtime.cycle.loop import RealClock, percentiles_us
from pkrt.rt.runtime.record.telemetry import Telemetry

S = 3
CHANNELS = [("t", 1, "s"), ("ref_pos", S, "m"), ("ref_vel", S, "m/s"), ("ref_acc", S, "m/s^2"),
            ("pos", S, "m"), ("vel", S, "m/s"), ("tau", S, "N"), ("tau_model", S, "N"),
            ("wake_us", 1, "us"), ("compute_us", 1, "us"), ("flags", 1, "bits")]


def _fill_and_commit(w: LogWriter, n: int, vec: np.ndarray) -> float:
    """Seconds per cycle for the loop's logging work (11 slice writes and commit)."""
    row, sl = w.row, w.slices
    t0 = time.perf_counter()
    for k in range(n):
        row[sl["t"]] = k
        row[sl["ref_pos"]] = vec
        row[sl["ref_vel"]] = vec
        row[sl["ref_acc"]] = vec
        row[sl["pos"]] = vec
        row[sl["vel"]] = vec
        row[sl["tau"]] = vec
        row[sl["tau_model"]] = vec
        row[sl["wake_us"]] = 1.0
        row[sl["compute_us"]] = 2.0
        row[sl["flags"]] = 0
        w.commit()
    return (time.perf_counter() - t0) / n


def _fill_views_and_commit(w: LogWriter, n: int, vec: np.ndarray) -> float:
    """The same through ``w.views`` (preallocated views, Ellipsis assignment)."""
    v = w.views
    t0 = time.perf_counter()
    for k in range(n):
        v["t"][0] = k
        v["ref_pos"][...] = vec
        v["ref_vel"][...] = vec
        v["ref_acc"][...] = vec
        v["pos"][...] = vec
        v["vel"][...] = vec
        v["tau"][...] = vec
        v["tau_model"][...] = vec
        v["wake_us"][0] = 1.0
        v["compute_us"][0] = 2.0
        v["flags"][0] = 0
        w.commit()
    return (time.perf_counter() - t0) / n


def _loop_latency(period: float, cycles: int, writer: LogWriter | None) -> np.ndarray:
    clock = RealClock()
    out = np.empty(cycles)
    vec = np.ones(S)
    for k in range(cycles):
        out[k] = clock.wait_until((k + 1) * period)
        if writer is not None:
            row, sl = writer.row, writer.slices
            row[sl["t"]] = k
            row[sl["pos"]] = vec
            writer.commit()
    return out


def run_logs_bench(seconds: float = 5.0) -> dict:
    d = tempfile.mkdtemp(prefix="pkrt-bench-logs-")
    vec = np.arange(S, dtype=float)
    res: dict = {"row_columns": sum(w for _, w, _ in CHANNELS)}

    w = LogWriter(os.path.join(d, "a.pkl"), {"lockstep": True}, CHANNELS)
    n = 60000  # a minute at 1 kHz
    t0 = time.perf_counter()
    per = _fill_and_commit(w, n, vec)
    w.close({})
    total = time.perf_counter() - t0
    res["loop_side_us_per_cycle_fill_and_commit"] = per * 1e6
    res["lockstep_throughput_cycles_per_s"] = n / total
    size = os.path.getsize(os.path.join(d, "a.pkl"))
    res["file_bytes_per_cycle"] = size / n

    w = LogWriter(os.path.join(d, "v.pkl"), {"lockstep": True}, CHANNELS)
    res["loop_side_us_per_cycle_views_and_commit"] = _fill_views_and_commit(w, n, vec) * 1e6
    w.close({})
    os.unlink(os.path.join(d, "v.pkl"))

    w = LogWriter(os.path.join(d, "b.pkl"), {}, CHANNELS, wait_when_full=True)
    t0 = time.perf_counter()
    for _ in range(n):
        w.commit()
    res["commit_only_ns"] = (time.perf_counter() - t0) / n * 1e9
    w.close({})

    t0 = time.perf_counter()
    log = read_log(os.path.join(d, "a.pkl"))
    res["read_60k_cycles_ms"] = (time.perf_counter() - t0) * 1e3
    assert log.n_cycles == n

    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    tel = Telemetry("127.0.0.1", rx.getsockname()[1], rate_hz=50, axes=["q1", "q2", "q3"])
    row = np.zeros(sum(w for _, w, _ in CHANNELS))
    slices, c = {}, 0
    for name, width, _ in CHANNELS:
        slices[name] = slice(c, c + width)
        c += width
    tel.maybe_send(0, 0.0, row, slices)
    t0 = time.perf_counter()
    for k in range(100000):
        tel.maybe_send(k, 0.001, row, slices)  # not due: the idle path
    res["telemetry_idle_ns"] = (time.perf_counter() - t0) / 100000 * 1e9
    tel2 = Telemetry("127.0.0.1", rx.getsockname()[1], rate_hz=1e9)
    t0 = time.perf_counter()
    for k in range(2000):
        tel2.maybe_send(k, float(k), row, slices)
    res["telemetry_send_us"] = (time.perf_counter() - t0) / 2000 * 1e6
    rx.close()

    cycles = int(seconds * 1000)
    bare = _loop_latency(1e-3, cycles, None)
    w = LogWriter(os.path.join(d, "c.pkl"), {}, CHANNELS)
    logged = _loop_latency(1e-3, cycles, w)
    counts = w.close({})
    res["loop_1khz_wake_latency_us_bare"] = percentiles_us(bare)
    res["loop_1khz_wake_latency_us_with_log"] = percentiles_us(logged)
    res["loop_1khz_dropped_blocks"] = counts["dropped_blocks"]
    for f in ("a.pkl", "b.pkl", "c.pkl"):
        os.unlink(os.path.join(d, f))
    os.rmdir(d)
    return res


if __name__ == "__main__":
    print(json.dumps(run_logs_bench(), indent=2))
