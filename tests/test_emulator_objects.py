"""What the emulated devices hold and answer (docs/emulators.md), in one process: the CiA 402
emulator's SYNC monitoring objects as pkrt's driver configures them, its PDO mapping checks,
and the Dynamixel Bulk / Fast instructions byte for byte."""

from __future__ import annotations

import dataclasses
import itertools
import struct

import numpy as np
import pytest
from canopen.sdo import SdoAbortedError

from pkrt.drivers import cia402_protocol as p
from pkrt.drivers import dynamixel_protocol as dxp
from pkrt.drivers.base import DriveError
from pkrt.drivers.cia402 import CiA402Drives
from pkrt.hil.cia402_emulator import CiA402Emulator
from pkrt.hil.cia402_objects import MAPPABLE_RX, MAPPABLE_TX, check_mapping
from pkrt.hil.dynamixel_emulator import build
from pkrt.rt.runtime.machine.config import load_machine

_ch = itertools.count()


# -- CiA 402: PDO mapping rules (CiA 301) -------------------------------------------------------------
def test_mapping_checks():
    check_mapping([p.MAP_STATUSWORD, p.MAP_POSITION_ACTUAL], MAPPABLE_TX)  # 48 bits
    check_mapping([p.MAP_POSITION_ACTUAL, p.MAP_VELOCITY_ACTUAL], MAPPABLE_TX)  # 64 bits: the most
    check_mapping([], MAPPABLE_TX)  # no object: the PDO carries nothing
    cases = [([p.MAP_STATUSWORD, p.MAP_POSITION_ACTUAL, p.MAP_VELOCITY_ACTUAL], MAPPABLE_TX, 0x06040042),
             ([0x60610008] * 9, MAPPABLE_TX, 0x06040042),  # 72 bits in 9 entries
             ([p.MAP_STATUSWORD], MAPPABLE_RX, 0x06040041),  # a statusword is not received
             ([p.MAP_CONTROLWORD, 0], MAPPABLE_RX, 0x06040041),  # a count covering an empty entry
             ([0x60640010], MAPPABLE_TX, 0x06040041)]  # 0x6064 is 32 bits, not 16
    for entries, table, code in cases:
        with pytest.raises(SdoAbortedError) as e:
            check_mapping(entries, table)
        assert e.value.code == code, entries


# -- CiA 402: SYNC monitoring as pkrt's driver configures it ------------------------------------------
@pytest.fixture(scope="module")
def config():
    return dataclasses.replace(load_machine("orthoglide-can"), rate_hz=100.0)


def _configured(config, remove=(), **over):
    ch = f"test-objects-{next(_ch)}"
    drives = CiA402Drives.from_config(config, {"interface": "virtual", "channel": ch, "heartbeat_ms": 0, **over})
    em = CiA402Emulator.from_config(config, ch)
    for node in em.nodes:
        for index in remove:
            del node.object_dictionary[index]
    em.start()
    return drives, em


@pytest.mark.realtime  # SDO transfers to the emulator thread (0.3 s timeout)
def test_driver_configures_sync_monitoring(config):
    drives, em = _configured(config)
    try:
        drives.configure()
        assert em.cycle_period_us == [10000] * 3 and em.sync_loss_limit == [3] * 3  # 100 Hz, 3 missed
        assert em.report()["sync_monitoring"] == [None] * 3  # armed by the first SYNC only
        assert "SYNC monitoring 0x1006 = 10000 us, 0x2F10 = 3 missed" in drives.watchdog_text()
    finally:
        drives.close()
        em.stop()
    assert em.error is None


@pytest.mark.realtime  # SDO transfers to the emulator thread (0.3 s timeout)
def test_sync_monitoring_off_writes_zero_and_tolerates_a_drive_without_the_object(config):
    drives, em = _configured(config, sync_loss_cycles=0)
    em.sync_loss_limit = [7] * 3  # left armed by an earlier session
    try:
        drives.configure()
        assert em.sync_loss_limit == [0] * 3 and em.cycle_period_us == [0] * 3
        assert "SYNC monitoring off" in drives.watchdog_text()
    finally:
        drives.close()
        em.stop()
    drives, em = _configured(config, remove=(p.SYNC_LOSS_LIMIT,), sync_loss_cycles=0)
    try:
        drives.configure()  # nothing to turn off
    finally:
        drives.close()
        em.stop()


def test_sync_monitoring_trips_only_when_configured(config):
    """Nobody configured it: a minute without SYNC leaves the drives enabled. Configured
    (0x1006 = 10 ms, 0x2F10 = 3) and armed by a SYNC: 35 ms of silence is a Fault."""
    em = CiA402Emulator.from_config(config, f"test-objects-{next(_ch)}")
    try:
        em.cycle, em.state = 0, [p.State.OPERATION_ENABLED] * 3
        em.last_sync = 100.0
        em._watchdog(160.0)
        assert em.state == [p.State.OPERATION_ENABLED] * 3 and em.sync_events == []
        for i in range(3):
            em.cycle_period_us[i], em.sync_loss_limit[i] = 10000, 3
        em._watchdog(160.0)  # configured, not armed yet: monitoring starts with a SYNC
        assert em.state == [p.State.OPERATION_ENABLED] * 3
        em.sync_armed = [True] * 3  # (what the next SYNC does)
        assert em.report()["sync_monitoring"] == [35000] * 3
        em._watchdog(100.0 + 0.0349)
        assert em.state == [p.State.OPERATION_ENABLED] * 3
        em._watchdog(100.0 + 0.0351)
        assert em.state == [p.State.FAULT] * 3 and [ev["node"] for ev in em.sync_events] == [1, 2, 3]
    finally:
        em.bus.shutdown()


@pytest.mark.realtime  # SDO transfers to the emulator thread (0.3 s timeout)
def test_a_drive_without_sync_monitoring_is_refused_in_one_line(config):
    drives, em = _configured(config, remove=(p.SYNC_LOSS_LIMIT,))
    try:
        with pytest.raises(DriveError) as e:
            drives.configure()
    finally:
        drives.close()
        em.stop()
    msg = str(e.value)
    assert "\n" not in msg and "0x2F10" in msg and "sync_loss_cycles = 0" in msg, msg


# -- Dynamixel: Bulk and Fast instructions ------------------------------------------------------------
@pytest.fixture(scope="module")
def servos():
    return build("orthoglide-serial")


def _answers(emu, pkt: bytes) -> list[bytes]:
    return [b for _, b in emu.handle(pkt, now=1.0)]


def test_bulk_read_answers_one_status_per_servo_in_order(servos):
    emu = servos
    emu.arm(None, 0, 1000.0)
    out = _answers(emu, dxp.bulk_read([(3, 0, 2), (1, 64, 1), (9, 0, 2), (2, 132, 4)]))  # 9: not on the bus
    pkts = [dxp.decode(b) for b in out]
    assert [(q.id, q.error) for q in pkts] == [(3, 0), (1, 0), (2, 0)]
    assert struct.unpack("<H", pkts[0].params)[0] == 1120 and pkts[1].params == b"\0"
    assert len(pkts[2].params) == 4
    assert _answers(emu, dxp.bulk_read([(1, 140, 10)]))[0] == dxp.status(1, 7)  # past the table: access error
    assert _answers(emu, dxp.instruction(dxp.BROADCAST_ID, dxp.BULK_READ, b"\x01\x00\x00")) == []  # malformed


def test_bulk_write_same_address_is_a_sync_write_else_per_servo(servos):
    emu = servos
    emu.arm(None, 0, 1000.0)
    assert _answers(emu, dxp.bulk_write([(1, 65, b"\x01"), (2, 11, b"\x00"), (3, 98, b"\x02")])) == []
    assert [emu.servos[i].table[a] for i, a in ((1, 65), (2, 11), (3, 98))] == [1, 0, 2]
    for i in (1, 2, 3):
        emu.servos[i].write(11, b"\x00")
        emu.servos[i].write(64, b"\x01")
    goal = [(i, 102, struct.pack("<h", 10 * i)) for i in (1, 2, 3)]
    _answers(emu, dxp.bulk_write(goal))
    assert [emu.servos[i].goal_current() for i in (1, 2, 3)] == [10, 20, 30] and emu.cycles == 1  # one cycle
    for bad in (b"\x01\x66\x00\x02\x00\x05", b"\x01\x66\x00\x00\x00"):  # data short; zero length
        _answers(emu, dxp.instruction(dxp.BROADCAST_ID, dxp.BULK_WRITE, bad))
    assert [emu.servos[i].goal_current() for i in (1, 2, 3)] == [10, 20, 30] and emu.cycles == 1
    assert dxp.parse_bulk_write(b"") is None and dxp.parse_bulk_read(b"\x01" * 6) is None


def test_fast_reads_answer_one_packet_with_a_crc_per_block(servos):
    emu = servos
    emu.arm(None, 0, 1000.0)
    out = _answers(emu, dxp.instruction(dxp.BROADCAST_ID, dxp.FAST_SYNC_READ,
                                        struct.pack("<HH", 0, 2) + bytes((1, 2, 3))))
    assert len(out) == 1
    pkt = out[0]
    assert dxp.decode(pkt).id == dxp.BROADCAST_ID  # a valid status packet as a whole
    blocks, k = [], 8
    while k < len(pkt):
        err, i, data = pkt[k], pkt[k + 1], pkt[k + 2: k + 4]
        crc = pkt[k + 4] | pkt[k + 5] << 8
        assert crc == dxp.crc16(pkt[: k + 4])  # each block: the CRC of the packet up to its data
        blocks.append((i, err, struct.unpack("<H", data)[0]))
        k += 6
    assert blocks == [(1, 0, 1120), (2, 0, 1120), (3, 0, 1120)]
    out = _answers(emu, dxp.instruction(dxp.BROADCAST_ID, dxp.FAST_BULK_READ,
                                        struct.pack("<BHH", 2, 64, 1) + struct.pack("<BHH", 1, 0, 2)))
    assert out == [dxp.fast_status([(2, 0, b"\0"), (1, 0, struct.pack("<H", 1120))])]
    assert _answers(emu, dxp.instruction(1, dxp.FAST_SYNC_READ, b"")) == [dxp.status(1, 2)]  # not broadcast


def test_unsupported_instruction_is_an_instruction_error(servos):
    emu = servos
    emu.arm(None, 0, 1000.0)
    assert _answers(emu, dxp.instruction(2, 0x05)) == [dxp.status(2, 2)]  # Action
    assert _answers(emu, dxp.instruction(dxp.BROADCAST_ID, 0x05)) == []  # broadcast: no answer
    assert np.all(np.isfinite(emu.plant.x))
