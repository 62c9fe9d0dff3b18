"""CLI verbs ``pkrt identify LOG... --machine M -o MODEL.toml`` (masses and friction from run
logs) and ``pkrt identify plan MACHINE -o EXCITE.csv`` (an exciting trajectory)."""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np

from pkrt.rt.cli.argtypes import positive_number, whole_number
from pkrt.rt.cli.printing import emit
from pkrt.rt.app.identify import ESTIMATORS, identify_logs
from pkrt.rt.core.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("logs", nargs="+", metavar="LOG", help="run logs (pkrt run --log, pkrt hil --log)")
    p.add_argument("--machine", required=True, help="machine configuration file or built-in name")
    p.add_argument("-o", "--output", required=True, help="identified model file (TOML)")
    p.add_argument("--machine-out", help="machine configuration using the identified model and friction "
                                         "(default: OUTPUT with -machine.toml)")
    p.add_argument("--window", type=positive_number, default=0.031,
                   help="Savitzky-Golay window in s for positions and forces alike (default: %(default)s)")
    p.add_argument("--decimate", type=whole_number(1), help="keep every N-th filtered sample (default: from the cutoff)")
    p.add_argument("--held-out", type=float, default=0.25,
                   help="fraction at the end of each log kept for validation (default: %(default)s)")
    p.add_argument("--v-min", type=float, help="leave out samples of an axis slower than this (m/s or rad/s; "
                                               "default: 2 %% of the axis's peak speed; samples whose velocity "
                                               "changes sign within the filter window are always left out)")
    p.add_argument("--estimator", choices=ESTIMATORS, default="auto",
                   help="iv: instrumental variables, the regressor of the logged reference as instruments "
                        "(unbiased when force noise moves the machine); ls: least squares; auto: iv when every "
                        "log has its reference (default)")
    p.add_argument("--plot", help="PNG: measured vs predicted force on the held-out data, parameters with intervals")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args) -> int:
    from pkrt.rt.runtime.machine.config import load_machine
    from pkrt.rt.core.outputs import check_outputs

    if not 0.0 < args.held_out < 0.9:
        raise UserError("--held-out must be in (0, 0.9)")
    config = load_machine(args.machine)
    out = args.output
    machine_out = args.machine_out or str(Path(out).with_name(Path(out).stem + "-machine.toml"))
    check_outputs({"-o": out, "--machine-out": machine_out, "--plot": args.plot},
                  {f"log {p}": p for p in args.logs})
    result = identify_logs(config, list(args.logs), out, machine_out, window=args.window, decimate=args.decimate,
                           held_out=args.held_out, v_min=args.v_min, plot=args.plot,
                           estimator=args.estimator).report
    emit(result, args.json, _text(result))
    return 0


def _text(r: dict) -> str:
    lines = [f"{Path(r['model']).name}: {len(r['base'])} base parameters from {r['samples_fit']} samples "
             f"({r['rows_fit']} rows), {r['samples_held_out']} held out; condition number {r['condition_number']:.3g}",
             f"  filter: window {r['filter']['window_s'] * 1e3:.0f} ms, cutoff {r['filter']['cutoff_hz']:.1f} Hz, "
             f"decimated to {r['filter']['decimated_rate_hz']:.0f} Hz; {r['estimator']}",
             "  #   estimate      rsd %   model        base parameter"]
    for i, b in enumerate(r["base"]):
        lines.append(f"  {i + 1:<3d} {b['value']:<12.6g} {b['rsd_percent']:<7.2f} {b['model']:<12.6g} {b['name']}")
    kept = r["consistent"].get("kept_at_original", {})
    if kept:
        bodies = r["consistent"]["bodies_kept_at_original"]
        parts = [f"{b} ({'all' if b in bodies else ', '.join(ps)})" for b, ps in kept.items()]
        lines.append(f"  not identifiable (no effect on the forces), kept at the original values: "
                     f"{sum(len(ps) for ps in kept.values())} parameters of {len(kept)} bodies: {'; '.join(parts)}")
    h = r["held_out_rms"]
    fmt = lambda v: ", ".join("-" if x is None else f"{x:.4g}" for x in v)  # noqa: E731
    lines.append(f"  held-out force residual RMS per axis: identified {fmt(h['consistent'])}; "
                 f"original model {fmt(h['original_model'])}")
    lines.append(f"  residual sigma per axis (fit): {fmt(r['residual_sigma'])}")
    c = r["consistent"]
    lines.append("  physically consistent standard parameters " + ("reproduce the estimate" if c["reproduces_estimate"]
                 else f"nearest to the estimate (Mahalanobis distance {c['mahalanobis']:.3g})"))
    lines.append(f"  friction: viscous {fmt(r['friction']['viscous'])}, Coulomb {fmt(r['friction']['coulomb'])}, "
                 f"offset {fmt(r['friction']['offset'])}")
    rf = r["residual_floor"]
    lines.append(f"  contact observer's residual with the identified model (gain {rf['gain']:g} 1/s): RMS "
                 f"{fmt(rf['rms'])}, p99.9 {fmt(rf['p999'])}, max {fmt(rf['max'])}")
    lines.append(f"  wrote {r['output']} and {r['machine_out']}" + (f", plot {r['plot']}" if r.get("plot") else ""))
    lines.append(f"  {r['seconds']['total']:.2f} s, CPU {r['seconds']['cpu']:.2f} s (regressor {r['seconds']['regressor']:.2f} s)")
    return "\n".join(lines)


VERBS = {"identify": (add_arguments, run)}


def add_plan_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("machine", metavar="MACHINE", help="machine configuration file or built-in name")
    p.add_argument("-o", "--output", required=True, help="trajectory CSV (t and one column per actuator)")
    p.add_argument("--f0", type=positive_number,
                   help="base frequency in Hz (period 1/f0; default: where the full position range also "
                        "reaches the velocity or acceleration limit)")
    p.add_argument("--harmonics", type=whole_number(2, 100), default=6, help="harmonics per actuator (default %(default)s)")
    p.add_argument("--duration", type=positive_number, default=30.0,
                   help="seconds in the CSV, rounded up to whole periods (default %(default)s)")
    p.add_argument("--periods", type=whole_number(1), help="periods in the CSV (instead of --duration)")
    p.add_argument("--iterations", type=whole_number(1), default=100,
                   help="cost evaluations of the optimiser (default %(default)s)")
    add_plan_margins(p, "random start")


def add_plan_margins(p: argparse.ArgumentParser, seed_help: str) -> None:
    """--margin, --singular-margin, --seed and --json of a plan verb (identify plan, calibrate plan)."""
    p.add_argument("--margin", type=float, default=0.05, help="position margin, fraction of each range (default %(default)s)")
    p.add_argument("--singular-margin", type=positive_number, default=3.0,
                   help="singularity measure at least this times the model's threshold (default %(default)s)")
    p.add_argument("--seed", type=whole_number(0, 2 ** 32 - 1), default=0, help=seed_help + " (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run_plan(args) -> int:
    from pkrt.models.identification.baseparams import base_parameters
    from pkrt.models.identification.excitation import Limits, plan_excitation, write_csv
    from pkrt.models.kinematics.mechanism import load_mechanism
    from pkrt.models.identification.regressor import model_parameters

    from pkrt.rt.runtime.machine.config import load_machine
    from pkrt.rt.core.outputs import check_outputs
    from pkrt.rt.core.treefile import load_tree

    t0 = time.perf_counter()
    if not 0.0 <= args.margin < 0.4:
        raise UserError("--margin must be in [0, 0.4)")
    config = load_machine(args.machine)
    check_outputs({"-o": args.output}, {"MACHINE": config.path})
    mech = load_mechanism(config.model_path)
    s = mech.n_act
    force = np.broadcast_to(config.controller.tau_max, s).astype(float)
    if config.backend == "sim":
        force = np.minimum(force, config.drives.force_limit)
    lim = Limits(config.limits.position[:, 0].copy(), config.limits.position[:, 1].copy(),
                 np.broadcast_to(config.limits.velocity, s).astype(float),
                 np.broadcast_to(config.limits.acceleration, s).astype(float), 0.8 * force)
    bp = base_parameters(mech)
    pi0 = model_parameters(mech.description, config.controller.viscous, config.controller.coulomb)
    fo, rep = plan_excitation(mech, bp, lim, pi0, load_tree(config.tree), f0=args.f0, harmonics=args.harmonics,
                              margin=args.margin, singular_margin=args.singular_margin,
                              iterations=args.iterations, seed=args.seed)
    periods = args.periods or max(1, math.ceil(args.duration * fo.f0 - 1e-9))
    rows = write_csv(args.output, fo, mech.actuator_names, periods, config.rate_hz)
    rep.update({"machine": config.path, "output": args.output, "rows": rows, "axes": mech.actuator_names,
                "periods": periods, "duration_s": periods / fo.f0, "base_parameters": bp.n_base,
                "force_limit_used": "80 % of min(tau_max, the plant's force_limit)",
                "coefficients": {"f0": fo.f0, "a": fo.a.tolist(), "b": fo.b.tolist(), "c": fo.c.tolist()},
                "seconds": time.perf_counter() - t0})
    emit(rep, args.json, _plan_text(rep))
    return 0


def _plan_text(r: dict) -> str:
    p, L = r["peaks"], r["limits"]
    f = lambda v: ", ".join(f"{x:.4g}" for x in v)  # noqa: E731
    return "\n".join([
        f"{r['output']}: {r['harmonics']} harmonics of {1 / r['period_s']:g} Hz per actuator, {r['duration_s']:g} s "
        f"({r['rows']} rows), starts and ends at rest",
        f"  condition number {r['condition_number']:.4g} ({r['condition_scaling']}), {r['base_parameters']} base parameters",
        f"  checked at {r['checked_at_hz']:g} Hz ({r['checked_samples']} samples per period), every limit met:",
        f"    position [{f(p['position_min'])}] .. [{f(p['position_max'])}] within [{f(L['position'][0])}] .. [{f(L['position'][1])}]",
        f"    velocity {f(p['velocity'])} <= {f(L['velocity'])}",
        f"    acceleration {f(p['acceleration'])} <= {f(L['acceleration'])}",
        f"    force {f(p['force'])} <= {f(L['force'])}",
        f"    singularity measure min {p['singularity_measure_min']:.4g} >= {L['singularity_measure']:.4g} "
        f"(at {r['singularity_checked_at_hz']:g} Hz)",
        f"  {r['seconds']:.1f} s; run it: pkrt run --machine MACHINE --traj {r['output']} --log excite.pktlog"])


VERBS["identify plan"] = (add_plan_arguments, run_plan)
