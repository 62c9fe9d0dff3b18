"""Geometric calibration, wired together: ``pkrt calibrate plan`` (measurement poses chosen for
observability, the trajectory that rests at each) and ``pkrt calibrate`` (a run's log and an
instrument's readings at its dwells in, a calibrated description and a machine configuration
on it out). The pieces are ``pkrt.models.calibration``; the dwells ``pkrt.rt.runtime.machine.dwells``;
the readings' file ``pkrt.rt.app.measurements``. Units: m, rad, s."""

from __future__ import annotations

import datetime as _dt
import hashlib
import math
import time
from pathlib import Path

import numpy as np

from pkrt.rt.core.errors import UserError
from pkrt.rt.runtime.machine.dwells import READING_S

HELD_OUT = 0.2  # the readings pkrt calibrate keeps out of the fit by default
RANDOM_DRAWS = 20  # random pose sets the chosen one is compared with
STRUCTURE_POSES = 120  # random poses over which the base set is found


def calibration_problem(config, mech, orientation: bool):
    """The calibration of ``mech`` read by the configuration's ``[tracker]`` (its noise);
    refused in one line for a machine without a tool, or orientation readings of a tool without."""
    from pkrt.models.calibration.problem import Problem
    from pkrt.models.kinematics.taskspace import tool_of

    tool = tool_of(mech)  # a machine without [tool] has nothing to calibrate: one line
    if orientation and not tool.orientation:
        raise UserError(f"the readings have orientation columns but {mech.name}'s tool has position coordinates only "
                        f"({', '.join(tool.coordinates)}): give x, y, z")
    return Problem(mech, orientation, config.tracker.noise_position, config.tracker.noise_orientation)


def _limits(config, margin: float) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = config.limits.position[:, 0], config.limits.position[:, 1]
    return lo + margin * (hi - lo), hi - margin * (hi - lo)


def structure(problem, config, margin: float = 0.05, seed: int = 1, singular_margin: float = 3.0):
    """The base set over random poses inside the limits (the machine's structure, not a design's)."""
    from pkrt.models.calibration.jacobian import PoseModel
    from pkrt.models.calibration.poses import candidate_poses

    theta, _ = candidate_poses(problem.mech, STRUCTURE_POSES, *_limits(config, margin), seed=seed,
                               singular_margin=singular_margin)
    return problem.base_set(PoseModel(problem.params, theta))


# -- pkrt calibrate plan ----------------------------------------------------------------------

def settle_time(config) -> float:
    """Rest after a move before the reading: ten time constants of the slowest axis's
    closed loop (critically damped at ``bandwidth_hz``: 4.5e-4 of the error left)."""
    w = 2 * math.pi * float(np.min(config.controller.bandwidth_hz))
    return 10.0 / w


def plan_poses(config, poses: int = 50, candidates: int = 600, dwell: float | None = None, margin: float = 0.05,
               singular_margin: float = 3.0, seed: int = 0) -> tuple:
    """(the trajectory, the report): ``poses`` measurement poses chosen among ``candidates``."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, "blas"):
        return _plan(config, poses, candidates, dwell, margin, singular_margin, seed)


def _plan(config, n: int, candidates: int, dwell, margin, singular_margin, seed):
    from pkrt.models.calibration.jacobian import PoseModel
    from pkrt.models.calibration.poses import (candidate_poses, check_trajectory, measurement_trajectory,
                                               observability, select, visiting_order)
    from pkrt.models.kinematics.mechanism import load_mechanism
    from pkrt.rt.core.treefile import load_tree

    t0 = time.perf_counter()
    mech = load_mechanism(config.model_path)
    tool = mech.description.tool
    problem = calibration_problem(config, mech, orientation=tool is not None and tool.orientation)
    lo, hi = _limits(config, margin)
    theta, sing = candidate_poses(mech, max(candidates, n), lo, hi, seed=seed, singular_margin=singular_margin)
    base = problem.base_set(PoseModel(problem.params, theta[:STRUCTURE_POSES]))
    fit_n = n - int(held_out_mask(n, HELD_OUT).sum())
    if fit_n * problem.m <= base.n_base:
        least = next(k for k in range(n, 10 * n + 100) if (k - held_out_mask(k, HELD_OUT).sum()) * problem.m > base.n_base)
        raise UserError(f"--poses {n}: {fit_n} poses fitted (a fifth held out) of {problem.m} coordinates cannot "
                        f"determine {base.n_base} base parameters; ask for at least {least}")
    Ab = problem.scaled_jacobian(PoseModel(problem.params, theta))[:, :, base.base]
    t_sel = time.perf_counter()
    chosen = select(Ab, n)
    t_sel = time.perf_counter() - t_sel
    rng = np.random.default_rng(seed + 1)
    rand = [observability(Ab[rng.choice(len(theta), n, replace=False)]) for _ in range(RANDOM_DRAWS)]
    span = hi - lo
    home = np.clip(mech.theta_ref, config.limits.position[:, 0], config.limits.position[:, 1])
    pts = theta[chosen][visiting_order(theta[chosen], home, span)]
    dwell = dwell if dwell is not None else math.ceil((settle_time(config) + READING_S) / 0.05) * 0.05
    s = mech.n_act
    vel = 0.8 * np.broadcast_to(config.limits.velocity, s)
    acc = 0.8 * np.broadcast_to(config.limits.acceleration, s)
    force = np.broadcast_to(config.controller.tau_max, s).astype(float)
    if config.backend == "sim":
        force = np.minimum(force, config.drives.force_limit)
    force = 0.8 * force
    tree = load_tree(config.tree)
    visc = np.broadcast_to(config.controller.viscous, s)
    coul = np.broadcast_to(config.controller.coulomb, s)
    slow = np.ones(n + 1)
    for _ in range(6):  # moves whose force is too high are slowed (the accelerations fall as 1 / T^2)
        plan, dwells = measurement_trajectory(pts, home, vel, acc, dwell, config.rate_hz, slow)
        chk = check_trajectory(mech, plan, dwells, tree, visc, coul, singular_margin)
        if chk["where"] is not None:
            raise UserError(f"calibration trajectory refused: {chk['where']}")
        over = np.max(chk["force"] / force, axis=1)
        if np.all(over <= 1.0):
            break
        slow[over > 1.0] *= 1.5
    else:
        i = int(np.argmax(over))
        raise UserError(f"calibration trajectory refused: move {i + 1} needs {over[i]:.3g} times 80 % of the force "
                        f"limit even when slowed (the pose cannot be held)")
    sel = observability(Ab[chosen])
    med = {k: float(np.median([r[k] for r in rand])) for k in ("o1", "condition_number")}
    report = {"machine": config.path, "model": mech.description.path, "axes": mech.actuator_names, "poses": n,
              "candidates": len(theta),
              "measures": "position and orientation" if problem.orientation else "position",
              "parameters": problem.n, "base_parameters": base.n_base,
              "observability": {"chosen": sel, "random_median": med, "random_draws": RANDOM_DRAWS,
                                "o1_over_random": sel["o1"] / med["o1"],
                                "index": "O1 = (product of the singular values)^(1/L) / sqrt(poses) of the identification "
                                         "Jacobian, rows per instrument standard deviation, columns per prior size"},
              "dwell_s": dwell, "settle_s": settle_time(config), "reading_s": READING_S,
              "dwells": [{"pose": i + 1, "t_start": a, "t_end": b, "theta": pts[i].tolist()}
                         for i, (a, b) in enumerate(dwells)],
              "duration_s": plan.duration, "rows": plan.n, "rate_hz": config.rate_hz,
              "peaks": {"velocity": np.abs(plan.vel).max(axis=0).tolist(),
                        "acceleration": np.abs(plan.acc).max(axis=0).tolist(),
                        "force": chk["force"].max(axis=0).tolist(),
                        "singularity_measure_min": chk["singularity_measure_min"]},
              "limits": {"velocity": vel.tolist(), "acceleration": acc.tolist(), "force": force.tolist(),
                         "singularity_measure": singular_margin * mech.description.singular_threshold,
                         "note": "80 % of [limits] and of the force limits"},
              "seconds": {"select": t_sel, "total": time.perf_counter() - t0}}
    return plan, report


# -- pkrt calibrate LOG MEASURED ----------------------------------------------------------------

def _sha256(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def log_dwells(log_path: str, mech) -> tuple[list, np.ndarray]:
    """The dwells of a run log of ``mech``'s machine and the measured actuator positions
    averaged over each dwell's reading (N, s); one-line errors for another machine's log, a
    faulted run, a log without its reference or without dwells."""
    from pkrt.rt.runtime.machine.dwells import MIN_DWELL_S, find_dwells
    from pkrt.rt.runtime.logs.identifylog import check_log_machine
    from pkrt.rt.runtime.record.logfile import read_log
    from pkrt.rt.runtime.logs.logstats import columns

    log = read_log(log_path)
    check_log_machine(log, mech.actuator_names, mech.name, mech.ranges)
    faults = [e for e in log.events if "fault" in str(e.get("kind"))]
    if faults:
        raise UserError(f"{log_path}: a faulted run (cycle {faults[0].get('cycle')}: {faults[0].get('message')}); "
                        f"record the measurement run again")
    if "ref_pos" not in log.channels:
        raise UserError(f"{log_path}: the log has no reference (ref_pos): its dwells cannot be found")
    pos = columns(log.channels["pos"])
    dwells = find_dwells(columns(log.channels["ref_pos"]), log.channels["t"])
    if not dwells:
        raise UserError(f"{log_path}: no dwells (the reference never rests {MIN_DWELL_S:g} s): record a run of a "
                        f"'pkrt calibrate plan' trajectory")
    theta = np.array([pos[d.rows].mean(axis=0) for d in dwells])
    if not np.all(np.isfinite(theta)):
        raise UserError(f"{log_path}: non-finite measured positions in a dwell")
    return dwells, theta


def match(dwells: list, meas, path: str) -> np.ndarray:
    """The dwell (0-based) of each reading; refused in one line when a reading names a dwell
    the log does not have, twice the same, or a time outside its dwell."""
    seen = set()
    for i, (d, t) in enumerate(zip(meas.dwell, meas.t)):
        if d > len(dwells):
            raise UserError(f"{path}: reading {i + 1} is of dwell {d}, the log has {len(dwells)} dwells: the readings "
                            f"do not match the log's dwells")
        if d in seen:
            raise UserError(f"{path}: reading {i + 1}: dwell {d} read twice")
        seen.add(d)
        dw = dwells[d - 1]
        if not dw.t_start - 1e-6 <= t <= dw.t_end + 1e-6:
            raise UserError(f"{path}: reading {i + 1} (dwell {d}) at t = {t:.6g} s, outside that dwell "
                            f"[{dw.t_start:.6g}, {dw.t_end:.6g}] s: the readings do not match the log's dwells")
    return meas.dwell - 1


def held_out_mask(n: int, fraction: float) -> np.ndarray:
    """(n,) bool: the readings kept out of the fit, every k-th (k = 1 / fraction rounded)."""
    every = max(2, int(round(1.0 / fraction))) if fraction > 0 else 0
    return (np.arange(n) % every == every - 1) if every else np.zeros(n, dtype=bool)


def calibrate_log(config, log_path: str, measured: str, out: str, machine_out: str, held_out: float = 0.2,
                  bounds=None, plot: str | None = None) -> dict:
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, "blas"):
        return _calibrate(config, log_path, measured, out, machine_out, held_out, bounds, plot)


def _calibrate(config, log_path, measured, out, machine_out, held_out, bounds, plot) -> dict:
    from pkrt.models.calibration.fit import Bounds, Readings, calibrate, predicted
    from pkrt.models.calibration.output import write_description
    from pkrt.models.kinematics.mechanism import load_mechanism
    from pkrt.rt.app.machinefile import write_machine_copy
    from pkrt.rt.app.measurements import read_measurements

    t0, c0 = time.perf_counter(), time.process_time()
    bounds = bounds or Bounds()
    mech = load_mechanism(config.model_path)
    meas = read_measurements(measured)
    problem = calibration_problem(config, mech, meas.rotation is not None)
    dwells, theta = log_dwells(log_path, mech)
    idx = match(dwells, meas, measured)
    readings = Readings(theta[idx], meas.position, meas.rotation)
    test = held_out_mask(readings.n, held_out)
    t_base = time.perf_counter()
    base = structure(problem, config)
    t_base = time.perf_counter() - t_base
    t_fit = time.perf_counter()
    fit = calibrate(problem, base, readings.subset(~test), bounds)
    t_fit = time.perf_counter() - t_fit
    if fit.at_bound:
        j = fit.at_bound[0]
        lim = bounds.of(problem.units, problem.tracker)[j]
        raise UserError(f"the fit ends on a bound: parameter {problem.names[j]} moved {_amount(lim, problem.units[j])} "
                        f"from the description's value (its bound): the readings and the description disagree (another "
                        f"machine, a wrong file, an instrument that moved?); check, or widen the bounds (--max-length, "
                        f"--max-angle, --max-scale)")
    res_test = res_test_cad = None
    if test.any():
        ho = readings.subset(test)
        res_test = predicted(problem, fit.delta, fit.frame, ho)
        res_test_cad = predicted(problem, np.zeros(problem.n_geo), fit.frame_cad, ho)
    report = _report(config, mech, problem, fit, readings, test, res_test, res_test_cad, log_path, measured, out,
                     machine_out)
    table = _provenance(report, problem, fit, mech, log_path, measured)
    write_description(problem.params, fit.delta, out, table,
                      f"{mech.name}: geometry calibrated by pkrt calibrate from {mech.description.path};\n"
                      f"masses kept; provenance in [calibration].")
    report["written_reproduces_fit_m"] = _check_written(problem, fit, out, readings.theta)
    write_machine_copy(config, out, machine_out, "calibrated", "pkrt calibrate")
    report["seconds"] = {"base_set": t_base, "fit": t_fit, "total": time.perf_counter() - t0,
                         "cpu": time.process_time() - c0}
    if plot:
        from pkrt.rt.app.calibrateplot import plot_calibration

        plot_calibration(plot, report, fit, test, res_test, res_test_cad)
        report["plot"] = plot
    return report


def _amount(v: float, unit: str) -> str:
    return {"m": f"{v * 1e3:g} mm", "rad": f"{v * 1e3:g} mrad", "1": f"{v:g} (scale)"}[unit]


def _report(config, mech, problem, fit, readings, test, res_test, res_test_cad, log_path, measured, out, machine_out):
    from pkrt.models.calibration.fit import rms
    from pkrt.models.kinematics.taskspace import matrix_rpy

    names, units = problem.names, problem.units
    base = fit.base
    params, tracker_std = [], {}
    for i, j in enumerate(base.base):
        if j >= problem.n_geo:  # the instrument's pose: reported whole below
            tracker_std[names[j]] = float(fit.std[i])
            continue
        cad = float(problem.params.nominal[j])
        params.append({"name": names[j], "unit": units[j], "cad": cad, "calibrated": cad + float(fit.value[i]),
                       "change": float(fit.value[i]), "std": float(fit.std[i])})
    return {
        "machine": config.path, "model": mech.description.path, "log": log_path, "measurements": measured,
        "output": out, "machine_out": machine_out,
        "measures": "position and orientation" if problem.orientation else "position",
        "noise": {"position_m": config.tracker.noise_position,
                  "orientation_rad": config.tracker.noise_orientation if problem.orientation else None},
        "readings": readings.n, "fit_poses": int((~test).sum()), "held_out_poses": int(test.sum()),
        "parameters": problem.n, "base_parameters": base.n_base, "estimated": params,
        "not_identifiable": [{"name": names[j], "why": why} for j, why in base.dependent],
        "tracker_pose": np.r_[fit.frame.t, matrix_rpy(fit.frame.R)].tolist(),
        "tracker_std": tracker_std,
        "tracker_pose_description": np.r_[fit.frame_cad.t, matrix_rpy(fit.frame_cad.R)].tolist(),
        "rms": {"fit": {"cad": rms(fit.residual_cad), "calibrated": rms(fit.residual)},
                "held_out": None if res_test is None else {"cad": rms(res_test_cad), "calibrated": rms(res_test)}},
        "chi2_per_dof": fit.chi2 / fit.dof, "evaluations": fit.evaluations, "axes": mech.actuator_names,
    }


def _provenance(report: dict, problem, fit, mech, log_path: str, measured: str) -> dict:
    ho = report["rms"]["held_out"] or {}
    return {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "software": "pkrt calibrate", "from_model": mech.description.path, "from_model_sha256": mech.content_hash,
            "log": log_path, "log_sha256": _sha256(log_path), "measurements": measured,
            "measurements_sha256": _sha256(measured), "measures": report["measures"],
            "noise_position_m": report["noise"]["position_m"],
            "poses_fit": report["fit_poses"], "poses_held_out": report["held_out_poses"],
            "fit_rms_position_m": report["rms"]["fit"]["calibrated"]["position_m"],
            "held_out_rms_position_m_cad": ho.get("cad", {}).get("position_m", -1.0),
            "held_out_rms_position_m": ho.get("calibrated", {}).get("position_m", -1.0),
            "tracker_pose": report["tracker_pose"],
            "parameters": [p["name"] for p in report["estimated"]],
            "units": [p["unit"] for p in report["estimated"]],
            "cad": [p["cad"] for p in report["estimated"]],
            "calibrated": [p["calibrated"] for p in report["estimated"]],
            "std": [p["std"] for p in report["estimated"]],
            "not_identifiable": len(report["not_identifiable"])}


def _check_written(problem, fit, path: str, theta: np.ndarray) -> float:
    """The written description's tool against the fit's at the readings' poses (m): the file
    is the fit (to rounding), or the run stops here."""
    from pkrt.models.calibration.jacobian import PoseModel
    from pkrt.models.calibration.parameters import GeometricParameters
    from pkrt.models.kinematics.mechanism import load_mechanism

    written = GeometricParameters(load_mechanism(path))
    P1, _ = PoseModel(written, theta).poses(np.zeros(written.n))
    P0, _ = PoseModel(problem.params, theta).poses(fit.delta)
    err = float(np.abs(P1 - P0).max())
    if err > 1e-9:
        raise UserError(f"{path}: the written description's tool is {err:.3g} m from the fit's (not written as fitted)")
    return err
