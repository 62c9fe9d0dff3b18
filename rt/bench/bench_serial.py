"""Benchmark: per-cycle cost of the Dynamixel driver path for 3 servos over a pseudo-terminal.

Figures (microseconds, p50 / p99 / max), nothing asserted:
  round_trip      read() + write() against the servo emulator in another process: Sync Read
                  out, 3 status packets back (the emulator parses, answers), Sync Write of Goal
                  Current out. Back to back, and paced at ``rate_hz`` (the emulator sleeps
                  between cycles, so each cycle pays two process wake-ups).
  encode_decode   the same without the line: pack the Sync Write (CRC), parse 3 status packets
                  (CRC, unstuffing), unpack and scale to SI.
  emulator        the emulator's own handling of one Sync Read + Sync Write (plant step
                  included), in this process, for reference.

Run: ``.venv/bin/python -m pkrt.rt.bench.bench_serial [--cycles N]``; ``pkrt bench --only serial``.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import time

import numpy as np

from pkrt.drivers import dynamixel_protocol as dxp
from pkrt.drivers.dynamixel import FEEDBACK_ADDR, FEEDBACK_FMT, FEEDBACK_LEN, DynamixelDrives
from pkrt.hil.dynamixel_emulator import build
from pkrt.hil.serial_hil import EmulatorProcess, serial_config

MACHINE = "orthoglide-serial"


def _stats(x_s) -> dict:
    us = np.asarray(x_s) * 1e6
    return {"p50": round(float(np.percentile(us, 50)), 1), "p99": round(float(np.percentile(us, 99)), 1),
            "max": round(float(us.max()), 1)}


def _hold(fb) -> np.ndarray:
    """A gentle PD hold at the start position (N): keeps the emulated machine still."""
    return 200.0 * (-0.1 - fb.position) - 20.0 * fb.velocity + np.array([0.0, 0.0, 60.0])


def run_serial_bench(cycles: int = 2000, rate_hz: float = 250.0) -> dict:
    """The figures above over ``cycles`` cycles (``cycles // 4`` paced at ``rate_hz``), and one
    HIL run at the machine's rate (``hil_1khz``)."""
    from .bench_can import run_hil_1khz

    config = serial_config(MACHINE, None)
    emu = EmulatorProcess(os.path.abspath(config.path), None, None, config.rate_hz)
    drives = DynamixelDrives.from_config(config, {"port": emu.port})
    try:
        drives.configure()
        drives.enable()
        fb = drives.feedback
        for _ in range(50):  # warm-up
            drives.read(0.0)
            drives.write(_hold(fb))
        back = np.empty(cycles)
        for k in range(cycles):
            t0 = time.perf_counter()
            fb = drives.read(k * 0.001)
            drives.write(_hold(fb))
            back[k] = time.perf_counter() - t0
        n_paced = max(cycles // 4, 10)
        paced = np.empty(n_paced)
        period = 1.0 / rate_hz
        t_next = time.perf_counter()
        for k in range(n_paced):
            t_next += period
            while time.perf_counter() < t_next:
                time.sleep(max(0.0, t_next - time.perf_counter() - 2e-4))
            t0 = time.perf_counter()
            fb = drives.read(k * period)
            drives.write(_hold(fb))
            paced[k] = time.perf_counter() - t0
        stats = drives.info()
    finally:
        drives.close()
        report = emu.stop()

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
        "servos": len(ids), "port": "pty to the emulator process", "rate_hz_paced": rate_hz,
        "round_trip_back_to_back_us": _stats(back), "round_trip_paced_us": _stats(paced),
        "encode_decode_us": _stats(codec), "emulator_us": _stats(emu_t),
        "bytes_per_cycle": {"out": len(sw) + len(sr), "in": len(answers)},
        "timeouts": stats["timeouts"], "retries": stats["retries"], "crc_errors": stats["crc_errors"],
        "late_answers": stats["late_answers"], "low_latency": stats["low_latency"],
        "emulator_cycles": report.get("cycles"),
        "hil_1khz": run_hil_1khz("serial"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cycles", type=int, default=2000)
    ap.add_argument("--rate", type=float, default=250.0)
    a = ap.parse_args()
    print(json.dumps(run_serial_bench(a.cycles, a.rate), indent=1))


if __name__ == "__main__":
    main()
