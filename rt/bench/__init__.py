"""Benchmarks (``pkrt bench``): figures, not assertions. Each section runs in this process, side
by side, and reports medians; ratios are taken within the same run.

Sections: ``reduction`` (exact reduction of every shipped machine), ``tree`` (tree tau
evaluation, jitted loop along the demo and at random states, one Python call, beside the 8^3
boxes, against the exact reduction; the shipped tree's build time), ``tracking`` (the demo under
computed torque with the shipped controller tree beside the 8^3 boxes, same plant, nominal and
10 % heavier), ``loop`` (the cycle as it is beside the cycle before, ``old_cycle``: lockstep
speed by wall clock and CPU time, also with every cycle through Python, ``compiled=False``, a real-time 1 kHz run each with a log split per part -- read,
safety, tree, law, write, bookkeeping, stage, and the plant's step outside the compute --
overruns, wake latency beside a bare sleep-then-spin loop), ``formats`` (MCAP, ROS 2 bag and CSV export speed and size; loop timing with
the Foxglove live view and one client against without), ``can`` and ``serial`` (driver path per
cycle for 3 drives, emulator cost, a HIL pass), ``can_udp`` (round trip to the CiA 402 emulator
in its own process over udp_multicast, without and with SCHED_FIFO), ``safestop`` (SIGKILL to
``pkrt run`` -> torque off in the emulated drives), ``dask`` (a tree built in one process, on
the process pool and on Dask LocalClusters of 1 and 2 workers, same bytes; peak memory of the
client, scheduler and workers), ``toolchannels`` (the tool channels' forward kinematics per log
row, warm from the last row and cold from the reference assembly, for the Orthoglide, the Delta
and the hexapod), ``hexapod`` (its demo in lockstep on the exact plant with the tree and the
exact reduction in the loop: plant and controller time per cycle, the run's wall time; a 1 s
real-time attempt), ``plan`` (time-optimal planning: the Delta's Adept cycle against the
hand-timed one, both in lockstep; planning cost of a 200-point path per machine; the
Orthoglide's G-code example end to end and two refused programs), ``identify``
(identification against a truth plant: Y pi check, base count and rank, the exciting
trajectory, a lockstep run, ``pkrt identify`` on its log, coverage of the intervals over noise
seeds; machines from ``PKRT_BENCH_IDENTIFY``), ``calibrate`` (geometric calibration: the base set,
``pkrt calibrate plan``'s observability against random poses, random truths fitted from simulated
readings with the true tool's error at held-out poses before and after, an end-to-end run with
``--measure`` and ``pkrt calibrate``, the Orthoglide's demo traced by the true tool; machines from
``PKRT_BENCH_CALIBRATE``), ``serve`` (a served machine: command round trip over its
socket, the live-target generator's cost per cycle, a real-time stream of targets), ``memory``
(``pkrt run`` as a child process, this code beside the code before the memory change: VmLck
and VmRSS at the loop's middle and the loop's page faults in real time; resident memory in
lockstep along a 60 s and a 600 s actuator CSV), ``panel`` (the operator panel: the loop's compute
time with no panel, the panel alone and ten pages in Chromium; emergency-stop click to error stop
over 100 clicks; error stop to the page).
lockstep along a 60 s and a 600 s actuator CSV), ``protect`` (contact detection: contacts and clamps
at random times of each machine's motions, with the CAD and the identified model; false alarms over
minutes of normal motion; the observer's cost per cycle and the loop's compute p99 with and
without it; machines from ``PKRT_BENCH_PROTECT``, minutes from ``PKRT_BENCH_PROTECT_MINUTES``),
``precheck`` (the G-code pre-check before motion on relief and finishing programs of 10^5 and 10^6
lines, each in a fresh process: lines per second, the fast reader alone, the interpreter beside it,
the first check's kernel loading, peak memory).
"""

from __future__ import annotations

SECTIONS = {
    "reduction": ("pkrt.rt.bench.bench_reduction", "run_reduction_bench"),
    "tree": ("pkrt.rt.bench.bench_tree", "run_tree_bench"),
    "tracking": ("pkrt.rt.bench.bench_tracking", "run_tracking_bench"),
    "loop": ("pkrt.rt.bench.bench_loop", "run_loop_bench"),
    "logs": ("pkrt.rt.bench.bench_logs", "run_logs_bench"),
    "formats": ("pkrt.rt.bench.bench_formats", "run_formats_bench"),
    "can": ("pkrt.rt.bench.bench_can", "run_can_bench"),
    "serial": ("pkrt.rt.bench.bench_serial", "run_serial_bench"),
    "can_udp": ("pkrt.rt.bench.bench_can", "run_can_udp_bench"),
    "safestop": ("pkrt.rt.bench.bench_safestop", "run_safestop_bench"),
    "dask": ("pkrt.rt.bench.bench_dask", "run_dask_bench"),
    "toolchannels": ("pkrt.rt.bench.bench_toolchannels", "run_toolchannels_bench"),
    "hexapod": ("pkrt.rt.bench.bench_hexapod", "run_hexapod_bench"),
    "plan": ("pkrt.rt.bench.bench_plan", "run_plan_bench"),
    "identify": ("pkrt.rt.bench.bench_identify", "run_identify_bench"),
    "calibrate": ("pkrt.rt.bench.bench_calibrate", "run_calibrate_bench"),
    "serve": ("pkrt.rt.bench.bench_serve", "run_serve_bench"),
    "memory": ("pkrt.rt.bench.bench_memory", "run_memory_bench"),
    "panel": ("pkrt.rt.bench.bench_panel", "run_panel_bench"),
    "protect": ("pkrt.rt.bench.bench_protect", "run_protect_bench"),
    "precheck": ("pkrt.rt.bench.bench_precheck", "run_precheck_bench"),
}
