"""Benchmark: per-cycle cost of the Dynamixel driver path for 3 servos over each HIL link: TCP
on 127.0.0.1 (pyserial socket://, the default) and a pseudo-terminal.

Figures (microseconds, p50 / p99 / max), nothing asserted:
  round_trip      read() + write() against the servo emulator in another process: Sync Read
                  out, 3 status packets back (the emulator parses, answers), Sync Write of Goal
                  Current out. Back to back, and paced at ``rate_hz`` (the emulator sleeps
                  between cycles, so each cycle pays two process wake-ups); unprioritised,
                  then this thread at SCHED_FIFO 80 and the emulator at 70 on the other CPU.
  encode_decode   the same without the line: pack the Sync Write (CRC), parse 3 status packets
                  (CRC, unstuffing), unpack and scale to SI.
  emulator        the emulator's own handling of one Sync Read + Sync Write (plant step
                  included), in this process, for reference.

Run: ``.venv/bin/python -m pkrt.rt.bench.bench_serial [--cycles N]``; ``pkrt bench --only serial``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import struct
import time

import numpy as np

from pkrt.drivers import dynamixel_protocol as dxp
from pkrt.drivers.base import DriveError
from pkrt.drivers.dynamixel import FEEDBACK_ADDR, FEEDBACK_FMT, FEEDBACK_LEN, DynamixelDrives
from pkrt.hil.dynamixel_emulator import build
from pkrt.hil.serial_hil import LINKS, EmulatorProcess, serial_config

MACHINE = "orthoglide-serial"


def _stats(x_s) -> dict:
    us = np.asarray(x_s) * 1e6
    return {"p50": round(float(np.percentile(us, 50)), 1), "p99": round(float(np.percentile(us, 99)), 1),
            "max": round(float(us.max()), 1)}


def _hold(fb) -> np.ndarray:
    """A gentle PD hold at the start position (N): keeps the emulated machine still."""
    return 200.0 * (-0.1 - fb.position) - 20.0 * fb.velocity + np.array([0.0, 0.0, 60.0])


def _round_trips(config, cycles: int, rate_hz: float, prio: int, link: str) -> dict:
    """Back-to-back and paced (``rate_hz``) round trips against an emulator process; ``prio`` 0:
    unprioritised, P > 0: this thread at SCHED_FIFO P on the machine's ``[realtime]`` CPU, the
    emulator at SCHED_FIFO P - 10 on another CPU (each reported applied or not)."""
    from pkrt.hil.can_hil import emulator_cpu
    from pkrt.rt.runtime.cycle.loop import apply_realtime, restore_realtime

    cpu = config.realtime.cpu if prio else -1
    emu = EmulatorProcess(os.path.abspath(config.path), None, None, rate_hz, emulator_cpu(cpu), max(prio - 10, 0),
                          link=link)
    # a lenient driver (5 ms, no fault on misses) so the distribution is measured, not cut at
    # the machine's timeout: ``over_timeout`` counts the paced round trips beyond it
    lenient = dataclasses.replace(config, rate_hz=100.0)
    drives = DynamixelDrives.from_config(lenient, {"port": emu.port, "timeout": 0.005, "retries": 0,
                                                   "fail_cycles": 10 ** 6})
    sched = apply_realtime(prio, cpu, mlockall=bool(prio), gc_freeze=False) if prio else {}
    back, paced, fault = [], [], None
    period = 1.0 / rate_hz
    try:
        drives.configure()
        drives.enable()
        fb = drives.feedback
        for _ in range(50):  # warm-up
            drives.read(0.0)
            drives.write(_hold(fb))
        for k in range(cycles):
            t0 = time.perf_counter()
            fb = drives.read(k * period)
            drives.write(_hold(fb))
            back.append(time.perf_counter() - t0)
        t_next = time.perf_counter()
        for k in range(cycles):
            t_next += period
            rest = t_next - time.perf_counter() - 1.5e-4
            if rest > 0:
                time.sleep(rest)
            while time.perf_counter() < t_next:
                pass
            t0 = time.perf_counter()
            fb = drives.read(k * period)
            drives.write(_hold(fb))
            paced.append(time.perf_counter() - t0)
    except DriveError as e:  # e.g. the line stalled past the write timeout: what was measured stands
        fault = str(e)
    finally:
        stats = drives.info()
        drives.close()
        if sched:
            restore_realtime(sched)
        report = emu.stop()
    back, paced = np.array(back), np.array(paced)
    return {"master": sched.get("sched_fifo", "not requested"), "emulator": (report.get("scheduling") or {}).get("sched_fifo"),
            "round_trip_back_to_back_us": _stats(back) if len(back) else None,
            "round_trip_paced_us": _stats(paced) if len(paced) else None, "fault": fault,
            "paced_over_timeout": int(np.sum(paced > config.drives.timeout)),
            "back_to_back_over_timeout": int(np.sum(back > config.drives.timeout)),
            "timeouts": stats["timeouts"], "late_answers": stats["late_answers"], "low_latency": stats["low_latency"],
            "emulator_cycles": report.get("cycles")}


def run_serial_bench(cycles: int = 2000, rate_hz: float | None = None, priorities: tuple = (0, 80)) -> dict:
    """The figures above over ``cycles`` cycles, paced at ``rate_hz`` (default: the machine's,
    1 kHz), once unprioritised and once at SCHED_FIFO (``priorities``), and one HIL run at the
    machine's rate (``hil_1khz``). The pty's data is moved by the kernel's workers (normal
    priority) whatever the two processes' priorities."""
    from pkrt.rt.bench.bench_can import run_hil_1khz

    config = serial_config(MACHINE, None)
    rate_hz = rate_hz or config.rate_hz
    line = {f"{link}_" + ("unprioritised" if not p else f"sched_fifo_{p}"): _round_trips(config, cycles, rate_hz, p, link)
            for p in priorities for link in LINKS}  # the links take turns (the machine's load drifts)
    drives = DynamixelDrives.from_config(config, {"port": "loop://"})

    # encode/decode only: the same bytes, no line
    answers = b"".join(dxp.status(i, 0, struct.pack(FEEDBACK_FMT, 1000 + i, 0, 0, 0, 12, 345, -10240))
                       for i in config.drives.ids)
    codec = np.empty(cycles)
    tau = np.array([10.0, -20.0, 60.0])
    for k in range(cycles):
        t0 = time.perf_counter()
        drives._goal_args[1::2] = [round(x * c) for x, c in zip(tau, drives._k_cur)]
        drives._pack_goal()
        p = dxp.PacketParser(max_length=64)
        p.feed(answers)
        while (pkt := p.next()) is not None:
            i = drives._index[pkt.id]
            _, _, _, _, cur, vel, pos = struct.unpack_from(FEEDBACK_FMT, pkt.params)
            drives.feedback.position[i] = drives._k_pos[i] * pos
            drives.feedback.velocity[i] = drives._k_vel[i] * vel
        codec[k] = time.perf_counter() - t0

    # the emulator's handling, in this process
    e = build(MACHINE)
    ids = config.drives.ids
    sr = dxp.sync_read(ids, FEEDBACK_ADDR, FEEDBACK_LEN)
    for i in ids:
        e.handle(dxp.write(i, 11, b"\0"))
        e.handle(dxp.write(i, 64, b"\x01"))
    sw = dxp.sync_write(102, 2, [(i, struct.pack("<h", 0)) for i in ids])
    emu_t = np.empty(min(cycles, 1000))
    for k in range(len(emu_t)):
        t0 = time.perf_counter()
        e.handle(sr)
        e.handle(sw)
        emu_t[k] = time.perf_counter() - t0

    return {
        "servos": len(ids), "port": "tcp (socket://) and pty to the emulator process", "rate_hz_paced": rate_hz,
        "timeout_us": config.drives.timeout * 1e6, **line,
        "encode_decode_us": _stats(codec), "emulator_us": _stats(emu_t),
        "bytes_per_cycle": {"out": len(sw) + len(sr), "in": len(answers)},
        "hil_1khz": run_hil_1khz("serial"), "load_avg": os.getloadavg(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cycles", type=int, default=2000)
    ap.add_argument("--rate", type=float, help="paced rate in Hz (default: the machine's)")
    a = ap.parse_args()
    print(json.dumps(run_serial_bench(a.cycles, a.rate), indent=1))


if __name__ == "__main__":
    main()
