"""Benchmark: the real-time loop (``pkrt bench --only loop``). Prints figures; asserts nothing."""

from __future__ import annotations

import numpy as np

PARTS_SHOWN = ("read", "safety", "tree", "law", "write", "bookkeeping", "stage", "compute", "plant")


def _parts(r: dict) -> dict:
    """Each part's [p50, p99] (us) from a run summary's ``cycle_parts``."""
    p = r["cycle_parts"]["p50_p99_max_us"]
    return {n: p[n][:2] for n in PARTS_SHOWN}


def run_loop_bench(duration: float = 10.0, rate_hz: float = 1000.0, repeats: int = 3) -> dict:
    """The Orthoglide demo with a log, the cycle as it is (``new``: per-part budget, the plant
    stepped after write, outside the compute) beside the cycle before (``old``: the plant
    stepped inside read, model and law in one call, numpy staging; ``run_session(old_cycle=True)``)
    in the same process: the lockstep speed (``repeats`` runs each, alternated; wall clock and
    the loop thread's CPU time; also the cycle as it is with every cycle through Python,
    ``compiled=False``, as lockstep ran before ``pkrt.rt.runtime.cycle.lockstep``), and one real-time run each (held at the demo's end up to
    ``duration``) split per part (p50/p99 us), overruns; a bare sleep-then-spin loop for the
    same number of cycles beside them."""
    import dataclasses
    import tempfile
    from pathlib import Path

    from pkrt.drivers import open_drives

    from pkrt.rt.runtime.machine.config import load_machine
    from pkrt.rt.runtime.cycle.loop import apply_realtime, bare_loop_latency, percentiles_us, restore_realtime
    from pkrt.rt.app.reference import plan_reference
    from pkrt.rt.runtime.machine.runsetup import load_controller_tree
    from pkrt.rt.runtime.machine.run import run_session

    config = dataclasses.replace(load_machine("orthoglide"), rate_hz=rate_hz)
    tree = load_controller_tree(config)
    demo = plan_reference(config)
    # lockstep variants: the cycle as it is (its plain cycles in one compiled loop), the same cycle
    # every one through Python (``compiled=False``: the lockstep before the compiled loop), and the
    # cycle before the per-part budget
    variants = {"new": {}, "python": {"compiled": False}, "old": {"old_cycle": True}}
    lock: dict = {name: [] for name in variants}
    out: dict = {"rate_hz": rate_hz, "duration_s": duration}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            for name, kw in variants.items():
                r = run_session(config, open_drives(config), trajectory=demo, lockstep=True, tree=tree,
                                log_path=str(Path(tmp) / f"lock-{name}-{i}.pktlog"), **kw)
                lock[name].append((r["realtime_factor"], r["realtime_factor_cpu"], r["rms_error"]))
        for name in variants:
            f = np.array([x[:2] for x in lock[name]])
            out[f"lockstep_{name}"] = {"realtime_factor_median": float(np.median(f[:, 0])),
                                       "realtime_factor_cpu_median": float(np.median(f[:, 1])),
                                       "rms_error": lock[name][0][2]}
        for name in ("python", "old"):
            out[f"lockstep_speedup_new_over_{name}_cpu"] = (out["lockstep_new"]["realtime_factor_cpu_median"]
                                                            / out[f"lockstep_{name}"]["realtime_factor_cpu_median"])
        rt = {}
        for name in ("new", "old"):  # with a log: its staging is part of the compute
            rt[name] = run_session(config, open_drives(config), trajectory=demo, duration=duration, tree=tree,
                                   log_path=str(Path(tmp) / f"rt-{name}.pktlog"), old_cycle=name == "old")
            out[f"realtime_{name}"] = {
                "cycles": rt[name]["cycles"], "overruns": rt[name]["overruns"], "fault": rt[name]["fault"],
                "parts_p50_p99_us": _parts(rt[name]), "compute_us": rt[name]["compute_us"],
                "drive_us (incl. the plant)": rt[name]["drive_us"], "wake_latency_us": rt[name]["wake_latency_us"],
                "log_dropped_blocks": rt[name]["log_dropped_blocks"]}
        out["realtime_settings"] = rt["new"]["realtime"]
    r = config.realtime  # the bare loop runs under the same real-time settings
    rep = apply_realtime(r.priority, r.cpu, r.mlockall, r.gc_freeze)
    try:
        bare = bare_loop_latency(1.0 / rate_hz, int(duration * rate_hz))
    finally:
        restore_realtime(rep)
    out["bare_loop_wake_latency_us"] = percentiles_us(bare)
    out["wake_p99_ratio_loop_over_bare"] = (rt["new"]["wake_latency_us"]["p99"]
                                            / max(percentiles_us(bare)["p99"], 1e-9))
    return out
