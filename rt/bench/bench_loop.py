"""Benchmark: the real-time loop (``pkrt bench --only loop``). Prints figures; asserts nothing."""

from __future__ import annotations

import numpy as np


def run_loop_bench(duration: float = 10.0, rate_hz: float = 1000.0) -> dict:
    """Real-time run of the Orthoglide demo (held at its end up to ``duration``) with a log, its
    cycle split into drives (here the simulated plant), controller and the loop's own overhead
    (safety, bookkeeping, log staging); a bare sleep-then-spin loop for the same number of
    cycles beside it; and the lockstep speed."""
    import dataclasses
    import tempfile
    from pathlib import Path

    from pkrt.drivers import open_drives

    from pkrt.rt.runtime.config import load_machine
    from pkrt.rt.runtime.loop import apply_realtime, bare_loop_latency, percentiles_us, restore_realtime
    from pkrt.rt.app.reference import plan_reference
    from pkrt.rt.runtime.run import load_controller_tree, run_session

    config = dataclasses.replace(load_machine("orthoglide"), rate_hz=rate_hz)
    tree = load_controller_tree(config)
    demo = plan_reference(config)
    lock = []
    for _ in range(3):
        d = open_drives(config)
        lock.append(run_session(config, d, trajectory=demo, lockstep=True, tree=tree)["realtime_factor"])
    d = open_drives(config)
    with tempfile.TemporaryDirectory() as tmp:  # with a log: its staging is part of the loop's overhead
        rt = run_session(config, d, trajectory=demo, duration=duration, tree=tree, log_path=str(Path(tmp) / "bench.pktlog"))
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
        "compute_us": rt["compute_us"], "drive_us (simulated plant)": rt["drive_us"],
        "controller_us": rt["controller_us"], "loop_overhead_us": rt["loop_overhead_us"],
        "log_dropped_blocks": rt["log_dropped_blocks"], "wake_latency_us": rt["wake_latency_us"],
        "bare_loop_wake_latency_us": percentiles_us(bare),
        "wake_p99_ratio_loop_over_bare": (rt["wake_latency_us"]["p99"] / max(percentiles_us(bare)["p99"], 1e-9)),
    }
