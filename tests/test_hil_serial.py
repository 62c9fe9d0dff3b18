"""Serial HIL end to end, in the default stepped timing: the Orthoglide demo in real time
through the Dynamixel driver, a TCP link (or a pseudo-terminal) and the servo emulator in
another process; tracking against the lockstep simulation (within 1.2x), a host pause that
delays the run without changing it, and each fault kind judged by the one HIL verdict
(hil/verdict.py), at the machine's rate. A run is repeated only when the independent
host-pause probe explains what went wrong (tests/realtime.py)."""

from __future__ import annotations

import json
import time

import pytest

from pkrt.hil.dynamixel_emulator import FAULT_KINDS
from pkrt.hil.serial_hil import EmulatorProcess, run_lockstep_reference, run_serial_hil, serial_config
from pkrt.rt.cli import main
from pkrt.rt.core.errors import UserError
from pkrt.rt.runtime.record.logfile import read_log

from pkrt.hil.verdict import hil_verdict

from .plans import demo_reference
from .realtime import HostPauses, anomalies, judge, judge_wallclock

pytestmark = pytest.mark.realtime

MACHINE = "orthoglide-serial"


@pytest.fixture(scope="module")
def emulator():
    emu = EmulatorProcess.of(serial_config(MACHINE, None))
    yield emu
    emu.stop()


def test_tracking_within_1_2x_of_the_lockstep_simulation(emulator, host_probe):
    ref = run_lockstep_reference(MACHINE, duration=3.0, reference=demo_reference)
    assert ref["fault"] is None
    hil = judge(lambda: run_serial_hil(MACHINE, duration=3.0, emulator=emulator, reference=demo_reference),
                host_probe)
    assert hil["fault"] is None, hil["fault"]
    assert hil["timing"] == "stepped" and hil["emulator"]["clock"] == "step"
    assert hil["cycles"] == hil["emulator"]["cycles"] == hil["driver"]["cycles"] == 3001
    assert hil["rms_error"] <= 1.2 * ref["rms_error"], run_figures(hil, ref)
    assert hil["driver"]["tx_bytes"] > 0
    assert hil["emulator"]["torque_off_cycle"] is not None  # the end of the run took torque off
    assert hil["emulator"]["nonzero_after_off"] == 0


def test_a_host_pause_delays_the_run_without_changing_it(emulator, host_probe):
    """Both ends stopped together for 6 ms, six times: the run completes, each pause a counted
    host delay, no timeout, and tracking is the lockstep run's."""
    ref = run_lockstep_reference(MACHINE, duration=3.0, reference=demo_reference)

    pauses = HostPauses(ms=6.0, count=6, every=0.25, after=0.5, spare=host_probe.pids)

    def run():
        with pauses:
            return run_serial_hil(MACHINE, duration=3.0, emulator=emulator, reference=demo_reference)

    hil = judge(run, host_probe, injected=pauses)
    assert len(pauses.spans) == 6, pauses.spans  # every pause was injected
    assert hil["fault"] is None and hil["driver"]["timeouts"] == 0, (hil["fault"], hil["driver"])
    assert hil["host_delays"]["count"] >= 3 and hil["host_delays"]["longest_ms"] >= 4.0, hil["host_delays"]
    assert hil["rms_error"] <= 1.2 * ref["rms_error"], run_figures(hil, ref)


def run_figures(hil: dict, ref: dict) -> str:
    """What a failed comparison needs to be judged: both runs' errors and every timing counter."""
    emu, drv = hil["emulator"], hil["driver"]
    return (f"HIL rms {hil['rms_error'] * 1e6:.2f} um (axes {[round(x * 1e6, 2) for x in hil['rms_error_axes']]}, "
            f"max {hil['max_error'] * 1e6:.1f} um), lockstep rms {ref['rms_error'] * 1e6:.2f} um "
            f"(max {ref['max_error'] * 1e6:.1f} um); cycles {hil['cycles']}, overruns {hil['overruns']}, "
            f"host delays {hil['host_delays']['count']}; emulator skips {emu['skips']}, late writes "
            f"{emu['late_writes']}, max gap {emu['max_gap_us']} us; driver timeouts {drv['timeouts']}, "
            f"failed cycles {drv['failed_cycles']}, late answers {drv['late_answers']}, CRC errors {drv['crc_errors']}")


EXPECTED = {"drop": "servo 2 on", "delay": "servos 1, 2, 3 on", "corrupt": "servo 2 on",
            "drive-fault": "overload error", "sever": "servos 1, 2, 3 on", "nan": "implausible feedback"}


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_each_fault_verdict(kind, emulator, tmp_path, host_probe):
    logs = iter(tmp_path / f"hil{i}.pktlog" for i in range(100))

    def run():
        nonlocal log
        log = next(logs)
        return run_serial_hil(MACHINE, fault=kind, duration=1.0, emulator=emulator, log_path=str(log),
                              reference=demo_reference)

    log = None
    r = judge(run, host_probe, expected=EXPECTED[kind])
    v = hil_verdict(r, kind)
    assert v.ok, v.reason
    assert r["injected_fault"] == kind and r["injected_cycle"] == 500
    assert r["fault"] is not None and EXPECTED[kind] in r["fault"], r["fault"]
    assert r["fault"].startswith("drive: ")
    assert r["emulator"]["nonzero_after_off"] == 0, r["emulator"]  # no current commanded after torque off
    events = read_log(str(log)).events
    assert any(r["fault"] in json.dumps(e) for e in events)


def test_bus_off_is_not_a_serial_fault():
    with pytest.raises(UserError, match="bus-off is a CAN fault"):
        run_serial_hil(MACHINE, fault="bus-off")


def test_pkrt_run_on_the_emulator_port(emulator, capsys, tmp_path, host_probe):
    def run():
        emulator.arm(None, None, serial_config(MACHINE, None).rate_hz)
        rc = main(["run", "--machine", MACHINE, "--port", emulator.port, "--duration", "0.5", "--json",
                   "--no-log"])
        cap = capsys.readouterr()
        if not cap.out.strip():  # stopped before the loop (no summary): the one-line error says why
            return rc, {"fault": cap.err.strip(), "fault_time": time.monotonic()}
        return rc, json.loads(cap.out)

    # pkrt run on real drives: wall-clock pacing and the configuration's strict timeout
    rc, out = judge_wallclock(run, host_probe, find=lambda r: anomalies(r[1]))
    assert rc == 0 and out["fault"] is None and out["cycles"] >= 45, out["fault"]
    assert emulator.report()["cycles"] >= 45


def test_pkrt_hil_cli_with_a_bad_port_reports_one_line(capsys):
    rc = main(["run", "--machine", MACHINE, "--port", "/nonexistent/ttyUSB9", "--duration", "0.1", "--no-log"])
    err = capsys.readouterr().err
    assert rc == 1 and "cannot open serial port '/nonexistent/ttyUSB9'" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("edit, field", [
    (("inject_after = 0.5 ", 'inject_after = "a" '), "inject_after"),
    (("inject_after = 0.5 ", "inject_after = nan "), "inject_after"),
    (("fault_servo = 2 ", "fault_servo = 99 "), "fault_servo"),
    (("fault_period = 1 ", "fault_period = 0 "), "fault_period"),
    (("delay = 0.02 ", 'delay = "x" '), "delay"),
    (('clock = "cycle" ', 'clock = "bogus" '), "clock"),
    (("priority = 70 ", 'priority = "x" '), "priority"),
])
def test_bad_emulator_settings_refused_before_starting_anything(edit, field, tmp_path):
    """A bad [emulator] value gave a traceback (inject_after) or 'servo emulator did not start'
    (exit 1) from the child process; now one UserError naming file, table and field."""
    from pkrt.models.kinematics.description import MACHINES_DIR

    text = (MACHINES_DIR / "orthoglide-serial.toml").read_text()
    for name in ("orthoglide.toml", "orthoglide.pkt", "orthoglide-plant.pkt"):
        text = text.replace(f'"{name.removesuffix(".toml")}"' if name.endswith(".toml") else f'"{name}"',
                            f'"{MACHINES_DIR / name}"')
    assert edit[0] in text
    path = tmp_path / "serial.toml"
    path.write_text(text.replace(edit[0], edit[1]))
    with pytest.raises(UserError, match=rf"serial.toml: \[emulator\], field '{field}'"):
        run_serial_hil(str(path), fault="drop", duration=0.2)


@pytest.mark.parametrize("machine", ["delta-serial", "hexapod-serial"])
@pytest.mark.parametrize("kind", ["drop", "drive-fault"])
def test_delta_and_hexapod_fault_verdict(machine, kind, host_probe):
    """The Delta (three rotary servos) and the hexapod (six servos on one line) at 1 kHz: the
    same detection and torque-off bound, with their own emulator process."""
    config = serial_config(machine, None)
    emu = EmulatorProcess.of(config)
    try:
        r = judge(lambda: run_serial_hil(machine, fault=kind, duration=1.0, emulator=emu, reference=demo_reference),
                  host_probe, expected=EXPECTED[kind])
    finally:
        emu.stop()
    assert r["fault"] is not None and EXPECTED[kind] in r["fault"], r["fault"]
    assert hil_verdict(r, kind).ok, hil_verdict(r, kind).reason
    assert r["emulator"]["nonzero_after_off"] == 0, r["emulator"]
    assert len(r["emulator"]["torque_on"]) == len(config.drives.ids) and not any(r["emulator"]["torque_on"])
    assert len(r["emulator"]["theta"]) == len(config.drives.ids)


@pytest.mark.parametrize("link", ["tcp", "pty"])
def test_both_links_carry_the_run_and_a_fault(link, host_probe):
    """The default link is TCP on 127.0.0.1 (pyserial socket://, Nagle off on both ends); a
    pseudo-terminal still works: a fault is detected the same way on either."""
    r = judge(lambda: run_serial_hil(MACHINE, fault="drop", duration=1.0, reference=demo_reference, link=link),
              host_probe, expected=EXPECTED["drop"])
    assert r["interface"] == link and r["emulator_process"]
    assert r["fault"] is not None and EXPECTED["drop"] in r["fault"] and 0 <= r["detection_cycles"] <= 3
    port, low = r["driver"]["port"], r["driver"]["low_latency"]
    if link == "tcp":
        assert port.startswith("socket://127.0.0.1:") and low == "TCP_NODELAY applied (socket:// port)"
    else:
        assert port.startswith("/dev/pts/") and "ASYNC_LOW_LATENCY" in low


def test_link_is_for_the_serial_bus_only(capsys):
    assert main(["hil", "--bus", "can", "--link", "tcp"]) == 2
    assert capsys.readouterr().err.strip() == "pkrt: error: --link applies to --bus serial only"
    with pytest.raises(UserError, match="serial HIL link 'usb': expected one of tcp, pty"):
        run_serial_hil(MACHINE, duration=0.1, link="usb")
