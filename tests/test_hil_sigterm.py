"""SIGTERM to a real ``pkrt run`` driving the Dynamixel servo emulator in its own process over
a pseudo-terminal: the emulated servos' torque is off within 3 cycles of the signal (read on
the emulator's side), and the log is complete with the reason."""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest

from pkrt.hil.serial_hil import EmulatorProcess, serial_config
from pkrt.rt.logfile import read_log
from tests.processes import child, stop, wait_until

pytestmark = pytest.mark.realtime  # wall-clock threads and processes (tests/realtime.py)

MACHINE = "orthoglide-serial"


@pytest.fixture(scope="module")
def emulator():
    config = serial_config(MACHINE, None)
    emu = EmulatorProcess(os.path.abspath(config.path), None, None, config.rate_hz)
    yield emu
    emu.stop()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGQUIT], ids=lambda s: signal.Signals(s).name)
def test_signal_takes_the_servos_torque_off_within_3_cycles(emulator, tmp_path, sig):
    rate = serial_config(MACHINE, None).rate_hz
    log = tmp_path / "hil.pktlog"
    for _ in range(3):  # a run on this loaded machine may stop on its own first (stale feedback): again
        emulator.arm(None, None, rate)
        with child([sys.executable, "-m", "pkrt.rt.cli", "run", "--machine", MACHINE, "--port", emulator.port,
                    "--duration", "20", "--log", str(log), "--json"]) as proc:
            running = wait_until(proc, lambda: emulator.report()["cycles"] >= 50)  # running, torque on
            at_signal = emulator.report()["cycles"]
            out, err = stop(proc, sig if running else None)
        if running:
            break
    assert running, err
    rep = emulator.report()
    name = signal.Signals(sig).name
    print(f"\n{name} after emulator cycle {at_signal}: torque off at emulator cycle {rep['torque_off_cycle']}")
    assert rep["torque_off_cycle"] is not None, rep  # every servo's torque off, seen by the servos
    assert 0 <= rep["torque_off_cycle"] - at_signal <= 3
    assert rep["nonzero_after_off"] == 0 and rep["cycles"] == rep["torque_off_cycle"]
    assert proc.returncode == 1 and err.strip().splitlines() == [
        f"pkrt: error: run stopped at cycle {json.loads(out)['fault_cycle']}: stopped by signal {name}"]
    summary = json.loads(out)
    assert summary["cycles"] == rep["cycles"]  # every cycle run reached the servos
    lg = read_log(log)
    assert not lg.truncated and lg.problems == [] and lg.n_cycles == summary["cycles"]
    assert lg.summary["fault"] == f"stopped by signal {name}"
    assert lg.events[-1]["message"] == f"stopped by signal {name}"
