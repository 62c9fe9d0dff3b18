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
