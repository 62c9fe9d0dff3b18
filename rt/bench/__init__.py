"""Benchmarks (``pkrt bench``): figures, not assertions. Each section runs in this process, side
by side, and reports medians; ratios are taken within the same run.

Sections: ``reduction`` (exact reduction of the Orthoglide), ``tree`` (tree tau evaluation,
jitted loop and Python call, against the exact reduction; 512-box build time), ``loop``
(real-time 1 kHz run: compute time, overruns, wake latency beside a bare sleep-then-spin loop;
lockstep speed), ``formats`` (MCAP, ROS 2 bag and CSV export speed and size; loop timing with
the Foxglove live view and one client against without), ``can`` and ``serial`` (driver path per
cycle for 3 drives), ``can_udp``
(round trip to the CiA 402 emulator in its own process over udp_multicast, without and with
SCHED_FIFO), ``safestop`` (SIGKILL to ``pkrt run`` -> torque off in the emulated drives).
"""

from __future__ import annotations

import argparse
import importlib

from ..cli import emit
from ..errors import UserError

SECTIONS = {
    "reduction": ("pkrt.rt.bench.bench_reduction", "run_reduction_bench"),
    "tree": ("pkrt.rt.bench.bench_tree", "run_tree_bench"),
    "loop": ("pkrt.rt.bench.bench_loop", "run_loop_bench"),
    "logs": ("pkrt.rt.bench.bench_logs", "run_logs_bench"),
    "formats": ("pkrt.rt.bench.bench_formats", "run_formats_bench"),
    "can": ("pkrt.rt.bench.bench_can", "run_can_bench"),
    "serial": ("pkrt.rt.bench.bench_serial", "run_serial_bench"),
    "can_udp": ("pkrt.rt.bench.bench_can", "run_can_udp_bench"),
    "safestop": ("pkrt.rt.bench.bench_safestop", "run_safestop_bench"),
}


def add_arguments_bench(p: argparse.ArgumentParser) -> None:
    p.add_argument("--only", help=f"comma-separated sections ({', '.join(SECTIONS)})")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run_bench(args) -> int:
    names = list(SECTIONS) if not args.only else [x.strip() for x in args.only.split(",") if x.strip()]
    for n in names:
        if n not in SECTIONS:
            raise UserError(f"--only: unknown section '{n}' ({', '.join(SECTIONS)})")
    out = {}
    for n in names:
        mod, fn = SECTIONS[n]
        out[n] = getattr(importlib.import_module(mod), fn)()
        if not args.json:
            print(f"[{n}]", flush=True)
            emit(out[n], False)
    if args.json:
        emit(out, True)
    return 0
