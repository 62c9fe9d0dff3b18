"""CLI verb ``pkrt bench``: figures, not assertions. Each section runs in this process, side
by side, and reports medians; ratios are taken within the same run.

Sections: ``reduction`` (exact reduction of the Orthoglide), ``tree`` (tree tau evaluation,
jitted loop and Python call, against the exact reduction; 512-box build time), ``loop``
(real-time 1 kHz run: compute time, overruns, wake latency beside a bare sleep-then-spin loop;
lockstep speed), ``formats`` (MCAP, ROS 2 bag and CSV export speed and size; loop timing with
the Foxglove live view and one client against without), ``can`` and ``serial`` (driver path per
cycle for 3 drives), ``dask`` (a tree built in one process, on the process pool and on Dask
LocalClusters of 1 and 2 workers, same bytes; peak memory of the client, scheduler and workers).
"""

from __future__ import annotations

import argparse
import importlib

import numpy as np

from .cli import emit
from .errors import UserError

SECTIONS = {
    "reduction": ("tests.bench.bench_reduction", "run_reduction_bench"),
    "tree": ("tests.bench.bench_tree", "run_tree_bench"),
    "loop": ("pkrt.rt.bench", "run_loop_bench"),
    "logs": ("tests.bench.bench_logs", "run_logs_bench"),
    "formats": ("tests.bench.bench_formats", "run_formats_bench"),
    "can": ("tests.bench.bench_can", "run_can_bench"),
    "serial": ("tests.bench.bench_serial", "run_serial_bench"),
    "dask": ("tests.bench.bench_dask", "run_dask_bench"),
}


def run_loop_bench(duration: float = 10.0, rate_hz: float = 1000.0) -> dict:
    """Real-time run of the Orthoglide demo (held at its end up to ``duration``), a bare
    sleep-then-spin loop for the same number of cycles, and the lockstep speed."""
    import dataclasses

    from pkrt.drivers import open_drives

    from .config import load_machine
    from .loop import apply_realtime, bare_loop_latency, percentiles_us, restore_realtime
    from .run import load_controller_tree, run_session

    config = dataclasses.replace(load_machine("orthoglide"), rate_hz=rate_hz)
    tree = load_controller_tree(config)
    lock = []
    for _ in range(3):
        d = open_drives(config)
        lock.append(run_session(config, d, lockstep=True, tree=tree)["realtime_factor"])
    d = open_drives(config)
    rt = run_session(config, d, duration=duration, tree=tree)
    r = config.realtime  # the bare loop runs under the same real-time settings
    rep = apply_realtime(r.priority, r.cpu, r.mlockall, r.gc_freeze)
    try:
        bare = bare_loop_latency(1.0 / rate_hz, int(duration * rate_hz))
    finally:
        restore_realtime(rep)
    return {
        "rate_hz": rate_hz, "duration_s": duration,
        "lockstep_realtime_factor_median": float(np.median(lock)),
        "realtime_settings": rt["realtime"], "realtime_cycles": rt["cycles"], "realtime_overruns": rt["overruns"],
        "realtime_fault": rt["fault"],
        "compute_us": rt["compute_us"], "wake_latency_us": rt["wake_latency_us"],
        "bare_loop_wake_latency_us": percentiles_us(bare),
        "wake_p99_ratio_loop_over_bare": (rt["wake_latency_us"]["p99"] / max(percentiles_us(bare)["p99"], 1e-9)),
    }


def add_arguments_bench(p: argparse.ArgumentParser) -> None:
    p.add_argument("--only", help=f"comma-separated sections ({', '.join(SECTIONS)})")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run_bench(args) -> int:
    names = list(SECTIONS) if not args.only else [x.strip() for x in args.only.split(",") if x.strip()]
    for n in names:
        if n not in SECTIONS:
            raise UserError(f"--only: unknown section '{n}' ({', '.join(SECTIONS)})")
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent  # the source checkout (editable install)
    if (root / "tests" / "bench").is_dir() and str(root) not in sys.path:
        sys.path.insert(0, str(root))
    out = {}
    for n in names:
        mod, fn = SECTIONS[n]
        try:
            f = getattr(importlib.import_module(mod), fn)
        except (ImportError, AttributeError) as e:
            out[n] = {"error": f"not available here ({e}); run from a source checkout"}
            continue
        out[n] = f()
        if not args.json:
            print(f"[{n}]", flush=True)
            emit(out[n], False)
    if args.json:
        emit(out, True)
    return 0
