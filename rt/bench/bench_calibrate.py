"""Benchmark ``calibrate``: the must-show figures of geometric calibration, per machine
(``PKRT_BENCH_CALIBRATE`` = comma-separated machines, default all three).

1. Structure: the geometric parameters, the identifiable (base) ones with the instrument's
   pose, why the others are not (counted by reason).
2. ``pkrt calibrate plan`` (50 poses): its time, O1 and condition number against random poses.
3. Random truths: every geometric parameter of the description changed by up to 0.5 mm,
   2 mrad or 2e-3 of scale, the tracker at a random pose 1-2 m away (unknown to the fit);
   readings of the truth's tool at the plan's poses with the [tracker] noise (10 um, 20 urad);
   the fit; the true tool error at 200 random held-out poses (noise-free readings) with the
   description (its tracker pose fitted) and after calibration, their ratio; each identifiable
   parameter's error in its own standard deviation against the truth's equivalent (the
   noise-free fit of the same truth at the plan's and the held-out poses).
4. End to end on one truth: the plan run in lockstep on the truth plant with ``pkrt run
   --measure`` (the hexapod's at 250 Hz: its exact plant costs ~1 ms a cycle), then ``pkrt
   calibrate`` on its log (its time: under 10 s for 50 poses).
5. The Orthoglide's demo traced by the true tool (``demo``): the issue's machine (leg 1
   0.3 mm shorter, guide 2 tilted 0.8 mrad, platform joint 3 0.2 mm off, q1's zero 0.15 mm off)
   and a random truth, each calibrated end to end; the demo run in lockstep on the truth plant
   with the description and with the calibrated model in the controller (the exact model in
   the loop for both, lockstep; trees of 3 intervals per axis for the domain check only), the true tool's RMS and largest distance from the programmed
   path (the controller's forward kinematics of the reference), in the instrument's frame
   mapped through each model's estimated tracker pose, and as the issue measured it, in the
   world frame.
"""

from __future__ import annotations

import os
import tempfile
import time
import tomllib
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from pkrt.rt.bench.bench_identify import cli_json

MACHINE_CONFIG = {"orthoglide": "orthoglide-sim.toml", "delta": "delta-sim.toml", "hexapod": "hexapod-sim.toml"}
TRUTHS = {"orthoglide": 10, "delta": 10, "hexapod": 5}
RUN_RATE = {"orthoglide": 1000.0, "delta": 1000.0, "hexapod": 250.0}
HELD_OUT_POSES = 200
NOISE = (10e-6, 20e-6)  # the [tracker] defaults: m, rad


def random_pose(rng: np.random.Generator) -> list[float]:
    """A tracker pose 1-2 m from the base's origin, turned by up to 0.5 rad about each axis."""
    d = rng.normal(size=3)
    return [*(rng.uniform(1.0, 2.0) * d / np.linalg.norm(d)), *rng.uniform(-0.5, 0.5, 3)]


def readings(truth, theta: np.ndarray, pose, noise=NOISE, seed: int = 0, orientation: bool = False):
    """The simulated instrument's readings of ``truth``'s tool (``Readings``)."""
    from pkrt.models.calibration.fit import Readings
    from pkrt.rt.app.measurements import simulated_readings

    tracker = SimpleNamespace(pose=pose, noise_position=noise[0], noise_orientation=noise[1], seed=seed)
    pos, rot = simulated_readings(truth, theta, tracker, orientation)
    return Readings(theta, pos, rot)


def truth_of(problem, delta, path: Path):
    """The description with the geometry changed by ``delta``, written to ``path`` and loaded."""
    from pkrt.models.calibration.output import write_description
    from pkrt.models.kinematics.mechanism import load_mechanism

    write_description(problem.params, delta, str(path))
    return load_mechanism(str(path))


def trial(problem, base, theta_fit, theta_test, truth, pose, seed: int) -> dict:
    """One truth: the fit to noisy readings at ``theta_fit``, the true error at ``theta_test``
    before and after (RMS per coordinate), the parameters' errors in their standard deviations."""
    from pkrt.models.calibration.fit import calibrate, predicted, rms

    ori = problem.orientation
    t0 = time.perf_counter()
    fit = calibrate(problem, base, readings(truth, theta_fit, pose, seed=seed, orientation=ori))
    seconds = time.perf_counter() - t0
    clean = readings(truth, theta_test, pose, noise=(0.0, 0.0), orientation=ori)
    before = rms(predicted(problem, np.zeros(problem.n_geo), fit.frame_cad, clean))
    after = rms(predicted(problem, fit.delta, fit.frame, clean))
    both = np.vstack([theta_fit, theta_test])
    eq = calibrate(problem, base, readings(truth, both, pose, noise=(0.0, 0.0), orientation=ori))
    geo = base.base < problem.n_geo
    z = (fit.value - eq.value)[geo] / fit.std[geo]
    out = {"before": before, "after": after, "ratio": before["position_m"] / after["position_m"],
           "after_over_noise": after["position_m"] / NOISE[0], "z_rms": float(np.sqrt(np.mean(z ** 2))),
           "z_max": float(np.abs(z).max()), "within_3": int(np.sum(np.abs(z) <= 3)), "parameters": int(geo.sum()),
           "chi2_per_dof": fit.chi2 / fit.dof, "fit_s": seconds, "at_bound": len(fit.at_bound)}
    if ori:
        out["ratio_orientation"] = before["orientation_rad"] / after["orientation_rad"]
        out["after_over_noise_orientation"] = after["orientation_rad"] / NOISE[1]
    return out


def truth_machine(name: str, folder: Path, truth_path: Path, pose, seed: int = 0) -> Path:
    """A copy of the machine's sim configuration whose plant is ``truth_path`` (exact, lockstep),
    with the simulated instrument at ``pose``."""
    from pkrt.models.identification.estimate import dump_toml
    from pkrt.models.kinematics.description import MACHINES_DIR

    src = MACHINES_DIR / MACHINE_CONFIG[name]
    cfg = tomllib.loads(src.read_text())
    cfg["machine"]["model"] = str(MACHINES_DIR / f"{name}.toml")
    cfg["machine"]["tree"] = str(MACHINES_DIR / cfg["machine"]["tree"])
    dr = cfg["drives"]
    dr.pop("plant_tree", None)
    dr.update(plant="exact", plant_model=str(truth_path), lockstep=True, substeps=1)
    cfg["realtime"] = {"priority": 0, "cpu": -1, "mlockall": False, "gc_freeze": True}
    cfg["tracker"] = {"pose": [float(x) for x in pose], "seed": seed}
    path = folder / f"{truth_path.stem}-sim.toml"
    path.write_text(dump_toml(cfg))
    return path


def end_to_end(name: str, folder: Path, config: Path, poses_csv: Path, tag: str) -> dict:
    """The plan run on the truth plant with the simulated instrument, then pkrt calibrate."""
    log, meas = folder / f"{tag}.pktlog", folder / f"{tag}-measured.csv"
    t0 = time.perf_counter()
    code, run = cli_json(["run", "--machine", str(config), "--traj", str(poses_csv), "--log", str(log), "--no-rt",
                          "--rate", str(RUN_RATE[name]), "--measure", str(meas)])
    run_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    code_c, cal = cli_json(["calibrate", str(log), str(meas), "--machine", str(config),
                            "-o", str(folder / f"{tag}-calibrated.toml")])
    return {"run": {"exit": code, "cycles": run.get("cycles"), "fault": run.get("fault"), "seconds": run_s,
                    "readings": (run.get("measure") or {}).get("readings")},
            "calibrate": {"exit": code_c, "seconds_wall": time.perf_counter() - t0, "seconds": cal.get("seconds"),
                          "rms": cal.get("rms"), "fit_poses": cal.get("fit_poses"),
                          "held_out_poses": cal.get("held_out_poses"), "chi2_per_dof": cal.get("chi2_per_dof"),
                          "tracker_pose": cal.get("tracker_pose"),
                          "tracker_pose_description": cal.get("tracker_pose_description")},
            "calibrated": str(folder / f"{tag}-calibrated.toml"), "machine": str(config)}


def run_machine(name: str, folder: Path, truths: int) -> dict:
    from pkrt.models.calibration.output import random_change
    from pkrt.models.calibration.poses import candidate_poses
    from pkrt.models.kinematics.mechanism import load_mechanism
    from pkrt.rt.app.calibrate import calibration_problem, structure
    from pkrt.rt.runtime.machine.config import load_machine

    config = load_machine(name)
    mech = load_mechanism(config.model_path)
    problem = calibration_problem(config, mech, mech.description.tool.orientation)
    base = structure(problem, config)
    kinds: dict[str, int] = {}
    for _, why in base.dependent:
        k = why.split(":")[0].split(" (")[0] if why.startswith("a motion") else why.split(" as ")[0]
        kinds[k] = kinds.get(k, 0) + 1
    out: dict = {"structure": {"parameters": problem.n, "base": base.n_base, "not_identifiable": kinds}}
    poses_csv = folder / f"{name}-poses.csv"
    t0 = time.perf_counter()
    code, plan = cli_json(["calibrate", "plan", name, "-o", str(poses_csv)])
    out["plan"] = {"exit": code, "seconds_wall": time.perf_counter() - t0, "seconds": plan.get("seconds"),
                   "observability": plan.get("observability"), "duration_s": plan.get("duration_s"),
                   "dwell_s": plan.get("dwell_s")}
    theta_fit = np.array([d["theta"] for d in plan["dwells"]])
    keep = np.ones(len(theta_fit), dtype=bool)
    keep[4::5] = False  # pkrt calibrate's default: every fifth reading held out
    theta_fit = theta_fit[keep]
    w = config.limits.position[:, 1] - config.limits.position[:, 0]
    theta_test, _ = candidate_poses(mech, HELD_OUT_POSES, config.limits.position[:, 0] + 0.05 * w,
                                    config.limits.position[:, 1] - 0.05 * w, seed=99)
    rows = []
    for k in range(truths):
        rng = np.random.default_rng(100 + k)
        truth = truth_of(problem, random_change(problem.params, rng), folder / f"{name}-truth{k}.toml")
        rows.append(trial(problem, base, theta_fit, theta_test, truth, random_pose(rng), seed=k))
    out["random_truths"] = {"trials": rows, "summary": _summary(rows)}
    rng = np.random.default_rng(7)
    truth_path = folder / f"{name}-truth-run.toml"
    truth_of(problem, random_change(problem.params, rng), truth_path)
    out["end_to_end"] = end_to_end(name, folder, truth_machine(name, folder, truth_path, random_pose(rng)),
                                   poses_csv, f"{name}-e2e")
    return out


def _summary(rows: list[dict]) -> dict:
    keys = ["ratio", "after_over_noise", "z_rms", "z_max", "fit_s"]
    keys += [k for k in ("ratio_orientation", "after_over_noise_orientation") if k in rows[0]]
    s = {f"{k}_{f.__name__}": float(f([r[k] for r in rows])) for k in keys for f in (np.min, np.median, np.max)}
    s["within_3_fraction"] = sum(r["within_3"] for r in rows) / sum(r["parameters"] for r in rows)
    s["at_bound"] = sum(r["at_bound"] for r in rows)
    return s


# -- the Orthoglide's demo traced by the true tool -------------------------------------------------------------

def issue_change(problem) -> np.ndarray:
    """The issue's machine: leg 1 0.3 mm shorter, guide 2 tilted 0.8 mrad, platform joint 3
    0.2 mm off, q1's zero 0.15 mm off."""
    d = np.zeros(problem.n_geo)
    names = problem.params.names
    d[names.index("u1_platform.point1.x")] = 0.3e-3  # leg 1's platform end towards its middle
    d[names.index("slide2.frame1.rx")] = 0.8e-3
    d[names.index("u3_platform.point2.y")] = 0.2e-3
    d[names.index("q1.offset")] = 0.15e-3
    return d


def demo_error(config_path: Path, truth, fit_pose, true_pose, folder: Path, tag: str) -> dict:
    """The demo in lockstep on the truth plant, the controller on ``config_path``'s model
    (exact in the loop): the true tool against the programmed path."""
    from pkrt.models.identification.estimate import dump_toml
    from pkrt.models.kinematics.mechanism import load_mechanism
    from pkrt.models.kinematics.taskspace import TaskKinematics
    from pkrt.rt.runtime.record.logfile import read_log
    from pkrt.rt.runtime.logs.logstats import columns

    cfg = tomllib.loads(config_path.read_text())
    tree = folder / f"{tag}-domain.pkt"
    code, _ = cli_json(["build", cfg["machine"]["model"], "-o", str(tree), "--boxes", "3", "--verify-samples", "10"])
    if code:
        raise RuntimeError(f"pkrt build {cfg['machine']['model']}: exit {code}")
    cfg["machine"]["tree"] = str(tree)
    cfg["controller"]["model"] = "exact"
    path = folder / f"{tag}-demo.toml"
    path.write_text(dump_toml(cfg))
    log = folder / f"{tag}-demo.pktlog"
    code, r = cli_json(["run", "--machine", str(path), "--log", str(log), "--no-rt", "--lockstep"])
    if not log.exists():
        raise RuntimeError(f"pkrt run --machine {path}: exit {code}, no log")
    data = read_log(str(log))
    k = slice(None, None, 10)  # 100 Hz
    ref, pos = columns(data.channels["ref_pos"])[k], columns(data.channels["pos"])[k]
    programmed = TaskKinematics(load_mechanism(cfg["machine"]["model"])).forward(ref)
    true = TaskKinematics(truth).forward(pos)
    T, F = _frame(true_pose), fit_pose
    mapped = (true - T.t) @ T.R @ F.R.T + F.t  # the true tool through the instrument into the model's frame
    e_frame, e_world = np.linalg.norm(mapped - programmed, axis=1), np.linalg.norm(true - programmed, axis=1)
    return {"exit": code, "tracking_rms_m": r.get("rms_error"), "fault": r.get("fault"),
            "tool_rms_m": float(np.sqrt(np.mean(e_frame ** 2))), "tool_max_m": float(e_frame.max()),
            "tool_rms_per_coordinate_m": float(np.sqrt(np.mean(e_frame ** 2) / 3)),
            "world_frame": {"tool_rms_m": float(np.sqrt(np.mean(e_world ** 2))), "tool_max_m": float(e_world.max())}}


def demo(folder: Path) -> dict:
    """The Orthoglide's demo on two truths, with the description and calibrated."""
    from pkrt.models.calibration.output import random_change
    from pkrt.models.kinematics.mechanism import load_mechanism
    from pkrt.rt.app.calibrate import calibration_problem
    from pkrt.rt.runtime.machine.config import load_machine

    config = load_machine("orthoglide")
    problem = calibration_problem(config, load_mechanism(config.model_path), False)
    poses_csv = folder / "orthoglide-poses.csv"
    if not poses_csv.exists():
        cli_json(["calibrate", "plan", "orthoglide", "-o", str(poses_csv)])
    out = {}
    for tag, change in (("issue", issue_change(problem)),
                        ("random", random_change(problem.params, np.random.default_rng(11)))):
        truth_path = folder / f"demo-{tag}-truth.toml"
        truth = truth_of(problem, change, truth_path)
        pose = random_pose(np.random.default_rng(12))
        cfg = truth_machine("orthoglide", folder, truth_path, pose)
        e2e = end_to_end("orthoglide", folder, cfg, poses_csv, f"demo-{tag}")
        c = e2e["calibrate"]
        out[tag] = {"end_to_end": e2e,
                    "description": demo_error(cfg, truth, _frame(c["tracker_pose_description"]), pose, folder,
                                              f"demo-{tag}-cad"),
                    "calibrated": demo_error(folder / f"demo-{tag}-calibrated-machine.toml", truth,
                                             _frame(c["tracker_pose"]), pose, folder, f"demo-{tag}-cal")}
        d, k = out[tag]["description"], out[tag]["calibrated"]
        out[tag]["ratio"] = d["tool_rms_m"] / k["tool_rms_m"]
        out[tag]["calibrated_over_noise"] = k["tool_rms_per_coordinate_m"] / NOISE[0]
    return out


def _frame(pose):
    from pkrt.models.calibration.jacobian import Frame
    from pkrt.models.kinematics.taskspace import rpy_matrix

    return Frame(rpy_matrix(pose[3:]), np.asarray(pose[:3], float))


def run_calibrate_bench() -> dict:
    names = [x for x in os.environ.get("PKRT_BENCH_CALIBRATE", ",".join(MACHINE_CONFIG)).split(",") if x]
    out: dict = {"load_average": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="pkrt-bench-calibrate-") as tmp:
        for name in names:
            try:
                out[name] = run_machine(name, Path(tmp), TRUTHS[name])
            except Exception as e:  # a figure that cannot be taken is reported, not hidden
                out[name] = {"error": f"{type(e).__name__}: {e}"}
        if "orthoglide" in names:
            try:
                out["orthoglide_demo"] = demo(Path(tmp))
            except Exception as e:
                out["orthoglide_demo"] = {"error": f"{type(e).__name__}: {e}"}
    return out
