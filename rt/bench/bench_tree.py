"""Benchmark: Orthoglide tree tau evaluation (the fast spline path, the old spline kernel it
replaced, the paper's 8^3 boxes, side by side in one run) vs the exact reduction, and the
shipped build; with ``--hexapod``, the shipped hexapod tree (s = 6) instead.

Prints figures, asserts nothing about time. ``run_tree_bench()`` returns them as a dict (used
by ``pkrt bench``). Run: ``.venv/bin/python -m pkrt.rt.bench.bench_tree [--no-build]``.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from numba import njit

from pkrt.models.kinematics.mechanism import load_mechanism
from pkrt.models.reduction.exact import ExactModel
from pkrt.rt.runtime.machine.config import MACHINES_DIR
from pkrt.rt.core.tree import eval_tau_w
from pkrt.rt.core.workspace import TreeWorkspace
from pkrt.rt.core.treefile import load_tree

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


def _tree_figures(tree, states: dict, reps: int, reference: bool = False) -> dict:
    """Median ns per tau evaluation: jitted loop over each state set, and one Python call.
    ``reference``: the kernel before the fast spline path (``Tree.reference_arrays``: binary
    search, Cox-de Boor, unpadded rows) called through numba's dispatcher from Python, as
    ``TreeWorkspace.tau_of`` did."""
    ws = TreeWorkspace(tree)
    T = tree.reference_arrays if reference else tree.arrays
    one = (np.zeros(tree.s), np.zeros(tree.s), np.zeros(tree.s))
    out = {}
    for name, (th, td, tdd) in states.items():
        _tau_loop(T, th[:10], td[:10], tdd[:10], ws.H, ws.D, ws.p_ext, ws.tau, ws.work, *one)  # compile / load
        wall, cpu = _timed(lambda: _tau_loop(T, th, td, tdd, ws.H, ws.D, ws.p_ext, ws.tau, ws.work,
                                             *one), len(th), reps)
        out[f"jit_{name}_ns"], out[f"jit_{name}_cpu_ns"] = wall, cpu
    th, td, tdd = states["random"]
    n_py = min(len(th), 100_000)
    # the state vectors made before the timed loops (a row view costs ~0.15 us to make here,
    # which the figures of the eighth to tenth sessions included: 3 a call)
    calls = [(th[i].copy(), td[i].copy(), tdd[i].copy()) for i in range(n_py)]
    ws.tau_of(tree, *calls[0])

    H, D, p, tau, work = ws.H, ws.D, ws.p_ext, ws.tau, ws.work

    def workspace_loop():
        for a, b, c in calls:
            ws.tau_of(tree, a, b, c)

    def dispatcher_loop():  # the old Python path: numba's dispatcher types every argument
        for a, b, c in calls:
            eval_tau_w(T, a, b, c, H, D, p, tau, work)
    py_loop = dispatcher_loop if reference else workspace_loop
    out["python_call_ns"], out["python_call_cpu_ns"] = _timed(py_loop, n_py, reps)
    return out


def run_tree_bench(n_states: int = 10 ** 6, reps: int = 5, exact_calls: int = 200,
                   build: bool = True, jobs: int | None = None) -> dict:
    """Figures (ns per evaluation are medians over ``reps`` repetitions): the shipped
    controller tree beside the paper's uniform 8^3 quadratic boxes (the tree shipped before),
    along the demo trajectory and at random states; the exact reduction; build times."""
    from pkrt.models.trees.shipped import settings_for
    from pkrt.models.trees.build import build_tree
    from pkrt.models.trees.settings import BuildSettings
    from pkrt.rt.app.reference import plan_reference
    from pkrt.rt.runtime.machine.config import load_machine

    tree = load_tree(MACHINES / "orthoglide.pkt")
    mech = load_mechanism("orthoglide")
    t0 = time.perf_counter()
    boxes, _ = build_tree(mech, BuildSettings(boxes=8, verify_samples=0), jobs=jobs, progress=False)
    boxes_build = time.perf_counter() - t0
    demo = plan_reference(load_machine("orthoglide"), mech=mech)
    k = -(-n_states // demo.n)  # the demo repeated up to n_states states, in its order
    states = {"demo": tuple(np.ascontiguousarray(np.tile(a, (k, 1))[:n_states])
                            for a in (demo.pos, demo.vel, demo.acc)),
              "random": _states(tree, n_states)}
    new = _tree_figures(tree, states, reps)
    ref = _tree_figures(tree, states, reps, reference=True)
    old = _tree_figures(boxes, states, reps)

    # exact reduction along a smooth path of nearby states (its warm-start best case)
    model = ExactModel(mech)
    th, td, tdd = states["random"]
    path = tree.lo + (tree.hi - tree.lo) * (0.5 + 0.3 * np.sin(np.linspace(0, 6.0, exact_calls)[:, None]
                                                                 + np.array([0.0, 2.0, 4.0])))
    model(path[0])

    def exact_loop():
        for i in range(exact_calls):
            model(path[i]).tau(td[i], tdd[i])
    exact_ns, exact_cpu = _timed(exact_loop, exact_calls, 3)

    out = {"tree": "orthoglide.pkt", "kind": tree.kind_name, "grid_points": tree.grid_points,
           "tree_bytes": tree.nbytes, "states": n_states, "demo_samples": demo.n,
           "tree_tau_jit_demo_ns": new["jit_demo_ns"], "tree_tau_jit_random_ns": new["jit_random_ns"],
           "tree_tau_python_call_ns": new["python_call_ns"],
           "tree_tau_jit_demo_cpu_ns": new["jit_demo_cpu_ns"],
           "tree_tau_jit_random_cpu_ns": new["jit_random_cpu_ns"],
           "tree_tau_python_call_cpu_ns": new["python_call_cpu_ns"],
           "boxes8_tau_jit_demo_ns": old["jit_demo_ns"], "boxes8_tau_jit_random_ns": old["jit_random_ns"],
           "boxes8_tau_python_call_ns": old["python_call_ns"],
           "boxes8_tau_jit_demo_cpu_ns": old["jit_demo_cpu_ns"],
           "boxes8_tau_jit_random_cpu_ns": old["jit_random_cpu_ns"],
           "boxes8_tau_python_call_cpu_ns": old["python_call_cpu_ns"],
           "reference_tau_jit_demo_ns": ref["jit_demo_ns"], "reference_tau_jit_random_ns": ref["jit_random_ns"],
           "reference_tau_python_call_ns": ref["python_call_ns"],
           "reference_tau_jit_demo_cpu_ns": ref["jit_demo_cpu_ns"],
           "reference_tau_jit_random_cpu_ns": ref["jit_random_cpu_ns"],
           "reference_tau_python_call_cpu_ns": ref["python_call_cpu_ns"],
           "kernel_bytes": tree.kernel_nbytes,
           "ratio_tree_over_boxes8_jit_demo": new["jit_demo_ns"] / old["jit_demo_ns"],
           "ratio_tree_over_boxes8_python": new["python_call_ns"] / old["python_call_ns"],
           "ratio_tree_over_reference_jit_demo": new["jit_demo_ns"] / ref["jit_demo_ns"],
           "ratio_tree_over_reference_jit_random": new["jit_random_ns"] / ref["jit_random_ns"],
           "ratio_tree_over_reference_python": new["python_call_ns"] / ref["python_call_ns"],
           "exact_reduction_ns": exact_ns, "exact_reduction_cpu_ns": exact_cpu,
           "ratio_exact_over_tree_jit_demo": exact_ns / new["jit_demo_ns"],
           "ratio_exact_over_tree_jit_random": exact_ns / new["jit_random_ns"],
           "ratio_exact_over_tree_python": exact_ns / new["python_call_ns"],
           "ratio_tree_over_boxes8_jit_random": new["jit_random_ns"] / old["jit_random_ns"],
           "boxes8_build_seconds": boxes_build}
    if build:
        _, settings = settings_for("orthoglide.pkt")
        _, stats = build_tree(mech, settings, jobs=jobs, progress=False)
        out["shipped_build_seconds"] = stats["build_seconds"]
        out["shipped_build_with_verify_seconds"] = stats["total_seconds"]
        out["build_jobs"] = jobs or __import__("os").cpu_count()
    return out


def run_hexapod_bench(n_states: int = 10 ** 5, reps: int = 5, exact_calls: int = 200) -> dict:
    """The shipped hexapod tree (s = 6 quadratic boxes): median ns per tau evaluation in a
    jitted loop over random states and along a smooth path, one Python call, and the exact
    reduction along the same path."""
    tree = load_tree(MACHINES / "hexapod.pkt")
    mech = load_mechanism("hexapod")
    phase = np.arange(tree.s) * (2 * np.pi / tree.s)
    t = np.linspace(0.0, 20.0, n_states)[:, None]
    mid, half = 0.5 * (tree.lo + tree.hi), 0.5 * (tree.hi - tree.lo)
    path = (np.ascontiguousarray(mid + 0.9 * half * np.sin(t + phase)),
            np.ascontiguousarray(0.9 * half * np.cos(t + phase)),
            np.ascontiguousarray(-0.9 * half * np.sin(t + phase)))
    fig = _tree_figures(tree, {"path": path, "random": _states(tree, n_states)}, reps)
    model = ExactModel(mech)
    model(path[0][0])

    def exact_loop():
        for i in range(exact_calls):
            model(path[0][i * 97 % n_states]).tau(path[1][i], path[2][i])
    exact_ns, exact_cpu = _timed(exact_loop, exact_calls, 3)
    return {"tree": "hexapod.pkt", "kind": tree.kind_name, "leaves": tree.n_leaves,
            "tree_bytes": tree.nbytes, "states": n_states,
            "tree_tau_jit_path_ns": fig["jit_path_ns"], "tree_tau_jit_random_ns": fig["jit_random_ns"],
            "tree_tau_jit_random_cpu_ns": fig["jit_random_cpu_ns"],
            "tree_tau_python_call_ns": fig["python_call_ns"],
            "exact_reduction_ns": exact_ns, "exact_reduction_cpu_ns": exact_cpu,
            "ratio_exact_over_tree_jit_random": exact_ns / fig["jit_random_ns"]}


def _print_hexapod(r: dict) -> None:
    print(f"Hexapod tree ({r['kind']}, {r['leaves']} leaves, {r['tree_bytes']} bytes), "
          f"{r['states']} states; wall clock, median of repetitions")
    print(f"  jitted loop, smooth path {r['tree_tau_jit_path_ns']:10.1f} ns")
    print(f"  jitted loop, random      {r['tree_tau_jit_random_ns']:10.1f} ns "
          f"({r['tree_tau_jit_random_cpu_ns']:.1f} ns CPU)")
    print(f"  one Python call          {r['tree_tau_python_call_ns']:10.1f} ns")
    print(f"  exact reduction          {r['exact_reduction_ns']:10.1f} ns per call "
          f"({r['ratio_exact_over_tree_jit_random']:.0f} x the jitted tree)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--no-build", action="store_true", help="skip the shipped tree's build timing")
    p.add_argument("--states", type=int, default=10 ** 6)
    p.add_argument("--jobs", type=int, default=None)
    p.add_argument("--json", action="store_true")
    p.add_argument("--hexapod", action="store_true", help="only the hexapod tree (s = 6)")
    a = p.parse_args()
    if a.hexapod:
        h = run_hexapod_bench(min(a.states, 10 ** 5))
        if a.json:
            print(json.dumps(h))
        else:
            _print_hexapod(h)
        return
    r = run_tree_bench(a.states, build=not a.no_build, jobs=a.jobs)
    if a.json:
        print(json.dumps(r))
        return
    print(f"Orthoglide tree ({r['kind']}, grid {r['grid_points']}, {r['tree_bytes']} bytes), "
          f"tau = H tdd + D [td td] - p_ext, {r['states']} states; wall clock, median of repetitions")
    print(f"  kernel arrays {r['kernel_bytes']} bytes (the file's plus the fast path's tables)")
    print("                          fast spline   old spline   boxes 8^3    fast/old  fast/boxes")
    for key, label in (("jit_demo", "jitted loop, demo"), ("jit_random", "jitted loop, random"),
                       ("python_call", "one Python call")):
        new, ref, box = (r[f"{k}_tau_{key}_ns"] for k in ("tree", "reference", "boxes8"))
        print(f"  {label:22s} {new:9.1f} ns {ref:9.1f} ns {box:9.1f} ns {new / ref:9.2f} {new / box:9.2f}")
    print("  CPU time (this thread):")
    for key, label in (("jit_demo", "jitted loop, demo"), ("jit_random", "jitted loop, random"),
                       ("python_call", "one Python call")):
        new, ref, box = (r[f"{k}_tau_{key}_cpu_ns"] for k in ("tree", "reference", "boxes8"))
        print(f"  {label:22s} {new:9.1f} ns {ref:9.1f} ns {box:9.1f} ns {new / ref:9.2f} {new / box:9.2f}")
    print(f"  exact reduction        {r['exact_reduction_ns']:10.1f} ns per call")
    print(f"  exact / tree           {r['ratio_exact_over_tree_jit_demo']:10.0f} x (jitted, demo), "
          f"{r['ratio_exact_over_tree_jit_random']:.0f} x (random), "
          f"{r['ratio_exact_over_tree_python']:.0f} x (Python call)")
    if "shipped_build_seconds" in r:
        print(f"  build of the shipped tree {r['shipped_build_seconds']:.1f} s with {r['build_jobs']} "
              f"jobs ({r['shipped_build_with_verify_seconds']:.1f} s with verification)")


if __name__ == "__main__":
    main()
