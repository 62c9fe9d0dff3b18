"""CiA 402 homing mode (6), master side: the objects, statusword bits and the procedure that
homes every drive of a ``CiA402Drives`` group over SDO before the cyclic phase.

Objects: 0x6098 homing method (35 and 37: the current position is home; 18: search the
positive limit switch at the 0x6099 sub 1 speed, leave it at the sub 2 speed, home where it
releases), 0x607C home offset (increments: the position actual value at home), 0x6099 sub 1
/ sub 2 switch / zero search speeds (increments/s), 0x609A homing acceleration.
Controlword bit 4 (rising edge) starts homing in Operation enabled with 0x6060 = 6, bit 8
halts. Statusword bit 10 target reached, 12 homing attained, 13 homing error: 12 + 10 done,
13 error, 10 alone while halted interrupted.

The procedure (``home``) keeps SYNC going at the loop period (the drives act on SYNC) while it
polls every statusword over SDO; then the drives go back to cyclic synchronous torque (0x6060 =
10) without leaving Operation enabled, applying ``hold_permille`` (the machine's weight) until
the caller's loop writes torque; ``drives.enable`` then starts the cyclic path (SYNC still
running meanwhile: the caller's loop must take it over within the drives' SYNC timeout).
"""

from __future__ import annotations

import threading
import time

import can
import numpy as np

from . import cia402_protocol as p
from .base import DriveError
from .cia402_setup import download, send_nmt, upload

MODE_HOMING = 6
HOMING_METHOD = 0x6098
HOME_OFFSET = 0x607C
HOMING_SPEEDS = 0x6099  # sub 1 switch search, sub 2 zero search (increments/s)
HOMING_ACCEL = 0x609A
CW_HOMING_START = 0x0010  # controlword bit 4 (operation mode specific), with 0x000F
CW_HALT = 0x0100          # controlword bit 8
SW_TARGET_REACHED = 1 << 10
SW_HOMING_ATTAINED = 1 << 12
SW_HOMING_ERROR = 1 << 13
METHODS = (18, 35, 37)    # what the emulator implements (and pkrt asks for)


class HomingError(DriveError):
    """Homing ended without a home: halted, timed out, an error bit, a drive fault."""


def homing_result(sw: int, halted: bool) -> str | None:
    """'done', 'error', 'interrupted' or None (still homing) from a statusword."""
    if sw & SW_HOMING_ERROR:
        return "error"
    if sw & SW_HOMING_ATTAINED and sw & SW_TARGET_REACHED:
        return "done"
    if halted and sw & SW_TARGET_REACHED:
        return "interrupted"
    return None


def home(drives, method: int, offset_counts, speeds_counts: tuple[float, float], accel_counts: float,
         timeout: float, halt: threading.Event | None = None, hold_permille=None) -> dict:
    """Home every drive of a configured (not enabled) ``CiA402Drives``, then enable them in
    cyclic torque mode; raises ``HomingError`` with the reason (the drives are disabled then).
    Returns per-drive results (the position actual value right after homing, increments).
    ``hold_permille``: the target torque (per mille of rated, per drive) the drives apply from
    enable until the caller's first cyclic write (e.g. the machine's weight), else 0."""
    if method not in METHODS:
        raise HomingError(f"homing method {method} is not supported (supported: {', '.join(map(str, METHODS))})")
    nodes = drives._nodes
    offs = np.broadcast_to(np.asarray(offset_counts, dtype=np.int64), (len(nodes),))
    sync = can.Message(arbitration_id=p.SYNC_COB_ID, data=b"", is_extended_id=False)
    dl = download
    stop_sync = threading.Event()

    def syncs():  # SYNC on the loop period all along (the drives move, and watch for it, on SYNC)
        nxt = time.perf_counter()
        while not stop_sync.is_set():
            try:
                drives._bus.send(sync, 0.001)
            except (can.CanError, OSError, ValueError):
                return
            nxt += drives.period
            stop_sync.wait(max(nxt - time.perf_counter(), 0.0))

    ticker = threading.Thread(target=syncs, name="cia402-homing-sync", daemon=True)
    try:
        send_nmt(drives._bus, drives.node_ids, p.NMT_START)
        for node, off in zip(nodes, offs):
            _set_up_homing(drives, node, method, int(off), speeds_counts, accel_counts)
        ticker.start()  # before any drive is enabled: a drive that saw SYNC before watches for it from then on
        for node in nodes:  # to Operation enabled (in homing mode), then the start edge
            _enable_for_homing(drives, node)
        for node in nodes:
            dl(node, p.CONTROLWORD, 0, "<H", p.CW_ENABLE_OPERATION | CW_HOMING_START)
        t0 = time.monotonic()
        done = _wait_homed(drives, t0, timeout, halt)
        _back_to_cyclic_torque(drives, hold_permille)
        drives.enable()  # already in Operation enabled: the cyclic path takes over (SYNC still going meanwhile)
        return {"method": method, "drives": done, "seconds": time.monotonic() - t0}
    except DriveError as e:
        for node in nodes:
            try:
                dl(node, p.CONTROLWORD, 0, "<H", p.CW_DISABLE_OPERATION)
            except DriveError:
                pass
        raise e if isinstance(e, HomingError) else HomingError(f"homing: {e}") from None
    finally:
        stop_sync.set()
        if ticker.is_alive():
            ticker.join(1.0)


def _set_up_homing(drives, node, method: int, offset: int, speeds_counts: tuple[float, float],
                   accel_counts: float) -> None:
    """Homing mode, method, home offset (increments), speeds and acceleration by SDO."""
    up, dl = upload, download
    dl(node, p.MODES_OF_OPERATION, 0, "<b", MODE_HOMING)
    if up(node, p.MODES_OF_OPERATION_DISPLAY, 0, "<b") != MODE_HOMING:
        raise HomingError(f"node {node.id}: the drive does not accept homing mode (0x6060 = 6)")
    dl(node, HOMING_METHOD, 0, "<b", method)
    dl(node, HOME_OFFSET, 0, "<i", offset)
    dl(node, HOMING_SPEEDS, 1, "<I", int(round(speeds_counts[0])))
    dl(node, HOMING_SPEEDS, 2, "<I", int(round(speeds_counts[1])))
    dl(node, HOMING_ACCEL, 0, "<I", int(round(accel_counts)))


def _enable_for_homing(drives, node) -> None:
    """Walk one drive to Operation enabled (within ``drives.enable_timeout``)."""
    up, dl = upload, download
    last = -1
    end = time.monotonic() + drives.enable_timeout
    while True:
        state = p.decode_statusword(up(node, p.STATUSWORD, 0, "<H"))
        if state is p.State.OPERATION_ENABLED:
            break
        if time.monotonic() > end:
            raise HomingError(f"node {node.id}: not in Operation enabled for homing (state {state.name})")
        cw = p.next_controlword(state, max(last, 0))
        if cw is not None:
            dl(node, p.CONTROLWORD, 0, "<H", cw)
            last = cw
    dl(node, p.CONTROLWORD, 0, "<H", p.CW_ENABLE_OPERATION)


def _wait_homed(drives, t0: float, timeout: float, halt: threading.Event | None) -> list[dict]:
    """Poll every drive each period until all are homed (halting them once ``halt`` is set);
    per drive its node and position actual value (increments) right after homing."""
    nodes, up, dl = drives._nodes, upload, download
    done = [None] * len(nodes)
    halted = False
    while not all(done):
        time.sleep(drives.period)
        if halt is not None and halt.is_set() and not halted:
            for node in nodes:
                dl(node, p.CONTROLWORD, 0, "<H", p.CW_ENABLE_OPERATION | CW_HOMING_START | CW_HALT)
            halted = True
        for i, node in enumerate(nodes):
            if not done[i] and _homed(node, up(node, p.STATUSWORD, 0, "<H"), halted):
                done[i] = {"node": node.id, "position": up(node, p.POSITION_ACTUAL, 0, "<i")}
        if time.monotonic() - t0 > timeout:
            raise HomingError(f"homing timeout: not homed after {timeout:g} s "
                              f"(nodes {[n.id for n, d in zip(nodes, done) if not d]})")
    return done


def _homed(node, sw: int, halted: bool) -> bool:
    """True when statusword ``sw`` says the drive is homed; HomingError when it left Operation
    enabled, reports a homing error or was halted before home was found."""
    state = p.decode_statusword(sw)
    if state is not p.State.OPERATION_ENABLED:
        raise HomingError(f"node {node.id}: drive left Operation enabled while homing "
                          f"(state {state.name}, statusword 0x{sw:04X})")
    r = homing_result(sw, halted)
    if r == "error":
        raise HomingError(f"node {node.id}: homing error (statusword bit 13, 0x{sw:04X})")
    if r == "interrupted":
        raise HomingError(f"node {node.id}: homing halted before home was found")
    return r == "done"


def _back_to_cyclic_torque(drives, hold_permille) -> None:
    """Each drive to cyclic synchronous torque without leaving Operation enabled, holding
    ``hold_permille`` (per mille of rated torque; None: 0)."""
    nodes, up, dl = drives._nodes, upload, download
    hold = np.zeros(len(nodes)) if hold_permille is None else np.asarray(hold_permille, float)
    for i, node in enumerate(nodes):
        dl(node, p.TARGET_TORQUE, 0, "<h", int(np.clip(round(hold[i]), -p.INT16_MAX, p.INT16_MAX)))
        dl(node, p.CONTROLWORD, 0, "<H", p.CW_ENABLE_OPERATION)  # bit 4 low
        dl(node, p.MODES_OF_OPERATION, 0, "<b", p.MODE_CST)
        if up(node, p.MODES_OF_OPERATION_DISPLAY, 0, "<b") != p.MODE_CST:
            raise HomingError(f"node {node.id}: not back in cyclic synchronous torque mode after homing")


def leave_cyclic(drives) -> None:
    """Stop the cyclic path of disabled ``CiA402Drives`` and bring SDO back (the homing
    procedure talks SDO): the canopen notifier restarted, the drives configured again (not
    enabled), ready for ``home``."""
    drives.disable()
    drives._cyclic = False
    if drives._network is not None and drives._network.notifier is None:
        drives._network.notifier = can.Notifier(drives._bus, drives._network.listeners, 0.05)
    drives.state = drives.state.__class__.CONFIGURED


def home_si(drives, method: int, offset_si, speeds_si: tuple[float, float], timeout: float,
            halt: threading.Event | None = None, hold_si=None) -> dict:
    """``home`` with the offset (m or rad), speeds (m/s or rad/s) and hold torque (N or N m)
    in SI, converted with each drive's increments and rated torque (the speeds at the first
    drive's scale)."""
    inc = np.asarray(drives.increments, float)
    offs = np.round(np.broadcast_to(np.asarray(offset_si, float), inc.shape) * inc).astype(np.int64)
    speeds = (abs(speeds_si[0]) * inc[0], abs(speeds_si[1]) * inc[0])
    hold = None if hold_si is None else np.asarray(hold_si, float) * np.asarray(drives._permille_per_si, float)
    return home(drives, method, offs, speeds, 10.0 * speeds[0], timeout, halt, hold)
