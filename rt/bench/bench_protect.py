"""Benchmark ``protect``: contact detection (``pkrt bench --only protect``; machines from
``PKRT_BENCH_PROTECT``, default all three; minutes of normal motion per machine and case from
``PKRT_BENCH_PROTECT_MINUTES``, default 10).

Per machine (``protectcases``: the Orthoglide's demo and G-code program, the Delta's demo of
three Adept cycles and the G-code program, the hexapod's demo):

1. The identified case: the identified model exact in the loop on a truth plant of other masses
   and friction with force noise; thresholds from ``pkrt protect tune`` (0.01 false alarms per
   hour) on 2 minutes of its normal motion, then ``minutes`` of other normal motion (other noise
   seeds): false alarms, and contacts at random times on it.
2. The CAD case (the model on a plant of the same model) with the same thresholds: contacts of
   ``FORCE_N`` at the tool in random directions at random times of each motion (a force step
   held 0.5 s, reaction ``stop``): detection delay from the true onset, the onset estimate's
   error, the stop's time, the true force at detection and its peak; clamps (a wall of ``CLAMP``
   N/m at the tool's position at a random time): the true force at detection against twice
   ``FORCE_N``; then ``minutes`` of normal motion: false alarms.
3. The observer's cost per cycle (the kernel in a compiled loop over a run's states, and the fused
   call's law part with and without it) and the loop's compute p99 in real time with and without
   it (the Orthoglide demo, 10 s each, alternated).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from pkrt.rt.bench.protectcases import (CLAMP, FORCE_N, MOTIONS, cad_case, contact_figures, identified_case, motion,
                                        normal_runs, random_direction, trial_times)

TRIALS = 8  # random contacts per motion and kind
TUNE_S = 120.0  # normal motion the thresholds are tuned on


def _stats(xs: list) -> dict:
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"n": 0}
    a = np.asarray(xs, float)
    return {"n": len(a), "median": float(np.median(a)), "max": float(a.max()), "min": float(a.min())}


def _ms(figures: list[dict], key: str) -> list:
    """``key`` (s) of each trial in ms (None where it has none)."""
    return [None if x.get(key) is None else x[key] * 1e3 for x in figures]


def _good_step(x: dict) -> bool:
    """A force step detected within 10 ms and stopped within 100 ms."""
    return x["detected"] and x["delay_s"] <= 0.010 + 1e-9 and x["stop_s"] is not None and x["stop_s"] <= 0.1


def _steps(case, plan, trials: int, rng) -> dict:
    """``trials`` force steps of the issue's force, random directions and times, held 0.5 s."""
    f = FORCE_N[case.name]
    steps = []
    for j, t in enumerate(trial_times(plan, trials, rng)):
        d = f * random_direction(rng)
        steps.append({"t": t, "force": d.tolist(),
                      **contact_figures(case.run(plan, seed=j, contact=case.contact("force", t, d, duration=0.5)))})
    return {"force_n": f, "steps": len(steps), "detected": sum(x["detected"] for x in steps),
            "within_10ms": sum(x["detected"] and x["delay_s"] <= 0.010 + 1e-9 for x in steps),
            "delay_ms": _stats(_ms(steps, "delay_s")), "onset_error_ms": _stats(_ms(steps, "onset_error_s")),
            "stop_ms": _stats(_ms(steps, "stop_s")), "peak_force_n": _stats([x.get("peak_force_n") for x in steps]),
            "estimated_tool_force_at_detection_n": _stats([x.get("estimated_tool_force_n") for x in steps]),
            "estimated_step_at_detection_n": _stats([x.get("estimated_step_n") for x in steps]),
            "misses": [x for x in steps if not _good_step(x)]}


def _clamps(case, plan, trials: int, rng) -> dict:
    """``trials`` walls at random times; a clamp whose path leaves the wall before it pushes back
    with the issue's force is no clamp (counted apart)."""
    f = FORCE_N[case.name]
    clamps = [{"t": t, **contact_figures(case.run(plan, seed=j, contact=case.contact("wall", t,
                                                                                      stiffness=CLAMP[case.name])))}
              for j, t in enumerate(trial_times(plan, trials, rng))]
    clamped = [x for x in clamps if x["detected"] or (x["peak_force_n"] or 0.0) >= f]
    below = [x for x in clamped if x["detected"] and x["force_at_detection_n"] < 2 * f]
    return {"clamp_stiffness_n_per_m": CLAMP[case.name], "clamps": len(clamps), "clamps_reaching_the_force": len(clamped),
            "clamps_detected": sum(x["detected"] for x in clamps),
            "clamp_force_at_detection_n": _stats([x.get("force_at_detection_n") for x in clamps]),
            "clamps_below_2x": len(below), "clamp_stop_ms": _stats(_ms(clamps, "stop_s")),
            "clamp_peak_force_n": _stats([x.get("peak_force_n") for x in clamps]),
            "clamp_misses": [x for x in clamped if x not in below]}


def contacts(case, rng, trials: int = TRIALS) -> dict:
    """Force steps and clamps at random times of each motion of ``case``."""
    out = {}
    for m in MOTIONS[case.name]:
        plan = motion(case.config, m)
        out[m] = {**_steps(case, plan, trials, rng), **_clamps(case, plan, trials, rng)}
    return out


def machine(name: str, minutes: float, folder: Path) -> dict:
    from pkrt.rt.app.protecttune import tune

    rng = np.random.default_rng(36)
    out: dict = {}
    t0 = time.perf_counter()
    ident = identified_case(name, folder)  # thresholds: none yet (observes)
    tuning = normal_runs(ident, TUNE_S, seed0=1000, logs=folder)
    tuned = tune(tuning["logs"], 0.01)
    th = np.array(tuned["thresholds"])
    out["thresholds"] = {"values": th.tolist(), "unit": tuned["unit"], "tuned_on_s": tuned["normal_s"],
                         "residual_max_seen": tuned["max_seen"], "residual_rms": tuned["rms"],
                         "detectable_in_10ms": tuned["detectable_in_10ms"]}
    ident.config = dataclasses.replace(ident.config, protect=dataclasses.replace(ident.config.protect, thresholds=th))
    t1 = time.perf_counter()
    fa = normal_runs(ident, minutes * 60.0, seed0=0)
    out["identified"] = {"false_alarms": fa["false_alarms"], "normal_s": fa["seconds"], "runs": fa["runs"],
                         "alarms": fa["alarms"], "wall_s": time.perf_counter() - t1,
                         "false_alarms_per_hour": fa["false_alarms"] / fa["seconds"] * 3600.0,
                         "contacts": contacts(ident, rng, trials=max(2, TRIALS // 4))}
    cad = cad_case(name, thresholds=th)
    out["cad"] = {"contacts": contacts(cad, rng)}
    t1 = time.perf_counter()
    fa = normal_runs(cad, minutes * 60.0, seed0=0)
    out["cad"].update(false_alarms=fa["false_alarms"], normal_s=fa["seconds"], runs=fa["runs"], alarms=fa["alarms"],
                      wall_s=time.perf_counter() - t1, false_alarms_per_hour=fa["false_alarms"] / fa["seconds"] * 3600.0)
    out["wall_s"] = time.perf_counter() - t0
    return out


def observer_cost(repeats: int = 30) -> dict:
    """ns per call of the observer's kernel in a compiled loop over a lockstep run's logged states
    (best of ``repeats``), for 3 and 6 actuators; the loop beside it without the call."""
    from numba import njit

    from pkrt.rt.runtime.cycle.controller import make_gains
    from pkrt.rt.runtime.cycle.observer import observe, observer_state

    @njit(cache=True)
    def loop(obs, td, H, D, p, w, gains, tau, on):
        acc = 0
        for k in range(td.shape[0]):
            if on:
                acc += observe(obs, k, td[k], H, D, p, w, gains, tau)
            else:
                acc += int(td[k, 0] > 0.0)
        return acc

    out = {}
    rng = np.random.default_rng(0)
    for s in (3, 6):
        m = s * (s + 1) // 2
        n = 20000
        td = rng.normal(size=(n, s))
        H = np.eye(s) + 0.1 * np.ones((s, s))
        D, p, w, tau = rng.normal(size=(s, m)), rng.normal(size=s), rng.normal(size=m), rng.normal(size=s)
        gains = make_gains(s, 1.0, 1.0, 1.0, 1.0, 20.0, 5.0)
        obs = observer_state(s, 250.0, 1e-3, 10.0, enabled=True)
        best = {}
        for on in (True, False):
            loop(obs, td[:10], H, D, p, w, gains, tau, on)
            ts = []
            for _ in range(repeats):
                t0 = time.perf_counter_ns()
                loop(obs, td, H, D, p, w, gains, tau, on)
                ts.append(time.perf_counter_ns() - t0)
            best[on] = min(ts) / n
        out[f"s{s}"] = {"ns_per_cycle": best[True] - best[False], "loop_ns_with": best[True],
                        "loop_ns_without": best[False]}
    return out


def loop_with_and_without(duration: float = 10.0, pairs: int = 2) -> dict:
    """The Orthoglide demo held to ``duration`` s in real time with a log, with ``[protect]`` on
    (the residual logged, nothing detected) and off, alternated: compute p50 / p99 (the seven
    parts) and the law part (the observer's time is in it); the lockstep run's real-time factor
    by CPU time, compiled, each way."""
    from pkrt.drivers import open_drives
    from pkrt.rt.app.reference import plan_reference
    from pkrt.rt.bench.protectcases import protected
    from pkrt.rt.runtime.machine.config import load_machine
    from pkrt.rt.runtime.machine.runsetup import load_controller_tree
    from pkrt.rt.runtime.machine.run import run_session

    base = load_machine("orthoglide")
    configs = {"without": base, "with": protected(base, np.full(3, 1e6))}
    tree = load_controller_tree(base)
    demo = plan_reference(base)
    rows: dict = {k: [] for k in configs}
    lock: dict = {k: [] for k in configs}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(pairs):
            for k, c in configs.items():
                r = run_session(c, open_drives(c), trajectory=demo, duration=duration, tree=tree,
                                log_path=str(Path(tmp) / f"rt-{k}-{i}.pktlog"))
                p = r["cycle_parts"]["p50_p99_max_us"]
                rows[k].append({"compute_p50_p99_us": p["compute"][:2], "law_p50_p99_us": p["law"][:2],
                                "overruns": r["overruns"], "fault": r["fault"],
                                "host_delays": r["host_delays"]["count"]})
                r = run_session(c, open_drives(c), trajectory=demo, lockstep=True, tree=tree,
                                log_path=str(Path(tmp) / f"lock-{k}-{i}.pktlog"))
                lock[k].append(r["realtime_factor_cpu"])
    return {"realtime": rows, "lockstep_realtime_factor_cpu": {k: float(np.median(v)) for k, v in lock.items()},
            "compute_p99_us_median": {k: float(np.median([x["compute_p50_p99_us"][1] for x in v]))
                                      for k, v in rows.items()},
            "realtime_settings": "the configuration's (SCHED_FIFO 80, CPU 1, mlockall) where allowed"}


def run_protect_bench() -> dict:
    names = [x for x in os.environ.get("PKRT_BENCH_PROTECT", ",".join(FORCE_N)).split(",") if x]
    minutes = float(os.environ.get("PKRT_BENCH_PROTECT_MINUTES", "10"))
    out: dict = {"load_average": os.getloadavg(), "minutes": minutes, "observer_cost": observer_cost(),
                 "loop": loop_with_and_without()}
    for name in names:
        with tempfile.TemporaryDirectory(prefix="pkrt-bench-protect-") as tmp:
            try:
                out[name] = machine(name, minutes, Path(tmp))
            except Exception as e:  # a figure that cannot be taken is reported, not hidden
                out[name] = {"error": f"{type(e).__name__}: {e}"}
    out["load_average_end"] = os.getloadavg()
    return out


def contact_plot(path: str) -> dict:
    """docs/protection.md's figure: the Orthoglide's demo with a 30 N step at the tool at 2.0 s
    for 0.3 s (the CAD case): top, observing only (thresholds out of reach), the residual beside
    the true actuator forces; bottom, the same contact with the stop reaction: the residual,
    the thresholds, the actuator speeds to standstill and torque off."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pkrt.rt.bench.protectcases import protected
    from pkrt.rt.runtime.record.logfile import read_log
    from pkrt.rt.runtime.logs.logstats import columns

    out = {}
    fig, ax = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    with tempfile.TemporaryDirectory() as tmp:
        for row, th in enumerate((1e6, None)):
            case = cad_case("orthoglide")
            if th is not None:
                case.config = protected(case.config, th)
            log = str(Path(tmp) / f"c{row}.pktlog")
            r = case.run(motion(case.config, "demo"), contact=case.contact("force", 2.0, (30.0, 0.0, 0.0), 0.3),
                         log=log)
            d = read_log(log)
            t = d.channels["t"]
            keep = (t > 1.95) & (t < 2.4)
            res, tru = columns(d.channels["residual"])[keep], columns(d.channels["contact_force"])[keep]
            for i in range(3):
                ax[row].plot(t[keep], res[:, i], f"C{i}-", lw=1.2, label=f"residual q{i + 1}")
                if row == 0:
                    ax[row].plot(t[keep], tru[:, i], f"C{i}:", lw=1, label=f"true q{i + 1}")
            if row == 1:
                thr = case.config.protect.thresholds[0]
                ax[row].axhline(thr, color="k", lw=0.6, ls="--")
                ax[row].axhline(-thr, color="k", lw=0.6, ls="--", label="threshold")
                v = ax[row].twinx()
                v.plot(t[keep], np.abs(columns(d.channels["vel"])[keep]).max(axis=1), "k-", lw=0.8)
                v.set_ylabel("max |actuator speed| (m/s)")
                ev = r["protect"]["contacts"][0]
                ax[row].axvline(ev["time_s"], color="r", lw=0.8)
                ax[row].axvline(ev["reaction_end_cycle"] / 1000.0, color="r", lw=0.8, ls=":")
                out = {"detected_s": ev["time_s"], "torque_off_s": ev["reaction_end_cycle"] / 1000.0}
            ax[row].set_ylabel("actuator force (N)")
            ax[row].legend(loc="upper right", fontsize=7, ncol=2)
    ax[0].set_title("30 N along x at the Orthoglide's tool from 2.0 s: the residual follows the true force")
    ax[1].set_title("the same contact with [protect]: detected (red), stopped on the path, torque off (dotted)")
    ax[1].set_xlabel("t (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return out
