"""pkrt's two-ended python-can interfaces for HIL between processes: ``unix_pair``
(hil/unix_pair.py, two real Unix datagram sockets) and ``udp_pair`` (hil/udp_pair.py, two UDP
multicast groups). Each end hears the other's frames and never its own; for unix_pair every
frame field crosses intact, a burst larger than the host's datagram queue limit arrives whole,
and bad set-ups and garbled datagrams are one line, as is a malformed udp_pair peer."""

from __future__ import annotations

import os
import socket

import can
import pytest

from pkrt.hil.can_hil import udp_channel
from pkrt.hil.unix_pair import address


def _udp_pair():
    (ga, pa), (gb, pb) = udp_channel(), udp_channel()
    a = can.Bus(interface="udp_pair", channel=ga, port=pa, peer=f"{gb}:{pb}")
    b = can.Bus(interface="udp_pair", channel=gb, port=pb, peer=f"{ga}:{pa}")
    return a, b


def _pair(tag: str, a_name: str | None = None, b_name: str | None = None):
    a_name = a_name or f"@pkrt-test-{os.getpid()}-{tag}-a"
    b_name = b_name or f"@pkrt-test-{os.getpid()}-{tag}-b"
    a = can.Bus(interface="unix_pair", channel=a_name, peer=b_name)
    b = can.Bus(interface="unix_pair", channel=b_name, peer=a_name)
    return a, b


@pytest.mark.parametrize("interface", ["unix_pair", "udp_pair"])
def test_each_end_hears_the_other_and_never_itself(interface):
    a, b = _pair("hear") if interface == "unix_pair" else _udp_pair()
    try:
        a.send(can.Message(arbitration_id=0x80, data=b"", is_extended_id=False))
        b.send(can.Message(arbitration_id=0x181, data=bytes(range(8)), is_extended_id=False))
        got_b, got_a = b.recv(1.0), a.recv(1.0)
        assert got_b is not None and got_b.arbitration_id == 0x80 and got_b.dlc == 0
        assert got_a is not None and got_a.arbitration_id == 0x181 and bytes(got_a.data) == bytes(range(8))
        assert a.recv(0.05) is None and b.recv(0.05) is None  # nothing looped back to a sender
    finally:
        a.shutdown()
        b.shutdown()


@pytest.mark.parametrize("msg", [
    can.Message(arbitration_id=0x1ABCDE01, data=b"\x01\x02", is_extended_id=True),
    can.Message(arbitration_id=0x601, is_remote_frame=True, dlc=4, is_extended_id=False),
    can.Message(arbitration_id=0x7FF, data=bytes(range(64)), is_fd=True, bitrate_switch=True,
                error_state_indicator=True, is_extended_id=False),
])
def test_every_frame_field_crosses(msg):
    a, b = _pair("fields")
    try:
        a.send(msg)
        got = b.recv(1.0)
        assert got is not None and got.equals(msg, timestamp_delta=None, check_channel=False, check_direction=False)
        assert got.timestamp > 0
    finally:
        a.shutdown()
        b.shutdown()


def test_a_burst_beyond_the_datagram_queue_limit_arrives_whole():
    """The host queues at most net.unix.max_dgram_qlen (10 here) datagrams for an unconnected
    sender; the ends connect to each other, so a 6-drive cycle's 12 TPDOs, or more, fit."""
    a, b = _pair("burst")
    try:
        for i in range(100):
            a.send(can.Message(arbitration_id=0x180 + i % 12, data=i.to_bytes(2, "little"), is_extended_id=False))
        got = [b.recv(0.5) for _ in range(100)]
        assert [int.from_bytes(m.data, "little") for m in got] == list(range(100))
        assert b.recv(0.0) is None
    finally:
        a.shutdown()
        b.shutdown()


def test_no_peer_yet_frames_go_unheard_then_it_is_reached():
    a = can.Bus(interface="unix_pair", channel=f"@pkrt-test-{os.getpid()}-late-a", peer=f"@pkrt-test-{os.getpid()}-late-b")
    try:
        a.send(can.Message(arbitration_id=0x80, data=b"", is_extended_id=False))  # nobody on the bus: no error
        b = can.Bus(interface="unix_pair", channel=f"@pkrt-test-{os.getpid()}-late-b", peer=f"@pkrt-test-{os.getpid()}-late-a")
        try:
            assert b.recv(0.05) is None  # the frame sent before b existed was not heard
            a.send(can.Message(arbitration_id=0x81, data=b"", is_extended_id=False))
            got = b.recv(1.0)
            assert got is not None and got.arbitration_id == 0x81
        finally:
            b.shutdown()
    finally:
        a.shutdown()


def test_filesystem_sockets_are_removed_at_shutdown(tmp_path):
    pa, pb = str(tmp_path / "a.sock"), str(tmp_path / "b.sock")
    a, b = _pair("fs", pa, pb)
    a.send(can.Message(arbitration_id=0x80, data=b"", is_extended_id=False))
    assert b.recv(1.0) is not None
    a.shutdown()
    b.shutdown()
    assert not os.path.exists(pa) and not os.path.exists(pb)


def test_a_garbled_datagram_is_one_line():
    raw_name, bus_name = f"@pkrt-test-{os.getpid()}-raw", f"@pkrt-test-{os.getpid()}-garbled"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as raw:
        raw.bind(address(raw_name))
        b = can.Bus(interface="unix_pair", channel=bus_name, peer=raw_name)
        try:
            raw.sendto(b"\x01\x02\x03", address(bus_name))
            with pytest.raises(can.CanOperationError, match="unix_pair: a received datagram is not a frame: 3 bytes"):
                b.recv(1.0)
            raw.sendto(bytes(14) + b"\x05", address(bus_name))  # says 0 data bytes, carries 1
            with pytest.raises(can.CanOperationError, match="data length 0 with 1 data bytes"):
                b.recv(1.0)
        finally:
            b.shutdown()


@pytest.mark.parametrize("channel, peer", [("@same", "@same"), ("", "@x"), ("@x", "")])
def test_a_bad_channel_or_peer_is_one_line(channel, peer):
    with pytest.raises(can.CanInitializationError, match="unix_pair: channel and peer must be two different"):
        can.Bus(interface="unix_pair", channel=channel, peer=peer)


def test_an_unbindable_channel_is_one_line(tmp_path):
    with pytest.raises(can.CanInitializationError, match="unix_pair: cannot bind"):
        can.Bus(interface="unix_pair", channel=str(tmp_path / "no-such-dir" / "a.sock"), peer="@x")


@pytest.mark.parametrize("peer", ["239.1.2.3", "10.0.0.1:4000", "239.1.2.3:0", "nonsense:12"])
def test_a_malformed_udp_pair_peer_is_one_line(peer):
    with pytest.raises(can.CanInitializationError, match="udp_pair: peer must be an IPv4 multicast GROUP:PORT"):
        can.Bus(interface="udp_pair", channel="239.1.2.4", port=udp_channel()[1], peer=peer)
