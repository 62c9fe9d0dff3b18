"""Benchmark: one exact reduction (assembly + reduce_at) of the Orthoglide, medians; and of
every shipped machine, p50 and p99.

Run: ``.venv/bin/python -m pkrt.rt.bench.bench_reduction``. Prints figures; asserts nothing.

- ``warm_nearby_ms``: assemble at theta from the solution at a nearby theta (|dtheta| = 2 mm
  per axis, the spacing of a tree's sample points) and reduce; the tree builder's case.
- ``warm_reference_ms``: assemble at a random theta in the box walking from the reference
  configuration (theta = 0), with sub-stepping, and reduce.
- ``reduce_only_ms``: ``reduce_at`` on an already assembled configuration.
- ``assemble_nearby_ms``: the assembly part of ``warm_nearby_ms``.
- ``machines``: for each shipped machine (fourbar, fivebar, orthoglide, delta, hexapod), the
  exact reduction per call warm from a nearby configuration (each actuator 0.5 % of its range
  width away, random signs: about one loop period of fast motion), p50 and p99 in ms, with
  its assembly and reduction parts (p50); beside it, where the machine ships a controller tree
  (``models/machines/NAME.pkt``), the tree's evaluation per call (H, D, p_ext) at the same
  states, p50 and p99 in us, and the ratio of the p50s.
"""

from __future__ import annotations

import time

import numpy as np

from pkrt.models.kinematics.mechanism import load_mechanism
from pkrt.models.kinematics.assembly import Assembler
from pkrt.models.reduction.exact import reduce_at
from pkrt.rt.runtime.machine.config import MACHINES_DIR
from pkrt.rt.core.tree import eval_outputs_w, n_outputs, work_size
from pkrt.rt.core.treefile import load_tree


def _median_ms(samples: list[float]) -> float:
    return float(np.median(samples) * 1e3)


SHIPPED = ("fourbar", "fivebar", "orthoglide", "delta", "hexapod")


def _nearby_times(mech, asm: Assembler, rng, n: int, d: np.ndarray):
    """n reductions each from the solution at a random theta d away (random signs): wall times
    (s) of (assembly + reduction, assembly, reduction)."""
    lo, hi = mech.ranges[:, 0], mech.ranges[:, 1]
    for _ in range(3):  # warm up the numba kernels and caches
        reduce_at(mech, asm.solve(mech.theta_ref), mech.theta_ref)
    total, assemble, reduce, thetas = [], [], [], []
    for _ in range(n):
        base = rng.uniform(lo + d, hi - d)
        asm.solve(base)
        theta = base + rng.choice([-1.0, 1.0], size=mech.n_act) * d
        thetas.append(theta)
        t0 = time.perf_counter()
        cfg = asm.solve(theta)
        t1 = time.perf_counter()
        reduce_at(mech, cfg, theta)
        t2 = time.perf_counter()
        total.append(t2 - t0)
        assemble.append(t1 - t0)
        reduce.append(t2 - t1)
    return total, assemble, reduce, np.array(thetas)


def tree_times(name: str, thetas: np.ndarray) -> list[float] | None:
    """Wall time (s) of the shipped controller tree's evaluation at each theta, or None."""
    path = MACHINES_DIR / f"{name}.pkt"
    if not path.exists():
        return None
    tree = load_tree(path)
    T, s = tree.arrays, tree.s
    f, work = np.zeros(n_outputs(s)), np.zeros(work_size(s))
    for th in thetas[:10]:  # compile or load from cache
        eval_outputs_w(T, th, f, work)
    out = []
    for th in thetas:
        t0 = time.perf_counter()
        eval_outputs_w(T, th, f, work)
        out.append(time.perf_counter() - t0)
    return out


def machine_reduction_times(name: str, n: int = 300, seed: int = 0, step: float = 0.005) -> dict:
    """Exact reduction per call, warm from a nearby configuration (``step`` of each range
    width away): p50 and p99 (ms), and the p50 of its assembly and reduction parts."""
    mech = load_mechanism(name)
    d = step * (mech.ranges[:, 1] - mech.ranges[:, 0])
    total, assemble, reduce, thetas = _nearby_times(mech, Assembler(mech), np.random.default_rng(seed), n, d)
    ms = np.array(total) * 1e3
    out = {"actuators": mech.n_act, "coordinates": mech.n_coords, "constraint_rows": mech.n_rows,
           "samples": n, "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
           "assemble_p50_ms": _median_ms(assemble), "reduce_p50_ms": _median_ms(reduce),
           "tree_p50_us": None, "tree_p99_us": None, "exact_over_tree_p50": None}
    tree = tree_times(name, thetas)
    if tree is not None:
        us = np.array(tree) * 1e6
        out.update(tree_p50_us=float(np.percentile(us, 50)), tree_p99_us=float(np.percentile(us, 99)),
                   exact_over_tree_p50=out["p50_ms"] * 1e3 / float(np.percentile(us, 50)))
    return out


def run_reduction_bench(n: int = 300, seed: int = 0) -> dict:
    """Median wall times (ms) of exact reductions of the Orthoglide; see the module docstring."""
    mech = load_mechanism("orthoglide")
    rng = np.random.default_rng(seed)
    lo, hi = mech.ranges[:, 0], mech.ranges[:, 1]
    asm = Assembler(mech)
    nearby, assemble_only, reduce_only, _ = _nearby_times(mech, asm, rng, n, np.full(3, 0.002))

    from_ref = []
    for _ in range(max(n // 3, 10)):
        theta = rng.uniform(lo, hi)
        asm.reset()
        t0 = time.perf_counter()
        reduce_at(mech, asm.solve(theta), theta)
        from_ref.append(time.perf_counter() - t0)

    return {
        "machines": {name: machine_reduction_times(name, n, seed) for name in SHIPPED},
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
    print("exact reduction per call, warm from a nearby configuration (ms), and the shipped tree (us):")
    print(f"  {'machine':<11s} {'s':>2s} {'coords':>6s} {'rows':>5s} {'p50':>8s} {'p99':>8s} "
          f"{'assemble':>9s} {'reduce':>8s} {'tree p50':>9s} {'tree p99':>9s} {'exact/tree':>10s}")
    for name, m in r["machines"].items():
        tree = (f"{m['tree_p50_us']:9.2f} {m['tree_p99_us']:9.2f} {m['exact_over_tree_p50']:9.0f}x"
                if m["tree_p50_us"] is not None else f"{'-':>9s} {'-':>9s} {'-':>10s}")
        print(f"  {name:<11s} {m['actuators']:2d} {m['coordinates']:6d} {m['constraint_rows']:5d} "
              f"{m['p50_ms']:8.3f} {m['p99_ms']:8.3f} {m['assemble_p50_ms']:9.3f} {m['reduce_p50_ms']:8.3f} {tree}")


if __name__ == "__main__":
    main()
