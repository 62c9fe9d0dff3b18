"""CiA 402 over CAN: protocol bytes from CiA 301 / CiA 402, the driver against the drive
emulator on python-can's virtual bus, fault detection with torque off, bad input."""

from __future__ import annotations

import dataclasses
import itertools
import math
import struct
import time

import can
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pkrt.drivers import cia402_protocol as p
from pkrt.drivers.base import DriveConfigError, DriveError, DriveState
from pkrt.drivers.cia402 import CiA402Drives
from pkrt.drivers.sim import Plant
from pkrt.hil.cia402_emulator import FAULT_KINDS, CiA402Emulator
from pkrt.rt.runtime.machine.config import load_machine

from .realtime import RUN_PRIORITY, drive_anomalies, judge
from .waiting import wait_for

pytestmark = pytest.mark.realtime  # wall-clock threads and processes (tests/realtime.py)

RATE = 100.0  # Hz for the bus tests (the HIL rate): slack for a loaded, shared test machine
PERIOD = 1.0 / RATE
_ch = itertools.count()


# -- protocol: statusword, controlword, EMCY, error frames ----------------------------------------
@pytest.mark.parametrize("sw, state", [
    (0x0000, p.State.NOT_READY_TO_SWITCH_ON), (0x0040, p.State.SWITCH_ON_DISABLED),
    (0x0250, p.State.SWITCH_ON_DISABLED), (0x0021, p.State.READY_TO_SWITCH_ON),
    (0x0231, p.State.READY_TO_SWITCH_ON), (0x0023, p.State.SWITCHED_ON), (0x0233, p.State.SWITCHED_ON),
    (0x0027, p.State.OPERATION_ENABLED), (0x1637, p.State.OPERATION_ENABLED),
    (0x0007, p.State.QUICK_STOP_ACTIVE), (0x0017, p.State.QUICK_STOP_ACTIVE),
    (0x000F, p.State.FAULT_REACTION_ACTIVE), (0x001F, p.State.FAULT_REACTION_ACTIVE),
    (0x0008, p.State.FAULT), (0x0218, p.State.FAULT), (0x0001, p.State.UNKNOWN), (0x0061, p.State.UNKNOWN),
])
def test_statusword_states_per_cia402_table(sw, state):
    assert p.decode_statusword(sw) is state


def test_statusword_of_each_state_decodes_back():
    for state, sw in p.STATUSWORD_OF.items():
        assert p.decode_statusword(sw) is state


@given(st.integers(0, 0xFFFF))
def test_statusword_decoder_total(sw):
    assert isinstance(p.decode_statusword(sw), p.State)


@pytest.mark.parametrize("cw, prev, cmd", [
    (0x0006, 0, p.Command.SHUTDOWN), (0x000E, 0, p.Command.SHUTDOWN), (0x0007, 0, p.Command.SWITCH_ON),
    (0x000F, 0, p.Command.ENABLE_OPERATION), (0x0000, 0, p.Command.DISABLE_VOLTAGE),
    (0x000D, 0, p.Command.DISABLE_VOLTAGE), (0x0002, 0, p.Command.QUICK_STOP), (0x000B, 0, p.Command.QUICK_STOP),
    (0x0080, 0x0000, p.Command.FAULT_RESET), (0x0080, 0x0080, p.Command.NONE),
])
def test_controlword_commands_per_cia402_table(cw, prev, cmd):
    assert p.decode_controlword(cw, prev) is cmd


def test_enable_sequence_and_fault_reset_edge():
    S = p.State
    assert [p.next_controlword(s, 0) for s in (S.SWITCH_ON_DISABLED, S.READY_TO_SWITCH_ON, S.SWITCHED_ON)] \
        == [0x0006, 0x0007, 0x000F]
    assert p.next_controlword(S.OPERATION_ENABLED, 0x000F) is None
    assert p.next_controlword(S.FAULT, 0x0000) == 0x0080  # rising edge of bit 7
    assert p.next_controlword(S.FAULT, 0x0080) == 0x0000  # drop it to make the next edge
    assert p.next_controlword(S.QUICK_STOP_ACTIVE, 0x000F) == 0x0000


def test_pdo_and_emcy_layouts_bytes():
    assert p.RPDO1.pack(0x000F, 50) == bytes.fromhex("0f003200")
    assert p.RPDO1.pack(0x000F, -50) == bytes.fromhex("0f00ceff")
    assert p.TPDO1.pack(0x0037, 123456) == bytes.fromhex("370040e20100")
    assert p.TPDO2.pack(-2) == bytes.fromhex("feffffff")
    assert p.encode_emcy(0x2310, 0x03) == bytes.fromhex("1023030000000000")
    assert p.emcy_text(0x2310, 0x03) == ("EMCY 0x2310 (current, device output side), error register 0x03 "
                                         "(generic, current)")
    assert "RPDO timeout" in p.emcy_text(0x8250, 0x11)
    assert "heartbeat" in p.emcy_text(0x8130, 0x10)
    assert p.emcy_text(0x0000, 0).startswith("EMCY 0x0000 (error reset")
    assert p.error_frame_text(0x040) == "CAN error frame 0x040 (bus-off)"
    assert p.error_frame_text(0x024) == "CAN error frame 0x024 (controller problem, no ACK on transmission)"


@given(st.integers(0, 0xFFFF), st.integers(0, 0xFF))
def test_emcy_text_total(code, reg):
    assert p.emcy_text(code, reg).startswith(f"EMCY 0x{code:04X}")


# -- driver and emulator on the virtual bus ------------------------------------------------------
@pytest.fixture(scope="module")
def config():
    c = load_machine("orthoglide-can")
    return dataclasses.replace(c, rate_hz=RATE)


@pytest.fixture(scope="module")
def plant(config):
    return Plant.from_config(config)


THETA0 = np.array([-0.1, -0.1, -0.1])


def make_pair(config, plant, fault=None, inject_cycle=None, **over):
    ch = f"test-cia402-{next(_ch)}"
    plant.reset(THETA0)
    # two missed windows tolerated (the HIL setting): a shared test machine can stall a thread
    # for a period; a third miss is a fault, still within 3 cycles of an injected fault
    drives = CiA402Drives.from_config(config, {"interface": "virtual", "channel": ch, "tpdo_timeout": 0.5 * PERIOD,
                                               "max_missed_cycles": 2, **over})
    em = CiA402Emulator.from_config(config, ch, fault=fault, plant=plant)
    em.inject_cycle = inject_cycle
    return drives, em, ch


def hold_torque(fb) -> np.ndarray:
    """A stiff PD about THETA0 plus the weight of the machine on the vertical axis (N)."""
    return 3000.0 * (THETA0 - fb.position) - 150.0 * fb.velocity + np.array([0.0, 0.0, 60.0])


def run_cycles(drives, n: int) -> None:
    t0 = time.perf_counter()
    for k in range(n):
        fb = drives.read(k * PERIOD)
        drives.write(hold_torque(fb))
        rest = t0 + (k + 1) * PERIOD - time.perf_counter()
        if rest > 0:
            time.sleep(rest)


def frames(bus) -> list[tuple[int, bytes]]:
    out = []
    msg = bus.recv(0.0)
    while msg is not None:
        out.append((msg.arbitration_id, bytes(msg.data)))
        msg = bus.recv(0.0)
    return out


def test_configuration_enable_and_cyclic_frames_byte_exact(config, plant):
    drives, em, ch = make_pair(config, plant)
    sniff = can.Bus(interface="virtual", channel=ch)
    em.start()
    try:
        drives.configure()
        drives.enable()
        # heartbeats (0x701-0x77F) run on their own timers and may fall between a request and its answer
        cfg_frames = [f for f in frames(sniff) if not 0x700 < f[0] <= 0x77F]
        h = bytes.fromhex
        # NMT (CiA 301): enter pre-operational, then start, node 1
        assert (0x000, h("8001")) in cfg_frames and (0x000, h("0101")) in cfg_frames
        # SDO expedited upload of the device type and its answer (profile 402, servo)
        i = cfg_frames.index((0x601, h("4000100000000000")))
        assert cfg_frames[i + 1] == (0x581, h("4300100092010200"))
        # rated torque 0x6076 = 200000 mN (u32 upload: command 0x43)
        assert (0x581, h("43766000400d0300")) in cfg_frames
        # modes of operation 0x6060 = 10 (1-byte download 0x2F), confirmed by 0x6061 (upload 0x4F)
        i = cfg_frames.index((0x601, h("2f6060000a000000")))
        assert cfg_frames[i + 1] == (0x581, h("6060600000000000"))
        assert (0x581, h("4f6160000a000000")) in cfg_frames
        # PDO mapping (4-byte downloads 0x23): RPDO1 invalidated, mapped, validated
        rpdo = [(0x601, h(x)) for x in ("2300140101020080", "2f001402ff000000", "2f00160000000000",
                                        "2300160110004060", "2300160210007160", "2f00160002000000",
                                        "2300140101020000")]
        pos = [cfg_frames.index(f) for f in rpdo]
        assert pos == sorted(pos)
        assert (0x601, h("23001a0110004160")) in cfg_frames and (0x601, h("23001a0220006460")) in cfg_frames
        assert (0x601, h("23011a0120006c60")) in cfg_frames and (0x601, h("2301180181020000")) in cfg_frames
        # controlword 0x6040 (2-byte downloads 0x2B): 0x0006 -> 0x0007 -> 0x000F
        cws = [d[4] for cid, d in cfg_frames if cid == 0x601 and d[:4] == h("2b406000")]
        assert cws == [0x06, 0x07, 0x0F]
        # statusword answers (2-byte uploads 0x4B): switch on disabled, ready, switched on, enabled
        sws = [d[4] for cid, d in cfg_frames if cid == 0x581 and d[:4] == h("4b416000")]
        assert sws == [0x40, 0x21, 0x33, 0x37]
        assert drives.state is DriveState.ENABLED and em.state == [p.State.OPERATION_ENABLED] * 3

        fb = drives.read(0.0)
        if not fb.fresh:  # the emulator thread was not scheduled in time: one more window
            fb = drives.read(PERIOD)
        theta = plant.theta.copy()  # the plant moves on SYNC only
        assert fb.fresh and np.allclose(fb.position, theta, atol=1e-6)
        assert np.allclose(fb.position, THETA0, atol=1e-3)
        drives.write(np.array([10.0, -10.0, 0.3]))  # 50, -50, 1.5 -> 2 per mille of 200 N
        seen: list[tuple[int, bytes]] = []

        def last_window():  # the frames since the last SYNC, once its TPDOs are in and the RPDOs applied
            seen.extend(frames(sniff))
            syncs = [i for i, f in enumerate(seen) if f[0] == 0x080]
            cyc = seen[syncs[-1]:] if syncs else []
            done = {0x181, 0x281, 0x201, 0x202, 0x203} <= {cid for cid, _ in cyc} and em.target[0] != 0
            return cyc if done else None

        cyc = wait_for(last_window, 1.0, "the TPDOs after SYNC and the drives' new targets")
        assert cyc[0] == (0x080, b"")  # SYNC: COB-ID 0x080, no data
        tp = dict(cyc)
        assert tp[0x181] == h("3700") + struct.pack("<i", round(theta[0] * 1e6))
        assert len(tp[0x281]) == 4
        assert tp[0x201] == h("0f003200") and tp[0x202] == h("0f00ceff") and tp[0x203] == h("0f000200")
        assert np.allclose(em.target, [50, -50, 2])
        drives.write(np.array([10.0, -10.0, 0.3]))  # the half per mille rounded up last time is carried
        assert dict(frames(sniff))[0x203] == h("0f000100")  # the virtual bus delivers at send
        wait_for(lambda: em.target[2] == 1, 0.02, "the carried rounding at node 3")  # inside the SYNC watchdog
        assert np.allclose(em.target, [50, -50, 1])

        drives.disable()  # torque off: disable operation (0x0007), zero torque, all drives at once
        off = dict(frames(sniff))  # the virtual bus delivers at send
        assert off[0x201] == off[0x202] == off[0x203] == h("07000000")
        wait_for(lambda: em.state == [p.State.SWITCHED_ON] * 3, 1.0, "every drive in Switched on")
    finally:
        drives.close()
        sniff.shutdown()
        em.stop()
    assert em.error is None


def test_tracking_cycles_and_fault_reset_on_enable(config, plant):
    drives, em, ch = make_pair(config, plant)
    em.state[1] = p.State.FAULT  # node 2 powers up in Fault: enable must reset it (0x0080 edge)
    em.start()
    try:
        drives.configure()
        drives.enable()
        run_cycles(drives, 40)
        assert drives.feedback.fresh
        assert np.all(np.abs(drives.feedback.position - THETA0) < 1e-2)  # held near THETA0 by the PD
        assert em.cycle == drives.cycle == 39
    finally:
        drives.close()
        em.stop()
    assert em.error is None and em.ever_enabled == [True] * 3


@pytest.mark.parametrize("fault", FAULT_KINDS)
def test_each_fault_detected_and_torque_off_within_3_cycles(config, plant, fault, host_probe):
    expect = {"drop": "TPDO timeout: TPDO1 of node 1, TPDO2 of node 1 not", "delay": "TPDO timeout",
              "drive-fault": "node 1: EMCY 0x2310", "bus-off": "bus-off", "sever": "TPDO timeout",
              "nan": "node 1: invalid position actual value 0x80000000"}[fault]

    def attempt():
        drives, em, ch = make_pair(config, plant, fault=fault, inject_cycle=10)
        # the delay of the stepped HIL (hil/timing.py): longer than the 3 windows of the detection,
        # so no late TPDO lands in one of them. (The wall-clock 0.9 period put each late TPDO
        # 0.1 period before the next SYNC: a loaded host delaying the emulator's thread by that
        # much slipped it into the next window, read as timely, and detection came a cycle late.)
        em.delay = 5 * PERIOD
        em.start()
        try:
            drives.configure()
            drives.enable()
            with pytest.raises(DriveError) as e:
                run_cycles(drives, 30)
            detected = drives.cycle
            if expect in str(e.value):  # torque off at the drives: the master's disable, or their own monitoring
                wait_for(lambda: em.torque_off_cycle is not None, 1.0, f"torque off at the drives ({fault})")
        finally:
            drives.close()
            em.stop()
        return drives, em, detected, str(e.value)

    def found(r):
        """A fault other than the injected one, or one before the injection: each is judged
        by the host-pause probe at its time (drivers' ``fault_time``, ``events``)."""
        drives, em, detected, reason = r
        late = [] if detected <= 13 or expect not in reason else \
            [(drives.fault_time or time.monotonic(), f"{fault} detected at cycle {detected}, injected at 10")]
        return drive_anomalies(drives, expect, fault, em.injected_cycle, detected) + late

    drives, em, detected, reason = judge(attempt, host_probe, find=found, priority=RUN_PRIORITY)
    assert em.error is None
    assert em.injected_cycle == 10
    assert drives.state is DriveState.FAULTED and drives.fault_reason == reason
    assert not drives.torque_on
    assert 10 <= detected <= 13, (detected, reason)
    assert em.torque_off_cycle is not None and em.torque_off_cycle - detected <= 3
    assert em.torque_off_cycle is not None and em.torque_off_cycle - em.injected_cycle <= 3, em.report()
    assert expect in reason


def test_garbage_frames_raise_only_drive_error(config, plant):
    drives, em, ch = make_pair(config, plant)
    em.start()
    try:
        drives.configure()
        drives.enable()
        ids = [0x000, 0x080, 0x081, 0x082, 0x181, 0x182, 0x183, 0x281, 0x282, 0x283, 0x201, 0x581, 0x601, 0x7FF]

        @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
        @given(st.one_of(st.sampled_from(ids), st.integers(0, 0x7FF)), st.binary(max_size=8),
               st.booleans(), st.booleans())
        def feed(cid, data, err, rtr):
            msg = can.Message(arbitration_id=cid, data=data, is_error_frame=err and not rtr,
                              is_remote_frame=rtr and not err, is_extended_id=False)
            try:
                drives._on_frame(msg, True)
            except DriveError as e:
                assert str(e)

        feed()
        sender = can.Bus(interface="virtual", channel=ch)

        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
        @given(st.lists(st.tuples(st.sampled_from(ids), st.binary(max_size=8)), max_size=6))
        def over_the_bus(batch):
            for cid, data in batch:  # reaches the emulator too: it must shrug garbage off
                sender.send(can.Message(arbitration_id=cid, data=data, is_extended_id=False))
            try:
                drives.read(0.0)
            except DriveError as e:
                assert str(e)

        over_the_bus()
        sender.shutdown()
    finally:
        drives.close()
        em.stop()
    assert em.error is None


def test_garbage_tpdo_lengths_and_invalid_values(config, plant):
    drives, em, ch = make_pair(config, plant)
    em.start()
    try:
        drives.configure()
        drives.enable()
        with pytest.raises(DriveError, match=r"node 2: TPDO1 of 3 bytes, expected 6"):
            drives._on_frame(can.Message(arbitration_id=0x182, data=b"\x37\x00\x00", is_extended_id=False), True)
        assert drives.state is DriveState.FAULTED and not drives.torque_on
        with pytest.raises(DriveError, match=r"node 3: invalid velocity actual value 0x80000000"):
            drives._on_frame(can.Message(arbitration_id=0x283, data=b"\x00\x00\x00\x80", is_extended_id=False), True)
        assert math.isnan(drives.feedback.velocity[2])
        with pytest.raises(DriveError, match=r"node 1: drive left Operation enabled, state FAULT \(statusword 0x0008\)"):
            drives._on_frame(can.Message(arbitration_id=0x181, data=bytes(6)[:0] + b"\x08\x00" + bytes(4),
                                         is_extended_id=False), True)
        # an EMCY "error reset / no error" is not a fault
        drives._on_frame(can.Message(arbitration_id=0x081, data=bytes(8), is_extended_id=False), True)
    finally:
        drives.close()
        em.stop()


# -- configuration errors ------------------------------------------------------------------------
@pytest.mark.parametrize("over, field", [
    ({"node_ids": [1, 1, 2]}, "node_ids"), ({"node_ids": [1, 2]}, "node_ids"), ({"node_ids": [0, 1, 2]}, "node_ids"),
    ({"interface": "nosuchbus"}, "interface"), ({"rated_torque": -1.0}, "rated_torque"),
    ({"increments_per_unit": [1, 2]}, "increments_per_unit"), ({"bitrate": 125000}, "bitrate"),
    ({"tpdo_timeout": 1.0}, "tpdo_timeout"), ({"max_missed_cycles": 1.5}, "max_missed_cycles"),
    ({"bitrate": True}, "bitrate"),
])
def test_bad_drive_settings_name_file_table_field(over, field):
    c = load_machine("orthoglide-can")
    with pytest.raises(DriveConfigError, match=rf"orthoglide-can.toml: \[drives\], field '{field}'"):
        CiA402Drives.from_config(c, over)


def test_no_drive_on_the_bus_is_a_clear_drive_error(config):
    drives = CiA402Drives.from_config(config, {"interface": "virtual", "channel": f"empty-{next(_ch)}",
                                               "sdo_timeout": 0.02})
    with pytest.raises(DriveError, match=r"node 1: SDO upload of 0x1000:00 failed"):
        drives.configure()
    drives.close()


def test_rated_torque_mismatch_refused(config, plant):
    drives, em, ch = make_pair(config, plant, rated_torque=250.0)
    em.start()
    try:
        with pytest.raises(DriveError, match=r"node 1: rated torque 0x6076 = 200 .* rated_torque = 250"):
            drives.configure()
    finally:
        drives.close()
        em.stop()


def test_enable_timeout_takes_torque_off_again(config, plant):
    drives, em, ch = make_pair(config, plant, enable_timeout=0.05)
    em.mode[2] = 0  # node 3 refuses Operation enabled: its mode of operation is not CST
    em.start()
    try:
        drives.configure()
        em.mode[2] = 0
        with pytest.raises(DriveError, match=r"node 3: not in Operation enabled after 0.05 s \(state SWITCHED_ON"):
            drives.enable()
        drives.disable()
        wait_for(lambda: p.State.OPERATION_ENABLED not in em.state and em.state[0] is p.State.SWITCHED_ON, 1.0,
                 "no drive in Operation enabled, node 1 in Switched on")
    finally:
        drives.close()
        em.stop()


def test_unknown_fault_kind_refused(config, plant):
    with pytest.raises(DriveConfigError, match="unknown CAN fault kind 'corrupt'"):
        CiA402Emulator.from_config(config, "x", fault="corrupt", plant=plant)


class _ScriptedBus:
    """A bus that answers the next SYNC with the frames the test puts in ``answer``."""

    def __init__(self):
        self.rx: list[can.Message] = []
        self.answer: list[can.Message] = []

    def send(self, msg, timeout=None):
        if msg.arbitration_id == p.SYNC_COB_ID:
            self.rx, self.answer = self.answer, []

    def recv(self, timeout=None):
        return self.rx.pop(0) if self.rx else None


def test_stale_position_carried_forward_over_skipped_loop_periods(config):
    """A window without TPDOs after the loop skipped periods (an overrun): the last position
    is carried forward at its velocity over the loop time since its SYNC (it was carried over
    one period per SYNC, i.e. 1 period where 3 had passed)."""
    drives = CiA402Drives.from_config(config, {"interface": "virtual", "channel": "unused",
                                               "max_missed_cycles": 2})
    bus = _ScriptedBus()
    drives._bus, drives._cyclic, drives.torque_on = bus, True, True
    k = 1.0 / drives._si_per_increment[0]  # increments per m

    def tpdos(pos_m, vel):
        out = []
        for n in drives.node_ids:
            out.append(can.Message(arbitration_id=0x180 + n, is_extended_id=False,
                                   data=struct.pack("<Hi", 0x0037, int(round(pos_m * k)))))
            out.append(can.Message(arbitration_id=0x280 + n, is_extended_id=False,
                                   data=struct.pack("<i", int(round(vel * k)))))
        return out

    bus.answer = tpdos(-0.1, 0.5)
    fb = drives.read(0.0)
    assert fb.fresh and fb.position[0] == pytest.approx(-0.1)
    # the loop overran: the next read is 3 periods later, and its TPDOs do not come
    fb = drives.read(3 * drives.period)
    assert not fb.fresh
    np.testing.assert_allclose(fb.position, -0.1 + 0.5 * 3 * drives.period, rtol=0, atol=1e-9)
    # they come back: fresh, and the next miss extrapolates from there by one period
    bus.answer = tpdos(-0.09, 0.5)
    fb = drives.read(4 * drives.period)
    assert fb.fresh and fb.position[0] == pytest.approx(-0.09)
    fb = drives.read(5 * drives.period)
    np.testing.assert_allclose(fb.position, -0.09 + 0.5 * drives.period, rtol=0, atol=1e-9)


def test_emulator_steps_skipped_periods_one_period_at_a_time(config, plant):
    """A SYNC that shows the master skipped periods (an overrun) advances the plant over the
    whole gap; it did so in one plant step of 'substeps' RK4 steps over n periods (coarser
    integration than the loop's), now period by period like an uninterrupted run."""
    drives, em, ch = make_pair(config, plant)
    try:
        em.state = [p.State.OPERATION_ENABLED] * 3
        em.target[:] = [300.0, -200.0, 500.0]  # per mille of the rated force
        em._on_sync(0.0, 1000.0)  # first SYNC: the grid's origin, nothing moves
        em._on_sync(0.0, 1000.0 + 4.3 * em.period)  # the loop skipped 3 periods (0.3: wake-up jitter)
        ref = Plant.from_config(config)
        ref.reset(THETA0)
        tau = em.target * 1e-3 * em.rated
        for _ in range(4):
            ref.step(tau, em.period)
        np.testing.assert_array_equal(em.plant.x, ref.x)  # exact: same plant code and steps, one process
    finally:
        em.bus.shutdown()


def test_the_sync_watchdog_times_the_master_not_a_host_that_held_the_emulator(config, plant):
    """A drive's SYNC watchdog measures the master's silence. When the host held the emulator
    itself (it woke over a period after the time it asked for: this VM stops both CPUs for
    2-5 ms now and then), that time is not the master's: the watchdog skips it and the stall
    is counted. A wake-up late by less than a period changes nothing."""
    drives, em, ch = make_pair(config, plant)
    try:
        em.cycle = 0
        em.state = [p.State.OPERATION_ENABLED] * 3
        em.cycle_period_us = [round(em.period * 1e6)] * 3  # monitoring as the driver configures it
        em.sync_loss_limit = [3] * 3
        em.sync_armed = [True] * 3
        now = 100.0
        em.last_sync = now - 4.0 * em.period  # past the 3.5-period watchdog ...
        em._held(3.0 * em.period)  # ... but the host held this process for 3 periods of it
        em._watchdog(now)
        assert em.state == [p.State.OPERATION_ENABLED] * 3 and em.report()["stalls"] == 1
        em._held(0.5 * em.period)  # ordinary wake-up jitter: not a stall
        em._watchdog(now + 1.0 * em.period)
        assert em.report()["stalls"] == 1 and em.state == [p.State.OPERATION_ENABLED] * 3
        em._watchdog(now + 3.0 * em.period)  # the master silent for 4 periods of the drive's own time
        assert p.State.OPERATION_ENABLED not in em.state
    finally:
        em.bus.shutdown()


def test_a_tpdo_right_behind_its_twin_is_the_newer_sample(config):
    """After a stall the drives can answer two SYNCs at once: the first set of TPDOs (a period
    old) fills the window and the second arrives right behind it. The second is the feedback,
    the first counts as late (the first was taken: a position a period old, 0.8 mm on an axis
    at 0.8 m/s)."""
    ch = f"test-cia402-twin-{next(_ch)}"
    drives = CiA402Drives.from_config(config, {"interface": "virtual", "channel": ch, "max_missed_cycles": 2})
    drives._bus = can.Bus(interface="virtual", channel=ch)
    drives._cyclic, drives.torque_on = True, True
    peer = can.Bus(interface="virtual", channel=ch)
    k = 1.0 / drives._si_per_increment[0]  # increments per m
    try:
        def tpdos(pos_m: float) -> None:
            for n in drives.node_ids:
                peer.send(can.Message(arbitration_id=0x180 + n, is_extended_id=False,
                                      data=struct.pack("<Hi", 0x0037, int(round(pos_m * k)))))
                peer.send(can.Message(arbitration_id=0x280 + n, is_extended_id=False, data=struct.pack("<i", 0)))

        drives.sync()
        tpdos(-0.1008)  # the answer to the SYNC before, late
        tpdos(-0.1)  # this SYNC's
        drives.collect(time.perf_counter() + 0.01)
        fb = drives.publish(0.0)
        assert fb.fresh and drives.late_frames == 6
        np.testing.assert_allclose(fb.position, -0.1, rtol=0, atol=1e-6)
    finally:
        drives._bus.shutdown()
        peer.shutdown()
