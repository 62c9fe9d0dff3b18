"""Benchmark ``identify``: the must-show figures of identification, per machine (Orthoglide
first; ``PKRT_BENCH_IDENTIFY`` = comma-separated machines, default all three).

1. Y pi = exact tau at 1000 random states (worst relative error), the base parameter count and
   the regressor's numerical rank.
2. The exciting trajectory (``pkrt identify plan``): its condition number and limits at 10 kHz.
3. A lockstep ``pkrt run`` of it at 1 kHz on a truth plant that differs non-uniformly from the
   controller's model (payload of half the platform's mass off its centre, the first body 15 %
   heavier, friction 0.75x and 0.8x the configuration's), with position quantisation (the
   range / 320000) and force noise per cycle (0.25 % of tau_max): the Orthoglide's 15 N s/m and
   4 N for 20 and 5, 1 um, 1 N; ``pkrt identify`` on its log: base parameters
   with rsd < 5 % against the truth, held-out residual RMS against the noise floor (the force
   noise through the same filter), the time it takes.
4. Coverage of the 95 % intervals over noise seeds: the run's filtered regressor reused with the
   truth's forces plus fresh filtered noise, fitted again per seed.
5. Tracking of the machine's demo on the truth plant with the original model, the truth and the
   identified models in the controller (trees of 12 intervals per axis built here for the last
   ones).

Steps 3 and 5 also for least squares on the same log (``identify_least_squares``,
``identified-ls``), beside the default instrumental variables.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
import tomllib
from pathlib import Path

import numpy as np

MACHINE_CONFIG = {"orthoglide": "orthoglide-sim.toml", "delta": "delta-sim.toml", "hexapod": "hexapod-sim.toml"}


def cli_json(argv: list[str]) -> tuple[int, dict]:
    """``pkrt ARGV --json`` as a user runs it (a process of its own: the benchmarks never import
    the CLI): (exit code, its JSON object or {})."""
    import json
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "pkrt.rt.cli", *argv, "--json"], capture_output=True, text=True)
    return r.returncode, (json.loads(r.stdout) if r.stdout.strip() else {})


def _yp_check(mech, n: int = 1000) -> dict:
    from pkrt.models.identification.baseparams import random_states
    from pkrt.models.reduction.exact import ExactModel
    from pkrt.models.identification.regressor import Regressor, model_parameters

    reg, exact = Regressor(mech), ExactModel(mech)
    pi = model_parameters(mech.description)
    th, td, tdd = random_states(mech, n, seed=1)
    worst = 0.0
    t0 = time.perf_counter()
    for a, b, c in zip(th, td, tdd):
        tau = exact(a).tau(b, c)
        worst = max(worst, float(np.abs(reg(a, b, c) @ pi - tau).max() / np.abs(tau).max()))
    return {"states": n, "worst_relative_error": worst, "seconds": time.perf_counter() - t0}


def truth_mechanism(mech, payload: float = 0.5, heavier: float = 1.15):
    """The platform (last body) carries ``payload`` of its mass 3 cm, 2 cm, 1 cm off its
    centre; the first body is ``heavier`` times its mass and inertia."""
    import dataclasses

    from pkrt.models.kinematics.mechanism import compile_mechanism

    bodies = list(mech.description.bodies)
    p = bodies[-1]
    m = p.mass * (1 + payload)
    off = np.array([0.03, -0.02, 0.01])
    com = (p.mass * p.com + payload * p.mass * (p.com + off)) / m
    d0, d1 = p.com - com, p.com + off - com
    inertia = (p.inertia + p.mass * ((d0 @ d0) * np.eye(3) - np.outer(d0, d0))
               + payload * p.mass * ((d1 @ d1) * np.eye(3) - np.outer(d1, d1)))
    bodies[-1] = dataclasses.replace(p, mass=m, com=com, inertia=inertia)
    b = bodies[0]
    bodies[0] = dataclasses.replace(b, mass=b.mass * heavier, inertia=b.inertia * heavier)
    return compile_mechanism(dataclasses.replace(mech.description, bodies=tuple(bodies)))


# the truth plant's friction, force noise and position quantum, relative to the machine's own
# (the Orthoglide's: 15 N s/m and 4 N where the model says 20 and 5, 1 N of 400, 1 um of 0.32 m)
VISCOUS_FACTOR, COULOMB_FACTOR = 0.75, 0.8
NOISE_OF_TAU_MAX = 0.0025
QUANTUM_OF_RANGE = 1e-6 / 0.32


def truth_levels(cfg: dict, mech) -> dict:
    """viscous, coulomb, force_noise, quantum of the truth plant for a machine configuration."""
    ctl = cfg["controller"]
    width = float(np.min(mech.ranges[:, 1] - mech.ranges[:, 0]))
    return {"viscous": VISCOUS_FACTOR * float(ctl["viscous"]), "coulomb": COULOMB_FACTOR * float(ctl["coulomb"]),
            "force_noise": NOISE_OF_TAU_MAX * float(ctl["tau_max"]),
            "quantum": float(f"{QUANTUM_OF_RANGE * width:.2g}")}


def write_truth(mech, config_path: Path, folder: Path):
    """truth.toml and truth-sim.toml in ``folder`` (plant friction, force noise and quantum from
    ``truth_levels``); returns (truth mechanism, config path)."""
    from pkrt.models.identification.estimate import body_values, dump_toml
    from pkrt.models.kinematics.mechanism import load_mechanism
    from pkrt.models.identification.regressor import model_parameters

    truth = truth_mechanism(mech)
    doc = tomllib.loads(Path(mech.description.path).read_text())
    for b, (m, c, I) in zip(doc["bodies"], body_values(model_parameters(truth.description), mech.n_bodies)):
        b["mass"], b["com"], b["inertia"] = m, c, I
    (folder / "truth.toml").write_text(dump_toml(doc, "bench truth: payload off the platform's centre, first body heavier"))
    cfg = tomllib.loads(config_path.read_text())
    d = config_path.parent
    cfg["machine"]["model"] = str(Path(mech.description.path))
    cfg["machine"]["tree"] = str((d / cfg["machine"]["tree"]).resolve())
    dr = cfg["drives"]
    dr.pop("plant_tree", None)
    lv = truth_levels(cfg, mech)
    dr.update(plant="exact", plant_model=str(folder / "truth.toml"), viscous=lv["viscous"], coulomb=lv["coulomb"],
              substeps=1, force_noise=lv["force_noise"], quantization=lv["quantum"], noise=0.0, lockstep=True)
    cfg["realtime"] = {"priority": 0, "cpu": -1, "mlockall": False, "gc_freeze": True}
    (folder / "truth-sim.toml").write_text(dump_toml(cfg))
    return load_mechanism(str(folder / "truth.toml")), folder / "truth-sim.toml"


def _coverage(res, truth_base: np.ndarray, force_noise: float, seeds: int) -> dict:
    """Fresh force noise on the run's own filtered regressor: the truth's forces plus white
    noise through the same Savitzky-Golay filter, fitted again; how often each 95 % interval
    (of the parameters with rsd < 5 %) holds the truth."""
    from scipy.signal import savgol_filter

    from pkrt.models.identification.estimate import fit

    s = res.samples
    f = s.filter
    Yb = res.Y[:, :, res.bp.base]
    clean = np.einsum("nsr,r->ns", Yb, truth_base)
    well = res.est.rsd < 0.05
    # noise on the full-rate signal, filtered and decimated like the forces
    half = f["window"] // 2
    n_full = (s.n + 2) * f["decimate"] + 2 * half
    hits, total = 0, 0
    rng = np.random.default_rng(12345)
    labels = [res.bp.label(i) for i in range(res.bp.n_base)]
    for _ in range(seeds):
        e = rng.normal(0.0, force_noise, (n_full, Yb.shape[1]))
        ef = savgol_filter(e, f["window"], f["polyorder"], axis=0)[half::f["decimate"]][:s.n]
        est = fit(Yb[~res.test], (clean + ef)[~res.test], res.use[~res.test], labels, Zb=res.Zb)
        inside = np.abs(est.value - truth_base) <= 1.96 * est.std
        hits += int(inside[well].sum())
        total += int(well.sum())
    return {"seeds": seeds, "parameters": int(well.sum()), "coverage": hits / max(total, 1)}


def run_machine(name: str, folder: Path, seeds: int = 100) -> dict:
    from pkrt.models.identification.baseparams import base_parameters
    from pkrt.models.kinematics.description import MACHINES_DIR
    from pkrt.models.kinematics.mechanism import load_mechanism
    from pkrt.models.identification.regressor import model_parameters
    from pkrt.rt.app.identify import identify_logs
    from pkrt.rt.runtime.machine.config import load_machine

    out: dict = {}
    mech = load_mechanism(name)
    out["y_times_pi"] = _yp_check(mech)
    bp = base_parameters(mech)
    out["base"] = {"standard": len(bp.names), "base": bp.n_base, "numerical_rank": bp.rank,
                   "not_identifiable": len(bp.zero)}
    truth, cfg_path = write_truth(mech, MACHINES_DIR / MACHINE_CONFIG[name], folder)
    csv = folder / "excite.csv"
    t0 = time.perf_counter()
    code, plan = cli_json(["identify", "plan", str(cfg_path), "-o", str(csv)])
    out["excitation"] = {k: plan.get(k) for k in ("condition_number", "condition_scaling", "ok", "checked_at_hz",
                                                  "peaks", "limits", "duration_s")}
    out["excitation"]["seconds"] = time.perf_counter() - t0
    log = folder / "excite.pktlog"
    t0 = time.perf_counter()
    code, run = cli_json(["run", "--machine", str(cfg_path), "--traj", str(csv), "--log", str(log), "--no-rt"])
    out["run"] = {"cycles": run["cycles"], "rms_error_m": run["rms_error"], "fault": run["fault"],
                  "seconds": time.perf_counter() - t0}
    config = load_machine(str(cfg_path))
    d = config.drives
    truth_base = bp.project(model_parameters(truth.description, d.viscous, d.coulomb))
    res = identify_logs(config, [str(log)], str(folder / "identified.toml"), str(folder / "identified-machine.toml"))
    out["identify"] = _figures(res, truth_base, d.force_noise)
    out["coverage"] = _coverage(res, truth_base, d.force_noise, seeds)
    # the same log by least squares, side by side (biased where force noise moves the machine)
    ls = identify_logs(config, [str(log)], str(folder / "identified-ls.toml"), str(folder / "identified-ls-machine.toml"),
                       estimator="ls")
    out["identify_least_squares"] = _figures(ls, truth_base, d.force_noise)
    if config.demo.points is not None or config.demo.task != "none":
        out["tracking"] = _tracking(cfg_path, folder, {"identified": res.report["friction"],
                                                       "identified-ls": ls.report["friction"]})
    return out


def _figures(res, truth_base: np.ndarray, force_noise: float) -> dict:
    """An identification against the truth: the base parameters with rsd < 5 % and how many are
    within 1 % of the truth, the spread of every estimate's error in its own standard deviations
    (about 1 when unbiased), held-out residual against the noise floor (the force noise through
    the filter), the consistent model's fit, times."""
    from scipy.signal import savgol_coeffs

    r = res.report
    well = [(i, b) for i, b in enumerate(r["base"]) if b["rsd_percent"] < 5]
    errs = [100 * (b["value"] - truth_base[i]) / truth_base[i] for i, b in well]
    z = (res.est.value - truth_base) / res.est.std
    f = r["filter"]
    floor = force_noise * float(np.linalg.norm(savgol_coeffs(f["window"], f["polyorder"])))
    return {
        "estimator": r["estimator"], "seconds": r["seconds"], "samples": r["samples"],
        "log_s": r["logs"][0]["duration_s"],
        "well_determined": [{"name": b["name"], "estimate": b["value"], "truth": float(truth_base[i]),
                             "rsd_percent": b["rsd_percent"], "error_percent": e} for (i, b), e in zip(well, errs)],
        "within_1_percent": int(sum(abs(e) <= 1 for e in errs)), "of": len(errs),
        # the count expected from the estimates' own spread: P(|N(0, rsd)| <= 1 %) summed
        "expected_within_1_percent": float(sum(math.erf(1.0 / (math.sqrt(2) * b["rsd_percent"])) for _, b in well)),
        "error_in_std": {"rms": float(np.sqrt(np.mean(z ** 2))), "max": float(np.abs(z).max()),
                         "over_3": int(np.sum(np.abs(z) > 3)), "of": len(z)},
        "held_out_rms": r["held_out_rms"]["consistent"], "noise_floor": floor,
        "held_out_over_floor": [x / floor for x in r["held_out_rms"]["consistent"]],
        "original_model_held_out_rms": r["held_out_rms"]["original_model"],
        "consistent": r["consistent"],
    }


def _tracking(cfg_path: Path, folder: Path, identified: dict[str, dict], boxes: int = 12) -> dict:
    """The machine's demo, lockstep, on the truth plant under computed torque with these
    controller models: the original (its shipped tree), the truth and each ``identified`` one
    (name: its friction; trees of ``boxes`` intervals per axis built here, the same for all),
    each with its friction feedforward (original: the configuration's; truth: the plant's;
    identified: identified).
    Beyond three actuators (the hexapod: 12^6 boxes is out of reach) the truth and the
    identified model run as ``[controller] model = "exact"`` (the model computed in the loop,
    lockstep) and their trees, of 2 intervals per axis, only serve the run's domain check."""
    base = tomllib.loads(cfg_path.read_text())
    from pkrt.models.kinematics.mechanism import load_mechanism

    exact_ctl = load_mechanism(str(Path(base["machine"]["model"]))).n_act > 3
    boxes = 2 if exact_ctl else boxes
    plant = base["drives"]
    runs = {"original": (None, None, None)}
    runs["truth"] = (folder / "truth.toml", plant["viscous"], plant["coulomb"])
    for name, fr in identified.items():  # each identified model (its file: NAME.toml) and its friction
        runs[name] = (folder / f"{name}.toml", fr["viscous"], fr["coulomb"])
    out = {"tree_boxes": boxes, "controller_model": "exact" if exact_ctl else "tree"}
    from pkrt.models.identification.estimate import dump_toml

    for name, (model, visc, coul) in runs.items():
        doc = tomllib.loads(cfg_path.read_text())
        if model is not None:
            tree = folder / f"{name}.pkt"
            t0 = time.perf_counter()
            code, _ = cli_json(["build", str(model), "-o", str(tree), "--boxes", str(boxes), "--verify-samples", "50"])
            out[f"{name}_build_s"] = time.perf_counter() - t0
            on_model(doc, model, tree, visc, coul, exact_ctl)
        path = folder / f"track-{name}.toml"
        path.write_text(dump_toml(doc))
        code, r = cli_json(["run", "--machine", str(path), "--no-log", "--no-rt"])
        out[name] = {"rms_error_m": r.get("rms_error"), "max_error_m": r.get("max_error"), "fault": r.get("fault"),
                     "exit": code}
    t = out["truth"]["rms_error_m"]
    for name in identified:
        i = out[name]["rms_error_m"]
        out[f"{name}_over_truth"] = i / t if t and i else None
    return out


def on_model(doc: dict, model, tree, viscous, coulomb, exact: bool) -> dict:
    """A machine configuration (TOML document) put on another model: its file and tree, the
    friction fed forward, and the model computed in the loop when ``exact``."""
    doc["machine"]["model"], doc["machine"]["tree"] = str(model), str(tree)
    doc["controller"]["viscous"], doc["controller"]["coulomb"] = viscous, coulomb
    if exact:
        doc["controller"]["model"] = "exact"
    return doc


def run_identify_bench() -> dict:
    names = [x for x in os.environ.get("PKRT_BENCH_IDENTIFY", ",".join(MACHINE_CONFIG)).split(",") if x]
    out = {"load_average": os.getloadavg()}
    for name in names:
        with tempfile.TemporaryDirectory(prefix="pkrt-bench-identify-") as tmp:
            try:
                out[name] = run_machine(name, Path(tmp))
            except Exception as e:  # a figure that cannot be taken is reported, not hidden
                out[name] = {"error": f"{type(e).__name__}: {e}"}
    return out
