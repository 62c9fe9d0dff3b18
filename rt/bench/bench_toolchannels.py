"""Benchmark: the tool channels' forward kinematics per log row (``pkrt.rt.app.toolchannels``:
``TaskKinematics.forward``, Newton per row by the model's constraint solver).

Run: ``.venv/bin/python -m pkrt.rt.bench.bench_toolchannels`` (about a minute). Prints figures;
asserts nothing.

For each machine with a tool, the rows are a planned reference at 1 kHz, as a log holds them:
the configuration's demo for the Orthoglide (5393 rows) and the Delta (2301 rows), a 5 s circle
with a tilt oscillation for the hexapod (5001 rows). ``warm_us_per_row``: every row from the
last row's solution, as the tool channels are computed (median of 3 passes over all rows);
``cold_us_per_row``: each row from the reference assembly (median over 300 rows), and the ratio
cold / warm; ``seconds_per_10k_rows``: both channels (reference and measured) of a 10 s log at
1 kHz, from the warm figure.
"""

from __future__ import annotations

import time

import numpy as np

from pkrt.models.kinematics.mechanism import load_mechanism
from pkrt.models.kinematics.taskspace import TaskKinematics, circle, plan_demo
from pkrt.rt.runtime.machine.config import load_machine

RATE = 1000.0


def _rows(name: str) -> np.ndarray:
    """A planned reference (actuator values, one row per cycle at 1 kHz)."""
    if name == "hexapod":
        mech = load_mechanism("hexapod")
        home = TaskKinematics(mech).forward(mech.theta_ref)[0]
        return TaskKinematics(mech).plan(circle(home, 0.05, 5.0, RATE, tilt=0.05)).pos
    config = load_machine(name)
    return plan_demo(load_mechanism(config.model_path), config.demo, RATE).pos


def machine_fk_times(name: str, passes: int = 3, cold_rows: int = 300) -> dict:
    rows = _rows(name)
    kin = TaskKinematics(load_mechanism(name))
    kin.forward(rows[:2], missing=True)  # compile or load the kernels
    warm = []
    for _ in range(passes):
        kin.assembler.reset()
        t0 = time.perf_counter()
        kin.forward(rows, missing=True)
        warm.append((time.perf_counter() - t0) / len(rows))
    cold = []
    for th in rows[np.linspace(0, len(rows) - 1, cold_rows).astype(int)]:
        kin.assembler.reset()
        t0 = time.perf_counter()
        kin.forward(th, missing=True)
        cold.append(time.perf_counter() - t0)
    w, c = float(np.median(warm)) * 1e6, float(np.median(cold)) * 1e6
    return {"rows": len(rows), "warm_us_per_row": w, "cold_us_per_row": c, "cold_over_warm": c / w,
            "seconds_per_10k_rows": 2 * 10_000 * w * 1e-6}


def run_toolchannels_bench() -> dict:
    return {name: machine_fk_times(name) for name in ("orthoglide", "delta", "hexapod")}


if __name__ == "__main__":
    import json

    print(json.dumps(run_toolchannels_bench(), indent=2))
