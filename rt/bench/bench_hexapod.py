"""Benchmark: the hexapod (``pkrt bench --only hexapod``): its demo planned, then run in
lockstep on the exact plant (``hexapod-sim.toml``) with the tree and with the exact reduction
as the model in the loop, the cycle split into the plant (``drive_us``) and the controller; and
one real-time attempt of 1 s at the configuration's rate (no real-time settings asked) to show
whether the exact plant holds the period here. Prints figures (medians), asserts nothing.
Run: ``.venv/bin/python -m pkrt.rt.bench.bench_hexapod``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

import numpy as np


def _timed_run(config, mech, plan, runs: int = 1, **kw) -> dict:
    """Medians over ``runs`` lockstep runs of the summary's p50 figures and of the wall time."""
    from pkrt.drivers import open_drives
    from pkrt.rt.app.reference import ExactInLoop
    from pkrt.rt.runtime.machine.run import run_session

    rows = []
    for _ in range(runs):
        drives = open_drives(config, plant_model=ExactInLoop(mech))
        t0 = time.perf_counter()
        r = run_session(config, drives, trajectory=plan, **kw)
        rows.append((time.perf_counter() - t0, r["drive_us"]["p50"], r["drive_us"]["p99"], r["controller_us"]["p50"],
                     r["controller_us"]["p99"], r["rms_error"], r["overruns"], r["cycles"], r["fault"]))
    med = [float(np.median([x[i] for x in rows])) for i in range(6)]
    last = rows[-1]
    return {"runs": runs, "wall_s": med[0], "plant_us_p50": med[1], "plant_us_p99": med[2],
            "controller_us_p50": med[3], "controller_us_p99": med[4], "rms_error_m": med[5],
            "overruns": last[6], "cycles": last[7], "fault": last[8]}


def run_hexapod_bench(runs: int = 3) -> dict:
    from pkrt.rt.app.reference import exact_model, machine_mechanism, plan_reference
    from pkrt.rt.runtime.machine.config import load_machine

    config = load_machine("hexapod")
    mech = machine_mechanism(config)
    t0 = time.perf_counter()
    plan = plan_reference(config, mech=mech)
    plan_s = time.perf_counter() - t0
    tree = _timed_run(config, mech, plan, runs, lockstep=True)
    exact_cfg = dataclasses.replace(config, controller=dataclasses.replace(config.controller, model="exact"))
    model, before = exact_model(exact_cfg, plan, lockstep=True)
    exact = _timed_run(exact_cfg, mech, plan, 1, lockstep=True, model=model)
    realtime = _timed_run(config, mech, plan, 1, lockstep=False, duration=1.0, realtime=False)
    period_us = 1e6 / config.rate_hz
    return {
        "load_average_1min": os.getloadavg()[0], "substeps": config.drives.substeps, "plan_s": plan_s,
        "demo_cycles": plan.n, "lockstep_tree": tree, "lockstep_exact_in_loop": exact,
        "exact_model_us_before_loop": before, "realtime_1s_tree": realtime,
        "ratio_plant_over_period": tree["plant_us_p50"] / period_us,
        "ratio_plant_over_tree_controller": tree["plant_us_p50"] / tree["controller_us_p50"],
        "ratio_exact_over_tree_controller": exact["controller_us_p50"] / tree["controller_us_p50"],
        "exact_evaluation_us_in_plant": tree["plant_us_p50"] / (4 * config.drives.substeps),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args()
    print(json.dumps(run_hexapod_bench(a.runs), indent=1))


if __name__ == "__main__":
    main()
