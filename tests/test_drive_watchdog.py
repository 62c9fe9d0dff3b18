"""The drive-side safety net for what no handler in pkrt's process can catch: the CiA 402
heartbeat consumer (0x1016) with the abort connection option (0x6007) against pkrt's master
heartbeat, and the Dynamixel Bus Watchdog (address 98). Frames byte for byte from CiA 301 /
CiA 402 and the ROBOTIS e-Manual; the emulators' behaviour; SIGKILL to a real ``pkrt run``
with the drives in processes of their own; bad settings."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import struct
import subprocess
import sys
import time

import can
import numpy as np
import pytest

from pkrt.drivers import cia402_protocol as p
from pkrt.drivers import dynamixel_protocol as dxp
from pkrt.drivers.base import DriveConfigError, DriveError
from pkrt.drivers.cia402 import CiA402Drives, heartbeat_above_caller
from pkrt.drivers.cia402_setup import download
from pkrt.drivers.dynamixel import DynamixelDrives, load_settings
from pkrt.drivers.sim import Plant
from pkrt.hil.cia402_emulator import CiA402Emulator
from pkrt.hil.dynamixel_emulator import build
from pkrt.rt.runtime.machine.config import load_machine
from pkrt.rt.bench.bench_safestop import RunEndedEarly, kill_run, machine_copy
from tests.test_dynamixel import TcpThreadEmulator

from .realtime import RUN_PRIORITY, drive_anomalies, drive_trips, judge
from .waiting import wait_for

pytestmark = pytest.mark.realtime  # wall-clock threads and processes (tests/realtime.py)

H = bytes.fromhex
RATE = 100.0
PERIOD = 1.0 / RATE
THETA0 = np.array([-0.1, -0.1, -0.1])
_ch = itertools.count()


# -- CiA 301 / CiA 402: encoders ------------------------------------------------------------------
def test_heartbeat_payload_and_consumer_entry_per_cia301():
    assert p.heartbeat() == b"\x05"  # NMT state operational
    assert p.heartbeat(p.NMT_STATE_PRE_OPERATIONAL) == b"\x7f"
    # 0x1016 entry: bits 23..16 producer node id, bits 15..0 time in ms
    assert p.heartbeat_consumer_entry(127, 50) == 0x007F0032
    assert p.decode_heartbeat_consumer_entry(0x007F0032) == (127, 50)
    assert p.decode_heartbeat_consumer_entry(0xFF7F0032) == (127, 50)  # reserved bits ignored
    with pytest.raises(ValueError):
        p.heartbeat_consumer_entry(128, 50)
    assert p.ABORT_CODES == {"fault": 1, "disable-voltage": 2, "quick-stop": 3}


@pytest.fixture(scope="module")
def can_config():
    return dataclasses.replace(load_machine("orthoglide-can"), rate_hz=RATE)


@pytest.fixture(scope="module")
def plant(can_config):
    return Plant.from_config(can_config)


def can_pair(config, plant, **over):
    ch = f"test-watchdog-{next(_ch)}"
    plant.reset(THETA0)
    # the drives' SYNC monitoring (also EMCY 0x8130) is not under test here: not configured
    drives = CiA402Drives.from_config(config, {"interface": "virtual", "channel": ch, "tpdo_timeout": 0.5 * PERIOD,
                                               "max_missed_cycles": 2, "sync_loss_cycles": 0, **over})
    em = CiA402Emulator.from_config(config, ch, plant=plant)
    return drives, em, ch


def drain(bus) -> list[tuple[float, int, bytes]]:
    out = []
    msg = bus.recv(0.0)
    while msg is not None:
        out.append((time.monotonic(), msg.arbitration_id, bytes(msg.data)))
        msg = bus.recv(0.0)
    return out


def run_cycles(drives, n: int, k0: int = 0) -> None:
    t0 = time.perf_counter()
    for k in range(n):
        fb = drives.read((k0 + k) * PERIOD)
        drives.write(3000.0 * (THETA0 - fb.position) - 150.0 * fb.velocity + np.array([0.0, 0.0, 60.0]))
        rest = t0 + (k + 1) * PERIOD - time.perf_counter()
        if rest > 0:
            time.sleep(rest)


@pytest.mark.parametrize("over, entry, abort, cob", [
    ({}, "32007f00", "0300", 0x77F),  # defaults: master 127, consumer 50 ms, quick stop
    ({"master_node_id": 100, "heartbeat_ms": 20, "consumer_timeout_ms": 40, "abort_connection": "disable-voltage"},
     "28006400", "0200", 0x764),
    ({"abort_connection": "fault"}, "32007f00", "0100", 0x77F),
])
def test_configuration_frames_byte_exact(can_config, plant, over, entry, abort, cob):
    drives, em, ch = can_pair(can_config, plant, **over)
    sniff = can.Bus(interface="virtual", channel=ch)
    em.start()
    try:
        drives.configure()
        cfg = drain(sniff)
        time.sleep(0.3)
        later = drain(sniff)
    finally:
        drives.close()
        sniff.shutdown()
        em.stop()
    frames = [(cid, d) for _, cid, d in cfg]
    # the master's heartbeat (CiA 301: COB-ID 0x700 + node id, 1 byte NMT state 0x05), before
    # the consumer entries are written: each drive arms on the next one
    first_hb = frames.index((cob, H("05")))

    def answer(i):  # the frame after request i, heartbeats aside (they run on their own timers)
        return next(f for f in frames[i + 1:] if not 0x700 < f[0] <= 0x77F)

    for n in (1, 2, 3):
        # SDO upload of 0x1016 sub 0 (command 0x40) answered with 1 entry (0x4F: 1 byte)
        i = frames.index((0x600 + n, H("4016100000000000")))
        assert answer(i) == (0x580 + n, H("4f16100001000000"))
        # expedited 4-byte downloads (0x23) of 0x1016 sub 1: 0 first, then node id << 16 | ms
        j = frames.index((0x600 + n, H("2316100100000000")))
        k = frames.index((0x600 + n, H("23161001" + entry)))
        # 2-byte download (0x2B) of 0x6007 = abort connection option code (INTEGER16)
        m = frames.index((0x600 + n, H("2b076000" + abort + "0000")))
        assert first_hb < j < k < m
        assert answer(k) == (0x580 + n, H("6016100100000000"))  # download confirmed
    # the heartbeat keeps going: about 0.3 s / period frames (loose: a loaded machine)
    period = over.get("heartbeat_ms", 10) / 1000.0
    n_hb = sum(1 for _, cid, d in later if cid == cob and d == H("05"))
    assert 0.3 * 0.3 / period <= n_hb <= 1.5 * 0.3 / period + 2, n_hb
    code = {"0300": 3, "0200": 2, "0100": 1}[abort]
    assert em.abort_code == [code] * 3
    ms = over.get("consumer_timeout_ms", 50)
    assert all(c is not None and c[0] == cob - 0x700 and abs(c[1] - ms / 1000) < 1e-9 for c in em.hb_consumer)


def _fifo_permitted() -> bool:
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except (PermissionError, OSError, AttributeError):
        return False
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    return True


@pytest.mark.skipif(not _fifo_permitted(), reason="SCHED_FIFO not permitted here")
def test_heartbeat_thread_runs_above_a_fifo_loop_that_never_sleeps():
    """python-can's periodic send thread inherits its creator's SCHED_FIFO priority and CPU. A
    loop at that priority that polls its TPDO window without sleeping then silences the
    heartbeat (SCHED_FIFO does not share a CPU among equals): the drives stop on the consumer
    time. One priority above the loop (``heartbeat_above_caller``) it keeps its period."""
    ch = f"hb-fifo-{next(_ch)}"
    bus, sniff = can.Bus(interface="virtual", channel=ch), can.Bus(interface="virtual", channel=ch)
    msg = can.Message(arbitration_id=0x77F, data=b"\x05", is_extended_id=False)
    affinity, interval = os.sched_getaffinity(0), sys.getswitchinterval()
    counts, what = {}, {}
    try:
        os.sched_setaffinity(0, {min(affinity)})
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(50))
        sys.setswitchinterval(50e-6)  # as the loop sets it (rt/runtime/cycle/loop.py)
        for above in (False, True):
            task = bus.send_periodic(msg, 0.01)
            what[above] = heartbeat_above_caller(task) if above else "inherited"
            wait_for(lambda: any(cid == 0x77F for _, cid, _ in drain(sniff)), 2.0,
                     "the heartbeat thread's first frame")
            end = time.monotonic() + 0.3
            while time.monotonic() < end:  # the loop's busy part, never sleeping
                pass
            counts[above] = sum(1 for _, cid, _ in drain(sniff) if cid == 0x77F)
            task.stop()
    finally:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        os.sched_setaffinity(0, affinity)
        sys.setswitchinterval(interval)
        bus.shutdown()
        sniff.shutdown()
    assert what[True] == "SCHED_FIFO 51 (one above the caller)"
    assert counts[False] <= 1, counts  # held off for the whole 0.3 s
    assert counts[True] >= 15, counts  # about 30 at 10 ms (loose: a loaded machine)


def test_heartbeat_off_writes_no_consumer_and_sends_no_heartbeat(can_config, plant):
    drives, em, ch = can_pair(can_config, plant, heartbeat_ms=0)
    sniff = can.Bus(interface="virtual", channel=ch)
    em.start()
    try:
        drives.configure()
        time.sleep(0.05)
        frames = [(cid, d) for _, cid, d in drain(sniff)]
    finally:
        drives.close()
        sniff.shutdown()
        em.stop()
    assert not any(0x700 < cid <= 0x77F and cid - 0x700 not in (1, 2, 3) for cid, _ in frames)
    assert not any(cid == 0x601 and d[1:3] == H("1610") for cid, d in frames)
    assert (0x601, H("2b07600003000000")) in frames  # 0x6007 still set (bus-off reaction)
    assert em.hb_consumer == [None] * 3
    assert drives.describe()["drive_watchdog"].startswith("heartbeat off")


@pytest.mark.parametrize("abort, states", [
    ("quick-stop", ["OPERATION_ENABLED", "QUICK_STOP_ACTIVE", "SWITCH_ON_DISABLED"]),
    ("disable-voltage", ["OPERATION_ENABLED", "SWITCH_ON_DISABLED"]),
    ("fault", ["OPERATION_ENABLED", "FAULT_REACTION_ACTIVE", "FAULT"]),
])
def test_lost_heartbeat_stops_the_drives_per_abort_connection_option(can_config, plant, abort, states, host_probe):
    """The master's heartbeat stops while its loop goes on (a hung heartbeat, as after a
    crash of its sender): every drive's consumer times out, sends EMCY 0x8130 and carries out
    0x6007; the driver reports the EMCY with torque off."""

    def attempt() -> None:  # at SCHED_FIFO: the master's heartbeat thread one above (51), on time
        drives, em, ch = can_pair(can_config, plant, abort_connection=abort, consumer_timeout_ms=40)
        sniff = can.Bus(interface="virtual", channel=ch)
        seen: list[list[str]] = [[] for _ in range(3)]
        set_state = em._set_state

        def record(i, new, later=0):  # the emulator's own transitions, in order
            seen[i].append(new.name)
            set_state(i, new, later)

        em._set_state = record
        em.start()
        try:
            drives.configure()
            drives.enable()
            run_cycles(drives, 10)
            drain(sniff)
            t_stop = time.monotonic()
            drives._heartbeat.stop()  # the heartbeat alone goes silent
            err = None
            try:
                run_cycles(drives, 40, 10)
            except DriveError as e:
                err = str(e)
            frames = []

            def stopped():  # every drive's EMCY 0x8130 and its 0x6007 reaction carried out
                frames.extend(drain(sniff))
                return (len([f for f in frames if f[2] == H("3081110000000000")]) == 3
                        and all(seen[i][-len(states) + 1:] == states[1:] for i in range(3)))

            if err is not None:
                wait_for(stopped, 1.0, f"EMCY 0x8130 of 3 drives and the states {states[1:]}")
            hb_after = [round(t - t_stop, 4) for t, cid, _ in frames if cid == 0x77F]
            assert err is not None and "EMCY 0x8130 (life guard or heartbeat error)" in err, (
                err, hb_after, em.hb_last, time.monotonic(), em.report())
        finally:
            drives.close()
            sniff.shutdown()
            em.stop()
        assert em.error is None
        emcy = [(t, cid) for t, cid, d in frames if d == H("3081110000000000")]
        assert sorted(cid for _, cid in emcy) == [0x81, 0x82, 0x83]
        assert all(t - t_stop >= 0.040 - 0.011 for t, _ in emcy)  # not before the consumer time
        for i in range(3):
            assert seen[i][-len(states) + 1:] == states[1:], seen[i]
            assert em.nodes[i].nmt.state == "PRE-OPERATIONAL"  # 0x1029 default: to pre-operational
        ev = em.heartbeat_events
        assert [e["node"] for e in ev] == [1, 2, 3] and all(e["state_before"] == "OPERATION_ENABLED" for e in ev)
        assert all(e["silent_s"] >= 0.040 for e in ev)

    judge(attempt, host_probe, find=lambda r: [], priority=RUN_PRIORITY)  # an SDO timeout: by the probe


def test_bus_off_uses_the_configured_abort_connection_option(can_config, plant, host_probe):
    def attempt():
        drives, em, ch = can_pair(can_config, plant, abort_connection="fault")
        em.fault, em.inject_cycle = "bus-off", 5
        em.start()
        try:
            drives.configure()
            drives.enable()
            with pytest.raises(DriveError) as e:
                run_cycles(drives, 20)
            detected = drives.cycle
            if "bus-off" in str(e.value):
                wait_for(lambda: [s.name for s in em.state] == ["FAULT"] * 3, 1.0, "every drive in Fault (0x6007 = 1)")
        finally:
            drives.close()
            em.stop()
        return str(e.value), em, drive_anomalies(drives, "bus-off", "bus-off", em.injected_cycle, detected)

    # a fault before the bus-off (a TPDO timeout) is judged by the host-pause probe at its time
    reason, em, _ = judge(attempt, host_probe, find=lambda r: r[2], priority=RUN_PRIORITY)
    assert "bus-off" in reason, reason
    assert [s.name for s in em.state] == ["FAULT"] * 3


def test_drive_without_a_heartbeat_consumer_is_a_clear_error(can_config, plant):
    drives, em, ch = can_pair(can_config, plant)
    del em.nodes[1].object_dictionary[p.HEARTBEAT_CONSUMER_TIME]  # node 2 has no 0x1016
    em.start()
    try:
        with pytest.raises(DriveError, match=r"^node 2: SDO upload of 0x1016:00 aborted: .*: the drive has no "
                                             r"heartbeat consumer; heartbeat_ms = 0 in \[drives\] runs without"):
            drives.configure()
    finally:
        drives.close()
        em.stop()


def test_emulator_refuses_an_abort_code_outside_the_profile(can_config, plant):
    drives, em, ch = can_pair(can_config, plant)
    em.start()
    try:
        drives.configure()
        with pytest.raises(DriveError, match=r"node 2: SDO download to 0x6007:00 aborted"):
            download(drives._nodes[1], p.ABORT_CONNECTION_OPTION, 0, "<h", 7)
    finally:
        drives.close()
        em.stop()


# -- Dynamixel Bus Watchdog -----------------------------------------------------------------------
def crc16_bitwise(data: bytes) -> int:
    """CRC-16 of Protocol 2.0 computed bit by bit (poly 0x8005, init 0, MSB first): independent
    of the driver's table."""
    crc = 0
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x8005) & 0xFFFF if crc & 0x8000 else (crc << 1) & 0xFFFF
    return crc


def spec_packet(body_hex: str) -> bytes:
    body = H("FF FF FD 00" + body_hex)
    c = crc16_bitwise(body)
    return body + bytes((c & 0xFF, c >> 8))


def test_bus_watchdog_packets_byte_exact():
    # Write (0x03) ID 1, address 98 = 0x0062, 1 byte: 3 (x 20 ms = 60 ms); LEN = 6
    assert dxp.write(1, 98, b"\x03") == spec_packet("01 06 00 03 62 00 03")
    # Sync Write (0x83) broadcast, address 98, length 1, IDs 1..3 value 0 (watchdog off); LEN = 13
    assert dxp.sync_write(98, 1, [(1, b"\0"), (2, b"\0"), (3, b"\0")]) == \
        spec_packet("FE 0D 00 83 62 00 01 00 01 00 02 00 03 00")
    # Read (0x02) ID 2, address 98, length 1
    assert dxp.read(2, 98, 1) == spec_packet("02 07 00 02 62 00 01 00")
    assert crc16_bitwise(H("FF FF FD 00 01 03 00 01")) == 0x4E19  # the e-Manual's ping example


def test_emulated_bus_watchdog_per_e_manual():
    emu = build("orthoglide-serial")
    t = 100.0

    def ask(pkt, at):
        out = emu.handle(pkt, at)
        return [dxp.decode(b) for _, b in out]

    assert ask(dxp.write(1, 11, b"\x00"), t)[0].error == 0  # current mode
    assert ask(dxp.write(1, 98, b"\x03"), t)[0].error == 0  # 60 ms
    assert ask(dxp.write(1, 64, b"\x01"), t)[0].error == 0  # torque on: the watchdog watches
    assert ask(dxp.write(1, 98, bytes((128,))), t)[0].error == 4  # 1..127 only
    emu.watchdog(t + 0.059)
    assert not emu.watchdog_trips
    ask(dxp.ping(1), t + 0.05)  # any instruction packet feeds it
    emu.watchdog(t + 0.109)
    assert not emu.watchdog_trips
    emu.watchdog(t + 0.111)
    assert [w["id"] for w in emu.watchdog_trips] == [1]
    sv = emu.servos[1]
    assert sv.torque and not sv.applies_torque  # stopped; Torque Enable left as it was
    r = ask(dxp.read(1, 98, 1), t + 0.2)[0]
    assert r.error == 0 and r.params == b"\xff"  # -1: Bus Watchdog error
    assert ask(dxp.write(1, 102, struct.pack("<h", 100)), t + 0.2)[0].error == 4  # Goal read-only
    assert ask(dxp.write(1, 116, struct.pack("<i", 100)), t + 0.2)[0].error == 4
    ask(dxp.sync_write(102, 2, [(1, struct.pack("<h", 100))]), t + 0.2)
    assert sv.goal_current() == 0  # a Sync Write is ignored too
    assert ask(dxp.write(1, 98, b"\x05"), t + 0.2)[0].error == 4  # only 0 clears
    assert ask(dxp.write(1, 98, b"\x00"), t + 0.2)[0].error == 0
    assert ask(dxp.write(1, 102, struct.pack("<h", 100)), t + 0.2)[0].error == 0
    assert sv.applies_torque and sv.goal_current() == 100
    emu.watchdog(t + 10.0)  # off (0): never trips
    assert len(emu.watchdog_trips) == 1
    # servo 2, torque off: an armed watchdog does not watch
    ask(dxp.write(2, 98, b"\x01"), t)
    emu.watchdog(t + 5.0)
    assert len(emu.watchdog_trips) == 1


@pytest.fixture(scope="module")
def serial_config():
    return load_machine("orthoglide-serial")


@pytest.fixture(scope="module")
def servo_emulator():
    """The servo emulator in a thread, on TCP (pkrt hil's link: a pty's data waits for the
    kernel's normal-priority workers, which the load of other processes delays by milliseconds)."""
    e = TcpThreadEmulator()
    yield e
    e.stop()


def test_driver_arms_clears_and_reports_the_bus_watchdog(servo_emulator, serial_config, host_probe):
    emu = servo_emulator.emu

    def attempt() -> list[tuple[float, str]]:
        """The test on a fresh arm of the emulator; a fault of the cyclic reads before the master
        falls silent, for the host-pause probe."""
        emu.arm(None, 0, serial_config.rate_hz)
        d = DynamixelDrives.from_config(serial_config, {"port": servo_emulator.port})
        try:
            d.configure()
            assert [sv.table[98] for sv in emu.servos.values()] == [0, 0, 0]
            d.enable()
            assert [sv.table[98] for sv in emu.servos.values()] == [3, 3, 3]  # 60 ms while torque is on
            try:  # a late or missing answer is retried at the next cycle; fail_cycles of them fault
                for k in range(5):
                    d.read(k * PERIOD)
                    d.write(np.zeros(3))
            except DriveError as e:  # at the shipped 1 kHz timeouts (0.6 ms): the probe judges it
                return [(d.fault_time or time.monotonic(), str(e))]
            # the master falls silent: every servo stops by itself
            wait_for(lambda: len(emu.watchdog_trips) == 3 and emu.torque_off_at is not None, 5.0,
                     "the Bus Watchdog of the 3 servos")
            assert [w["id"] for w in emu.watchdog_trips] == [1, 2, 3]
            assert all(w["silent_s"] >= 0.060 for w in emu.watchdog_trips)
            assert emu.torque_off_at is not None and not any(sv.applies_torque for sv in emu.servos.values())
            d.configure()  # as a new run after a dead one: the error left behind is found and cleared
            assert d.watchdog_cleared == [1, 2, 3]
            assert [sv.table[98] for sv in emu.servos.values()] == [0, 0, 0]
            assert "cleared a watchdog error left on servo(s) [1, 2, 3]" in d.describe()["drive_watchdog"]
            d.enable()
            d.read(0.0)
            time.sleep(0.1)  # this process stalls past the watchdog: the driver knows what that means
            with pytest.raises(DriveError, match=r"nothing sent for \d+ ms, longer than their Bus Watchdog \(60 ms\): "
                                                 r"they have stopped themselves"):
                d.read(PERIOD)
            assert not d.torque_on
            wait_for(lambda: [sv.table[98] for sv in emu.servos.values()] == [0, 0, 0], 2.0,
                     "Bus Watchdog 0 on every servo")  # disable writes 0 (clears)
            assert not any(sv.torque for sv in emu.servos.values())
        finally:
            d.close()
        return []

    judge(attempt, host_probe, find=lambda found: found, priority=RUN_PRIORITY)


# -- SIGKILL to a real `pkrt run`, drives in their own processes ------------------------------------
# Bound: the configured watchdog time plus the emulator's wake-up on this shared machine.
SLACK_S = 0.030


def since_last_sign_of_life(r: dict) -> float | None:
    """Seconds from the master's last sign of life to the drives' torque off in a kill_run
    result: the drives' guarantee runs from there (CAN: its last heartbeat seen on the bus; a
    master that a loaded host starved before the kill fell silent earlier), else from the kill."""
    dt = r["kill_to_off_s"]
    hb = [t for t, cid, d in (r.get("frames") or []) if cid == 0x77F and t <= r["t_kill"]]
    return None if dt is None else (r["t_kill"] + dt - max(hb) if hb else dt)


def judged_kill_run(tmp_path, probe, bus: str, watchdog_s: float | None = None, **kw) -> dict:
    """kill_run judged by the host-pause ``probe``: a run that ended before the kill (a fault:
    none is expected) at the time of its fault, or, when the drives' own watchdogs had stopped
    them before (the run's fault then follows, e.g. a following error of an axis without torque),
    at each trip over the master's silence before it (``drive_trips``); drives that stopped later
    than ``watchdog_s`` (+ slack) after the master's last sign of life at the time they stopped."""
    def run():
        try:
            r = kill_run(bus, tmp_path, **kw)
        except RunEndedEarly as e:
            trips = [(a[0], f"{a[1]}, then {str(e)[:200]}", *a[2:]) for a in drive_trips(e.emulator)]
            return None, trips or [(e.summary.get("fault_time") or time.monotonic(), str(e)[:300])]
        since = since_last_sign_of_life(r)
        if watchdog_s is None or since is None or since <= watchdog_s + SLACK_S:
            return r, []
        return r, [(r["t_kill"] + r["kill_to_off_s"], f"drives off {since * 1e3:.1f} ms after the master's last "
                                                      f"sign of life (watchdog {watchdog_s * 1e3:g} ms)")]

    return judge(run, probe, find=lambda r: r[1])[0]


def kill_and_time(tmp_path, probe, bus: str, watchdog_s: float) -> dict:
    """judged_kill_run, checked: the drives stopped within ``watchdog_s`` (+ slack) of the
    master's last sign of life."""
    r = judged_kill_run(tmp_path, probe, bus, watchdog_s)
    dt = r["kill_to_off_s"]
    assert dt is not None, r["after"]
    print(f"\n{bus}: SIGKILL -> no drive applies torque after {dt * 1e3:.1f} ms (watchdog {watchdog_s * 1e3:g} ms)")
    assert since_last_sign_of_life(r) <= watchdog_s + SLACK_S, r["after"]
    return r


def test_sigkill_serial_servos_stop_within_the_bus_watchdog_time(tmp_path, host_probe):
    r = kill_and_time(tmp_path, host_probe, "serial", 0.060)
    assert r["before"]["torque_on"] == [True] * 3 and r["before"]["bus_watchdog"] == [3, 3, 3]
    trips = r["after"]["watchdog_trips"]
    assert sorted(w["id"] for w in trips) == [1, 2, 3]
    assert all(w["silent_s"] >= 0.060 for w in trips)  # the watchdog, not something earlier
    assert r["after"]["bus_watchdog"] == [255, 255, 255] and r["after"]["torque_on"] == [False] * 3


def test_sigkill_can_drives_stop_within_the_heartbeat_consumer_time(tmp_path, host_probe):
    r = kill_and_time(tmp_path, host_probe, "can", 0.050)
    assert r["before"]["torque_on"] and r["before"]["heartbeat_consumers"] == [{"producer": 127, "ms": 50}] * 3
    ev = r["after"]["heartbeat_events"]
    assert sorted(e["node"] for e in ev) == [1, 2, 3]
    assert all(e["state_before"] == "OPERATION_ENABLED" and e["state_after"] == "SWITCH_ON_DISABLED"
               and e["abort_code"] == 3 and e["silent_s"] >= 0.050 for e in ev)
    t_kill, frames = r["t_kill"], r["frames"]
    hb = [t for t, cid, d in frames if cid == 0x77F and d == H("05")]
    assert len(hb) >= 10 and min(hb) < t_kill
    assert not [t for t in hb if t > t_kill + 0.005]  # the heartbeat died with the process
    emcy = sorted(cid for t, cid, d in frames if t > t_kill and d == H("3081110000000000"))
    assert emcy == [0x81, 0x82, 0x83]


@pytest.mark.parametrize("bus", ["serial", "can"])
def test_sigkill_without_the_watchdog_leaves_torque_on(tmp_path, bus, host_probe):
    """The control: with the safety net off, nothing on the drive side notices."""
    r = judged_kill_run(tmp_path, host_probe, bus, watchdog_ms=0, watch_s=0.3)
    assert r["kill_to_off_s"] is None
    assert r["after"]["torque_on"] in (True, [True] * 3), r["after"]


# -- settings ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("over, field", [
    ({"heartbeat_ms": -1}, "heartbeat_ms"), ({"heartbeat_ms": 1.5}, "heartbeat_ms"),
    ({"heartbeat_ms": True}, "heartbeat_ms"), ({"heartbeat_ms": 70000}, "heartbeat_ms"),
    ({"consumer_timeout_ms": 0}, "consumer_timeout_ms"), ({"consumer_timeout_ms": 15}, "consumer_timeout_ms"),
    ({"consumer_timeout_ms": "50"}, "consumer_timeout_ms"),
    ({"abort_connection": "stop"}, "abort_connection"), ({"abort_connection": 3}, "abort_connection"),
    ({"master_node_id": 2}, "master_node_id"), ({"master_node_id": 128}, "master_node_id"),
    ({"bus_options": "port=1"}, "bus_options"), ({"bus_options": {"channel": "x"}}, "bus_options"),
])
def test_bad_can_watchdog_settings_name_file_table_field(over, field):
    c = load_machine("orthoglide-can")
    with pytest.raises(DriveConfigError, match=rf"orthoglide-can.toml: \[drives\], field '{field}'"):
        CiA402Drives.from_config(c, over)


@pytest.mark.parametrize("value", [30, -20, 2560, 1.5, True, "60", 10])
def test_bad_bus_watchdog_settings_name_file_table_field(serial_config, value):
    with pytest.raises(DriveConfigError, match=r"orthoglide-serial.toml: \[drives\], field 'bus_watchdog_ms'"):
        load_settings(serial_config, {"bus_watchdog_ms": value})  # 10 ms: under 2 periods at 100 Hz


@pytest.mark.parametrize("machine, table, field, value", [
    ("orthoglide-serial", "drives", "bus_watchdog_ms", "45"),
    ("orthoglide-can", "drives", "abort_connection", '"coast"'),
    ("orthoglide-can", "drives", "consumer_timeout_ms", "5"),
])
def test_pkrt_run_bad_watchdog_setting_is_one_line_exit_2(tmp_path, machine, table, field, value):
    path = machine_copy(tmp_path, machine, {table: {field: value}})
    out = subprocess.run([sys.executable, "-m", "pkrt.rt.cli", "run", "--machine", path, "--no-log", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"pkrt: error: {path}: [{table}], field '{field}'"), lines


def test_watchdog_settings_in_the_run_summary_and_log(tmp_path):
    from pkrt.hil.serial_hil import run_serial_hil
    from pkrt.rt.app.reference import plan_reference
    from pkrt.rt.runtime.record.logfile import read_log

    log = tmp_path / "w.pktlog"
    r = run_serial_hil("orthoglide-serial", duration=0.3, log_path=str(log), reference=plan_reference)
    text = "Bus Watchdog (address 98) = 3 x 20 ms = 60 ms while torque is on"
    assert r["drives"]["drive_watchdog"] == text
    assert read_log(log).header["plant"]["drive_watchdog"] == text
    c = CiA402Drives.from_config(load_machine("orthoglide-can"), {})
    assert json.loads(json.dumps(c.describe()))["drive_watchdog"] == (
        "master heartbeat 0x77F every 10 ms, drive consumer time 0x1016 = 50 ms, "
        "abort connection 0x6007 = 3 (quick-stop); SYNC monitoring 0x1006 = 1000 us, 0x2F10 = 3 missed")
