"""SIGTERM to a real ``pkrt run`` driving the Dynamixel servo emulator in its own process over
a pseudo-terminal: the emulated servos' torque is off within 3 cycles of the signal (read on
the emulator's side), and the log is complete with the reason."""

from __future__ import annotations

import json
import signal
import sys
import time

import pytest

from pkrt.hil.serial_hil import EmulatorProcess, serial_config
from pkrt.rt.runtime.record.logfile import read_log
from tests.processes import child, stop, wait_until

from .realtime import judge_wallclock

pytestmark = pytest.mark.realtime  # wall-clock threads and processes (tests/realtime.py)

MACHINE = "orthoglide-serial"


@pytest.fixture(scope="module")
def emulator():
    emu = EmulatorProcess.of(serial_config(MACHINE, None))
    yield emu
    emu.stop()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGQUIT], ids=lambda s: signal.Signals(s).name)
def test_signal_takes_the_servos_torque_off_within_3_cycles(emulator, tmp_path, sig, host_probe):
    """Measured on the monotonic clock both processes share: from just before the signal is
    sent to the emulator's first period without torque (at 1 kHz, 3 cycles are 3 ms: the
    emulator's cycle count read before the signal would already be late by the test's own
    scheduling). A run stopped first by another fault, or whose torque went off late, is
    repeated only when the host-pause probe saw the host pause then (tests/realtime.py)."""
    rate = serial_config(MACHINE, None).rate_hz
    log = tmp_path / "hil.pktlog"
    name = signal.Signals(sig).name

    def run() -> dict:
        emulator.arm(None, None, rate)
        with child([sys.executable, "-m", "pkrt.rt.cli", "run", "--machine", MACHINE, "--port", emulator.port,
                    "--duration", "20", "--log", str(log), "--json"]) as proc:
            running = wait_until(proc, lambda: emulator.report()["cycles"] >= 50)  # running, torque on
            sent = time.monotonic()
            out, err = stop(proc, sig if running else None)
        summary = json.loads(out) if out.strip() else {}
        return {"running": running, "sent": sent, "out": out, "err": err, "summary": summary,
                "returncode": proc.returncode, "rep": emulator.report()}

    def find(r: dict) -> list[tuple[float, str]]:
        s, rep, out = r["summary"], r["rep"], []
        if not r["running"]:
            out.append((r["sent"], f"not running 50 cycles in: {r['err'].strip()[-200:]}"))
        if s.get("fault") and name not in s["fault"]:
            out.append((s.get("fault_time") or r["sent"], f"fault: {s['fault']}"))
        late = rep["torque_off_at"] is not None and rep["torque_off_at"] - r["sent"] > 3.0 / rate
        if late:
            out.append((rep["torque_off_at"],
                        f"torque off {(rep['torque_off_at'] - r['sent']) * 1e3:.1f} ms after the signal"))
        return out

    r = judge_wallclock(run, host_probe, find=find)
    rep, summary, err = r["rep"], r["summary"], r["err"]
    off_ms = None if rep["torque_off_at"] is None else (rep["torque_off_at"] - r["sent"]) * 1e3
    print(f"\n{name}: torque off {off_ms} ms after the signal was sent, emulator cycle {rep['torque_off_cycle']}")
    assert rep["torque_off_cycle"] is not None, rep  # every servo's torque off, seen by the servos
    assert 0.0 <= off_ms <= 3 * 1e3 / rate, off_ms
    assert rep["nonzero_after_off"] == 0 and rep["cycles"] == rep["torque_off_cycle"]
    assert r["returncode"] == 1 and err.strip().splitlines() == [
        f"pkrt: error: run stopped at cycle {summary['fault_cycle']}: stopped by signal {name}"]
    assert summary["cycles"] == rep["cycles"]  # every cycle run reached the servos
    lg = read_log(log)
    assert not lg.truncated and lg.problems == [] and lg.n_cycles == summary["cycles"]
    assert lg.summary["fault"] == f"stopped by signal {name}"
    assert lg.events[-1]["message"] == f"stopped by signal {name}"
