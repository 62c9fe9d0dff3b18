"""The ``udp_pair`` python-can interface (hil/udp_pair.py): two real sockets on this host, each
end hears the other's frames and never its own; a malformed peer is one line."""

from __future__ import annotations

import can
import pytest

from pkrt.hil.can_hil import udp_channel


def _pair():
    (ga, pa), (gb, pb) = udp_channel(), udp_channel()
    a = can.Bus(interface="udp_pair", channel=ga, port=pa, peer=f"{gb}:{pb}")
    b = can.Bus(interface="udp_pair", channel=gb, port=pb, peer=f"{ga}:{pa}")
    return a, b


def test_each_end_hears_the_other_and_never_itself():
    a, b = _pair()
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


@pytest.mark.parametrize("peer", ["239.1.2.3", "10.0.0.1:4000", "239.1.2.3:0", "nonsense:12"])
def test_a_malformed_peer_is_one_line(peer):
    with pytest.raises(can.CanInitializationError, match="udp_pair: peer must be an IPv4 multicast GROUP:PORT"):
        can.Bus(interface="udp_pair", channel="239.1.2.4", port=udp_channel()[1], peer=peer)
