"""Benchmark ``plan``: time-optimal planning (``pkrt.models.planning.topp``, ``pkrt plan``).

- Delta, Adept cycle (25 / 305 / 25 mm, corners blended within 10 mm): the minimum cycle time
  under 20 N m and the velocity and acceleration limits with margins of 5, 10, 15 and 20 %,
  against the hand-timed 0.5 s, with the planned accelerations as each period's mean (the
  default) and as instantaneous values (before), and the hand-timed cycle with both; each run in lockstep on the simulated plant,
  and the hand-timed and 10 % cycles over CAN HIL (1 kHz, stepped): the largest commanded
  torque over every cycle, saturated cycles, tracking error (max, RMS) and its ratio to the
  hand-timed cycle's.
- Planning cost of a 200-point path on each shipped simulated machine (median of 5, IK
  included), with the closed-form inverse kinematics (``models/kinematics/legik.py``) and with Newton on
  the constraints (before): the grid (inverse kinematics, exact rates, dynamics) and the timing
  (LPs, loop-rate sampling and checks) separately.
- Orthoglide, the example program ``orthoglide-demo.ngc`` end to end in lockstep: the largest
  distance of the planned tool path from the programmed path (G64 P0.5 mm), the feed reached per
  line, the run's tracking; two programs refused before motion (outside the workspace, too much
  force), with their one-line messages.
"""

from __future__ import annotations

import tempfile
import time
from importlib import resources
from pathlib import Path

import numpy as np

from pkrt.drivers import open_drives
from pkrt.models.planning.geompath import Line, Motion, polyline_motions
from pkrt.models.kinematics.taskspace import adept_cycle
from pkrt.rt.app.reference import (gcode_setup, home_tool, machine_mechanism, path_planner, plan_adept,
                                   plan_gcode)
from pkrt.rt.runtime.machine.config import load_machine
from pkrt.rt.core.errors import UserError
from pkrt.rt.core.plan import Planned
from pkrt.rt.runtime.record.logfile import read_log
from pkrt.rt.runtime.logs.logstats import columns
from pkrt.rt.runtime.machine.runsetup import load_controller_tree
from pkrt.rt.runtime.machine.run import run_session

MACHINES = ("delta", "orthoglide", "hexapod")


def _lockstep(config, plan, tree) -> dict:
    """Run ``plan`` in lockstep on the simulated plant; figures from the summary and the log."""
    with tempfile.TemporaryDirectory() as d:
        log = str(Path(d) / "run.pktlog")
        r = run_session(config, open_drives(config, {}), trajectory=plan, lockstep=True, tree=tree, log_path=log)
        tau = columns(read_log(log).channels["tau"])
    return {"duration_s": plan.duration, "fault": r["fault"], "saturated_cycles": r["saturated_cycles"],
            "max_abs_torque": float(np.abs(tau).max()), "max_error": r["max_error"], "rms_error": r["rms_error"]}


def _hil(plan) -> dict:
    """``plan`` over CAN (CiA 402 driver, emulator process, unix_pair) at 1 kHz, stepped timing;
    the largest commanded torque from the run's log."""
    from pkrt.hil.can_hil import run_can_hil

    with tempfile.TemporaryDirectory() as d:
        log = str(Path(d) / "hil.pktlog")
        r = run_can_hil("delta-can", duration=None, reference=lambda config: plan, log_path=log)
        tau = columns(read_log(log).channels["tau"])
    return {"duration_s": plan.duration, "fault": r["fault"], "saturated_cycles": r["saturated_cycles"],
            "max_abs_torque": float(np.abs(tau[np.all(np.isfinite(tau), axis=1)]).max()),
            "max_error": r["max_error"], "rms_error": r["rms_error"], "overruns": r["overruns"]}


def adept_figures(margins=(0.05, 0.1, 0.15, 0.2), hil: bool = True) -> dict:
    """The hand-timed cycle and the time-optimal one per margin, each with the accelerations as
    each period's mean (``held_acc``, the planner's default) and as instantaneous values at the
    samples (before); in lockstep, and over CAN HIL for the default margin (10 %)."""
    config = load_machine("delta")
    mech = machine_mechanism(config)
    tree = load_controller_tree(config)
    from pkrt.models.kinematics.taskspace import TaskKinematics

    start = np.asarray(config.demo.start, float)
    hand = TaskKinematics(mech).plan(adept_cycle(start, config.rate_hz, 0.5, config.demo.height, config.demo.width,
                                                 config.demo.direction))
    base = _lockstep(config, hand, tree)
    out = {"torque_limit": float(config.controller.tau_max.max()), "hand_timed": base}
    held = hand.acc.copy()
    held[:-1] = np.diff(hand.vel, axis=0) * config.rate_hz  # the same convention as the planner's
    out["hand_timed_period_mean_acc"] = _lockstep(config, Planned(hand.rate_hz, hand.pos, hand.vel, held), tree)
    plan_adept(path_planner(config, mech), config.demo, tolerance=0.01)  # compile and load the kernels
    keep = {}
    for margin in margins:
        for held in (True, False):
            planner = path_planner(config, mech, margin=margin, held_acc=held)
            t0 = time.perf_counter()
            optimal, rep = plan_adept(planner, config.demo, tolerance=0.01)
            cost = time.perf_counter() - t0
            run = _lockstep(config, optimal, tree)
            key = f"time_optimal_margin{margin:g}" + ("" if held else "_instantaneous_acc")
            out[key] = {**run, "planning_ms": cost * 1e3, "peak_planned_torque": rep["peak_force"],
                        "tracking_ratio_max": run["max_error"] / base["max_error"],
                        "tracking_ratio_rms": run["rms_error"] / base["rms_error"]}
            if held:  # against the hand-timed cycle given the same period-mean accelerations
                same = out["hand_timed_period_mean_acc"]
                out[key]["tracking_ratio_max_same_acc"] = run["max_error"] / same["max_error"]
                out[key]["tracking_ratio_rms_same_acc"] = run["rms_error"] / same["rms_error"]
            keep[key] = optimal
    if hil:
        h_base = _hil(hand)
        out["hil_hand_timed"] = h_base
        for key in ("time_optimal_margin0.1", "time_optimal_margin0.1_instantaneous_acc"):
            if key in keep:
                r = _hil(keep[key])
                out[f"hil_{key}"] = {**r, "tracking_ratio_max": r["max_error"] / h_base["max_error"],
                                     "tracking_ratio_rms": r["rms_error"] / h_base["rms_error"]}
    return out


def _path_for(name: str, planner) -> Motion:
    """A task path on each machine: the Delta's Adept half cycle (blended), a blended polyline on
    the Orthoglide, a line with fixed orientation on the hexapod."""
    home = home_tool(planner)
    if name == "delta":
        p0 = np.array([-0.1525, 0.0, -0.8])
        up, across = np.array([0, 0, 0.025]), np.array([0.305, 0, 0])
        return polyline_motions([p0, p0 + up, p0 + up + across, p0 + across], 0.01)[0]
    if name == "orthoglide":
        return polyline_motions([home, home + [0.04, 0, -0.02], home + [0.04, 0.04, -0.02]], 0.0005)[0]
    end = home.copy()
    end[:3] += [0.02, 0.01, 0.01]
    return Motion([Line.between(home, end)])


def _cost(planner, motion, repeats: int) -> dict:
    planner.plan_motion(motion)  # compile and load the kernels, find the closed form
    rows = []
    for _ in range(repeats):
        planner.kin.start_at(motion.segments[0].start())
        t0 = time.perf_counter()
        plan, rep = planner.plan_motion(motion)
        total = time.perf_counter() - t0
        rows.append((total, rep["grid_s"], rep["timing_s"], rep["grid_points"]))
    total, grid, timing, points = (float(np.median([r[i] for r in rows])) for i in range(4))
    return {"grid_points": int(points), "total_ms": total * 1e3, "grid_ik_dynamics_ms": grid * 1e3,
            "timing_ms": (total - grid) * 1e3, "duration_s": plan.duration}


def cost_figures(repeats: int = 5) -> dict:
    """Per machine, the same path planned with the closed-form inverse kinematics
    (``models/kinematics/legik.py``, "closed_form") and with Newton on the model's constraints ("newton",
    the reference), medians of ``repeats``; "ik" names the one the planner uses by default."""
    out = {}
    for name in MACHINES:
        config = load_machine(name)
        row = {}
        for closed in (True, False):
            planner = path_planner(config, grid_points=200, closed_form=closed)
            motion = _path_for(name, planner)
            row["closed_form" if closed else "newton"] = _cost(planner, motion, repeats)
            if closed:
                row["ik"] = "closed form" if planner.legs is not None else "newton"
        row["speedup"] = row["newton"]["total_ms"] / row["closed_form"]["total_ms"]
        out[name] = row
    return out


def gcode_figures() -> dict:
    config = load_machine("orthoglide")
    tree = load_controller_tree(config)
    planner = path_planner(config)
    demo = str(resources.files("pkrt.models") / "machines" / "orthoglide-demo.ngc")
    t0 = time.perf_counter()
    plan, rep = plan_gcode(planner, demo, setup=gcode_setup(config))
    cost = time.perf_counter() - t0
    from pkrt.models.planning.gcode import parse_program
    from scipy.spatial import cKDTree

    origin = home_tool(planner)
    text = Path(demo).read_text().replace("G64 P0.5", "G61")
    pts = [g.eval(np.linspace(0, g.length, max(int(g.length / 2e-5), 2)))[0]
           for it in parse_program(text, "demo", origin).items if isinstance(it, Motion) for g in it.segments]
    tool = planner.kin.forward(plan.pos[::2])
    dist = cKDTree(np.vstack(pts)).query(tool)[0]
    reach = [f for f in rep["feeds"] if f["feed_reachable"]]
    out = {"duration_s": plan.duration, "planning_ms": cost * 1e3, "max_path_deviation_mm": float(dist.max() * 1e3),
           "g64_tolerance_mm": 0.5,
           "feed_error_pct_where_reachable": max(abs(f["peak_speed_m_s"] / f["feed_m_s"] - 1) * 100 for f in reach),
           "lines_feed_reachable": [f["line"] for f in reach], "lockstep": _lockstep(config, plan, tree)}
    refused = {}
    with tempfile.TemporaryDirectory() as d:
        for what, prog in (("workspace", "G21 G90\nG1 X10 F600\nG1 X200\nM2\n"),
                           ("force", "G21 G90\nG1 X-10 F600\nG1 X-100 Y-100 Z-100\nM2\n")):
            p = Path(d) / f"{what}.ngc"
            p.write_text(prog)
            weak = path_planner(config) if what == "workspace" else _weak(config, 85.0)
            try:
                plan_gcode(weak, str(p))
                refused[what] = "NOT REFUSED"
            except UserError as e:
                refused[what] = str(e).replace(str(p), f"{what}.ngc")
    out["refused"] = refused
    return out


def _weak(config, tau_max: float):
    """The Orthoglide's planner with a lower force limit (it cannot hold the platform
    everywhere)."""
    import dataclasses

    c = dataclasses.replace(config, controller=dataclasses.replace(
        config.controller, tau_max=np.full_like(config.controller.tau_max, tau_max)))
    return path_planner(c)


def run_plan_bench() -> dict:
    return {"adept": adept_figures(), "cost_200_points": cost_figures(), "gcode": gcode_figures()}
