"""Benchmark: tracking of the Orthoglide demo under computed torque in lockstep, with the
shipped controller tree beside the paper's uniform 8^3 quadratic boxes (the tree shipped
before), same run, same plant (the shipped plant tree), nominal and 10 % heavier plant.

Prints figures, asserts nothing. ``run_tracking_bench()`` returns them as a dict (used by
``pkrt bench --only tracking``). Run: ``.venv/bin/python -m pkrt.rt.bench.bench_tracking``.
"""

from __future__ import annotations

import argparse
import json

from pkrt.drivers import open_drives
from pkrt.models.kinematics.mechanism import load_mechanism
from pkrt.models.trees.build import build_tree
from pkrt.models.trees.settings import BuildSettings
from pkrt.rt.app.reference import plan_reference
from pkrt.rt.runtime.machine.config import load_machine
from pkrt.rt.runtime.machine.runsetup import load_controller_tree
from pkrt.rt.runtime.machine.run import run_session


def run_tracking_bench(jobs: int | None = None) -> dict:
    """RMS and max tracking error (m) and the lockstep speed per (tree, mass scale)."""
    config = load_machine("orthoglide")
    shipped = load_controller_tree(config)
    boxes, _ = build_tree(load_mechanism(config.model_path), BuildSettings(boxes=8, verify_samples=0),
                          jobs=jobs, progress=False)
    out = {"shipped_tree": f"{shipped.kind_name} {shipped.grid_points}", "before_tree": "boxes 8^3"}
    demo = plan_reference(config)
    for ms in (1.0, 1.1):
        for name, tree in (("shipped", shipped), ("boxes8", boxes)):
            r = run_session(config, open_drives(config, {"mass_scale": ms}), trajectory=demo, lockstep=True, tree=tree)
            key = f"{name}_mass{ms:g}"
            out[f"{key}_rms_error_m"] = r["rms_error"]
            out[f"{key}_max_error_m"] = r["max_error"]
            out[f"{key}_fault"] = r["fault"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--jobs", type=int, default=None)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    r = run_tracking_bench(a.jobs)
    if a.json:
        print(json.dumps(r))
        return
    print("Orthoglide demo, computed torque, lockstep; plant: the shipped plant tree")
    print(f"                         shipped ({r['shipped_tree']})     boxes 8^3 (before)")
    for ms in (1.0, 1.1):
        s, b = f"shipped_mass{ms:g}", f"boxes8_mass{ms:g}"
        print(f"  mass x {ms:<4g} RMS / max   {r[s + '_rms_error_m'] * 1e6:7.2f} / {r[s + '_max_error_m'] * 1e6:6.2f} um"
              f"      {r[b + '_rms_error_m'] * 1e6:7.2f} / {r[b + '_max_error_m'] * 1e6:6.2f} um")


if __name__ == "__main__":
    main()
