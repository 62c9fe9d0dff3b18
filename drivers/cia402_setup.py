"""Configuring CiA 402 drives before the loop, through the ``canopen`` package (CiA 301 SDO and
NMT): SDO transfers reported as one-line ``DriveError``s, NMT commands, PDO (re)mapping, the
walk to Operation enabled, the drive-side safety net (heartbeat consumer 0x1016, SYNC
monitoring 0x1006 / 0x2F10) and the master's heartbeat. ``cia402_lifecycle`` (the drives' bring-up)
calls these in its configure and enable steps; its cyclic path does not use them.
"""

from __future__ import annotations

import logging
import os
import struct
import time

import can
import canopen

from . import cia402_protocol as p
from .base import DriveError

# canopen logs SDO aborts and timeouts itself; the driver reports them as one-line DriveErrors
logging.getLogger("canopen").addHandler(logging.NullHandler())


def upload(node, index: int, sub: int, fmt: str) -> int:
    """SDO upload of ``index:sub`` from ``node`` (a ``canopen.RemoteNode``), unpacked with the
    ``struct`` format ``fmt`` (short data padded with zeros)."""
    try:
        data = node.sdo.upload(index, sub)
        return struct.unpack(fmt, data[: struct.calcsize(fmt)].ljust(struct.calcsize(fmt), b"\0"))[0]
    except canopen.SdoAbortedError as e:
        raise DriveError(f"node {node.id}: SDO upload of 0x{index:04X}:{sub:02X} aborted: {e}") from None
    except (canopen.SdoCommunicationError, can.CanError) as e:
        raise DriveError(f"node {node.id}: SDO upload of 0x{index:04X}:{sub:02X} failed: {e}") from None


def download(node, index: int, sub: int, fmt: str, value: int) -> None:
    """SDO download of ``value`` (packed with the ``struct`` format ``fmt``) to ``index:sub``."""
    try:
        node.sdo.download(index, sub, struct.pack(fmt, value))
    except canopen.SdoAbortedError as e:
        raise DriveError(f"node {node.id}: SDO download to 0x{index:04X}:{sub:02X} aborted: {e}") from None
    except (canopen.SdoCommunicationError, can.CanError) as e:
        raise DriveError(f"node {node.id}: SDO download to 0x{index:04X}:{sub:02X} failed: {e}") from None


def send_nmt(bus, node_ids, command: int) -> None:
    """The NMT ``command`` (CiA 301: COB-ID 0x000, command and node id) to every node."""
    try:
        for n in node_ids:
            bus.send(can.Message(arbitration_id=p.NMT_COB_ID, data=[command, n], is_extended_id=False))
    except (can.CanError, OSError, ValueError) as e:
        raise DriveError(f"CAN send failed (NMT): {e}") from None


def map_pdo(node, comm: int, mapping: int, cob_id: int, trans_type: int, entries) -> None:
    """CiA 301 PDO (re)mapping: invalidate, transmission type, entries, count, validate."""
    download(node, comm, 1, "<I", p.PDO_COB_ID_INVALID | cob_id)
    download(node, comm, 2, "<B", trans_type)
    download(node, mapping, 0, "<B", 0)
    for k, e in enumerate(entries, 1):
        download(node, mapping, k, "<I", e)
    download(node, mapping, 0, "<B", len(entries))
    download(node, comm, 1, "<I", cob_id)


def enable_operation(node, deadline: float, enable_timeout: float, states: list, i: int) -> None:
    """Walk drive ``node`` through the CiA 402 state machine to Operation enabled by SDO
    (statusword 0x6041 read, controlword 0x6040 written: 0x0006 -> 0x0007 -> 0x000F, a Fault
    reset with the 0x0080 edge) by ``deadline`` (time.monotonic(); ``enable_timeout`` s after
    the walk began, for the message). ``states[i]`` follows every state read."""
    last_cw = -1
    while True:
        sw = upload(node, p.STATUSWORD, 0, "<H")
        state = p.decode_statusword(sw)
        states[i] = state
        if state is p.State.OPERATION_ENABLED:
            return
        if time.monotonic() > deadline:
            raise DriveError(f"node {node.id}: not in Operation enabled after {enable_timeout:g} s "
                             f"(state {state.name}, statusword 0x{sw:04X})")
        cw = p.next_controlword(state, max(last_cw, 0))
        if cw is None:
            time.sleep(0.001)
            continue
        download(node, p.CONTROLWORD, 0, "<H", cw)
        last_cw = cw


def configure_heartbeat_consumer(node, master_node_id: int, consumer_timeout_ms: int) -> None:
    """Heartbeat consumer entry 0x1016 sub 1 = master node id << 16 | consumer time (ms),
    written through 0 as CiA 301 asks."""
    hint = ("the drive has no heartbeat consumer; heartbeat_ms = 0 in [drives] runs without the "
            "drive-side watchdog")
    try:
        entries = upload(node, p.HEARTBEAT_CONSUMER_TIME, 0, "<B")
    except DriveError as e:
        raise DriveError(f"{e}: {hint}") from None
    if entries < 1:
        raise DriveError(f"node {node.id}: 0x1016 has {entries} consumer entries: {hint}")
    download(node, p.HEARTBEAT_CONSUMER_TIME, 1, "<I", 0)
    download(node, p.HEARTBEAT_CONSUMER_TIME, 1, "<I", p.heartbeat_consumer_entry(master_node_id, consumer_timeout_ms))


def configure_sync_monitoring(node, cycle_period_us: int, sync_loss_cycles: int) -> None:
    """0x1006 = the loop period (us), 0x2F10 = ``sync_loss_cycles``; with 0, the limit is
    set to 0 where the drive has it (monitoring off) and left alone where it does not."""
    if not sync_loss_cycles:
        try:
            node.sdo.download(p.SYNC_LOSS_LIMIT, 0, struct.pack("<H", 0))
        except canopen.SdoAbortedError as e:
            if e.code not in (0x06020000, 0x06090011):  # object / sub-index does not exist
                raise DriveError(f"node {node.id}: SDO download to 0x{p.SYNC_LOSS_LIMIT:04X}:00 aborted: {e}") from None
        except (canopen.SdoCommunicationError, can.CanError) as e:
            raise DriveError(f"node {node.id}: SDO download to 0x{p.SYNC_LOSS_LIMIT:04X}:00 failed: {e}") from None
        return
    hint = "the drive has no SYNC monitoring here; sync_loss_cycles = 0 in [drives] runs without it"
    try:
        download(node, p.COMM_CYCLE_PERIOD, 0, "<I", cycle_period_us)
        download(node, p.SYNC_LOSS_LIMIT, 0, "<H", sync_loss_cycles)
    except DriveError as e:
        raise DriveError(f"{e}: {hint}") from None


def start_heartbeat(bus, master_node_id: int, heartbeat_ms: int, interface: str):
    """The master's heartbeat (COB-ID 0x700 + ``master_node_id``, NMT state Operational) every
    ``heartbeat_ms`` until the bus closes or the process ends: python-can's periodic send task,
    returned; the first frame at once."""
    msg = can.Message(arbitration_id=p.HEARTBEAT_BASE + master_node_id, data=p.heartbeat(), is_extended_id=False)
    try:
        bus.send(msg, 0.01)
        return bus.send_periodic(msg, heartbeat_ms / 1000.0)
    except (can.CanError, OSError, ValueError, NotImplementedError) as e:
        raise DriveError(f"CAN interface {interface!r}: cannot send the master heartbeat: {e}") from None


def heartbeat_above_caller(task) -> str:
    """Put the periodic send task's thread (python-can's ``ThreadBasedCyclicSendTask``) one
    SCHED_FIFO priority above the calling thread when the caller runs SCHED_FIFO; returns what
    was done. A new thread inherits its creator's policy, priority and CPU: at the loop's own
    priority on the loop's CPU it would run only while the loop sleeps (SCHED_FIFO does not
    share a CPU among equals), so a loop that polls its TPDO window without sleeping silences the
    heartbeat, and the drives stop on the consumer time. Above the loop it takes the CPU when
    due (a few tens of us every ``heartbeat_ms``). The kernel's broadcast manager (SocketCAN) has
    no thread: nothing to do."""
    thread = getattr(task, "thread", None)
    tid = getattr(thread, "native_id", None)
    if tid is None:
        return "no thread (the interface sends the heartbeat itself)"
    try:
        if os.sched_getscheduler(0) != os.SCHED_FIFO:
            return "inherited (the caller is not SCHED_FIFO)"
        prio = min(os.sched_getparam(0).sched_priority + 1, os.sched_get_priority_max(os.SCHED_FIFO))
        os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(prio))
    except (OSError, AttributeError) as e:
        return f"not changed: {e}"
    return f"SCHED_FIFO {prio} (one above the caller)"
