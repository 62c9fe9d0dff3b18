"""Benchmark: one exact reduction of the Orthoglide (assembly + reduce_at), medians.

Run: ``.venv/bin/python tests/bench/bench_reduction.py``. Prints figures; asserts nothing.

- ``warm_nearby_ms``: assemble at theta from the solution at a nearby theta (|dtheta| = 2 mm
  per axis, the spacing of a tree's sample points) and reduce; the tree builder's case.
- ``warm_reference_ms``: assemble at a random theta in the box walking from the reference
  configuration (theta = 0), with sub-stepping, and reduce.
- ``reduce_only_ms``: ``reduce_at`` on an already assembled configuration.
- ``assemble_nearby_ms``: the assembly part of ``warm_nearby_ms``.
"""

from __future__ import annotations

import time

import numpy as np

from pkrt.models.mechanism import load_mechanism
from pkrt.models.reduction import Assembler, reduce_at


def _median_ms(samples: list[float]) -> float:
    return float(np.median(samples) * 1e3)


def run_reduction_bench(n: int = 300, seed: int = 0) -> dict:
    """Median wall times (ms) of exact reductions of the Orthoglide; see the module docstring."""
    mech = load_mechanism("orthoglide")
    rng = np.random.default_rng(seed)
    lo, hi = mech.ranges[:, 0], mech.ranges[:, 1]
    asm = Assembler(mech)
    # warm up the numba kernels and caches
    for _ in range(3):
        reduce_at(mech, asm.solve(np.zeros(3)), np.zeros(3))

    nearby, assemble_only, reduce_only = [], [], []
    for _ in range(n):
        base = rng.uniform(lo + 0.002, hi - 0.002)
        asm.solve(base)
        theta = base + rng.choice([-0.002, 0.002], size=3)
        t0 = time.perf_counter()
        cfg = asm.solve(theta)
        t1 = time.perf_counter()
        reduce_at(mech, cfg, theta)
        t2 = time.perf_counter()
        nearby.append(t2 - t0)
        assemble_only.append(t1 - t0)
        reduce_only.append(t2 - t1)

    from_ref = []
    for _ in range(max(n // 3, 10)):
        theta = rng.uniform(lo, hi)
        asm.reset()
        t0 = time.perf_counter()
        reduce_at(mech, asm.solve(theta), theta)
        from_ref.append(time.perf_counter() - t0)

    return {
        "model": mech.name,
        "coordinates": mech.n_coords,
        "constraint_rows": mech.n_rows,
        "samples": n,
        "warm_nearby_ms": _median_ms(nearby),
        "warm_reference_ms": _median_ms(from_ref),
        "assemble_nearby_ms": _median_ms(assemble_only),
        "reduce_only_ms": _median_ms(reduce_only),
    }


def main() -> None:
    r = run_reduction_bench()
    print(f"exact reduction of the {r['model']} ({r['coordinates']} coordinates, "
          f"{r['constraint_rows']} constraint rows), medians over {r['samples']} samples:")
    for key in ("warm_nearby_ms", "warm_reference_ms", "assemble_nearby_ms", "reduce_only_ms"):
        print(f"  {key:<20s} {r[key]:8.3f} ms")


if __name__ == "__main__":
    main()
