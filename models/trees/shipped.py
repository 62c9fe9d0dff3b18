"""Rebuild the trees shipped in ``models/machines/`` (builds are deterministic on a machine).

Run: ``.venv/bin/python -m pkrt.models.trees.shipped [NAME ...] [--jobs N]``. The equivalent
commands are printed with ``--list``, e.g. ``pkrt build fourbar -o models/machines/fourbar.pkt
--kind spline --tol 0.001``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from pkrt.rt.core.treefile import save_tree

from ..kinematics.mechanism import load_mechanism
from .build import build_tree
from .settings import BuildSettings

MACHINES = Path(__file__).resolve().parent.parent / "machines"

# file name -> (model, build settings); the settings are those the CLI would use
SHIPPED: dict[str, tuple[str, dict]] = {
    # graded tensor cubic splines (see docs/trees.md, "Memory against accuracy", for the measurements behind the choice)
    "fourbar.pkt": ("fourbar", {"kind": "spline", "tol": 1e-3}),
    "fivebar.pkt": ("fivebar", {"kind": "spline", "tol": 1e-3}),
    "orthoglide.pkt": ("orthoglide", {"kind": "spline", "tol": 5e-3}),  # the controller's
    # the simulated plant's physics: at least 10x more accurate than the controller's tree
    "orthoglide-plant.pkt": ("orthoglide", {"kind": "spline", "tol": 2e-4}),
    "delta.pkt": ("delta", {"kind": "spline", "tol": 5e-3}),  # the controller's
    "delta-plant.pkt": ("delta", {"kind": "spline", "tol": 2e-4}),  # measured 44x more accurate in tau
    # 6 actuators: adaptive quadratic boxes (a 6-D tensor spline sums 4^6 rows per output)
    "hexapod.pkt": ("hexapod", {"kind": "boxes", "tol": 0.015, "verify_samples": 30000}),
    # the HIL emulators' plant (hexapod-can): only the box its demo needs (legs within
    # [-0.016, 0.025] m), 14x more accurate in tau than the controller's tree over the whole box
    "hexapod-plant.pkt": ("hexapod", {"kind": "boxes", "tol": 0.003, "region": (-0.03, 0.03)}),
}


def settings_for(name: str) -> tuple[str, BuildSettings]:
    model, kw = SHIPPED[name]
    return model, BuildSettings(**kw)


def command_for(name: str) -> str:
    model, kw = SHIPPED[name]
    opts = " ".join(f"--{k.replace('_', '-')}={','.join(map(str, v))}" if isinstance(v, tuple)
                    else f"--{k.replace('_', '-')} {v}" for k, v in kw.items())
    return f"pkrt build {model} -o models/machines/{name} {opts}"


def rebuild(name: str, jobs: int | None = None, out_dir: Path = MACHINES) -> Path:
    model, settings = settings_for(name)
    tree, _ = build_tree(load_mechanism(model), settings, jobs=jobs)
    path = out_dir / name
    save_tree(tree, path)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("names", nargs="*", help=f"trees to rebuild (default: all of {list(SHIPPED)})")
    p.add_argument("--jobs", type=int, default=None)
    p.add_argument("--list", action="store_true", help="print the equivalent pkrt commands")
    a = p.parse_args(argv)
    names = a.names or list(SHIPPED)
    for n in names:
        if n not in SHIPPED:
            p.error(f"unknown tree {n!r}; shipped: {', '.join(SHIPPED)}")
    for n in names:
        if a.list:
            print(command_for(n))
            continue
        t = time.perf_counter()
        path = rebuild(n, a.jobs)
        print(f"{path}: {path.stat().st_size} bytes in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
