"""CLI verbs ``pkrt calibrate LOG MEASURED.csv --machine M -o CALIBRATED.toml`` (the geometry
from an instrument's readings of the tool) and ``pkrt calibrate plan MACHINE -o POSES.csv``
(measurement poses chosen for observability)."""

from __future__ import annotations

import argparse
from pathlib import Path

from pkrt.rt.cli.argtypes import positive_number, whole_number
from pkrt.rt.cli.printing import emit
from pkrt.rt.cli.identify import add_plan_margins
from pkrt.rt.core.errors import UserError


HELD_OUT = 0.2  # as pkrt.rt.app.calibrate.HELD_OUT (not imported: --help stays light)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("log", metavar="LOG", help="the run log of the measurement run (pkrt run --traj POSES.csv --log)")
    p.add_argument("measured", metavar="MEASURED.csv",
                   help="the instrument's readings, one per dwell: dwell,t,x,y,z[,roll,pitch,yaw] in its own frame "
                        "(pkrt run --measure writes it on the simulated plant)")
    p.add_argument("--machine", required=True, help="machine configuration file or built-in name (its [tracker] "
                                                    "noise weighs the readings)")
    p.add_argument("-o", "--output", required=True, help="calibrated model file (TOML)")
    p.add_argument("--machine-out", help="machine configuration using the calibrated model "
                                         "(default: OUTPUT with -machine.toml)")
    p.add_argument("--held-out", type=float, default=HELD_OUT,
                   help="fraction of the readings kept out of the fit to check it (every n-th; default %(default)s)")
    p.add_argument("--max-length", type=positive_number, default=5e-3,
                   help="bound of every length's change from the description, m (default %(default)s)")
    p.add_argument("--max-angle", type=positive_number, default=20e-3,
                   help="bound of every angle's change, rad (default %(default)s)")
    p.add_argument("--max-scale", type=positive_number, default=0.02,
                   help="bound of every actuator scale's change (default %(default)s)")
    p.add_argument("--plot", help="PNG: each reading's error before and after, the parameters with their intervals")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args) -> int:
    from pkrt.models.calibration.fit import Bounds
    from pkrt.rt.app.calibrate import calibrate_log
    from pkrt.rt.core.outputs import check_outputs
    from pkrt.rt.runtime.machine.config import load_machine

    if not 0.0 <= args.held_out <= 0.5:
        raise UserError("--held-out must be in [0, 0.5]")
    config = load_machine(args.machine)
    out = args.output
    machine_out = args.machine_out or str(Path(out).with_name(Path(out).stem + "-machine.toml"))
    check_outputs({"-o": out, "--machine-out": machine_out, "--plot": args.plot},
                  {"LOG": args.log, "MEASURED.csv": args.measured, "--machine": config.path})
    bounds = Bounds(length=args.max_length, angle=args.max_angle, scale=args.max_scale)
    r = calibrate_log(config, args.log, args.measured, out, machine_out, held_out=args.held_out, bounds=bounds,
                      plot=args.plot)
    emit(r, args.json, _text(r))
    return 0


def _um(x) -> str:
    return "-" if x is None else f"{x * 1e6:.1f}"


def _rms_line(label: str, d: dict | None) -> str:
    if d is None:
        return f"  {label}: no readings held out"
    text = f"  {label}: position RMS {_um(d['cad']['position_m'])} um with the description, " \
           f"{_um(d['calibrated']['position_m'])} um calibrated"
    if "orientation_rad" in d["cad"]:
        text += f"; orientation {_um(d['cad']['orientation_rad'])} urad, {_um(d['calibrated']['orientation_rad'])} urad"
    return text


def _text(r: dict) -> str:
    unit = {"m": ("mm", 1e3), "rad": ("mrad", 1e3), "1": ("1e-3", 1e3)}
    lines = [f"{Path(r['model']).name}: {r['base_parameters']} identifiable parameters of {r['parameters']} "
             f"(with the instrument's pose) from {r['fit_poses']} readings ({r['measures']}), {r['held_out_poses']} "
             f"held out; noise {_um(r['noise']['position_m'])} um" +
             (f", {_um(r['noise']['orientation_rad'])} urad" if r["noise"]["orientation_rad"] else ""),
             "  parameter                          change            std     unit"]
    for p in r["estimated"]:
        u, k = unit[p["unit"]]
        lines.append(f"  {p['name']:<34s} {p['change'] * k:+12.4f} {p['std'] * k:12.4f}     {u}")
    t = r["tracker_pose"]
    lines.append(f"  instrument at x, y, z {t[0]:.6f}, {t[1]:.6f}, {t[2]:.6f} m, roll, pitch, yaw {t[3]:.6f}, {t[4]:.6f}, "
                 f"{t[5]:.6f} rad (in the base frame)")
    lines.append(f"  not identifiable (kept at the description's values): {len(r['not_identifiable'])} parameters "
                 f"(--json lists each with why)")
    lines.append(_rms_line("fit", r["rms"]["fit"]))
    lines.append(_rms_line("held out", r["rms"]["held_out"]))
    lines.append(f"  chi-square per degree of freedom {r['chi2_per_dof']:.3g} (1: the residuals are the instrument's "
                 f"noise)")
    lines.append(f"  wrote {r['output']} and {r['machine_out']}" + (f", plot {r['plot']}" if r.get("plot") else ""))
    lines.append(f"  build its tree: pkrt build {r['output']} -o {Path(r['output']).with_suffix('.pkt')}")
    s = r["seconds"]
    lines.append(f"  {s['total']:.2f} s (fit {s['fit']:.2f} s, base set {s['base_set']:.2f} s), CPU {s['cpu']:.2f} s")
    return "\n".join(lines)


VERBS = {"calibrate": (add_arguments, run)}


def add_plan_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("machine", metavar="MACHINE", help="machine configuration file or built-in name")
    p.add_argument("-o", "--output", required=True, help="trajectory CSV (t and one column per actuator) for "
                                                         "pkrt run --traj")
    p.add_argument("--poses", type=whole_number(2), default=50, help="measurement poses (default %(default)s)")
    p.add_argument("--candidates", type=whole_number(10), default=600,
                   help="random poses inside the limits the poses are chosen from (default %(default)s)")
    p.add_argument("--dwell", type=positive_number,
                   help="rest at each pose, s (default: ten time constants of the closed loop plus the reading)")
    add_plan_margins(p, "random candidates")


def run_plan(args) -> int:
    from pkrt.models.calibration.poses import write_trajectory
    from pkrt.rt.app.calibrate import plan_poses
    from pkrt.rt.core.outputs import check_outputs
    from pkrt.rt.runtime.machine.config import load_machine

    if not 0.0 <= args.margin < 0.4:
        raise UserError("--margin must be in [0, 0.4)")
    if args.dwell is not None and args.dwell < 0.3:
        raise UserError("--dwell must be at least 0.3 s (a dwell is 0.25 s of rest or more, read in its last 0.1 s)")
    config = load_machine(args.machine)
    check_outputs({"-o": args.output}, {"MACHINE": config.path})
    plan, r = plan_poses(config, poses=args.poses, candidates=args.candidates, dwell=args.dwell, margin=args.margin,
                         singular_margin=args.singular_margin, seed=args.seed)
    r["output"] = args.output
    write_trajectory(args.output, plan, r["axes"])
    emit(r, args.json, _plan_text(r))
    return 0


def _plan_text(r: dict) -> str:
    o = r["observability"]
    p, L = r["peaks"], r["limits"]
    f = lambda v: ", ".join(f"{x:.4g}" for x in v)  # noqa: E731
    return "\n".join([
        f"{r['output']}: {r['poses']} poses chosen from {r['candidates']} candidates for {r['base_parameters']} "
        f"identifiable parameters ({r['measures']} measured), {r['duration_s']:.1f} s ({r['rows']} rows)",
        f"  observability O1 {o['chosen']['o1']:.4g} (random poses: median {o['random_median']['o1']:.4g} of "
        f"{o['random_draws']} draws, x{o['o1_over_random']:.2f}); condition number {o['chosen']['condition_number']:.4g} "
        f"(random {o['random_median']['condition_number']:.4g})",
        f"  rests {r['dwell_s']:g} s at each pose (settle {r['settle_s']:.2f} s, reading {r['reading_s']:g} s)",
        f"  peaks within {L['note']}: velocity {f(p['velocity'])} <= {f(L['velocity'])}; acceleration "
        f"{f(p['acceleration'])} <= {f(L['acceleration'])}; force {f(p['force'])} <= {f(L['force'])}; singularity "
        f"measure min {p['singularity_measure_min']:.4g} >= {L['singularity_measure']:.4g}",
        f"  {r['seconds']['total']:.1f} s; run it: pkrt run --machine MACHINE --traj {r['output']} --log poses.pktlog "
        f"(--measure MEASURED.csv on the simulated plant)"])


VERBS["calibrate plan"] = (add_plan_arguments, run_plan)
