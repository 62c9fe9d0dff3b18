"""The object dictionary of one emulated CiA 402 servo drive, as data: every object with its
type, access and default (docs/emulators.md lists them), built in code as a
``canopen.ObjectDictionary`` (``canopen.export_od`` writes it as an EDS file for a master), and
the PDO mapping rules: the objects each direction may map, and CiA 301's checks of a mapping.

PDO mapping (CiA 301): writing the number of mapped objects (sub-index 0 of 0x1600, 0x1A00,
0x1A01) checks the entries: more than 64 bits (8 bytes) in all, or more than 8 entries, is
refused with SDO abort 0x06040042; an entry (or a count covering one) that this drive cannot
map in that direction is refused with 0x06040041 (``check_mapping``; the emulator's SDO write
callback calls it, hil/cia402_canopen.py). The mapping in force is read when the node goes
Operational.
"""

from __future__ import annotations

from canopen import objectdictionary as od
from canopen.objectdictionary import datatypes as dt
from canopen.sdo import SdoAbortedError

from pkrt.drivers import cia402_protocol as p

from .cia402_homing import add_homing_objects


def _var(name: str, index: int, sub: int, data_type: int, access: str, default) -> od.ODVariable:
    v = od.ODVariable(name, index, sub)
    v.data_type, v.access_type, v.default = data_type, access, default
    return v


def build_object_dictionary(node_id: int, rated_mnm: int) -> od.ObjectDictionary:
    """The object dictionary of one emulated CiA 402 servo drive (rated torque in mN m or mN).
    0x2F10 (SYNC loss limit) is this drive's manufacturer-specific object; docs/emulators.md
    lists every object."""
    d = od.ObjectDictionary()
    d.node_id = node_id
    for v in (_var("Device type", 0x1000, 0, dt.UNSIGNED32, "ro", 0x00020192),
              _var("Error register", 0x1001, 0, dt.UNSIGNED8, "ro", 0),
              _var("Communication cycle period", p.COMM_CYCLE_PERIOD, 0, dt.UNSIGNED32, "rw", 0),
              _var("SYNC loss limit", p.SYNC_LOSS_LIMIT, 0, dt.UNSIGNED16, "rw", 0),
              _var("Producer heartbeat time", 0x1017, 0, dt.UNSIGNED16, "rw", 0),
              _var("Abort connection option code", p.ABORT_CONNECTION_OPTION, 0, dt.INTEGER16, "rw", 2),
              _var("Controlword", p.CONTROLWORD, 0, dt.UNSIGNED16, "rw", 0),
              _var("Statusword", p.STATUSWORD, 0, dt.UNSIGNED16, "ro", 0),
              _var("Modes of operation", p.MODES_OF_OPERATION, 0, dt.INTEGER8, "rw", 0),
              _var("Modes of operation display", p.MODES_OF_OPERATION_DISPLAY, 0, dt.INTEGER8, "ro", 0),
              _var("Position actual value", p.POSITION_ACTUAL, 0, dt.INTEGER32, "ro", 0),
              _var("Velocity actual value", p.VELOCITY_ACTUAL, 0, dt.INTEGER32, "ro", 0),
              _var("Target torque", p.TARGET_TORQUE, 0, dt.INTEGER16, "rw", 0),
              _var("Rated torque", p.RATED_TORQUE, 0, dt.UNSIGNED32, "ro", rated_mnm),
              _var("Torque actual value", p.TORQUE_ACTUAL, 0, dt.INTEGER16, "ro", 0)):
        d.add_object(v)
    hb = od.ODRecord("Consumer heartbeat time", p.HEARTBEAT_CONSUMER_TIME)
    hb.add_member(_var("Highest sub-index", p.HEARTBEAT_CONSUMER_TIME, 0, dt.UNSIGNED8, "ro", 1))
    hb.add_member(_var("Consumer heartbeat time 1", p.HEARTBEAT_CONSUMER_TIME, 1, dt.UNSIGNED32, "rw", 0))
    d.add_object(hb)
    pdos = ((0x1400, 0x1600, p.RPDO_BASE[0] + node_id, 0xFF), (0x1800, 0x1A00, p.TPDO_BASE[0] + node_id, 1),
            (0x1801, 0x1A01, p.TPDO_BASE[1] + node_id | p.PDO_COB_ID_INVALID, 1))
    for comm, mapping, cob_id, trans in pdos:
        r = od.ODRecord(f"PDO communication 0x{comm:04X}", comm)
        r.add_member(_var("Highest sub-index", comm, 0, dt.UNSIGNED8, "ro", 2))
        r.add_member(_var("COB-ID", comm, 1, dt.UNSIGNED32, "rw", cob_id))
        r.add_member(_var("Transmission type", comm, 2, dt.UNSIGNED8, "rw", trans))
        d.add_object(r)
        m = od.ODRecord(f"PDO mapping 0x{mapping:04X}", mapping)
        m.add_member(_var("Number of mapped objects", mapping, 0, dt.UNSIGNED8, "rw", 0))
        for k in range(1, 9):
            m.add_member(_var(f"Mapped object {k}", mapping, k, dt.UNSIGNED32, "rw", 0))
        d.add_object(m)
    add_homing_objects(d)
    return d


# objects a PDO may map here, with their struct codes
MAPPABLE_RX = {p.MAP_CONTROLWORD: "H", p.MAP_TARGET_TORQUE: "h"}
MAPPABLE_TX = {p.MAP_STATUSWORD: "H", p.MAP_POSITION_ACTUAL: "i", p.MAP_VELOCITY_ACTUAL: "i",
               0x60770010: "h", 0x60610008: "b"}
MAPPING = {0x1600: MAPPABLE_RX, 0x1A00: MAPPABLE_TX, 0x1A01: MAPPABLE_TX}  # mapping index -> table


def check_mapping(entries: list[int], table: dict) -> None:
    """CiA 301 checks of the PDO mapping ``entries`` (index << 16 | sub << 8 | bits) that a
    master validates by writing their count: SdoAbortedError 0x06040041 for an object this
    drive cannot map in that direction, 0x06040042 for more than 8 entries or 64 bits."""
    if len(entries) > p.PDO_MAX_ENTRIES:
        raise SdoAbortedError(p.ABORT_PDO_LENGTH)
    if any(e not in table for e in entries):
        raise SdoAbortedError(p.ABORT_NOT_MAPPABLE)
    if sum(e & 0xFF for e in entries) > p.PDO_MAX_BITS:
        raise SdoAbortedError(p.ABORT_PDO_LENGTH)
