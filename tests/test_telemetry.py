"""Live telemetry: msgpack over UDP at a bounded rate, never blocking."""

from __future__ import annotations

import socket
import time
import tracemalloc

import msgpack
import numpy as np
import pytest

from pkrt.rt.core.errors import UserError
from pkrt.rt.runtime.record.telemetry import Telemetry
from tests.test_replay import make_fourbar_machine

SLICES = {"t": slice(0, 1), "pos": slice(1, 4), "tau": slice(4, 7), "flags": slice(7, 8)}


@pytest.fixture
def listener():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    s.bind(("127.0.0.1", 0))
    s.settimeout(0.5)
    yield s
    s.close()


def receive_all(sock) -> list[dict]:
    out = []
    while True:
        try:
            data = sock.recv(65536)
        except (socket.timeout, TimeoutError):
            return out
        out.append(msgpack.unpackb(data, raw=False))
        sock.settimeout(0.2)


def test_rate_and_content(listener):
    port = listener.getsockname()[1]
    tel = Telemetry("127.0.0.1", port, rate_hz=50, axes=["q1", "q2", "q3"])
    row = np.zeros(8)
    for k in range(2000):  # 2 s of a 1 kHz loop
        t = k * 1e-3
        row[:] = (t, 0.1 * k, 0.2, 0.3, -k, 5.0, 6.0, k % 3)
        tel.maybe_send(k, t, row, SLICES)
    msgs = receive_all(listener)
    assert tel.sent == len(msgs) == 100 and tel.dropped == 0
    ts = np.array([m["timestamp"] for m in msgs])
    np.testing.assert_allclose(np.diff(ts), 0.02, atol=1e-9)
    m = msgs[10]
    assert set(m) == {"timestamp", "cycle", "t", "pos/q1", "pos/q2", "pos/q3", "tau/q1", "tau/q2",
                      "tau/q3", "flags"}
    k = m["cycle"]
    assert m["timestamp"] == pytest.approx(k * 1e-3) and m["pos/q1"] == pytest.approx(0.1 * k)
    assert m["tau/q1"] == -k and m["flags"] == k % 3
    tel.close()


def test_no_burst_after_a_pause(listener):
    tel = Telemetry("127.0.0.1", listener.getsockname()[1], rate_hz=10)
    row = np.zeros(8)
    for t in (0.0, 0.05, 0.1, 5.0, 5.01, 5.05, 5.1):  # a 4.9 s gap, then normal cycles
        tel.maybe_send(0, t, row, SLICES)
    assert [m["timestamp"] for m in receive_all(listener)] == [0.0, 0.1, 5.0, 5.1]
    assert "pos/0" in Telemetry("127.0.0.1", 9)._layout(SLICES)[1]  # no axis names: indices


def test_idle_calls_are_cheap_and_allocate_nothing(listener):
    tel = Telemetry("127.0.0.1", listener.getsockname()[1], rate_hz=1)
    row = np.zeros(8)
    tel.maybe_send(0, 0.0, row, SLICES)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        for k in range(1, 900):
            tel.maybe_send(k, 0.5, row, SLICES)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak - base < 256  # the loop counter itself; a message dict alone is > 600 bytes
    assert tel.sent == 1


def test_never_blocks_and_counts_drops(listener):
    # a listener that never reads: the kernel drops what does not fit, sendto never waits
    tel = Telemetry("127.0.0.1", listener.getsockname()[1], rate_hz=1e6)
    row = np.zeros(8)
    t0 = time.perf_counter()
    for k in range(20000):
        tel.maybe_send(k, k * 1e-6, row, SLICES)
    assert time.perf_counter() - t0 < 5.0
    assert tel.sent + tel.dropped == 20000
    tel.close()  # a send that fails is counted, not raised
    assert tel.maybe_send(1, 1.0, row, SLICES) is False and tel.dropped >= 1


def test_bad_settings():
    with pytest.raises(UserError, match="cannot resolve host"):
        Telemetry("no-such-host.invalid", 9870)
    with pytest.raises(UserError, match="port must be"):
        Telemetry("127.0.0.1", 70000)
    with pytest.raises(UserError, match="rate must be positive"):
        Telemetry("127.0.0.1", 9870, rate_hz=0)


def test_lockstep_run_streams_at_the_configured_rate(tmp_path, listener):
    """A UDP listener receives decodable msgpack at the configured rate (in loop time) from a
    lockstep run, whose overruns stay at zero."""
    from pkrt.drivers import open_drives
    from pkrt.rt.runtime.machine.config import load_machine
    from pkrt.rt.runtime.machine.run import run_session

    m = make_fourbar_machine(tmp_path)
    config = load_machine(str(m["machine"]))
    tel = Telemetry("127.0.0.1", listener.getsockname()[1], rate_hz=50, axes=["theta"])
    drives = open_drives(config, {})
    try:
        s = run_session(config, drives, trajectory=str(m["traj"]), lockstep=True,
                        log_path=str(tmp_path / "run.pkl"), telemetry=tel)
    finally:
        drives.close()
    msgs = receive_all(listener)
    assert s["fault"] is None and s["overruns"] == 0 and s["cycles"] == 2001
    assert len(msgs) == tel.sent == 101 and tel.dropped == 0  # t = 0, 0.02, ..., 2.0 s
    ts = np.array([x["timestamp"] for x in msgs])
    np.testing.assert_allclose(np.diff(ts), 0.02, atol=1e-9)
    assert {"pos/theta", "ref_pos/theta", "tau/theta", "wake_us", "flags"} <= set(msgs[0])
    assert all(np.isfinite(x["tau/theta"]) for x in msgs)


def test_run_without_a_log_still_streams(tmp_path, listener):
    """`pkrt run --no-log --telemetry HOST:PORT`: telemetry was sent from the log's staging row
    only, so a run without a log sent nothing."""
    from pkrt.drivers import open_drives
    from pkrt.rt.runtime.machine.config import load_machine
    from pkrt.rt.runtime.machine.run import run_session

    m = make_fourbar_machine(tmp_path)
    config = load_machine(str(m["machine"]))
    tel = Telemetry("127.0.0.1", listener.getsockname()[1], rate_hz=50, axes=["theta"])
    drives = open_drives(config, {})
    try:
        s = run_session(config, drives, trajectory=str(m["traj"]), lockstep=True, log_path=None,
                        telemetry=tel, duration=0.5)
    finally:
        drives.close()
        tel.close()
    msgs = receive_all(listener)
    assert s["fault"] is None and len(msgs) == tel.sent == 26
    assert {"pos/theta", "ref_pos/theta", "tau/theta", "wake_us", "flags"} <= set(msgs[0])
    assert msgs[-1]["timestamp"] == pytest.approx(0.5) and np.isfinite(msgs[-1]["pos/theta"])


def test_run_json_reports_telemetry_counts(listener, capsys):
    """Failed sends were counted (docs/logs.md: 'a failed send is counted') but the count was never
    reported: the run's summary had no telemetry figures."""
    import json

    from pkrt.rt.cli import main

    port = listener.getsockname()[1]
    assert main(["run", "--lockstep", "--no-log", "--duration", "0.2", "--telemetry", f"127.0.0.1:{port}",
                 "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["telemetry"]["sent"] == len(receive_all(listener)) == 11 and s["telemetry"]["dropped"] == 0
