"""Dynamixel Protocol 2.0: packets byte-exact against the ROBOTIS e-Manual's worked examples,
byte stuffing, CRC, the streaming parser (hypothesis), settings, and the driver talking to the
servo emulator over a real pseudo-terminal."""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import struct
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pkrt.drivers import dynamixel_protocol as dxp
from pkrt.drivers.base import DriveConfigError, DriveError, DriveState
from pkrt.drivers.dynamixel import ADDR_MODEL_NUMBER, DynamixelDrives, load_settings
from pkrt.hil.dynamixel_emulator import FAULT_KINDS, build, open_pty
from pkrt.rt.runtime.machine.config import load_machine

from .realtime import RUN_PRIORITY, judge, unmatched
from .waiting import wait_for

H = bytes.fromhex

# -- the e-Manual's examples ---------------------------------------------------------------------

SPEC_INSTRUCTIONS = [
    # (what, encoder call, bytes from the e-Manual)
    ("ping ID 1", lambda: dxp.ping(1), "FF FF FD 00 01 03 00 01 19 4E"),
    ("read ID 1 Present Position", lambda: dxp.read(1, 132, 4), "FF FF FD 00 01 07 00 02 84 00 04 00 1D 15"),
    ("write ID 1 Goal Position 512", lambda: dxp.write(1, 116, struct.pack("<i", 512)),
     "FF FF FD 00 01 09 00 03 74 00 00 02 00 00 CA 89"),
    ("sync read IDs 1, 2 Present Position", lambda: dxp.sync_read([1, 2], 132, 4),
     "FF FF FD 00 FE 09 00 82 84 00 04 00 01 02 CE FA"),
    ("sync write IDs 1, 2 Goal Position 150, 170",
     lambda: dxp.sync_write(116, 4, [(1, struct.pack("<i", 150)), (2, struct.pack("<i", 170))]),
     "FF FF FD 00 FE 11 00 83 74 00 04 00 01 96 00 00 00 02 AA 00 00 00 82 87"),
]

SPEC_STATUS = [
    # (bytes, id, error, params)
    ("FF FF FD 00 01 07 00 55 00 06 04 26 65 5D", 1, 0, H("06 04 26")),  # ping: model 1030, fw 38
    ("FF FF FD 00 01 08 00 55 00 A6 00 00 00 8C C0", 1, 0, struct.pack("<i", 166)),  # read / sync read
    ("FF FF FD 00 02 08 00 55 00 1F 08 00 00 BA BE", 2, 0, struct.pack("<i", 2079)),  # sync read, ID 2
    ("FF FF FD 00 01 04 00 55 00 A1 0C", 1, 0, b""),  # write acknowledged
]


@pytest.mark.parametrize("what,encode,expected", SPEC_INSTRUCTIONS, ids=[s[0] for s in SPEC_INSTRUCTIONS])
def test_instruction_packets_match_the_specification(what, encode, expected):
    assert encode() == H(expected)
    pkt = dxp.decode(H(expected))
    assert pkt.error == -1 and pkt.instruction == H(expected)[7]


@pytest.mark.parametrize("raw,dxl_id,error,params", SPEC_STATUS)
def test_status_packets_match_the_specification(raw, dxl_id, error, params):
    assert dxp.status(dxl_id, error, params) == H(raw)
    assert dxp.decode(H(raw)) == dxp.Packet(dxl_id, dxp.STATUS, error, params)


def test_crc_table_and_value_from_the_specification():
    assert dxp.CRC_TABLE[:8] == (0x0000, 0x8005, 0x800F, 0x000A, 0x801B, 0x001E, 0x0014, 0x8011)
    assert dxp.CRC_TABLE[255] == 0x0202
    assert dxp.crc16(H("FF FF FD 00 01 03 00 01")) == 0x4E19  # sent as 19 4E


def test_byte_stuffing():
    # Goal Position bytes FF FF FD 00: the pattern FF FF FD gets an extra FD, LEN counts it
    pkt = dxp.write(1, 116, H("FF FF FD 00"))
    body = H("FF FF FD 00 01 0A 00 03 74 00 FF FF FD FD 00")
    c = dxp.crc16(body)  # CRC over the stuffed packet
    assert pkt == body + bytes((c & 0xFF, c >> 8))
    assert dxp.decode(pkt).params == H("74 00 FF FF FD 00")
    assert dxp.stuff(H("FF FF FD FD")) == H("FF FF FD FD FD")
    assert dxp.unstuff(dxp.stuff(H("FF FF FD FF FF FD"))) == H("FF FF FD FF FF FD")
    # a status packet whose data contains the header pattern
    st_pkt = dxp.status(3, 0, H("FF FF FD 00 00 00 00 00"))
    assert H("FF FF FD FD 00") in st_pkt and HEADER_COUNT(st_pkt) == 1
    assert dxp.decode(st_pkt).params == H("FF FF FD 00 00 00 00 00")


def HEADER_COUNT(b: bytes) -> int:
    return b.count(dxp.HEADER)


def test_status_error_byte():
    raw = dxp.status(2, 0x80 | 4, b"")
    p = dxp.decode(raw)
    assert p.error == 0x84
    assert dxp.error_text(p.error) == "hardware alert + data range error"
    assert dxp.hardware_error_text(0x20 | 0x04) == "overheating error, overload error"


@pytest.mark.parametrize("raw,msg", [
    ("FF FF FD 00 01 03 00 01 19 4F", "CRC mismatch"),
    ("FF FF FD 00 01 03 00 01 19", "not a Protocol 2.0 packet"),
    ("FF FF FD 00 01 09 00 01 19 4E", "length field"),
    ("00 FF FD 00 01 03 00 01 19 4E", "not a Protocol 2.0 packet"),
])
def test_decode_rejects_bad_packets(raw, msg):
    with pytest.raises(dxp.ProtocolError, match=msg):
        dxp.decode(H(raw))


def test_encoder_rejects_bad_ids():
    with pytest.raises(dxp.ProtocolError, match="invalid Dynamixel ID 253"):
        dxp.ping(253)
    with pytest.raises(dxp.ProtocolError, match="invalid Dynamixel ID 254"):
        dxp.status(dxp.BROADCAST_ID)
    with pytest.raises(dxp.ProtocolError, match="2 data bytes for ID 1"):
        dxp.sync_write(102, 4, [(1, b"\0\0")])


def test_parser_resynchronises_after_garbage_and_crc_errors():
    good1 = dxp.status(1, 0, struct.pack("<ii", 5, -7))
    good2 = dxp.status(2, 0, H("FF FF FD 00 00 00 00 00"))
    bad = bytearray(dxp.status(3, 0, b"\1\2\3\4"))
    bad[-3] ^= 0x01
    stream = H("00 FF 13 FF FF") + good1 + H("FF FF FD") + bytes(bad) + H("55 AA") + good2 + H("FF FF")
    for chunk in (len(stream), 1, 3):  # whole, byte by byte, in threes
        p = dxp.PacketParser()
        got = []
        for i in range(0, len(stream), chunk):
            p.feed(stream[i:i + chunk])
            while (pkt := p.next()) is not None:
                got.append(pkt)
        assert [g.id for g in got] == [1, 2]
        assert got[0].params == struct.pack("<ii", 5, -7)
        assert got[1].params == H("FF FF FD 00 00 00 00 00")
        assert p.crc_errors == 1
        assert bytes(p.buf) == H("FF FF")  # a possible header start is kept


def test_parser_skips_absurd_lengths():
    p = dxp.PacketParser(max_length=64)
    p.feed(H("FF FF FD 00 01 FF 7F 55") + dxp.ping(4))
    assert p.next() == dxp.Packet(4, dxp.PING, -1, b"")
    assert p.bad_length == 1


# -- property tests --------------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80))
def test_decode_of_garbage_raises_only_protocol_error(data):
    try:
        dxp.decode(data)
    except dxp.ProtocolError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=12), st.integers(4, 200))
def test_parser_never_raises_on_garbage(chunks, max_length):
    p = dxp.PacketParser(max_length=max_length)
    for c in chunks:
        p.feed(c)
        while (pkt := p.next()) is not None:
            assert 0 <= pkt.id <= 255 and isinstance(pkt.params, bytes)
    assert len(p.buf) <= max_length + 7 + 40 * 12  # bounded: nothing accumulates without limit


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 252), st.sampled_from([dxp.PING, dxp.READ, dxp.WRITE, dxp.SYNC_READ, dxp.SYNC_WRITE]),
       st.binary(max_size=60))
def test_instruction_round_trip(dxl_id, inst, params):
    raw = dxp.instruction(dxl_id, inst, params)
    assert dxp.HEADER not in raw[4:]  # stuffing keeps the header pattern out of the body
    assert dxp.decode(raw) == dxp.Packet(dxl_id, inst, -1, params)


no_fd = st.binary(max_size=30).map(lambda b: b.replace(b"\xfd", b"\x00"))  # cannot form a header


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 252), st.integers(0, 255), st.binary(max_size=24), no_fd),
                min_size=1, max_size=6), st.integers(1, 17))
def test_status_stream_round_trip_with_garbage_between(items, chunk):
    stream = b"".join(g + dxp.status(i, e, prm) for i, e, prm, g in items)
    p = dxp.PacketParser()
    got = []
    for k in range(0, len(stream), chunk):
        p.feed(stream[k:k + chunk])
        while (pkt := p.next()) is not None:
            got.append(pkt)
    assert got == [dxp.Packet(i, dxp.STATUS, e, prm) for i, e, prm, _ in items]


# -- settings --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def config():
    """The shipped servos at 100 Hz with a 3 ms timeout and one retry: the protocol tests below
    exercise retries, for which the shipped 1 kHz period leaves no room (retries = 0 there)."""
    shipped = load_machine("orthoglide-serial")
    raw = {**shipped.raw, "drives": {**shipped.raw["drives"], "timeout": 0.003, "retries": 1}}
    return dataclasses.replace(shipped, rate_hz=100.0, raw=raw).with_drives()


def test_settings_and_unit_factors(config):
    s = load_settings(config, {"port": "/dev/pts/99"})
    assert s.port == "/dev/pts/99" and s.ids == (1, 2, 3) and s.baudrate == 4000000
    # linear axis through a 40 mm/rev belt: motor torque = F * lead / 2 pi
    assert s.force_per_lsb(0) == pytest.approx(2.69e-3 * 1.78 * 2 * math.pi / 0.04)
    d = DynamixelDrives(s, config.limits.position)
    assert d._k_pos[0] == pytest.approx(0.04 / 4096)  # m per pulse
    assert d._k_vel[0] == pytest.approx(0.229 / 60 * 0.04)  # m/s per LSB
    # a rotary axis: gear_ratio motor revolutions per axis revolution
    r = load_settings(config, {"lead": 0.0, "gear_ratio": 2.0})
    assert r.scale(0) == pytest.approx(math.pi)
    assert r.force_per_lsb(0) == pytest.approx(2.69e-3 * 1.78 * 2.0)


@pytest.mark.parametrize("override,field", [
    ({"ids": [1, 2]}, "ids"),
    ({"ids": [1, 1, 2]}, "ids"),
    ({"ids": [1, 2, 253]}, "ids"),
    ({"port": ""}, "port"),
    ({"baudrate": "fast"}, "baudrate"),
    ({"torque_constant": None}, "torque_constant"),
    ({"lead": -0.01}, "lead"),
    ({"direction": [1, 2, 1]}, "direction"),
    ({"current_limit": 1e6}, "current_limit"),
    ({"retries": -1}, "retries"),
    ({"fail_cycles": 0}, "fail_cycles"),
    ({"timeout": 0.05}, "timeout"),  # 0.05 s x 2 attempts cannot fit a 10 ms period
    ({"low_latency": "yes"}, "low_latency"),
])
def test_bad_settings_name_file_table_and_field(config, override, field):
    with pytest.raises(DriveConfigError, match=rf"orthoglide-serial\.toml: \[drives\], field '{field}'"):
        load_settings(config, override)


def test_unopenable_port_is_a_clear_drive_error(config):
    d = DynamixelDrives.from_config(config, {"port": "/nonexistent/ttyUSB7"})
    with pytest.raises(DriveError, match="cannot open serial port '/nonexistent/ttyUSB7'"):
        d.configure()


def test_pyserial_url_loopback_hears_only_its_own_echo(config):
    """loop:// echoes our instruction packets: they are skipped, the servos never answer."""
    d = DynamixelDrives.from_config(config, {"port": "loop://", "timeout": 0.001})
    with pytest.raises(DriveError, match=r"servo 1 on loop://: no valid answer to ping after 3 attempts"):
        d.configure()
    assert "not available for" in d.low_latency or "not applied" in d.low_latency
    assert d.stats["timeouts"] == 3 and d.stats["garbage_bytes"] == 0
    d.close()


# -- driver <-> emulator over a real pty -----------------------------------------------------------

class ThreadEmulator:
    """The emulator serving a pty from a thread of this process (tests only)."""

    def __init__(self):
        self.emu = build("orthoglide-serial")
        self.master, self.slave, self.port = open_pty()
        self.ctl_r, self.ctl_w = os.pipe()
        self.replies = []
        self.thread = threading.Thread(target=self.emu.serve, args=(self.master, self.ctl_r, self.replies.append),
                                       daemon=True)
        self.thread.start()

    def stop(self):
        os.close(self.ctl_w)
        self.thread.join(5)
        for fd in (self.ctl_r, self.master, self.slave):
            os.close(fd)


class TcpThreadEmulator(ThreadEmulator):
    """The same on a TCP listener on 127.0.0.1, the driver at socket:// (pkrt hil's link)."""

    def __init__(self):
        self.emu = build("orthoglide-serial")
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = f"socket://127.0.0.1:{self.listener.getsockname()[1]}"
        self.ctl_r, self.ctl_w = os.pipe()
        self.replies = []
        self.thread = threading.Thread(target=self.emu.serve, args=(None, self.ctl_r, self.replies.append, self.listener),
                                       daemon=True)
        self.thread.start()

    def stop(self):
        os.close(self.ctl_w)
        self.thread.join(5)
        os.close(self.ctl_r)
        self.listener.close()


@pytest.fixture(scope="module")
def emulator():
    e = ThreadEmulator()
    yield e
    e.stop()


@pytest.fixture(scope="module")
def tcp_emulator():
    e = TcpThreadEmulator()
    yield e
    e.stop()


@pytest.fixture
def drives(emulator, config):
    emulator.emu.arm(None, 0, config.rate_hz)
    d = DynamixelDrives.from_config(config, {"port": emulator.port})
    yield d
    d.close()


@pytest.fixture(params=["pty", "tcp"])
def any_link_drives(request, config):
    """Drives on the emulator thread over a pty, then over TCP."""
    emulator = request.getfixturevalue("emulator" if request.param == "pty" else "tcp_emulator")
    emulator.emu.arm(None, 0, config.rate_hz)
    d = DynamixelDrives.from_config(config, {"port": emulator.port})
    yield d
    d.close()


@pytest.mark.realtime
def test_configure_enable_read_write_disable(drives, emulator):
    emu = emulator.emu
    drives.configure()
    assert drives.models == {1: 1120, 2: 1120, 3: 1120}
    assert all(sv.table[11] == 0 for sv in emu.servos.values())  # current control mode
    assert drives.info()["current_limit"] == [1193, 1193, 1193]
    drives.enable()
    assert all(sv.torque for sv in emu.servos.values())
    fb = drives.read(0.0)
    assert fb.fresh
    np.testing.assert_allclose(fb.position, emu.plant.theta, atol=0.04 / 4096)
    np.testing.assert_allclose(fb.position, [-0.1, -0.1, -0.1], atol=0.04 / 4096)
    tau = np.array([10.0, -20.0, 300.0])
    drives.write(tau)
    fpl = drives.settings.force_per_lsb(0)
    drives.read(0.01)  # the write has been handled once the next answer is in
    assert [sv.goal_current() for sv in emu.servos.values()] == [round(x / fpl) for x in tau]
    assert emu.cycles == 1
    assert drives.feedback.position[2] > -0.1  # 300 N up: the third slider moved up
    drives.write(np.array([1e6, -1e6, 0.0]))  # clamped to the current limit
    drives.read(0.02)
    assert [sv.goal_current() for sv in emu.servos.values()] == [1193, -1193, 0]
    drives.disable()
    drives.configure()  # answers again: the disable reached every servo
    assert not any(sv.torque for sv in emu.servos.values())
    assert all(sv.goal_current() == 0 for sv in emu.servos.values())
    assert drives.stats["timeouts"] == 0 and drives.stats["crc_errors"] == 0


@pytest.mark.realtime
def test_goal_current_rounding_is_carried_to_the_next_write(drives, emulator):
    """Goal Current is whole LSB (0.75 N here): over n writes of one force the servos get n
    times its LSB value to within half an LSB, not n times its rounding."""
    emu = emulator.emu
    drives.configure()
    drives.enable()
    drives.read(0.0)
    fpl = drives.settings.force_per_lsb(0)
    tau = np.array([10.0, -20.2, 60.0])  # 13.3, -26.9, 79.8 LSB
    sums = np.zeros(3)
    c0 = emu.cycles
    for k in range(8):
        drives.write(tau)
        deadline = time.monotonic() + 5.0
        while emu.cycles < c0 + k + 1 and time.monotonic() < deadline:  # the emulator thread took it
            time.sleep(0.0005)
        sums += [sv.goal_current() for sv in emu.servos.values()]
    assert np.all(np.abs(sums - 8 * tau / fpl) <= 0.5), (sums, 8 * tau / fpl)
    assert not np.allclose(sums, 8 * np.round(tau / fpl))  # plain rounding would give these
    drives.disable()


@pytest.mark.realtime
def test_servo_status_error_is_reported(drives):
    drives.configure()
    with pytest.raises(DriveError, match="servo 2: access error during model write"):
        drives.transact(2, dxp.write(2, ADDR_MODEL_NUMBER, b"\0\0"), 0, "model write")


@pytest.mark.realtime
def test_retries_recover_lost_and_corrupted_answers(tcp_emulator, config, host_probe):
    emulator = tcp_emulator  # pkrt hil's link: a pty waits for the kernel's normal-priority workers

    def attempt(kind):
        emulator.emu.arm(kind, 0, config.rate_hz)
        emulator.emu.fault_period = 2  # every second status packet of servo 2
        drives = DynamixelDrives.from_config(config, {"port": emulator.port})
        try:
            drives.configure()
            drives.enable()
            fresh = []
            for k in range(12):
                fresh.append(drives.read(k * 0.01).fresh)
                drives.write(np.zeros(3))
            drives.disable()
        except DriveError as e:  # a timeout too many for fail_cycles: its events say when
            fresh = [str(e)]
        finally:
            drives.close()
        return fresh, dict(drives.stats), dict(emulator.emu.counts), found(drives, emulator.emu)

    def found(drives, emu) -> list[tuple[float, str]]:
        """Answers late, and timeouts that no packet the emulator dropped or corrupted explains
        (one each, within 0.1 s after it): the emulator thread did not answer in time, which
        the host-pause probe must explain."""
        late = [(t, what) for t, what in drives.events if "late answers" in what]
        timeouts = [(t, what) for t, what in drives.events if what.startswith("timeout")]
        return late + unmatched(timeouts, emu.spoilt_at, 0.1)

    try:
        for kind in ("drop", "corrupt"):
            fresh, stats, counts, _ = judge(lambda: attempt(kind), host_probe, find=lambda r: r[3],
                                            priority=RUN_PRIORITY)
            assert all(f is True for f in fresh), (kind, fresh, stats)
            assert stats["retries"] >= 5, (stats, counts)
            if kind == "corrupt":
                assert stats["crc_errors"] >= 5
    finally:
        emulator.emu.fault_period = 1


@pytest.mark.realtime
def test_non_finite_torque_command_faults_with_torque_off(drives, emulator):
    drives.configure()
    drives.enable()
    drives.read(0.0)
    with pytest.raises(DriveError, match="non-finite torque command on axis 1"):
        drives.write(np.array([0.0, np.nan, 0.0]))
    assert drives.state is DriveState.FAULTED and not drives.torque_on
    drives.transact(1, dxp.ping(1), 3, "ping")  # handled after the torque-off packets
    assert not any(sv.torque for sv in emulator.emu.servos.values())


@pytest.mark.realtime
@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_each_fault_is_detected_with_torque_off_within_3_cycles(kind, emulator, config, host_probe):
    # on the pty: the TCP emulator thread sometimes answers no ping after a `delay` run
    inject = 5

    def attempt():
        """(drives, read index of the DriveError, its reason, anomalies): an answer late or
        missing before the injection, a late answer after it (not for `delay`), a fault before
        the injection."""
        emulator.emu.arm(kind, inject, config.rate_hz)
        drives = DynamixelDrives.from_config(config, {"port": emulator.port})
        try:
            drives.configure()
            drives.enable()
        except BaseException:  # closed: a setup timeout is judged, the next attempt opens its own
            drives.close()
            raise
        t_inject = reason = raised_at = None
        for k in range(inject + 6):
            if k == inject:
                t_inject = time.monotonic()
            try:
                fb = drives.read(k * 0.01)
            except DriveError as e:
                reason, raised_at = str(e), k
                break
            drives.write(20.0 * (-0.1 - fb.position) + np.array([0.0, 0.0, 60.0]))
        found = [(t, what) for t, what in drives.events
                 if t_inject is None or t < t_inject or (kind != "delay" and "late answers" in what)]
        if raised_at is not None and raised_at < inject:
            found.append((drives.fault_time, f"fault before the injection: {reason}"))
        if found:
            drives.close()
        return drives, raised_at, reason, sorted(found)

    drives, raised_at, reason, _ = judge(attempt, host_probe, find=lambda r: r[3], priority=RUN_PRIORITY)
    assert raised_at is not None, f"{kind} not detected: {drives.info()} {emulator.emu.report()}"
    assert inject <= raised_at <= inject + 3, (reason, drives.info(), emulator.emu.report())
    assert drives.fault_reason == reason and drives.state is DriveState.FAULTED
    drives.close()  # waits for nothing; let the emulator take the last packets in
    wait_for(lambda: emulator.emu.torque_off_cycle is not None, 0.5, "the emulator's torque off")
    emu = emulator.emu
    assert emu.injected_cycle == inject
    assert emu.torque_off_cycle is not None and emu.torque_off_cycle - emu.injected_cycle <= 3
    assert emu.nonzero_after_off == 0
    # a delayed answer is either missed (its read timed out) or taken late (after the timeout, in
    # the next cycle's read): whichever of the driver's two checks trips first names it
    expected = {"drop": ("no valid feedback",), "delay": ("no valid feedback", "answers arriving late"),
                "corrupt": ("no valid feedback",), "drive-fault": ("overload error",),
                "sever": ("no valid feedback",), "nan": ("implausible feedback",)}
    assert any(e in reason for e in expected[kind]), reason


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.binary(min_size=1, max_size=60), min_size=1, max_size=4))
def test_driver_fed_garbage_raises_only_drive_error(config, chunks):
    """Whatever comes back on the line, read() returns feedback or raises DriveError."""
    master, slave, port = open_pty()
    d = DynamixelDrives.from_config(config, {"port": port, "timeout": 0.001, "fail_cycles": 2})

    def answer(data: bytes) -> None:
        os.read(master, 4096)  # the request
        os.write(master, data)

    try:
        d._open()
        for c in chunks:
            t = threading.Thread(target=answer, args=(dxp.status(1, 0, struct.pack("<ii", 0, -10240)) + c,))
            t.start()
            try:
                d.read(0.0)
            except DriveError:
                break
            finally:
                t.join()
    finally:
        d.close()
        os.close(master)
        os.close(slave)


def test_emulator_control_table_rules(emulator):
    """The emulated servos answer as X-series servos do (no line: bytes in, bytes out)."""
    emu = emulator.emu
    emu.arm(None, 0, 100.0)

    def ask(pkt):
        p = dxp.PacketParser()
        for _, b in emu.handle(pkt):
            p.feed(b)
        out = []
        while (x := p.next()) is not None:
            out.append(x)
        return out

    assert [a.id for a in ask(dxp.ping(dxp.BROADCAST_ID))] == [1, 2, 3]  # broadcast ping: all answer
    assert ask(dxp.ping(9)) == []  # nobody there
    assert ask(dxp.write(1, 11, b"\x00"))[0].error == 0  # operating mode, torque off: fine
    assert ask(dxp.write(1, 64, b"\x01"))[0].error == 0  # torque on
    assert ask(dxp.write(1, 11, b"\x03"))[0].error == 7  # EEPROM locked while torque is on
    assert ask(dxp.write(1, 64, b"\x02"))[0].error == 4  # torque enable 2: data range error
    assert ask(dxp.write(1, 132, b"\0\0\0\0"))[0].error == 7  # present position is read-only
    assert ask(dxp.write(1, 102, struct.pack("<h", 2000)))[0].error == 6  # beyond the current limit
    assert ask(dxp.instruction(1, 0x7F))[0].error == 2  # unknown instruction
    assert ask(dxp.read(2, 146, 4))[0].error == 7  # past the table
    emu.servos[3].shutdown(0x20)
    a = ask(dxp.read(3, 70, 1))[0]
    assert a.error == dxp.ERR_ALERT and a.params == b"\x20"
    assert ask(dxp.write(3, 64, b"\x01"))[0].error == dxp.ERR_ALERT | 1  # no torque before a reboot
    emu.arm(None, 0, 100.0)
    assert emu.servos[3].table[70] == 0 and not emu.servos[1].torque  # re-arming power-cycles


@pytest.mark.realtime
def test_wall_clock_plant_moves_between_messages(drives, emulator):
    """With the wall clock, the plant moves with the time between messages, not per write."""
    emu = emulator.emu
    emu.clock = "wall"
    try:
        drives.configure()
        drives.enable()
        z0 = drives.read(0.0).position[2]
        drives.write(np.array([0.0, 0.0, 300.0]))  # up, against gravity
        z1 = drives.read(0.0).position[2]
        threading.Event().wait(0.05)
        z2 = drives.read(0.05).position[2]
        # 50 ms under (300 N - weight) lifts the slider by millimetres; the first read came
        # right after the write
        assert z0 <= z1 < z2 and z2 - z0 > 1e-3 and z2 - z1 > 5 * (z1 - z0)
    finally:
        emu.clock = "cycle"


def test_fresh_answers_low_in_their_tick_bin_are_not_late():
    """The Realtime Tick counts whole ms: at 1 kHz (timeout 0.6 ms, under a tick) a fresh answer
    stamped low in its 1 ms bin after a first one stamped high in its bin was called late (three
    such cycles stopped a run at its 3rd-4th cycle); a stamp older than the request by more than
    a tick plus the timeout still is."""
    shipped = load_machine("orthoglide-serial")
    assert shipped.rate_hz == 1000.0 and shipped.drives.timeout < 1e-3
    d = DynamixelDrives.from_config(shipped, {"port": "loop://"})
    # servo clock = host clock + 0.05 ms of handling; tick = whole ms of the servo clock
    for t_ms in (1000.0, 1000.9, 1001.92, 1002.5, 1003.97):
        assert not d._stale(0, int(t_ms + 0.05), t_ms), t_ms
    assert d._stale(0, 1002, 1004.9)  # stamped 2.9 ms before this request went out: an old answer
    assert not d._stale(1, 5000, 5000.0) and d._stale(1, 4997, 5000.5)


@pytest.mark.realtime
def test_leftovers_of_an_older_request_are_counted_not_spoiling_a_complete_cycle(any_link_drives, host_probe):
    """Answers to an older request still in the line (a delayed transaction) are dropped and
    counted as late; this cycle's own answers, all there and Realtime-Tick fresh, are fresh
    feedback (they were discarded with the leftovers: one delayed transaction then made three
    cycles without fresh feedback at 1 kHz and stopped the run). Over TCP the drain took one
    byte of the leftovers (pyserial's socket:// in_waiting is 0 or 1) and left the rest to be
    read as the next cycle's answers."""
    drives = any_link_drives
    drives.configure()
    drives.enable()

    def attempt():
        drives.read(0.0)
        before, n_events = drives.stats["late_answers"], len(drives.events)
        drives._send(drives._sync_read)  # a request whose answers nobody waits for
        time.sleep(0.05)  # its 3 answers arrive: leftovers for the next read
        fb = drives.read(0.001)
        timeouts = [(t, w) for t, w in drives.events[n_events:] if w.startswith("timeout")]  # a stall timed it out
        return fb.fresh, drives.stats["late_answers"] - before, dict(drives.stats), timeouts

    fresh, late, stats, _ = judge(attempt, host_probe, find=lambda r: r[3], priority=RUN_PRIORITY)
    assert late == 3, stats
    assert fresh, stats


def test_an_answer_right_behind_an_older_one_replaces_it(config):
    """After a stall the servos' line can deliver an older request's answers late and this
    request's right behind them, both stamped in the same ms: the later answer of each servo is
    the feedback, the earlier is counted late (the earlier was taken: a reading one or two
    periods old, 1.6 mm on an axis at 0.8 m/s, and a force kick the next cycle)."""
    server = socket.create_server(("127.0.0.1", 0))
    # a 20 ms window without retry (10 Hz): the scripted peer is a thread of this process
    raw = {**config.raw, "drives": {**config.raw["drives"], "timeout": 0.02, "retries": 0, "bus_watchdog_ms": 0}}
    slow = dataclasses.replace(config, rate_hz=10.0, raw=raw).with_drives()
    d = DynamixelDrives.from_config(slow, {"port": f"socket://127.0.0.1:{server.getsockname()[1]}"})
    d._open()
    peer, _ = server.accept()
    try:
        def answers(pos: int) -> bytes:
            return b"".join(dxp.status(i, 0, struct.pack("<HBBhhii", 100, 0, 0, 0, 0, 0, pos)) for i in (1, 2, 3))

        def serve():  # one Sync Read in: the old answers, then the new ones right behind
            buf = b""
            while b"\x82" not in buf[7:8]:
                buf += peer.recv(64)
            peer.sendall(answers(-10240) + answers(-10000))

        th = threading.Thread(target=serve, daemon=True)
        th.start()
        fb = d.read(0.0)
        th.join(5)
        assert fb.fresh and d.stats["late_answers"] == 3, d.stats
        np.testing.assert_allclose(fb.position, -10000 * d._k_pos[0], rtol=1e-12)
    finally:
        d.close()
        peer.close()
        server.close()


def test_cycle_clock_undoes_a_skip_that_was_a_late_write(emulator):
    """Cycle clock: writes on a 1 ms grid; one delivered 1.3 ms late looks like a skipped
    period, the next one lands in the same period and undoes it, so the plant ends on the
    loop's period count (a late write used to leave it a period ahead for good); a real skip
    (the loop's overrun: no write for a period) stays counted."""
    emu = emulator.emu
    emu.dt = 1e-3
    emu._t0, emu._k_plant = None, 0
    steps = []

    def write(now):  # the plant's period accounting of one Goal Current write
        d = emu._periods_at_write(now)
        emu._k_plant += max(d, 0) + (d >= 0)
        steps.append(d)

    for k in range(5):
        write(10.0 + k * 1e-3 + 2e-4)
    write(10.0 + 5e-3 + 1.5e-3)  # cycle 5's write 1.3 ms late: in period 6
    write(10.0 + 6e-3 + 2e-4)  # cycle 6's, on time: the same period
    write(10.0 + 7e-3 + 2e-4)
    assert steps == [0, 0, 0, 0, 0, 1, -1, 0] and emu._k_plant == 8
    assert (emu.skipped_periods, emu.late_writes) == (0, 1)
    write(10.0 + 9e-3 + 2e-4)  # the loop skipped cycle 8 (an overrun)
    write(10.0 + 10e-3 + 2e-4)
    assert steps[-2:] == [1, 0], (steps, emu._k_plant, emu._t0)
    assert emu._k_plant == 11 and emu.skipped_periods == 1
