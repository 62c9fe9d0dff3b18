"""The lifecycle of ``CiA402Drives`` (drivers/cia402.py) before and after its cyclic path:
``from_config`` (the drives of a ``[drives]`` table, their bus load checked), ``watchdog_text``
(the drive-side safety net in one line), ``configure`` (the bus opened, the master's heartbeat
started, every node checked and mapped through ``canopen``), ``enable`` (NMT start, Operation enabled, the bus handed to the cyclic
path) and ``close``. Functions of the drives object, in the order a run calls them; the SDO and
NMT steps they use are ``cia402_setup``'s.
"""

from __future__ import annotations

import time

import can
import canopen

from . import cia402_protocol as p
from .base import DriveConfigError, DriveError
from .cia402_setup import (configure_heartbeat_consumer, configure_sync_monitoring, download, enable_operation,
                           heartbeat_above_caller, map_pdo, send_nmt, start_heartbeat, upload)


def from_config(cls, config, overrides: dict):
    """The drives of a machine configuration's ``[drives]`` table; ``overrides`` (e.g.
    ``interface``, ``channel``, ``bitrate``) replace its keys."""
    if config.backend != "cia402":
        raise DriveConfigError(f"{config.path}: [drives], field 'backend': expected 'cia402', got {config.backend!r}")
    config = config.with_drives(overrides)  # validated by the schema (pkrt.rt.core.schema.CiA402DrivesTable)
    d = config.drives
    if d.interface not in can.VALID_INTERFACES:
        raise DriveConfigError(f"{config.path}: [drives], field 'interface': unknown python-can interface "
                               f"{d.interface!r}")
    drives = cls(list(d.node_ids), d.rated_torque, d.increments_per_unit, config.rate_hz,
                 interface=d.interface, channel=d.channel, bitrate=d.bitrate, tpdo_timeout=d.tpdo_timeout,
                 max_missed_cycles=d.max_missed_cycles, sdo_timeout=d.sdo_timeout,
                 enable_timeout=d.enable_timeout, heartbeat_ms=d.heartbeat_ms,
                 consumer_timeout_ms=d.consumer_timeout_ms, abort_connection=d.abort_connection,
                 master_node_id=d.master_node_id, bus_options=dict(d.bus_options),
                 sync_loss_cycles=d.sync_loss_cycles)
    if drives.bus_load > 1.0:
        raise DriveConfigError(f"{config.path}: [drives], field 'bitrate': {drives.n_axes} drives at {config.rate_hz:g} Hz need "
                               f"{drives.bus_load:.0%} of {drives.bitrate} bit/s")
    return drives


def watchdog_text(d) -> str:
    """The drive-side safety net in use, one line (for the run summary and log header)."""
    action = f"abort connection 0x6007 = {p.ABORT_CODES[d.abort_connection]} ({d.abort_connection})"
    sync = (f"SYNC monitoring 0x1006 = {d.cycle_period_us} us, 0x2F10 = {d.sync_loss_cycles} missed"
            if d.sync_loss_cycles else "SYNC monitoring off (sync_loss_cycles = 0)")
    if not d.heartbeat_ms:
        return (f"heartbeat off (heartbeat_ms = 0): drives do not notice a lost master; {action} on bus-off; "
                f"{sync}")
    return (f"master heartbeat 0x{p.HEARTBEAT_BASE + d.master_node_id:03X} every {d.heartbeat_ms} ms, "
            f"drive consumer time 0x1016 = {d.consumer_timeout_ms} ms, {action}; {sync}")


def configure(d) -> None:
    """Open the bus (refused in the error state), start the master's heartbeat, reach every
    node through ``canopen`` (pre-operational) and check and configure each."""
    try:
        # no acceptance filters: python-can's software filtering (virtual and others) would
        # also drop error frames, and unknown COB-IDs cost one dict lookup
        d._bus = can.Bus(interface=d.interface, channel=d.channel, bitrate=d.bitrate,
                            **d.bus_options)
    except (can.CanError, OSError, ValueError, ImportError, TypeError) as e:
        raise DriveError(f"cannot open CAN interface {d.interface!r} channel {d.channel!r}: {e}") from None
    try:
        bus_state = d._bus.state  # interfaces that track it (pcan, kvaser, ...); else ACTIVE
    except (can.CanError, NotImplementedError, OSError):
        bus_state = can.BusState.ACTIVE
    if bus_state is can.BusState.ERROR:
        d._bus.shutdown()
        d._bus = None
        raise DriveError(f"CAN interface {d.interface!r} channel {d.channel!r} is in the error state "
                         "(bus-off): check wiring, termination and bitrate")
    start_master_heartbeat(d)
    d._network = canopen.Network(d._bus)
    d._network.notifier = can.Notifier(d._bus, d._network.listeners, 0.05)
    for n in d.node_ids:
        node = canopen.RemoteNode(n, canopen.ObjectDictionary())
        node.sdo.RESPONSE_TIMEOUT = d.sdo_timeout
        d._network.add_node(node)
        d._nodes.append(node)
    send_nmt(d._bus, d.node_ids, p.NMT_PRE_OPERATIONAL)
    for i, node in enumerate(d._nodes):
        configure_node(d, i, node)


def configure_node(d, i: int, node: canopen.RemoteNode) -> None:
    """Node ``node`` (actuator ``i``): device type, rated torque, CST mode, the safety net and
    the PDO mapping."""
    n = node.id
    device_type = upload(node, 0x1000, 0, "<I")
    if device_type & 0xFFFF != 402:
        raise DriveError(f"node {n}: not a CiA 402 drive (device type 0x1000 = 0x{device_type:08X})")
    rated = upload(node, p.RATED_TORQUE, 0, "<I") / 1000.0
    if abs(rated - d.rated_torque[i]) > 1e-3 * d.rated_torque[i]:
        raise DriveError(f"node {n}: rated torque 0x6076 = {rated:g} (N or N m) but the machine "
                         f"configuration says rated_torque = {d.rated_torque[i]:g}")
    download(node, p.MODES_OF_OPERATION, 0, "<b", p.MODE_CST)
    mode = upload(node, p.MODES_OF_OPERATION_DISPLAY, 0, "<b")
    if mode != p.MODE_CST:
        raise DriveError(f"node {n}: mode of operation display 0x6061 = {mode}, expected 10 (cyclic "
                         "synchronous torque)")
    download(node, p.TARGET_TORQUE, 0, "<h", 0)
    configure_watchdog(d, node)
    map_pdo(node, 0x1400, 0x1600, p.RPDO_BASE[0] + n, 0xFF, (p.MAP_CONTROLWORD, p.MAP_TARGET_TORQUE))
    map_pdo(node, 0x1800, 0x1A00, p.TPDO_BASE[0] + n, 1, (p.MAP_STATUSWORD, p.MAP_POSITION_ACTUAL))
    map_pdo(node, 0x1801, 0x1A01, p.TPDO_BASE[1] + n, 1, (p.MAP_VELOCITY_ACTUAL,))


def start_master_heartbeat(d) -> None:
    """The master's heartbeat, every ``heartbeat_ms`` until the bus closes or the process
    ends (python-can's periodic send task; the first frame at once)."""
    if not d.heartbeat_ms:
        return
    d._heartbeat = start_heartbeat(d._bus, d.master_node_id, d.heartbeat_ms, d.interface)
    d.heartbeat_scheduling = heartbeat_above_caller(d._heartbeat)


def configure_watchdog(d, node) -> None:
    """Heartbeat consumer (0x1016 sub 1, through 0), abort connection option (0x6007) and
    SYNC monitoring (0x1006, 0x2F10)."""
    if d.heartbeat_ms:
        configure_heartbeat_consumer(node, d.master_node_id, d.consumer_timeout_ms)
    download(node, p.ABORT_CONNECTION_OPTION, 0, "<h", p.ABORT_CODES[d.abort_connection])
    configure_sync_monitoring(node, d.cycle_period_us, d.sync_loss_cycles)


def enable(d) -> None:
    """NMT start, every drive to Operation enabled, the last known feedback read by SDO; then
    the cyclic path takes the bus (the notifier stopped, the queue drained)."""
    send_nmt(d._bus, d.node_ids, p.NMT_START)
    d._started = True  # PDOs live: disable() can reach the drives from here on
    deadline = time.monotonic() + d.enable_timeout
    for i, node in enumerate(d._nodes):
        enable_operation(node, deadline, d.enable_timeout, d.states, i)
    for i, node in enumerate(d._nodes):  # last known feedback until the first TPDOs
        d._pos_raw[i] = upload(node, p.POSITION_ACTUAL, 0, "<i")
        d._vel_raw[i] = upload(node, p.VELOCITY_ACTUAL, 0, "<i")
        if d._pos_raw[i] == p.INT32_INVALID or d._vel_raw[i] == p.INT32_INVALID:
            raise DriveError(f"node {node.id}: invalid position or velocity actual value 0x80000000")
    # the cyclic path reads the bus itself from here on
    d._network.notifier.stop()
    d._network.notifier = None
    while d._bus.recv(0.0) is not None:
        pass
    for msg in d._rpdo:
        p.RPDO1.pack_into(msg.data, 0, p.CW_ENABLE_OPERATION, 0)
    d._missed = 0
    d._age[:] = 0.0
    d._last_t = None
    d._window_dt = d.period
    d._carry = [0.0] * d.n_axes  # target torque rounding carried between writes (write)
    d._cyclic = True


def close(d) -> None:
    """Drives shut down and back to pre-operational, the heartbeat stopped, the bus closed
    (never raises: a bus that is gone has nothing more to hear)."""
    if d._bus is None:
        return
    try:
        if d._started:
            for msg in d._rpdo:
                p.RPDO1.pack_into(msg.data, 0, p.CW_SHUTDOWN, 0)
                d._bus.send(msg, 0.001)
        for n in d.node_ids:
            d._bus.send(can.Message(arbitration_id=p.NMT_COB_ID, data=[p.NMT_PRE_OPERATIONAL, n],
                                       is_extended_id=False), 0.001)
    except (can.CanError, OSError, ValueError):
        pass  # the bus is gone: nothing more to tell the drives
    finally:
        if d._heartbeat is not None:  # the drives, now disabled, will see a heartbeat event
            d._heartbeat.stop()
            d._heartbeat = None
        if d._network is not None and d._network.notifier is not None:
            d._network.notifier.stop()
        d._bus.shutdown()
        d._bus = None
        d._cyclic = d._started = False
