"""python-can interface ``unix_pair``: a CAN bus between two processes on one host as two Unix
datagram sockets, one per end; each end sends to the other's and never hears its own frames.

Why not UDP (``udp_pair``, ``udp_multicast``): on this 2-vCPU VM a multicast ``sendto`` goes
through the IP stack and the loopback device's softirq, 5-20 µs a frame, and the drive emulator
sends 6 TPDOs a cycle (docs/drives.md). A Unix datagram goes straight to the peer socket's
queue: the frame that wakes the peer costs about 10 µs, the ones behind it while it runs
about 3 µs.

``channel`` is this end's socket address and ``peer`` the other end's: a filesystem path, or
``@name`` for Linux's abstract namespace (no file to clean up; what ``pkrt hil`` uses). A
frame is one datagram: ``<dIBB`` (timestamp in s since the epoch at send, which stands for the
time the frame was on the wire; arbitration id; flags; data length) then the data bytes. Like
the UDP interfaces it has no arbitration, bus timing or error frames; it exists for HIL on one
host (production: ``socketcan`` or another real interface).

Registered with python-can as an entry point (``pyproject.toml``): ``can.Bus(interface=
"unix_pair", channel="@pkrt-drv", peer="@pkrt-emu")``.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import time

import can

HEADER = struct.Struct("<dIBB")  # timestamp (s, epoch), arbitration id, flags, data length
EXTENDED, REMOTE, ERROR, FD, BRS, ESI = 1, 2, 4, 8, 16, 32
MAX_DATA = 64  # CAN FD
RECV_BYTES = HEADER.size + MAX_DATA


def address(name: str) -> str:
    """``@name`` -> the abstract-namespace address; a path as it is."""
    return "\0" + name[1:] if name.startswith("@") else name


def encode(msg: can.Message, stamp: float) -> bytes:
    """One frame as a datagram (``stamp``: s since the epoch)."""
    flags = ((EXTENDED if msg.is_extended_id else 0) | (REMOTE if msg.is_remote_frame else 0)
             | (ERROR if msg.is_error_frame else 0) | (FD if msg.is_fd else 0)
             | (BRS if msg.bitrate_switch else 0) | (ESI if msg.error_state_indicator else 0))
    data = bytes(msg.data) if msg.data is not None else b""
    return HEADER.pack(stamp, msg.arbitration_id, flags, msg.dlc if msg.is_remote_frame else len(data)) + data


def decode(datagram: bytes, channel: str) -> can.Message:
    """A datagram -> the frame; ValueError (one line) when it is not one."""
    if len(datagram) < HEADER.size:
        raise ValueError(f"{len(datagram)} bytes, shorter than a frame header ({HEADER.size})")
    stamp, arb, flags, n = HEADER.unpack_from(datagram)
    data = datagram[HEADER.size:]
    remote = bool(flags & REMOTE)
    if n > MAX_DATA or (not remote and n != len(data)):
        raise ValueError(f"data length {n} with {len(data)} data bytes")
    return can.Message(timestamp=stamp, arbitration_id=arb, is_extended_id=bool(flags & EXTENDED),
                       is_remote_frame=remote, is_error_frame=bool(flags & ERROR), is_fd=bool(flags & FD),
                       bitrate_switch=bool(flags & BRS), error_state_indicator=bool(flags & ESI),
                       dlc=n, data=None if remote else data, channel=channel, check=True)


class UnixPairBus(can.BusABC):
    """Receive on Unix datagram socket ``channel``, send to ``peer`` (see the module docstring)."""

    def __init__(self, channel: str, peer: str, **kwargs):
        if not channel or not peer or address(channel) == address(peer):
            raise can.CanInitializationError(
                f"unix_pair: channel and peer must be two different socket addresses, got {channel!r} and {peer!r}")
        super().__init__(channel, **kwargs)
        self._peer = address(peer)
        self._path = None if channel.startswith("@") else channel
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            if self._path is not None and os.path.exists(self._path):
                os.unlink(self._path)  # a socket file left by an end that died
            self._sock.bind(address(channel))
        except OSError as e:
            self._sock.close()
            raise can.CanInitializationError(f"unix_pair: cannot bind {channel!r}: {e.strerror or e}") from None
        self._sock.setblocking(False)
        self._connected = False
        self._connect()
        self.channel_info = f"unix_pair {channel} -> {peer}"

    def _recv_internal(self, timeout):
        # a frame already queued (the rest of a burst): one system call; else wait for one
        try:
            datagram = self._sock.recv(RECV_BYTES)
        except BlockingIOError:
            if timeout == 0.0 or not select.select([self._sock], [], [], timeout)[0]:
                return None, False
            try:
                datagram = self._sock.recv(RECV_BYTES)
            except BlockingIOError:
                return None, False
        if not self._connected:
            self._connect()  # the peer is up: connect back (see _connect)
        try:
            return decode(datagram, self.channel_info), False
        except ValueError as e:
            raise can.CanOperationError(f"unix_pair: a received datagram is not a frame: {e}") from None

    def _connect(self) -> bool:
        """Connect to the peer (once it is bound): a Unix datagram socket whose peer is connected
        back to it is not held to the host's max_dgram_qlen (10 datagrams here), only to its
        send buffer (some 270 frames): 12 TPDOs of 6 drives fit in one burst."""
        try:
            self._sock.connect(self._peer)
        except (FileNotFoundError, ConnectionRefusedError):
            return False
        self._connected = True
        return True

    def send(self, msg: can.Message, timeout=None) -> None:
        if not self._connected and not self._connect():
            return  # no peer listening: on a bus the frame goes unheard (the peer's timeouts tell)
        try:
            self._sock.send(encode(msg, time.time()))
        except ConnectionRefusedError:
            self._connected = False  # the peer went away; a peer bound again is connected at the next send
        except BlockingIOError:  # the peer has not read for a while (tens of ms of frames)
            raise can.CanOperationError("unix_pair: transmit queue full (the peer is not reading)") from None
        except OSError as e:
            raise can.CanOperationError(f"unix_pair: send to {self._peer.lstrip(chr(0))!r} failed: {e.strerror or e}") from None

    def fileno(self) -> int:
        return self._sock.fileno()

    def shutdown(self) -> None:
        super().shutdown()
        self._sock.close()
        if self._path is not None:
            try:
                os.unlink(self._path)
            except OSError:
                pass
