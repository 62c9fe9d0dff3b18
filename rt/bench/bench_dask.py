"""Benchmark: one tree built in one process, on the process pool and on Dask (LocalCluster of
1 and 2 worker processes), same bytes checked; peak memory of the client, the scheduler and
the workers of a build on a cluster started as processes (``dask scheduler``, ``dask worker``).

Prints figures, asserts nothing about time (only that every build gives the same bytes).
``run_dask_bench()`` returns them as a dict (``pkrt bench --only dask``). Run:
``.venv/bin/python -m pkrt.rt.bench.bench_dask [--boxes N] [--reps R]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from pkrt.models.kinematics.mechanism import load_mechanism
from pkrt.models.trees.build import build_tree
from pkrt.models.trees.settings import BuildSettings
from pkrt.rt.core.treefile import tree_bytes
from pkrt.rt.bench.daskcluster import BIN, ProcessCluster, peak_rss_mb

MODEL = "orthoglide"


def _timed_build(mech, boxes: int, jobs: int | None, scheduler: str | None) -> tuple[float, bytes]:
    """Wall time of ``build_tree`` (with the verification) and the tree's bytes."""
    t = time.perf_counter()
    tree, _ = build_tree(mech, BuildSettings(boxes=boxes), jobs=jobs, progress=False,
                         scheduler=scheduler)
    return time.perf_counter() - t, tree_bytes(tree)


def _build_process_rss(argv: list[str], out: Path, model: str = MODEL) -> tuple[float, float, bytes]:
    """Run ``pkrt build`` as a child: (wall s, its peak RSS MB, the tree's bytes). The peak is
    the child's VmHWM read every 20 ms while it runs (a fork's rusage also counts the parent's
    pages)."""
    t = time.perf_counter()
    p = subprocess.Popen([str(BIN / "pkrt"), "build", model, "-o", str(out), *argv],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0.0
    while p.poll() is None:
        peak = max(peak, peak_rss_mb(p.pid) or 0.0)
        time.sleep(0.02)
    wall = time.perf_counter() - t
    err = p.stderr.read().decode()
    p.stderr.close()
    if p.returncode != 0:
        raise RuntimeError(f"pkrt build {' '.join(argv)} failed: {err}")
    return wall, peak, out.read_bytes()


def run_dask_bench(boxes: int = 8, reps: int = 5) -> dict:
    """Figures: medians over ``reps`` builds of the Orthoglide's ``boxes``^3 uniform tree. The
    configurations take turns within each repetition (the machine's load drifts); the two
    LocalClusters are started once, their start and stop timed apart."""
    import logging

    import distributed

    logging.getLogger("distributed").setLevel(logging.ERROR)  # the in-process schedulers' INFO lines
    mech = load_mechanism(MODEL)
    out: dict = {"model": MODEL, "boxes": boxes, "reps": reps, "cores": os.cpu_count(),
                 "load_average_1min_before": os.getloadavg()[0]}
    clusters, configs = {}, {"single_process": (1, None), "process_pool_2": (2, None)}
    try:
        for n in (1, 2):
            t = time.perf_counter()
            clusters[n] = distributed.LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                                   dashboard_address=":0", silence_logs=logging.ERROR)
            out[f"local_cluster_{n}_start_s"] = time.perf_counter() - t
            configs[f"local_cluster_{n}_worker{'s' if n > 1 else ''}"] = (None, clusters[n].scheduler_address)
        times: dict[str, list[float]] = {name: [] for name in configs}
        # CPU seconds: this process (the whole single-process build; with a LocalCluster the
        # client and the scheduler), and the 1-worker cluster's worker process
        cpu: dict[str, list[float]] = {"single_process": [], "local_cluster_1_client": [],
                                       "local_cluster_1_worker": []}
        watch = distributed.Client(clusters[1])
        ref = None
        for _ in range(reps):
            for name, (jobs, scheduler) in configs.items():
                c0, w0 = time.process_time(), watch.run(time.process_time)
                dt, data = _timed_build(mech, boxes, jobs, scheduler)
                c1, w1 = time.process_time(), watch.run(time.process_time)
                if name == "single_process":
                    cpu[name].append(c1 - c0)
                if name == "local_cluster_1_worker":
                    cpu["local_cluster_1_client"].append(c1 - c0)
                    cpu[name].append(sum(w1[w] - w0[w] for w in w1))
                times[name].append(dt)
                ref = data if ref is None else ref
                if data != ref:
                    raise AssertionError(f"{name}: the tree's bytes differ from the single-process build")
        watch.close()
    finally:
        for n, c in clusters.items():
            t = time.perf_counter()
            c.close()
            out[f"local_cluster_{n}_stop_s"] = time.perf_counter() - t
    for name in configs:
        out[f"{name}_s"] = float(np.median(times[name]))
    for name in list(configs)[1:]:
        out[f"speedup_{name}"] = out["single_process_s"] / out[f"{name}_s"]
    for name, v in cpu.items():
        out[f"{name}_cpu_s"] = float(np.median(v))
    out["scheduler_local_2_workers_with_start_stop_s"], data = _timed_build(mech, boxes, 2, "local")
    if data != ref:
        raise AssertionError("--scheduler local: the tree's bytes differ from the single-process build")

    # memory: a build on a scheduler and 2 workers started as processes
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        wall1, rss1, data1 = _build_process_rss(["--boxes", str(boxes), "--jobs", "1"], tmp / "one.pkt")
        with ProcessCluster(2, tmp / "logs", nanny=False) as c:
            base_rss = {"scheduler": peak_rss_mb(c.scheduler.pid),
                        "workers": [peak_rss_mb(w.pid) for w in c.workers]}
            wall2, rss2, data2 = _build_process_rss(
                ["--boxes", str(boxes), "--scheduler", c.address], tmp / "two.pkt")
            sched = peak_rss_mb(c.scheduler.pid)
            workers = [peak_rss_mb(w.pid) for w in c.workers]
    out.update({
        "single_process_cli_s": wall1, "single_process_cli_peak_rss_mb": rss1,
        "cluster_2_workers_cli_s": wall2, "cluster_client_peak_rss_mb": rss2,
        "cluster_scheduler_peak_rss_mb": sched, "cluster_worker_peak_rss_mb": workers,
        "cluster_idle_scheduler_rss_mb": base_rss["scheduler"],
        "cluster_idle_worker_rss_mb": base_rss["workers"],
        "load_average_1min_after": os.getloadavg()[0],
        "builds_with_the_same_bytes": len(configs) * reps + 3,
    })
    if not data1 == data2 == ref:
        raise AssertionError("pkrt build: the tree's bytes differ between --jobs 1, --scheduler "
                             "and the builds above")
    return out


def run_hexapod_dask_bench(tol: float = 0.02) -> dict:
    """The 6-D build (the hexapod, adaptive boxes at ``tol``, with its default verification)
    on a scheduler and 2 workers started as processes: wall time and peak RSS of the client,
    the scheduler and each worker; then the same build on the process pool of 2 (its peak RSS
    and the same bytes)."""
    argv = ["--kind", "boxes", "--tol", str(tol)]
    out: dict = {"model": "hexapod", "tol": tol, "cores": os.cpu_count(),
                 "load_average_1min_before": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        with ProcessCluster(2, tmp / "logs", nanny=False) as c:
            idle = {"scheduler": peak_rss_mb(c.scheduler.pid), "workers": [peak_rss_mb(w.pid) for w in c.workers]}
            wall, client, data = _build_process_rss([*argv, "--scheduler", c.address], tmp / "dask.pkt", "hexapod")
            out.update({"cluster_2_workers_s": wall, "cluster_client_peak_rss_mb": client,
                        "cluster_scheduler_peak_rss_mb": peak_rss_mb(c.scheduler.pid),
                        "cluster_worker_peak_rss_mb": [peak_rss_mb(w.pid) for w in c.workers],
                        "cluster_idle_scheduler_rss_mb": idle["scheduler"],
                        "cluster_idle_worker_rss_mb": idle["workers"]})
        wall2, rss2, data2 = _build_process_rss([*argv, "--jobs", "2"], tmp / "pool.pkt", "hexapod")
    out.update({"process_pool_2_s": wall2, "process_pool_2_main_peak_rss_mb": rss2, "tree_bytes": len(data),
                "same_bytes": data == data2, "load_average_1min_after": os.getloadavg()[0]})
    if data != data2:
        raise AssertionError("hexapod: the Dask build's bytes differ from the process pool's")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--boxes", type=int, default=8)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", action="store_true")
    p.add_argument("--hexapod", type=float, metavar="TOL",
                   help="instead: the 6-D hexapod build at this --tol on 2 worker processes (peak RSS)")
    a = p.parse_args()
    if a.hexapod:
        h = run_hexapod_dask_bench(a.hexapod)
        if a.json:
            print(json.dumps(h))
            return
        print(f"hexapod --kind boxes --tol {a.hexapod} with its verification, {h['cores']} cores, load "
              f"{h['load_average_1min_before']:.1f} -> {h['load_average_1min_after']:.1f}; one build each")
        print(f"  scheduler + 2 workers   {h['cluster_2_workers_s']:6.1f} s; peak RSS client "
              f"{h['cluster_client_peak_rss_mb']:.0f} MB, scheduler {h['cluster_scheduler_peak_rss_mb']:.0f} MB "
              f"(idle {h['cluster_idle_scheduler_rss_mb']:.0f}), workers "
              + ", ".join(f"{x:.0f}" for x in h["cluster_worker_peak_rss_mb"]) + " MB (idle "
              + ", ".join(f"{x:.0f}" for x in h["cluster_idle_worker_rss_mb"]) + ")")
        print(f"  process pool of 2       {h['process_pool_2_s']:6.1f} s; peak RSS main process "
              f"{h['process_pool_2_main_peak_rss_mb']:.0f} MB; same bytes ({h['tree_bytes']} bytes)")
        return
    r = run_dask_bench(a.boxes, a.reps)
    if a.json:
        print(json.dumps(r))
        return
    print(f"{MODEL} {a.boxes}^3 uniform tree with its verification, {r['cores']} cores, "
          f"load {r['load_average_1min_before']:.1f} -> {r['load_average_1min_after']:.1f}; "
          f"medians of {a.reps} builds (wall clock, taking turns)")
    for name in ("single_process", "process_pool_2", "local_cluster_1_worker", "local_cluster_2_workers"):
        ratio = r.get(f"speedup_{name}")
        print(f"  {name:<24} {r[f'{name}_s']:6.2f} s" + (f"  speedup {ratio:.2f}x" if ratio else ""))
    print(f"  CPU time: one process {r['single_process_cpu_s']:.2f} s; 1-worker LocalCluster: worker "
          f"{r['local_cluster_1_worker_cpu_s']:.2f} s + client and scheduler "
          f"{r['local_cluster_1_client_cpu_s']:.2f} s")
    print(f"  LocalCluster start / stop: 1 worker {r['local_cluster_1_start_s']:.1f} / "
          f"{r['local_cluster_1_stop_s']:.1f} s, 2 workers {r['local_cluster_2_start_s']:.1f} / "
          f"{r['local_cluster_2_stop_s']:.1f} s; --scheduler local (2 workers) with both: "
          f"{r['scheduler_local_2_workers_with_start_stop_s']:.1f} s")
    print("peak RSS, one build each (pkrt build as a child process):")
    print(f"  single process             {r['single_process_cli_peak_rss_mb']:6.0f} MB "
          f"({r['single_process_cli_s']:.1f} s)")
    print(f"  client (--scheduler)       {r['cluster_client_peak_rss_mb']:6.0f} MB "
          f"({r['cluster_2_workers_cli_s']:.1f} s on 2 workers)")
    print(f"  scheduler                  {r['cluster_scheduler_peak_rss_mb']:6.0f} MB "
          f"(idle {r['cluster_idle_scheduler_rss_mb']:.0f} MB)")
    print("  workers                    " + ", ".join(f"{x:.0f}" for x in r["cluster_worker_peak_rss_mb"])
          + " MB (idle " + ", ".join(f"{x:.0f}" for x in r["cluster_idle_worker_rss_mb"]) + " MB)")
    print(f"same bytes: all {r['builds_with_the_same_bytes']} builds")


if __name__ == "__main__":
    main()
