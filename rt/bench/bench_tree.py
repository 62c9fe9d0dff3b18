"""Benchmark: Orthoglide tree tau evaluation vs the exact reduction, and the 512-box build.

Prints figures, asserts nothing about time. ``run_tree_bench()`` returns them as a dict (used
by ``pkrt bench``). Run: ``.venv/bin/python -m pkrt.rt.bench.bench_tree [--no-build]``.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from numba import njit

from pkrt.models.mechanism import load_mechanism
from pkrt.models.reduction import ExactModel
from pkrt.rt.config import MACHINES_DIR
from pkrt.rt.tree import TreeWorkspace, eval_tau_w
from pkrt.rt.treefile import load_tree

MACHINES = MACHINES_DIR


@njit(cache=False)  # run as a script and as pkrt.rt.bench.bench_tree: one numba cache would serve two module names
def _tau_loop(T, thetas, tds, tdds, H, D, p_ext, tau, work, theta, td, tdd):
    """eval_tau_w over every state; returns a checksum so the work cannot be elided. Each
    state is copied into the preallocated 1-d theta, td, tdd first, as the controller holds
    it (row views would cost reference counting per state)."""
    acc = 0.0
    bad = 0
    for i in range(thetas.shape[0]):
        for j in range(thetas.shape[1]):
            theta[j] = thetas[i, j]
            td[j] = tds[i, j]
            tdd[j] = tdds[i, j]
        st = eval_tau_w(T, theta, td, tdd, H, D, p_ext, tau, work)
        bad += st
        acc += tau[0]
    return acc + bad


def _states(tree, n: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    w = tree.hi - tree.lo
    th = tree.lo + w * rng.random((n, tree.s))
    td = 2.0 * w * (2 * rng.random((n, tree.s)) - 1)
    tdd = 20.0 * w * (2 * rng.random((n, tree.s)) - 1)
    return th, td, tdd


def _timed(fn, n: int, reps: int) -> tuple[float, float]:
    """Median ns per item over reps: (wall clock, this thread's CPU time). CPU time is the
    fairer figure on a machine shared with other work."""
    wall, cpu = [], []
    for _ in range(reps):
        t, c = time.perf_counter(), time.thread_time()
        fn()
        cpu.append((time.thread_time() - c) / n)
        wall.append((time.perf_counter() - t) / n)
    return float(np.median(wall) * 1e9), float(np.median(cpu) * 1e9)


def run_tree_bench(n_states: int = 10 ** 6, reps: int = 5, exact_calls: int = 200,
                   build: bool = True, jobs: int | None = None) -> dict:
    """Figures (ns per evaluation are medians over ``reps`` repetitions)."""
    tree = load_tree(MACHINES / "orthoglide.pkt")
    ws = TreeWorkspace(tree)
    th, td, tdd = _states(tree, n_states)
    T = tree.arrays
    state = (np.zeros(tree.s), np.zeros(tree.s), np.zeros(tree.s))
    _tau_loop(T, th[:10], td[:10], tdd[:10], ws.H, ws.D, ws.p_ext, ws.tau, ws.work, *state)  # compile / load
    jit_ns, jit_cpu = _timed(lambda: _tau_loop(T, th, td, tdd, ws.H, ws.D, ws.p_ext, ws.tau, ws.work,
                                               *state), n_states, reps)

    n_py = min(n_states, 100_000)
    ws.tau_of(tree, th[0], td[0], tdd[0])

    def py_loop():
        for i in range(n_py):
            ws.tau_of(tree, th[i], td[i], tdd[i])
    py_ns, py_cpu = _timed(py_loop, n_py, reps)

    # exact reduction along a smooth path of nearby states (its warm-start best case)
    mech = load_mechanism("orthoglide")
    model = ExactModel(mech)
    path = tree.lo + (tree.hi - tree.lo) * (0.5 + 0.3 * np.sin(np.linspace(0, 6.0, exact_calls)[:, None]
                                                                 + np.array([0.0, 2.0, 4.0])))
    model(path[0])

    def exact_loop():
        for i in range(exact_calls):
            model(path[i]).tau(td[i], tdd[i])
    exact_ns, exact_cpu = _timed(exact_loop, exact_calls, 3)

    out = {"tree": "orthoglide.pkt", "leaves": tree.n_leaves, "states": n_states,
           "tree_tau_jit_loop_ns": jit_ns, "tree_tau_python_call_ns": py_ns,
           "exact_reduction_ns": exact_ns,
           "tree_tau_jit_loop_cpu_ns": jit_cpu, "tree_tau_python_call_cpu_ns": py_cpu,
           "exact_reduction_cpu_ns": exact_cpu,
           "ratio_exact_over_tree_jit": exact_ns / jit_ns,
           "ratio_exact_over_tree_python": exact_ns / py_ns,
           "ratio_exact_over_tree_jit_cpu": exact_cpu / jit_cpu}
    if build:
        from pkrt.models.treebuild import BuildSettings, build_tree
        _, stats = build_tree(mech, BuildSettings(boxes=8), jobs=jobs, progress=False)
        out["build_512_seconds"] = stats["build_seconds"]
        out["build_512_with_verify_seconds"] = stats["total_seconds"]
        out["build_jobs"] = jobs or __import__("os").cpu_count()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--no-build", action="store_true", help="skip the 512-box build timing")
    p.add_argument("--states", type=int, default=10 ** 6)
    p.add_argument("--jobs", type=int, default=None)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    r = run_tree_bench(a.states, build=not a.no_build, jobs=a.jobs)
    if a.json:
        print(json.dumps(r))
        return
    print(f"Orthoglide tree ({r['leaves']} leaves), tau = H tdd + D [td td] - p_ext, "
          f"{r['states']} random states")
    print("                     wall clock    CPU time (median of repetitions)")
    print(f"  jitted loop      {r['tree_tau_jit_loop_ns']:10.1f} ns {r['tree_tau_jit_loop_cpu_ns']:10.1f} ns  per evaluation")
    print(f"  Python tau_of    {r['tree_tau_python_call_ns']:10.1f} ns {r['tree_tau_python_call_cpu_ns']:10.1f} ns  per evaluation")
    print(f"  exact reduction  {r['exact_reduction_ns']:10.1f} ns {r['exact_reduction_cpu_ns']:10.1f} ns  per call")
    print(f"  exact / tree     {r['ratio_exact_over_tree_jit']:10.0f} x (jitted), "
          f"{r['ratio_exact_over_tree_python']:.0f} x (Python call)")
    if "build_512_seconds" in r:
        print(f"  build 8x8x8      {r['build_512_seconds']:10.1f} s with {r['build_jobs']} jobs "
              f"({r['build_512_with_verify_seconds']:.1f} s with verification)")


if __name__ == "__main__":
    main()
