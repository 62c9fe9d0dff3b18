"""Dynamixel Protocol 2.0 packets: framing, byte stuffing, CRC-16 and a streaming parser.

Packet (ROBOTIS e-Manual, Protocol 2.0)::

    FF FF FD 00 | ID | LEN_L LEN_H | INST | PARAMS... | CRC_L CRC_H

LEN counts INST, the (stuffed) parameters and the two CRC bytes. A status packet is an
instruction 0x55 whose first parameter is the error byte. Byte stuffing: in the region
INST..PARAMS every ``FF FF FD`` becomes ``FF FF FD FD`` (before LEN and the CRC are computed),
so the header pattern ``FF FF FD 00`` cannot appear inside a packet. CRC-16: polynomial 0x8005,
initial value 0, no reflection, over everything from the header to the last parameter byte
(after stuffing), sent little-endian. All multi-byte fields are little-endian.

Pure Python on bytes; every malformed input raises :class:`ProtocolError` (a ``DriveError``)
or is skipped and counted by :class:`PacketParser`, never anything else.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from .base import DriveError

HEADER = b"\xff\xff\xfd\x00"
STUFF_FROM = b"\xff\xff\xfd"
STUFF_TO = b"\xff\xff\xfd\xfd"
BROADCAST_ID = 0xFE
MAX_ID = 252

# instructions
PING = 0x01
READ = 0x02
WRITE = 0x03
REBOOT = 0x08
SYNC_READ = 0x82
SYNC_WRITE = 0x83
FAST_SYNC_READ = 0x8A
BULK_READ = 0x92
BULK_WRITE = 0x93
FAST_BULK_READ = 0x9A
STATUS = 0x55

# status error byte: bit 7 = hardware alert, bits 0..6 = error number
ERR_ALERT = 0x80
ERROR_NAMES = {
    1: "result fail",
    2: "instruction error",
    3: "CRC error",
    4: "data range error",
    5: "data length error",
    6: "data limit error",
    7: "access error",
}

# Hardware Error Status (address 70) bits of X-series servos
HARDWARE_ERROR_NAMES = {
    0x01: "input voltage error",
    0x04: "overheating error",
    0x08: "motor encoder error",
    0x10: "electrical shock error",
    0x20: "overload error",
}


class ProtocolError(DriveError):
    """A malformed, truncated or corrupted Dynamixel packet."""


class Packet(NamedTuple):
    """A decoded packet: ``error`` is the status error byte (-1 for instruction packets),
    ``params`` the unstuffed parameters (without the error byte)."""

    id: int
    instruction: int
    error: int
    params: bytes


def _make_table() -> tuple[int, ...]:
    table = []
    for i in range(256):
        crc = i << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x8005) if crc & 0x8000 else (crc << 1)
        table.append(crc & 0xFFFF)
    return tuple(table)


CRC_TABLE = _make_table()  # the e-Manual's crc_table (0x0000, 0x8005, 0x800F, 0x000A, ...)


def crc16(data, crc: int = 0) -> int:
    """CRC-16 of Protocol 2.0 (poly 0x8005, init 0) over ``data`` (bytes-like)."""
    t = CRC_TABLE
    for b in data:
        crc = ((crc << 8) & 0xFFFF) ^ t[((crc >> 8) ^ b) & 0xFF]
    return crc


def stuff(body: bytes) -> bytes:
    """Byte stuffing of the INST..PARAMS region: FF FF FD -> FF FF FD FD."""
    return body.replace(STUFF_FROM, STUFF_TO) if STUFF_FROM in body else body


def unstuff(body: bytes) -> bytes:
    """Inverse of :func:`stuff`: FF FF FD FD -> FF FF FD."""
    return body.replace(STUFF_TO, STUFF_FROM) if STUFF_TO in body else body


def _frame(dxl_id: int, body: bytes) -> bytes:
    body = stuff(body)
    n = len(body) + 2
    if n > 0xFFFF:
        raise ProtocolError(f"packet too long ({n} bytes)")
    pkt = HEADER + bytes((dxl_id, n & 0xFF, n >> 8)) + body
    c = crc16(pkt)
    return pkt + bytes((c & 0xFF, c >> 8))


def _check_id(dxl_id: int, broadcast_ok: bool = True) -> None:
    if not (0 <= dxl_id <= MAX_ID or (broadcast_ok and dxl_id == BROADCAST_ID)):
        raise ProtocolError(f"invalid Dynamixel ID {dxl_id} (0..{MAX_ID}"
                            f"{' or 254' if broadcast_ok else ''})")


def instruction(dxl_id: int, inst: int, params: bytes = b"") -> bytes:
    """An instruction packet (stuffed, with LEN and CRC)."""
    _check_id(dxl_id)
    return _frame(dxl_id, bytes((inst,)) + bytes(params))


def status(dxl_id: int, error: int = 0, params: bytes = b"") -> bytes:
    """A status packet (instruction 0x55) with ``error`` byte and parameters."""
    _check_id(dxl_id, broadcast_ok=False)
    return _frame(dxl_id, bytes((STATUS, error & 0xFF)) + bytes(params))


def ping(dxl_id: int) -> bytes:
    return instruction(dxl_id, PING)


def read(dxl_id: int, address: int, length: int) -> bytes:
    return instruction(dxl_id, READ, struct.pack("<HH", address, length))


def write(dxl_id: int, address: int, data: bytes) -> bytes:
    return instruction(dxl_id, WRITE, struct.pack("<H", address) + bytes(data))


def sync_read(ids, address: int, length: int) -> bytes:
    for i in ids:
        _check_id(i, broadcast_ok=False)
    return instruction(BROADCAST_ID, SYNC_READ, struct.pack("<HH", address, length) + bytes(ids))


def sync_write(address: int, length: int, items) -> bytes:
    """``items``: sequence of (id, data) with len(data) == length."""
    out = bytearray(struct.pack("<HH", address, length))
    for i, data in items:
        _check_id(i, broadcast_ok=False)
        if len(data) != length:
            raise ProtocolError(f"sync write: {len(data)} data bytes for ID {i}, expected {length}")
        out.append(i)
        out += data
    return instruction(BROADCAST_ID, SYNC_WRITE, bytes(out))


def bulk_read(items) -> bytes:
    """Bulk Read (0x92): ``items`` is a sequence of (id, address, length), one status packet
    per servo comes back, in that order."""
    out = bytearray()
    for i, address, length in items:
        _check_id(i, broadcast_ok=False)
        out += struct.pack("<BHH", i, address, length)
    return instruction(BROADCAST_ID, BULK_READ, bytes(out))


def bulk_write(items) -> bytes:
    """Bulk Write (0x93): ``items`` is a sequence of (id, address, data); no status packet."""
    out = bytearray()
    for i, address, data in items:
        _check_id(i, broadcast_ok=False)
        out += struct.pack("<BHH", i, address, len(data)) + bytes(data)
    return instruction(BROADCAST_ID, BULK_WRITE, bytes(out))


def parse_bulk_read(params: bytes) -> list[tuple[int, int, int]] | None:
    """The (id, address, length) entries of Bulk Read parameters; None when malformed."""
    if not params or len(params) % 5:
        return None
    return [struct.unpack_from("<BHH", params, k) for k in range(0, len(params), 5)]


def parse_bulk_write(params: bytes) -> list[tuple[int, int, bytes]] | None:
    """The (id, address, data) entries of Bulk Write parameters; None when malformed."""
    out, k = [], 0
    while k < len(params):
        if k + 5 > len(params):
            return None
        i, address, n = struct.unpack_from("<BHH", params, k)
        if n < 1 or k + 5 + n > len(params):
            return None
        out.append((i, address, bytes(params[k + 5: k + 5 + n])))
        k += 5 + n
    return out or None


def fast_status(blocks) -> bytes:
    """The one status packet answering Fast Sync Read (0x8A) or Fast Bulk Read (0x9A): ID
    0xFE, then per servo ``error, id, data, CRC`` (``blocks``: (id, error, data) in the order
    asked). Each block's CRC is the CRC-16 of the packet from its header to the end of that
    block's data (the servos append to the packet one after the other; the last block's CRC
    is the packet's). Not byte-stuffed (ROBOTIS's SDK does not unstuff fast packets)."""
    n = 1 + sum(4 + len(d) for _, _, d in blocks)
    pkt = bytearray(HEADER + bytes((BROADCAST_ID, n & 0xFF, n >> 8, STATUS)))
    for i, err, data in blocks:
        pkt += bytes((err & 0xFF, i)) + bytes(data)
        c = crc16(pkt)
        pkt += bytes((c & 0xFF, c >> 8))
    return bytes(pkt)


def decode(pkt: bytes) -> Packet:
    """Decode exactly one complete packet; raise :class:`ProtocolError` otherwise."""
    pkt = bytes(pkt)
    if len(pkt) < 10 or not pkt.startswith(HEADER):
        raise ProtocolError(f"not a Protocol 2.0 packet ({len(pkt)} bytes)")
    n = pkt[5] | (pkt[6] << 8)
    if n < 3 or 7 + n != len(pkt):
        raise ProtocolError(f"length field {n} does not match a {len(pkt)}-byte packet")
    c = pkt[-2] | (pkt[-1] << 8)
    if crc16(pkt[:-2]) != c:
        raise ProtocolError(f"CRC mismatch (received 0x{c:04X}, computed 0x{crc16(pkt[:-2]):04X})")
    return _body(pkt[4], unstuff(pkt[7:-2]))


def _body(dxl_id: int, body: bytes) -> Packet:
    inst = body[0]
    if inst == STATUS:
        if len(body) < 2:
            raise ProtocolError(f"status packet from ID {dxl_id} without an error byte")
        return Packet(dxl_id, inst, body[1], body[2:])
    return Packet(dxl_id, inst, -1, body[1:])


def error_text(error: int) -> str:
    """Human-readable status error byte, e.g. 'alert + data range error'."""
    parts = []
    if error & ERR_ALERT:
        parts.append("hardware alert")
    num = error & 0x7F
    if num:
        parts.append(ERROR_NAMES.get(num, f"error {num}"))
    return " + ".join(parts) if parts else "no error"


def hardware_error_text(bits: int) -> str:
    names = [name for b, name in HARDWARE_ERROR_NAMES.items() if bits & b]
    return ", ".join(names) if names else f"0x{bits:02X}"


class PacketParser:
    """Streaming parser: feed bytes as they arrive, take complete packets out.

    Resynchronises on the header after garbage, a bad length or a CRC error; never raises on
    input. Counters: ``garbage`` (bytes skipped), ``crc_errors``, ``bad_length``, ``packets``.
    ``max_length`` bounds the LEN field (a bigger one is taken as garbage).
    """

    def __init__(self, max_length: int = 1024):
        self.buf = bytearray()
        self.max_length = max_length
        self.garbage = 0
        self.crc_errors = 0
        self.bad_length = 0
        self.packets = 0

    def clear(self) -> None:
        """Drop buffered bytes (counted as garbage)."""
        self.garbage += len(self.buf)
        self.buf.clear()

    def feed(self, data) -> None:
        self.buf += data

    def next(self) -> Packet | None:
        """The next complete, valid packet, or None when more bytes are needed."""
        buf = self.buf
        while True:
            i = buf.find(HEADER)
            if i < 0:
                keep = 3 if len(buf) >= 3 else len(buf)  # a header may be split across reads
                while keep and not HEADER.startswith(bytes(buf[len(buf) - keep:])):
                    keep -= 1
                drop = len(buf) - keep
                if drop:
                    self.garbage += drop
                    del buf[:drop]
                return None
            if i:
                self.garbage += i
                del buf[:i]
            if len(buf) < 7:
                return None
            n = buf[5] | (buf[6] << 8)
            if n < 3 or n > self.max_length:
                self.bad_length += 1
                self.garbage += 4
                del buf[:4]
                continue
            total = 7 + n
            if len(buf) < total:
                return None
            if crc16(bytes(buf[: total - 2])) != (buf[total - 2] | (buf[total - 1] << 8)):
                self.crc_errors += 1
                self.garbage += 4
                del buf[:4]
                continue
            dxl_id = buf[4]
            body = unstuff(bytes(buf[7: total - 2]))
            del buf[:total]
            if body[0] == STATUS and len(body) < 2:
                self.bad_length += 1
                continue
            self.packets += 1
            return _body(dxl_id, body)
