"""CAN hardware-in-the-loop: the Orthoglide demo in real time through the real CiA 402 driver,
python-can's virtual bus and the CiA 402 drive emulator (a thread) driving the simulated plant.

Cycle numbers in the result are loop cycles (``run_session``'s k). The emulator counts SYNCs;
every SYNC is mapped back to the loop cycle that sent it (the loop skips cycles after an
overrun, so the two counts can differ). ``torque_off_cycle`` is measured in the emulator: the
cycle from which no drive applied torque (the loop's own estimate is ``loop_torque_off_cycle``).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import time

import numpy as np

from pkrt.drivers.cia402 import CiA402Drives
from pkrt.rt.config import load_machine
from pkrt.rt.errors import UserError
from pkrt.rt.run import load_controller_tree, plan_trajectory, run_session

from .cia402_emulator import FAULT_KINDS, CiA402Emulator

_channels = itertools.count()


def run_can_hil(machine: str = "orthoglide-can", fault: str | None = None, duration: float = 5.0,
                rate_hz: float | None = None, log_path: str | None = None, channel: str | None = None) -> dict:
    """Run the demo for ``duration`` s (real time) with an optional injected ``fault`` (one of
    ``FAULT_KINDS``) at ``rate_hz`` (default: ``[emulator] rate_hz``, else the machine's rate,
    with the ``[emulator] tpdo_timeout`` window); return run_session's summary plus ``injected_cycle``, the emulator's
    ``torque_off_cycle`` and HIL figures (bus load, emulator response time, frames, late TPDOs)."""
    if fault is not None and fault not in FAULT_KINDS:
        raise UserError(f"unknown CAN fault '{fault}' (known: {', '.join(FAULT_KINDS)})")
    config = load_machine(machine)
    if config.drives.get("backend") != "cia402":
        raise UserError(f"{config.path}: [drives] backend is {config.drives.get('backend')!r}, not 'cia402'")
    em_table = config.raw.get("emulator", {})
    rate = rate_hz if rate_hz is not None else em_table.get("rate_hz", config.rate_hz)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 1.0 <= rate <= 100000.0:
        raise UserError(f"HIL rate {rate!r} Hz: expected a number in [1, 100000]")
    config = dataclasses.replace(config, rate_hz=float(rate))
    channel = channel or f"pkrt-hil-{os.getpid()}-{next(_channels)}"
    tree = load_controller_tree(config)
    plan = plan_trajectory(config, tree, None, duration)
    overrides = {"interface": "virtual", "channel": channel}
    if isinstance(em_table.get("tpdo_timeout"), (int, float)):
        overrides["tpdo_timeout"] = min(em_table["tpdo_timeout"], 0.75 / config.rate_hz)
    if "max_missed_cycles" in em_table:
        overrides["max_missed_cycles"] = em_table["max_missed_cycles"]
    drives = CiA402Drives.from_config(config, overrides)
    emulator = CiA402Emulator.from_config(config, channel, fault=fault)
    emulator.plant.reset(plan.pos[0])  # the machine stands at the trajectory's start, at rest

    sync_cycle = np.full(plan.n + 2, -1, dtype=np.int64)  # loop cycle of the k-th SYNC

    def on_cycle(k: int, t: float) -> None:
        j = drives.cycle + 1  # index of the SYNC this cycle's read will send
        if j < sync_cycle.shape[0]:
            sync_cycle[j] = k

    emulator.start()
    try:
        summary = run_session(config, drives, trajectory=plan, tree=tree, on_cycle=on_cycle, log_path=log_path)
    finally:
        drives.close()
        time.sleep(0.02)  # let the emulator take the last frames
        emulator.stop()
    em = emulator.report()

    def loop_cycle(sync_index: int | None) -> int | None:
        if sync_index is None:
            return None
        last = drives.cycle  # last SYNC sent
        if 0 <= sync_index <= min(last, sync_cycle.shape[0] - 1):
            return int(sync_cycle[sync_index])
        return None

    ev = em["torque_off_event"]  # (SYNC index, periods after it: a drive's own watchdog)
    base = loop_cycle(ev[0]) if ev is not None else None
    off = None if base is None else base + ev[1]
    summary["loop_torque_off_cycle"] = summary.get("torque_off_cycle")
    summary.update({
        "bus": "can", "fault_kind": fault,
        "injected_cycle": loop_cycle(em["injected_cycle"]),
        "torque_off_cycle": off,
        "hil": {"interface": "virtual", "channel": channel, "bus_load": drives.bus_load,
                "late_frames": drives.late_frames, "syncs": drives.cycle + 1,
                "emulator_cycles": em["emulator_cycles"], "emulator_frames_rx": em["frames_rx"],
                "emulator_frames_tx": em["frames_tx"], "emulator_response_us": em["emulator_response_us"],
                "drive_states": em["drive_states"], "emulator_error": em["emulator_error"]},
    })
    return summary
