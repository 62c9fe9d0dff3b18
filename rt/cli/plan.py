"""CLI verb ``pkrt plan``: time a path in minimum time under the machine's velocity, acceleration
and force limits (``pkrt.models.planning.topp``) and write the reference as a CSV that ``pkrt run --traj``
plays: a G-code program, a CSV path (no time column) or the time-optimal Adept cycle."""

from __future__ import annotations

import argparse
import csv
import os

import numpy as np

from pkrt.rt.cli.argtypes import positive_number, vector, whole_number
from pkrt.rt.cli.printing import emit
from pkrt.rt.runtime.machine.config import load_machine
from pkrt.rt.core.errors import UserError
from pkrt.rt.core.plan import state_columns
from pkrt.rt.core.outputs import atomic_write, check_outputs


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", nargs="?", help="a G-code program, or a CSV path (columns: the tool's task coordinates "
                                           "or the actuators' names, no t)")
    p.add_argument("-o", "--output", help="planned reference CSV (t, one column per actuator, then their velocities and accelerations: <name>_vel, <name>_acc)")
    p.add_argument("--machine", default="orthoglide", help="machine configuration file or built-in name")
    p.add_argument("--adept", action="store_true", help="the time-optimal Adept cycle of the machine's [demo] "
                                                        "(start, height, width, direction) instead of FILE")
    p.add_argument("--blend", type=positive_number, default=0.01,
                   help="--adept: corner blending tolerance in m (default: %(default)s)")
    p.add_argument("--cycles", type=whole_number(1, 10000), default=1, help="--adept: cycles (default: 1)")
    p.add_argument("--margin", type=float, default=0.1,
                   help="fraction of the velocity, acceleration and force limits kept for the controller "
                        "(default: %(default)s)")
    p.add_argument("--model", choices=("tree", "exact"), help="forces from the controller's tree or the exact "
                                                              "model (default: the configuration's)")
    p.add_argument("--origin", type=vector, help="G-code: program origin x,y,z in m (default: the tool at the "
                                                 "reference assembly)")
    p.add_argument("--grid", type=whole_number(10, 100000), default=200, help="grid points per motion (default: 200)")
    p.add_argument("--smooth", type=float, default=0.002,
                   help="jerk smoothing window in s (0: none, the bang-bang time-optimal profile; default: %(default)s)")
    p.add_argument("--plot", help="plot PNG: path speed against its limits, forces against theirs")
    p.add_argument("--check", action="store_true",
                   help="G-code: only the whole-program check before motion (syntax, unsupported words, modal "
                        "errors, every end point and arc inside the workspace and the actuator ranges): its "
                        "figures, no timing (fast: millions of lines a second)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def plan_from_args(args, config, mech=None):
    """(Planned, report) for ``pkrt plan``'s FILE or --adept."""
    from pkrt.rt.app.reference import gcode_setup, path_planner, plan_adept, plan_gcode, plan_path_csv

    if not 0 <= args.margin < 1:
        raise UserError(f"--margin must be in [0, 1), got {args.margin}")
    if args.adept == bool(args.file):
        raise UserError("give FILE (a G-code program or a CSV path) or --adept, not both")
    if args.origin is not None and (len(args.origin) != 3 or not np.all(np.isfinite(args.origin))):
        raise UserError("--origin: expected three finite numbers x,y,z (m)")
    if not 0 <= args.smooth <= 1:
        raise UserError(f"--smooth must be in [0, 1] s, got {args.smooth}")
    planner = path_planner(config, mech, args.model, args.margin, args.grid, args.smooth)
    if args.adept:
        if config.demo.task != "adept-cycle":
            raise UserError(f"{config.path}: --adept needs a [demo] with task = \"adept-cycle\"")
        return plan_adept(planner, config.demo, args.blend, args.cycles)
    if not os.path.isfile(args.file):
        raise UserError(f"{args.file}: no such file")
    if args.file.lower().endswith(".csv"):
        return plan_path_csv(planner, args.file)
    return plan_gcode(planner, args.file, args.origin, gcode_setup(config))


def check_from_args(args, config) -> dict:
    """``pkrt plan FILE --check``: the G-code program's pre-check figures (``check_gcode``)."""
    from pkrt.rt.app.reference import check_gcode, gcode_setup, path_planner

    if args.adept or not args.file:
        raise UserError("--check: give FILE, a G-code program")
    if args.output or args.plot:
        raise UserError("--check writes no reference or plot (it does not time the program): drop -o / --plot")
    if args.origin is not None and (len(args.origin) != 3 or not np.all(np.isfinite(args.origin))):
        raise UserError("--origin: expected three finite numbers x,y,z (m)")
    if not os.path.isfile(args.file):
        raise UserError(f"{args.file}: no such file")
    if args.file.lower().endswith(".csv"):
        raise UserError(f"{args.file}: --check is for G-code programs (a CSV path is checked when planned)")
    planner = path_planner(config, None, args.model)
    return check_gcode(planner, args.file, args.origin, gcode_setup(config), config.limits.position,
                       preview_points=0).summary()


def _check_text(r: dict) -> str:
    m, box = r["motions"], np.array(r["box_m"]) * 1e3
    span = ", ".join(f"{a} [{lo:.3f}, {hi:.3f}]" for a, lo, hi in zip("xyz", box[0], box[1]))
    return (f"{r['path']}: accepted: {r['lines']} lines ({r['interpreted_lines']} by the interpreter), "
            f"{m['traverse']} traverses, {m['feed']} feeds, {m['arc']} arcs, {r['points_checked']} points inside "
            f"{r['machine']}'s workspace ({span} mm); feed path {r['feed_length_m']:.4g} m, "
            f"{r['feed_time_s']:.1f} s at the programmed feeds; checked in {r['seconds'] * 1e3:.0f} ms "
            f"({r['lines_per_s'] / 1e6:.2f} million lines/s)")


def write_csv(plan, names: list[str], path: str) -> None:
    """t, the actuators' positions, then their velocities and accelerations (``<name>_vel``,
    ``<name>_acc``: the planned ones, which ``pkrt run --traj`` reads back exactly at the loop
    rate), at full precision, written whole or not at all."""
    with atomic_write(path, "-o", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t", *state_columns(names)])
        t = np.arange(plan.n) / plan.rate_hz
        rows = np.hstack([t[:, None], plan.pos, plan.vel, plan.acc])
        for r in rows:
            w.writerow([repr(float(v)) for v in r])


def run(args) -> int:
    config = load_machine(args.machine)
    if args.check:
        report = {**check_from_args(args, config), "machine": config.name}
        emit(report, args.json, _check_text(report))
        return 0
    if not args.output and not args.json and not args.plot:
        raise UserError("nothing to write: give -o planned.csv, --plot or --json")
    check_outputs({"-o": args.output, "--plot": args.plot}, {"FILE": args.file})
    plan, report = plan_from_args(args, config)
    names = list(report["peak_velocity"])  # the model's actuator names
    if args.output:
        write_csv(plan, names, args.output)
        report["output"] = args.output
    if args.plot:
        from pkrt.models.planning.topp_plot import plot_plan

        plot_plan(plan, report, names, args.plot)
        report["plot"] = args.plot
    report["machine"] = config.name
    report = {k: v for k, v in report.items() if not k.startswith("_")}
    emit(report, args.json, _text(report))
    return 0


def _text(r: dict) -> str:
    lines = [f"{r['machine']}: planned {r['duration_s']:.4f} s ({r['samples']} samples at {r['rate_hz']:g} Hz), "
             f"margin {r['margin']:.0%}, forces from the {r['dynamics']}, planned in {r['planning_s'] * 1e3:.0f} ms"]
    for what in ("velocity", "acceleration", "force"):
        peaks = ", ".join(f"{k} {v:.4g}" for k, v in r[f"peak_{what}"].items())
        share = ", ".join(f"{k} {v['share']:.0%}" for k, v in r["binding"][what].items())
        lines.append(f"  peak {what}: {peaks} (binds: {share})")
    if r["feeds"]:
        lines.append(f"  feed binds on {r['binding']['feed']['share']:.0%} of the samples")
        for f in r["feeds"]:
            lines.append(f"    line {f['line']}: F {f['feed_m_s'] * 6e4:.6g} mm/min, peak {f['peak_speed_m_s'] * 6e4:.6g} "
                         f"mm/min{'' if f['feed_reachable'] else ' (feed not reachable: limits bind first)'}")
    if r.get("precheck"):
        c = r["precheck"]
        lines.append(f"  checked whole before planning: {c['lines']} lines in {c['seconds'] * 1e3:.0f} ms")
    for e in r.get("events", []):
        lines.append(f"  at {e['t_s']:.3f} s: {e['text']}")
    for k in ("output", "plot"):
        if r.get(k):
            lines.append(f"  {k} {r[k]}")
    return "\n".join(lines)


VERBS = {"plan": (add_arguments, run)}
