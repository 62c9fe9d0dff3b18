"""python-can interface ``udp_pair``: a CAN bus between two processes on one host as two UDP
multicast groups, one per direction, so that neither end receives its own frames.

python-can's ``udp_multicast`` sends every frame to one group and port and loops it back to
every member, the sender included: at 1 kHz each end then receives and decodes its own frames
through python-can only to drop them (the emulator its 6 TPDOs a cycle, the driver its SYNC and
3 RPDOs); without them the emulator's CPU per cycle fell 16 % and the driver path 30 % (CHANGELOG.md,
2026-11-23). Here each end listens on its own group and port (``channel``, ``port``: the same socket
set-up as ``udp_multicast``, python-can's ``GeneralPurposeUdpMulticastBus``) and sends to the
other end's (``peer`` = "GROUP:PORT") from a socket that is in no group and bound to no known
port, so it hears nothing. Frames are python-can's udp_multicast datagrams (msgpack), so a
``udp_multicast`` bus on either group and port can listen in. Like ``udp_multicast`` it has no
arbitration, bus timing or error frames; it exists for HIL on one host (production:
``socketcan`` or another real interface).

Registered with python-can as an entry point (``pyproject.toml``): ``can.Bus(interface=
"udp_pair", channel="239.1.2.3", port=43113, peer="239.1.2.4:43114")``.
"""

from __future__ import annotations

import socket
import struct

import can
from can.interfaces.udp_multicast.bus import GeneralPurposeUdpMulticastBus
from can.interfaces.udp_multicast.utils import pack_message, unpack_message


def parse_peer(peer: str) -> tuple[str, int]:
    """"GROUP:PORT" -> (group, port); CanInitializationError (one line) if malformed."""
    group, _, port = str(peer).rpartition(":")
    try:
        socket.inet_aton(group)
        if not (group and 1 <= int(port) <= 65535 and 224 <= int(group.split(".")[0]) <= 239):
            raise ValueError
    except (OSError, ValueError):
        raise can.CanInitializationError(f"udp_pair: peer must be an IPv4 multicast GROUP:PORT, got {peer!r}") from None
    return group, int(port)


class UdpPairBus(can.BusABC):
    """Listen on multicast ``channel``:``port``, send to ``peer`` (IPv4, hop limit 1)."""

    def __init__(self, channel: str, port: int, peer: str, **kwargs):
        self._peer = parse_peer(peer)
        if (channel, int(port)) == self._peer:
            raise can.CanInitializationError("udp_pair: peer is this bus's own group and port (it would hear itself)")
        super().__init__(channel, **kwargs)
        self._listen = GeneralPurposeUdpMulticastBus(channel, int(port), hop_limit=1)
        self._tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._tx.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, struct.pack("@I", 1))
        self._tx.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)  # the peer is on this host
        self.channel_info = f"udp_pair {channel}:{port} -> {peer}"

    def _recv_internal(self, timeout):
        got = self._listen.recv(timeout)
        if not got:
            return None, False
        data, _, stamp = got
        try:
            return unpack_message(data, replace={"timestamp": stamp}, check=True), False
        except Exception as e:  # noqa: BLE001 - a malformed datagram
            raise can.CanOperationError(f"udp_pair: could not unpack a received datagram: {e}") from None

    def send(self, msg: can.Message, timeout=None) -> None:
        try:
            self._tx.sendto(pack_message(msg), self._peer)
        except OSError as e:
            raise can.CanOperationError(f"udp_pair: send to {self._peer[0]}:{self._peer[1]} failed: {e}") from None

    def fileno(self) -> int:
        return self._listen.fileno()

    def shutdown(self) -> None:
        super().shutdown()
        self._listen.shutdown()
        self._tx.close()
