"""Run log format: round trip, background writer, truncation (SIGKILL), corruption, bad files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import tracemalloc

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pkrt.rt.runtime.record.logfile import FORMAT, VERSION, LogFileError, LogWriter, read_log

AXES = ["q1", "q2", "q3"]
CHANNELS = [("t", 1, "s"), ("ref_pos", 3, "m"), ("ref_vel", 3, "m/s"), ("ref_acc", 3, "m/s^2"),
            ("pos", 3, "m"), ("vel", 3, "m/s"), ("tau", 3, "N"), ("tau_model", 3, "N"),
            ("wake_us", 1, "us"), ("compute_us", 1, "us"), ("flags", 1, "")]
HEADER = {"machine": {"machine": {"name": "orthoglide-sim", "rate_hz": 1000.0}},
          "machine_path": "models/machines/orthoglide-sim.toml", "model_name": "orthoglide",
          "model_hash": "sha256:abc", "tree_path": "orthoglide.pkt", "tree_hash": "sha256:def",
          "rate_hz": 1000.0, "axes": AXES, "units": ["m", "m", "m"],
          "controller": {"kind": "ct", "kp": np.full(3, 2526.6), "kd": np.full(3, 100.5), "tau_max": [400.0] * 3},
          "trajectory": {"kind": "sine", "amplitude": 0.05}, "lockstep": True, "plant": {"mass_scale": 1.0}}


def demo_rows(n: int, rate: float = 1000.0, seed: int = 0) -> dict[str, np.ndarray]:
    """Orthoglide-like data: sine references, lagging positions, torques with saturation."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / rate
    w = 2 * np.pi * np.array([0.5, 0.7, 0.9])
    amp = np.array([0.05, 0.04, 0.03])
    ref = -0.1 + amp * np.sin(w * t[:, None])
    refv = amp * w * np.cos(w * t[:, None])
    refa = -amp * w * w * np.sin(w * t[:, None])
    err = 1e-4 * np.sin(3 * t[:, None] + np.arange(3))
    tau_model = 8.0 * refa + np.array([0.0, 0.0, 9.81 * 8.0])
    tau = np.clip(tau_model + 50 * err, -400, 400)
    tau[100:110, 2] = 400.0
    flags = np.zeros(n)
    flags[100:110] = 1
    flags[n // 2] = 4
    return {"t": t, "ref_pos": ref, "ref_vel": refv, "ref_acc": refa, "pos": ref - err,
            "vel": refv - 3e-4 * np.cos(3 * t[:, None]), "tau": tau, "tau_model": tau_model,
            "wake_us": rng.lognormal(3.0, 0.4, n), "compute_us": rng.lognormal(3.5, 0.2, n),
            "flags": flags}


def write_demo_log(path, n: int = 2000, block_cycles: int = 256, events=(), summary=None,
                   header=None) -> dict[str, np.ndarray]:
    """Write a complete demo log through LogWriter the way the loop does; return the data."""
    data = demo_rows(n)
    w = LogWriter(path, dict(HEADER if header is None else header), CHANNELS, block_cycles)
    row, sl = w.row, w.slices
    ev = dict(events)
    for i in range(n):
        for name, _, _ in CHANNELS:
            row[sl[name]] = data[name][i]
        w.commit()
        if i in ev:
            w.event(i, *ev[i])
    w.close({"cycles": n, "rms_error": 1e-4} if summary is None else summary)
    return data


def test_round_trip_is_exact(tmp_path):
    p = tmp_path / "run.pkl"
    data = write_demo_log(p, n=1000, block_cycles=128, events={500: ("overrun", "cycle 500 late")})
    log = read_log(p)
    assert log.n_cycles == 1000 and not log.truncated and log.bad_blocks == 0
    np.testing.assert_array_equal(log.cycles, np.arange(1000))
    for name, _, unit in CHANNELS:
        np.testing.assert_array_equal(log.channels[name], data[name])  # bit-exact
        assert log.units[name] == unit
    assert log.channels["t"].ndim == 1 and log.channels["pos"].shape == (1000, 3)
    h = log.header
    assert h["format"] == FORMAT and h["version"] == VERSION
    assert set(h["software"]) == {"pkrt", "numpy", "numba", "msgpack", "python"}
    assert h["software"]["numpy"] == np.__version__
    assert h["controller"]["kp"] == [2526.6] * 3  # numpy arrays stored as lists
    assert h["model_hash"] == "sha256:abc" and h["axes"] == AXES
    assert log.events == [{"cycle": 500, "kind": "overrun", "message": "cycle 500 late",
                           "wall": log.events[0]["wall"]}]
    assert log.summary == {"cycles": 1000, "rms_error": 1e-4}


def test_partial_block_and_close_twice(tmp_path):
    p = tmp_path / "short.pkl"
    w = LogWriter(p, {}, [("t", 1, "s"), ("pos", 2, "m")], block_cycles=64)
    for i in range(100):  # one full block and a partial one of 36 rows
        w.row[w.slices["t"]] = i
        w.row[w.slices["pos"]] = (i, -i)
        w.commit()
    first = w.close({"a": 1})
    assert first == {"rows": 100, "blocks": 2, "rows_written": 100, "dropped_blocks": 0, "error": None}
    assert w.close({"b": 2}) == first
    log = read_log(p)
    np.testing.assert_array_equal(log.channels["t"], np.arange(100.0))
    np.testing.assert_array_equal(log.channels["pos"][:, 1], -np.arange(100.0))
    assert log.summary == {"a": 1} and not log.truncated
    assert log.axes() == ["q1", "q2"]  # no axis names in the header: from the widths


def test_empty_run_and_context_manager(tmp_path):
    p = tmp_path / "empty.pkl"
    with LogWriter(p, {"rate_hz": 500.0}, [("t", 1, "s")]) as w:
        w.event(0, "fault", "drive 2 did not enable")
    log = read_log(p)
    assert log.n_cycles == 0 and log.channels["t"].shape == (0,)
    assert log.events[0]["kind"] == "fault" and log.summary == {}


def test_header_survives_odd_values(tmp_path):
    import datetime as dt

    p = tmp_path / "odd.pkl"
    header = {"machine": {"when": dt.date(2026, 1, 2), "path": tmp_path, "n": np.int32(3)},
              "flag": np.bool_(True), "obj": object}
    LogWriter(p, header, [("t", 1, "s")]).close({"x": np.float32(0.5)})
    log = read_log(p)
    assert log.header["machine"] == {"when": "2026-01-02", "path": str(tmp_path), "n": 3}
    assert log.header["flag"] is True and log.summary == {"x": 0.5}


def test_commit_allocates_no_arrays(tmp_path):
    w = LogWriter(tmp_path / "a.pkl", {}, CHANNELS, block_cycles=256, wait_when_full=True)
    for _ in range(300):
        w.commit()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        for _ in range(200):  # stay inside one block: the pure per-cycle path
            w.commit()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    w.close({})
    row_bytes = 8 * w.width
    assert peak - base < row_bytes, f"commit allocated {peak - base} bytes (a row is {row_bytes})"


def test_slow_writer_drops_blocks_without_blocking(tmp_path):
    """A FIFO nobody reads stalls the writer thread for real; commits must go on and count
    the dropped blocks; the log read afterwards has the gaps and the count."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    w = LogWriter(fifo, {"lockstep": False}, CHANNELS, block_cycles=256, n_buffers=3)
    t0 = time.perf_counter()
    for i in range(256 * 20):
        w.row[0] = i
        w.commit()
    elapsed = time.perf_counter() - t0
    assert w.dropped_blocks > 0
    chunks = []
    os.set_blocking(rfd, True)

    def drain():
        while True:
            b = os.read(rfd, 1 << 16)
            if not b:
                return
            chunks.append(b)

    th = threading.Thread(target=drain)
    th.start()
    counts = w.close({"done": True})
    th.join()
    os.close(rfd)
    assert elapsed < 5.0  # never waited on the stalled writer (tens of ms in practice)
    out = tmp_path / "copy.pkl"
    out.write_bytes(b"".join(chunks))
    log = read_log(out)
    assert log.dropped_blocks == counts["dropped_blocks"] == w.dropped_blocks
    assert log.n_cycles == 256 * (20 - w.dropped_blocks)
    np.testing.assert_array_equal(log.channels["t"], log.cycles.astype(float))
    assert log.summary == {"done": True} and not log.truncated


_KILL_SCRIPT = r"""
import sys, time, numpy as np
from pkrt.rt.runtime.record.logfile import LogWriter
w = LogWriter(sys.argv[1], {"rate_hz": 2000.0}, [("t", 1, "s"), ("pos", 3, "m"), ("flags", 1, "")],
              block_cycles=50)
i = 0
while True:
    w.row[0] = i / 2000.0
    w.row[1:4] = (np.sin(i * 1e-3), np.cos(i * 1e-3), i)
    w.row[4] = i % 16
    w.commit()
    if i == 120:
        w.event(i, "state", "enabled")
    if i % 50 == 49:
        print(i, flush=True)
    i += 1
    time.sleep(0.0002)
"""


def test_sigkill_mid_run_reads_to_last_complete_block(tmp_path):
    p = tmp_path / "killed.pkl"
    proc = subprocess.Popen([sys.executable, "-c", _KILL_SCRIPT, str(p)], stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(12):  # about a dozen blocks handed over
            assert proc.stdout.readline(), "writer process died"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    log = read_log(p)
    assert log.truncated and log.summary is None and log.bad_blocks == 0
    assert log.n_cycles >= 100 and log.n_cycles % 50 == 0  # complete blocks only
    i = np.arange(log.n_cycles)
    np.testing.assert_array_equal(log.cycles, i)
    np.testing.assert_array_equal(log.channels["t"], i / 2000.0)
    np.testing.assert_array_equal(log.channels["pos"][:, 2], i)
    np.testing.assert_array_equal(log.channels["flags"], i % 16)
    assert log.events[0]["message"] == "enabled"


def test_truncation_anywhere_reads_a_prefix(tmp_path):
    p = tmp_path / "full.pkl"
    data = write_demo_log(p, n=700, block_cycles=100)
    raw = p.read_bytes()
    cut = tmp_path / "cut.pkl"
    header_len = len(msgpack.packb(msgpack.Unpacker(open(p, "rb"), raw=False).unpack(), use_bin_type=True))
    for n in sorted({header_len, header_len + 1, len(raw) // 3, len(raw) // 2, len(raw) - 40, len(raw) - 1}
                    | set(range(header_len, len(raw), 2917))):
        cut.write_bytes(raw[:n])
        log = read_log(cut)
        assert log.truncated and log.summary is None
        k = log.n_cycles
        assert k % 100 == 0 or k == 700
        np.testing.assert_array_equal(log.channels["pos"], data["pos"][:k])
    cut.write_bytes(raw[: header_len - 1])
    with pytest.raises(LogFileError, match="not a pkrt log"):
        read_log(cut)


def test_corrupted_block_is_skipped_and_counted(tmp_path):
    p = tmp_path / "c.pkl"
    data = write_demo_log(p, n=500, block_cycles=100)
    raw = bytearray(p.read_bytes())
    # flip one bit inside the third block's float data (keys: type, first, n, data, crc)
    unp = msgpack.Unpacker(raw=False)
    unp.feed(bytes(raw))
    ends = [unp.tell() for rec in unp if rec.get("type") == "block"]
    raw[ends[2] - 1000] ^= 0x40
    p.write_bytes(bytes(raw))
    log = read_log(p)
    assert log.bad_blocks == 1 and log.n_cycles == 400 and not log.truncated
    keep = np.r_[0:200, 300:500]
    np.testing.assert_array_equal(log.cycles, keep)
    np.testing.assert_array_equal(log.channels["tau"], data["tau"][keep])
    assert log.summary is not None


@pytest.mark.parametrize("content, match", [
    (b"", "this is an empty file, expected a pkrt run log"),
    (b"time,pos\n0,1\n", "this is a CSV file, expected a pkrt run log"),
    (msgpack.packb({"type": "header", "format": "other"}), "not a pkrt log"),
    (msgpack.packb({"type": "header", "format": FORMAT, "version": 99, "channels": [], "run": {}}),
     "version 99 is not supported"),
    (msgpack.packb({"type": "header", "format": FORMAT, "version": VERSION, "channels": [["t", 0, "s"]],
                    "run": {}}), "damaged pkrt log header"),
    (msgpack.packb([1, 2, 3]), "not a pkrt log"),
])
def test_bad_files_raise_one_line(tmp_path, content, match):
    p = tmp_path / "bad.pkl"
    p.write_bytes(content)
    with pytest.raises(LogFileError, match=match) as e:
        read_log(p)
    assert "\n" not in str(e.value)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(LogFileError, match="no such log file"):
        read_log(tmp_path / "nope.pkl")
    with pytest.raises(LogFileError, match="is a directory"):
        read_log(tmp_path)


_GOOD: dict[str, bytes] = {}


def _good_log(tmp_path_factory) -> bytes:
    if "raw" not in _GOOD:
        p = tmp_path_factory.mktemp("fuzz") / "g.pkl"
        write_demo_log(p, n=300, block_cycles=64, events={10: ("fault", "x")})
        _GOOD["raw"] = p.read_bytes()
    return _GOOD["raw"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, 255)), min_size=1, max_size=6),
       cut=st.one_of(st.none(), st.integers(0, 10**9)))
def test_damaged_logs_read_or_fail_cleanly(tmp_path_factory, edits, cut):
    raw = bytearray(_good_log(tmp_path_factory))
    for pos, val in edits:
        raw[pos % len(raw)] = val
    if cut is not None:
        raw = raw[: cut % (len(raw) + 1)]
    p = tmp_path_factory.getbasetemp() / "fuzzed.pkl"
    p.write_bytes(bytes(raw))
    try:
        log = read_log(p)
    except LogFileError as e:
        assert "\n" not in str(e)
        return
    for name, w in log.widths.items():
        assert len(log.channels[name]) == log.n_cycles
    assert log.n_cycles <= 300


def test_views_write_into_the_row(tmp_path):
    w = LogWriter(tmp_path / "v.pkl", {}, [("t", 1, "s"), ("pos", 2, "m")], block_cycles=4)
    for k in range(6):
        w.views["t"][0] = k
        w.views["pos"][...] = (k, 2 * k)
        w.commit()
    w.close({})
    log = read_log(tmp_path / "v.pkl")
    np.testing.assert_array_equal(log.channels["pos"], np.c_[np.arange(6), 2 * np.arange(6)])
    np.testing.assert_array_equal(log.channels["t"], np.arange(6))
