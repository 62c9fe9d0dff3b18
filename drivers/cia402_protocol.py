"""CiA 301 / CiA 402 protocol constants and pure encoders/decoders (no bus, no state).

Shared by the CiA 402 driver (``pkrt.drivers.cia402``) and the drive emulator
(``pkrt.hil.cia402_emulator``). Everything here follows the specifications byte for byte:
CiA 301 (COB-IDs of the predefined connection set, SYNC, EMCY, SDO, NMT) and CiA 402
(controlword 0x6040 commands, statusword 0x6041 states, modes of operation 0x6060).
"""

from __future__ import annotations

import enum
import struct

# -- CiA 301 predefined connection set (11-bit COB-IDs) ---------------------------------------
NMT_COB_ID = 0x000
SYNC_COB_ID = 0x080
EMCY_BASE = 0x080  # + node id
TPDO_BASE = (0x180, 0x280, 0x380, 0x480)  # + node id, TPDO1..4 (drive -> master)
RPDO_BASE = (0x200, 0x300, 0x400, 0x500)  # + node id, RPDO1..4 (master -> drive)
SDO_TX_BASE = 0x580  # + node id, server -> client
SDO_RX_BASE = 0x600  # + node id, client -> server
HEARTBEAT_BASE = 0x700

NMT_START = 0x01
NMT_STOP = 0x02
NMT_PRE_OPERATIONAL = 0x80
NMT_RESET_NODE = 0x81
NMT_RESET_COMMUNICATION = 0x82

# NMT states as a heartbeat frame (COB-ID 0x700 + node id, 1 byte) reports them (CiA 301 7.2.8.3.2)
NMT_STATE_BOOT_UP = 0x00
NMT_STATE_STOPPED = 0x04
NMT_STATE_OPERATIONAL = 0x05
NMT_STATE_PRE_OPERATIONAL = 0x7F
HEARTBEAT_CONSUMER_TIME = 0x1016  # sub 1..n: u32 = node id << 16 | consumer time in ms
PRODUCER_HEARTBEAT_TIME = 0x1017  # u16, ms
EMCY_HEARTBEAT = 0x8130  # life guard or heartbeat error

PDO_COB_ID_INVALID = 0x80000000  # bit 31 of the COB-ID entry (sub-index 1): PDO not valid
PDO_MAX_BITS = 64  # a classical CAN frame carries at most 8 bytes of mapped objects
PDO_MAX_ENTRIES = 8  # mapping sub-indices 1..8 (the most 8-bit objects a PDO can hold)

# SYNC monitoring (off while either is 0): CiA 301 0x1006 and a manufacturer-specific limit
COMM_CYCLE_PERIOD = 0x1006  # u32, us: the master's SYNC period (0: not used)
SYNC_LOSS_LIMIT = 0x2F10  # u16, manufacturer-specific: SYNCs missed in a row before the drive
#                           faults (tripped (limit + 0.5) * 0x1006 after the last SYNC; 0: off)
EMCY_SYNC_LOSS = 0x8130  # what the drive reports on a SYNC loss (life guard / heartbeat class)

# SDO abort codes (CiA 301 7.2.4.3.17) the emulated drives answer with
ABORT_NOT_MAPPABLE = 0x06040041  # object cannot be mapped to the PDO
ABORT_PDO_LENGTH = 0x06040042  # number and length of the objects to be mapped would exceed PDO length
ABORT_VALUE_RANGE = 0x06090030  # value range of parameter exceeded

# -- CiA 402 objects -----------------------------------------------------------------------------
CONTROLWORD = 0x6040
STATUSWORD = 0x6041
MODES_OF_OPERATION = 0x6060
MODES_OF_OPERATION_DISPLAY = 0x6061
POSITION_ACTUAL = 0x6064
VELOCITY_ACTUAL = 0x606C
TARGET_TORQUE = 0x6071
MAX_TORQUE = 0x6072
RATED_TORQUE = 0x6076
TORQUE_ACTUAL = 0x6077
ABORT_CONNECTION_OPTION = 0x6007  # i16: action on a heartbeat event, bus-off, NMT stop/reset
MODE_CST = 10  # cyclic synchronous torque mode

# abort connection option codes (0x6007, CiA 402): what a drive does when the connection to
# its master is lost (heartbeat event, bus-off, ...); 0 = no action, < 0 manufacturer-specific
ABORT_FAULT = 1  # fault signal: Fault reaction active -> Fault
ABORT_DISABLE_VOLTAGE = 2  # disable voltage command: Switch on disabled (torque off at once)
ABORT_QUICK_STOP = 3  # quick stop command: Quick stop active -> Switch on disabled
ABORT_CODES = {"fault": ABORT_FAULT, "disable-voltage": ABORT_DISABLE_VOLTAGE, "quick-stop": ABORT_QUICK_STOP}

# controlword commands (CiA 402, table "device control commands")
CW_DISABLE_VOLTAGE = 0x0000
CW_QUICK_STOP = 0x0002
CW_SHUTDOWN = 0x0006
CW_SWITCH_ON = 0x0007  # also "disable operation" from Operation enabled
CW_DISABLE_OPERATION = 0x0007
CW_ENABLE_OPERATION = 0x000F
CW_FAULT_RESET = 0x0080  # acts on the 0 -> 1 edge of bit 7

# PDO mapping entries (index << 16 | sub-index << 8 | length in bits)
MAP_CONTROLWORD = 0x60400010
MAP_TARGET_TORQUE = 0x60710010
MAP_STATUSWORD = 0x60410010
MAP_POSITION_ACTUAL = 0x60640020
MAP_VELOCITY_ACTUAL = 0x606C0020

# cyclic frame layouts, little endian (CiA 301: PDO data is packed LSB first)
RPDO1 = struct.Struct("<Hh")  # controlword, target torque (per mille of rated torque)
TPDO1 = struct.Struct("<Hi")  # statusword, position actual value (increments)
TPDO2 = struct.Struct("<i")  # velocity actual value (increments/s)
EMCY = struct.Struct("<HB5s")  # error code, error register, manufacturer-specific bytes

INT32_INVALID = -0x80000000  # reported for a non-finite or unmeasurable value; always rejected
INT16_MAX = 0x7FFF


class State(enum.IntEnum):
    """CiA 402 power drive system states."""

    NOT_READY_TO_SWITCH_ON = 0
    SWITCH_ON_DISABLED = 1
    READY_TO_SWITCH_ON = 2
    SWITCHED_ON = 3
    OPERATION_ENABLED = 4
    QUICK_STOP_ACTIVE = 5
    FAULT_REACTION_ACTIVE = 6
    FAULT = 7
    UNKNOWN = 8  # a bit pattern the specification does not define


# statusword -> state: (mask, value) pairs from the CiA 402 statusword table
_SW_TABLE = (
    (0x4F, 0x00, State.NOT_READY_TO_SWITCH_ON),  # x0xx 0000
    (0x4F, 0x40, State.SWITCH_ON_DISABLED),  # x1xx 0000
    (0x6F, 0x21, State.READY_TO_SWITCH_ON),  # x01x 0001
    (0x6F, 0x23, State.SWITCHED_ON),  # x01x 0011
    (0x6F, 0x27, State.OPERATION_ENABLED),  # x01x 0111
    (0x6F, 0x07, State.QUICK_STOP_ACTIVE),  # x00x 0111
    (0x4F, 0x0F, State.FAULT_REACTION_ACTIVE),  # x0xx 1111
    (0x4F, 0x08, State.FAULT),  # x0xx 1000
)

# state -> the statusword a drive reports in it (bit 4 "voltage enabled" set when powered)
STATUSWORD_OF = {
    State.NOT_READY_TO_SWITCH_ON: 0x0000,
    State.SWITCH_ON_DISABLED: 0x0040,
    State.READY_TO_SWITCH_ON: 0x0021,
    State.SWITCHED_ON: 0x0033,
    State.OPERATION_ENABLED: 0x0037,
    State.QUICK_STOP_ACTIVE: 0x0017,
    State.FAULT_REACTION_ACTIVE: 0x001F,
    State.FAULT: 0x0008,
}


def decode_statusword(sw: int) -> State:
    """The CiA 402 state a statusword (0x6041) reports."""
    for mask, value, state in _SW_TABLE:
        if sw & mask == value:
            return state
    return State.UNKNOWN


def next_controlword(state: State, last_cw: int) -> int | None:
    """The controlword that moves a drive in ``state`` one step towards Operation enabled
    (0x0006 -> 0x0007 -> 0x000F; Fault: 0x0000 then the 0x0080 edge), or None when the drive
    must be left alone (already enabled, or in a transient state)."""
    if state is State.SWITCH_ON_DISABLED:
        return CW_SHUTDOWN
    if state is State.READY_TO_SWITCH_ON:
        return CW_SWITCH_ON
    if state is State.SWITCHED_ON:
        return CW_ENABLE_OPERATION
    if state is State.FAULT:
        return CW_DISABLE_VOLTAGE if last_cw & 0x80 else CW_FAULT_RESET
    if state is State.QUICK_STOP_ACTIVE:
        return CW_DISABLE_VOLTAGE
    return None


class Command(enum.Enum):
    """Device control commands a controlword encodes (drive side)."""

    DISABLE_VOLTAGE = "disable voltage"
    QUICK_STOP = "quick stop"
    SHUTDOWN = "shutdown"
    SWITCH_ON = "switch on / disable operation"
    ENABLE_OPERATION = "switch on + enable operation"
    FAULT_RESET = "fault reset"
    NONE = "none"  # bit 7 held high without an edge


def decode_controlword(cw: int, previous: int) -> Command:
    """The command of controlword ``cw`` given the previous one (fault reset is an edge)."""
    if cw & 0x80:
        return Command.FAULT_RESET if not previous & 0x80 else Command.NONE
    if not cw & 0x02:
        return Command.DISABLE_VOLTAGE  # 0xxx xx0x
    if not cw & 0x04:
        return Command.QUICK_STOP  # 0xxx x01x
    if not cw & 0x01:
        return Command.SHUTDOWN  # 0xxx x110
    if not cw & 0x08:
        return Command.SWITCH_ON  # 0xxx 0111
    return Command.ENABLE_OPERATION  # 0xxx 1111


def heartbeat(state: int = NMT_STATE_OPERATIONAL) -> bytes:
    """A heartbeat frame payload (COB-ID 0x700 + producer node id): the producer's NMT state."""
    return bytes((state,))


def heartbeat_consumer_entry(producer: int, time_ms: int) -> int:
    """A heartbeat consumer time entry (0x1016 sub 1..n, u32): bits 23..16 the producer's node
    id, bits 15..0 the consumer time in ms (0: entry not used); bits 31..24 reserved (0)."""
    if not 0 <= producer <= 0x7F or not 0 <= time_ms <= 0xFFFF:
        raise ValueError(f"heartbeat consumer entry: node id {producer} or time {time_ms} ms out of range")
    return producer << 16 | time_ms


def decode_heartbeat_consumer_entry(entry: int) -> tuple[int, int]:
    """(producer node id, consumer time in ms) of a 0x1016 entry."""
    return entry >> 16 & 0xFF, entry & 0xFFFF


# -- EMCY (CiA 301 7.2.7) -------------------------------------------------------------------------
_EMCY_CLASSES = (
    (0xFFFF, 0x0000, "error reset or no error"),
    (0xFFFF, 0x8110, "CAN overrun (objects lost)"),
    (0xFFFF, 0x8120, "CAN in error passive mode"),
    (0xFFFF, 0x8130, "life guard or heartbeat error"),
    (0xFFFF, 0x8140, "recovered from bus off"),
    (0xFFFF, 0x8150, "CAN-ID collision"),
    (0xFFFF, 0x8210, "PDO not processed due to length error"),
    (0xFFFF, 0x8220, "PDO length exceeded"),
    (0xFFFF, 0x8240, "unexpected SYNC data length"),
    (0xFFFF, 0x8250, "RPDO timeout"),
    (0xFF00, 0x1000, "generic error"),
    (0xFF00, 0x2100, "current, device input side"),
    (0xFF00, 0x2200, "current inside the device"),
    (0xFF00, 0x2300, "current, device output side"),
    (0xF000, 0x2000, "current"),
    (0xFF00, 0x3100, "mains voltage"),
    (0xFF00, 0x3200, "voltage inside the device"),
    (0xFF00, 0x3300, "output voltage"),
    (0xF000, 0x3000, "voltage"),
    (0xFF00, 0x4100, "ambient temperature"),
    (0xFF00, 0x4200, "device temperature"),
    (0xF000, 0x4000, "temperature"),
    (0xF000, 0x5000, "device hardware"),
    (0xFF00, 0x6100, "internal software"),
    (0xFF00, 0x6200, "user software"),
    (0xFF00, 0x6300, "data set"),
    (0xF000, 0x6000, "device software"),
    (0xF000, 0x7000, "additional modules"),
    (0xFF00, 0x8100, "communication"),
    (0xFF00, 0x8200, "protocol error"),
    (0xF000, 0x8000, "monitoring"),
    (0xF000, 0x9000, "external error"),
    (0xFF00, 0xF000, "additional functions"),
    (0xFF00, 0xFF00, "device specific"),
)
_ERROR_REGISTER_BITS = ("generic", "current", "voltage", "temperature", "communication",
                        "device profile specific", "reserved", "manufacturer specific")


def emcy_text(code: int, register: int) -> str:
    """A readable description of an EMCY error code and error register (CiA 301)."""
    what = "unknown error class"
    for mask, value, name in _EMCY_CLASSES:
        if code & mask == value:
            what = name
            break
    bits = [n for i, n in enumerate(_ERROR_REGISTER_BITS) if register >> i & 1]
    return f"EMCY 0x{code:04X} ({what}), error register 0x{register:02X} ({', '.join(bits) or 'none'})"


def encode_emcy(code: int, register: int, vendor: bytes = b"\0" * 5) -> bytes:
    """An EMCY frame payload: error code (u16), error register (u8), 5 vendor bytes."""
    return EMCY.pack(code, register, vendor[:5].ljust(5, b"\0"))


# -- SocketCAN error frames (linux/can/error.h), as python-can reports them -----------------------
CAN_ERR_BUSOFF = 0x040
CAN_ERR_DLC = 8
_CAN_ERR_CLASSES = ((0x001, "TX timeout"), (0x002, "lost arbitration"), (0x004, "controller problem"),
                    (0x008, "protocol violation"), (0x010, "transceiver status"), (0x020, "no ACK on transmission"),
                    (0x040, "bus-off"), (0x080, "bus error"), (0x100, "controller restarted"))


def error_frame_text(can_id: int) -> str:
    """The error classes of a SocketCAN error frame (its CAN ID without CAN_ERR_FLAG)."""
    names = [n for bit, n in _CAN_ERR_CLASSES if can_id & bit]
    return f"CAN error frame 0x{can_id:03X} ({', '.join(names) or 'unspecified'})"
