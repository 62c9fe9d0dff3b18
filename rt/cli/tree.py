"""CLI verbs ``pkrt build``, ``pkrt tree info``, ``pkrt tree verify`` and ``pkrt tree plot``."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from pkrt.rt.cli.argtypes import positive_number, vector, whole_number
from pkrt.rt.cli.printing import emit
from pkrt.rt.core.errors import CheckFailed, UserError
from pkrt.rt.core.outputs import check_outputs
from pkrt.rt.core.treefile import check_tree_matches_model, load_tree, save_tree

from pkrt.models.kinematics.description import resolve_model_path
from pkrt.models.kinematics.mechanism import load_mechanism


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.3e}" if isinstance(x, float) else str(x)


def _states(v: dict) -> str:
    """The states a verification report compared (reports before the stress set: samples)."""
    sets = v.get("sets")
    if isinstance(sets, dict):
        return ", ".join(f"{n} {k}" for k, n in sets.items()) + " states"
    return f"{v.get('samples', 0)} samples"


# -- pkrt build -------------------------------------------------------------------------------

def add_arguments_build(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="model file or built-in name (fourbar, orthoglide, ...)")
    p.add_argument("-o", "--output", required=True, metavar="TREE", help="tree file to write")
    p.add_argument("--kind", choices=("spline", "boxes"), default=None,
                   help="spline: tensor cubic spline, continuous, needs the whole box in the "
                        "domain; boxes: the paper's quadratic boxes (default: boxes for more "
                        "than 3 actuators, else spline if the model allows it, else boxes)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--boxes", type=whole_number(1), metavar="N",
                   help="uniform: N intervals per actuator (N^s boxes or spline cells)")
    g.add_argument("--tol", type=positive_number, metavar="REL",
                   help="adaptive: refine until every held-out relative error (coefficients, "
                        "and for splines the torque) is below REL (default 0.005)")
    p.add_argument("--max-leaves", type=whole_number(1), default=4096, metavar="N",
                   help="adaptive boxes: leaf budget (default 4096)")
    p.add_argument("--max-bytes", type=whole_number(1, 2 ** 40), default=None, metavar="N",
                   help="adaptive: bound on the coefficient arrays' bytes (default 16 MiB)")
    p.add_argument("--sing-threshold", type=float, default=None, metavar="X",
                   help="out of domain below this singularity measure (default: the model's)")
    p.add_argument("--jobs", type=whole_number(1), default=None, metavar="N",
                   help="processes, or workers with --scheduler local (default: all cores); "
                        "the result does not depend on it")
    add_scheduler_argument(p)
    p.add_argument("--region", type=vector, default=None, metavar="LO,HI[,...]",
                   help="build over this box inside the actuator ranges: lo,hi for every actuator or "
                        "lo1,hi1,lo2,hi2,... (e.g. a plant tree for the region a demo uses)")
    p.add_argument("--seed", type=whole_number(0, 2 ** 32 - 1), default=0, metavar="K", help="verification seed")
    p.add_argument("--verify-samples", type=whole_number(0, 10 ** 12), default=1000, metavar="N",
                   help="random states for the verification stored in the file (default 1000)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


DEFAULT_TOL = 0.005
def add_scheduler_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scheduler", metavar="ADDRESS", default=None,
                   help="sample the model on a Dask cluster: its scheduler tcp://HOST:PORT, or "
                        "'local' for --jobs worker processes here (needs pkrt[dask]); same result")


def run_build(args) -> int:
    from pkrt.models.trees.build import build_tree
    from pkrt.models.trees.settings import DEFAULT_MAX_BYTES, SPLINE_DEFAULT_MAX_S, BuildError, BuildSettings
    mech = load_mechanism(args.model)
    tol = args.tol if args.tol is not None or args.boxes is not None else DEFAULT_TOL
    out = Path(args.output)
    check_outputs({"-o": out}, {"model file": resolve_model_path(args.model)})

    def settings(kind: str) -> BuildSettings:
        return BuildSettings(boxes=args.boxes, tol=tol, kind=kind, max_leaves=args.max_leaves,
                             max_bytes=args.max_bytes or DEFAULT_MAX_BYTES,
                             sing_threshold=args.sing_threshold,
                             verify_samples=args.verify_samples, seed=args.seed,
                             region=None if args.region is None else tuple(args.region))
    fallback = None
    kind = args.kind
    if kind is None and mech.n_act > SPLINE_DEFAULT_MAX_S:
        kind = "boxes"  # a tensor spline sums 4^s rows per output: too slow beyond s = 3
    if kind is None:  # spline when the whole box is in the model's domain, else boxes
        try:
            tree, stats = build_tree(mech, settings("spline"), jobs=args.jobs, scheduler=args.scheduler)
        except BuildError as e:
            if "--kind boxes" not in str(e):
                raise
            fallback = str(e)
            tree, stats = build_tree(mech, settings("boxes"), jobs=args.jobs, scheduler=args.scheduler)
    else:
        tree, stats = build_tree(mech, settings(kind), jobs=args.jobs, scheduler=args.scheduler)
    if tree.kind_name == "boxes" and not tree.leaf_ok.any():
        raise CheckFailed(f"no box of the tree is in the domain: all {tree.n_leaves} leaves are out of domain "
                    f"(cannot be assembled, or singularity measure below {tree.header['build']['sing_threshold']:g}); "
                    f"{out} not written")
    save_tree(tree, out)
    b, v = tree.header["build"], tree.header["verification"]
    result = {"tree": str(out), "model": mech.name, "file_bytes": out.stat().st_size,
              **{k: b.get(k) for k in ("kind", "mode", "boxes", "tol", "leaves",
                                       "leaves_out_of_domain", "grid_points", "samples",
                                       "samples_failed", "max_heldout_error", "stop")},
              "spline_refused": fallback, "verification": v, **stats}
    cells = (f"spline, {'x'.join(map(str, b['grid_points']))} grid points" if b["kind"] == "spline"
             else f"{b['leaves']} leaves ({b['leaves_out_of_domain']} out of domain)")
    text = ((f"spline refused ({fallback}); built boxes\n" if fallback else "") +
            f"wrote {out}: {cells}, "
            f"{out.stat().st_size} bytes, {b['samples']} exact samples, "
            f"build {stats['build_seconds']:.1f} s\n"
            f"held-out max rel error {_fmt(b['max_heldout_error'])}; verification "
            f"({_states(v)}): max_rel_coef_error {_fmt(v.get('max_rel_coef_error'))}, "
            f"max_rel_tau_error {_fmt(v.get('max_rel_tau_error'))}, "
            f"max_face_jump {_fmt(v.get('max_face_jump'))}")
    emit(result, args.json, text)
    return 0


# -- pkrt tree info -----------------------------------------------------------------------------

def add_arguments_tree_info(p: argparse.ArgumentParser) -> None:
    p.add_argument("tree", metavar="TREE", help="tree file")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run_tree_info(args) -> int:
    from pkrt.models.trees.summary import tree_summary

    tree = load_tree(args.tree)
    r = tree_summary(tree)
    a = r["actuators"]
    b, v = r["build"], r["verification"]
    lines = [f"{args.tree}: pkrt tree of model '{r['model']['name']}' "
             f"(content hash {r['model']['content_hash'][:16]}...)",
             "actuators: " + ", ".join(f"{n} [{lo:g}, {hi:g}] {u}" for n, u, (lo, hi)
                                        in zip(a["names"], a["units"], a["ranges"])),
             (f"kind spline: grid points per axis {'x'.join(map(str, r['grid_points']))}, "
              if r["kind"] == "spline" else
              f"kind boxes: leaves {r['leaves']} ({r['leaves_out_of_domain']} out of domain), "
              f"nodes {r['nodes']}, depth {r['depth']}, ") +
             f"arrays {r['array_bytes']} bytes, file {r['file_bytes']} bytes",
             f"outputs: {len(r['outputs'])} ({r['outputs'][0]} ... {r['outputs'][-1]})",
             "build: " + ", ".join(f"{k} {val}" for k, val in b.items() if val is not None),
             "built with: " + (", ".join(f"{k} {val}" for k, val in r["software"].items())
                               if isinstance(r["software"], dict) else "versions not recorded")]
    if v:
        lines.append(f"verification ({_states(v)}, seed {v.get('seed')}): "
                     f"max_rel_coef_error {_fmt(v.get('max_rel_coef_error'))}, "
                     f"max_rel_tau_error {_fmt(v.get('max_rel_tau_error'))}, "
                     f"max_face_jump {_fmt(v.get('max_face_jump'))}, "
                     f"out-of-domain samples {v.get('out_of_domain_samples')}")
    emit(r, args.json, "\n".join(lines))
    return 0


# -- pkrt tree verify ---------------------------------------------------------------------------

def add_arguments_tree_verify(p: argparse.ArgumentParser) -> None:
    from pkrt.models.trees.verify import DIAGONAL_SAMPLES, STRESS_SAMPLES
    p.add_argument("tree", metavar="TREE", help="tree file")
    p.add_argument("--model", metavar="MODEL", default=None,
                   help="model file or built-in name (default: the model named in the tree)")
    p.add_argument("--samples", type=whole_number(1, 10 ** 12), default=2000, metavar="N",
                   help="random states (default 2000)")
    p.add_argument("--stress", type=whole_number(0), default=STRESS_SAMPLES, metavar="N",
                   help=f"states on the region's faces, edges and corners (default {STRESS_SAMPLES})")
    p.add_argument("--diagonal-samples", type=whole_number(0), default=DIAGONAL_SAMPLES, metavar="N",
                   help=f"states on the region's diagonal (default {DIAGONAL_SAMPLES})")
    p.add_argument("--seed", type=whole_number(0, 2 ** 32 - 1), default=0, metavar="K", help="random seed")
    p.add_argument("--region", type=vector, default=None, metavar="LO,HI[,...]",
                   help="sample theta in this box: lo,hi for every axis or lo1,hi1,lo2,hi2,...")
    p.add_argument("--diagonal", action="store_true",
                   help="only the region's diagonal, --samples points (the paper's Figure 5)")
    p.add_argument("--jobs", type=whole_number(1), default=None, metavar="N",
                   help="processes, or workers with --scheduler local (default: all cores)")
    add_scheduler_argument(p)
    p.add_argument("--max-error", type=positive_number, default=None, metavar="REL",
                   help="exit 1 if max_rel_coef_error exceeds REL")
    p.add_argument("--max-jump", type=positive_number, default=None, metavar="REL",
                   help="exit 1 if max_face_jump exceeds REL")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _dist(d: dict | None) -> str:
    return "n/a" if not d else f"p50 {_fmt(d['p50'])}, p99 {_fmt(d['p99'])}, max {_fmt(d['max'])}"


def _theta(t) -> str:
    return "(" + ", ".join(f"{x:.4f}" for x in t) + ")"


def verify_text(path: str, model: str, r: dict) -> str:
    """The human-readable report of ``verify_tree``."""
    g = r.get("group_max_rel_error", {})
    lines = [f"{path} vs model '{model}': {r['compared']} of {_states(r)} compared (seed "
             f"{r['seed']}, region {r['region']})",
             f"relative coefficient error: {_dist(r.get('coef_error'))}; max per group H "
             f"{_fmt(g.get('H'))}, D {_fmt(g.get('D'))}, p_ext {_fmt(g.get('p_ext'))}",
             f"relative torque error:      {_dist(r.get('tau_error'))} "
             f"(|theta_dot| <= {np.round(r['velocity_bound'], 6).tolist()}, "
             f"|theta_ddot| <= {np.round(r['acceleration_bound'], 6).tolist()})"]
    for key, what in (("set_max_rel_coef_error", "coefficient"), ("set_max_rel_tau_error", "torque")):
        if r.get(key):
            lines.append(f"max {what} error per set: " + ", ".join(f"{k} {_fmt(v)}" for k, v in r[key].items()))
    if r.get("worst_coef_states"):
        lines.append("worst coefficient errors:")
        lines += [f"  {w['error']:.3e} {w['output']:<10} at theta {_theta(w['theta'])} ({w['set']})"
                  for w in r["worst_coef_states"]]
        lines.append("worst torque errors:")
        lines += [f"  {w['error']:.3e} axis {w['axis']} at theta {_theta(w['theta'])} ({w['set']})"
                  for w in r["worst_tau_states"]]
    jump_at = (f" ({r['worst_face_output']} at theta {_theta(r['worst_face_theta'])})"
               if r.get("worst_face_theta") else "")
    above = r.get("scale_above_stored")
    lines += [f"max_rel_coef_error {_fmt(r.get('max_rel_coef_error'))}, max_rel_tau_error "
              f"{_fmt(r.get('max_rel_tau_error'))}, max_face_jump {_fmt(r['max_face_jump'])} over "
              f"{r['faces_checked']} faces{jump_at}",
              "scales: largest |output| of the tree header and of these states"
              + (f" (up to {above:.4f} times the header's)" if above is not None else ""),
              f"out-of-domain states {r['out_of_domain_samples']}, exact model failed "
              f"{r['exact_failed_samples']}"]
    return "\n".join(lines)


def run_tree_verify(args) -> int:
    from pkrt.models.trees.sampling import SampleEvaluator
    from pkrt.models.trees.verify import verify_tree
    tree = load_tree(args.tree)
    model = args.model or tree.header["model"]["name"]
    mech = load_mechanism(model)
    check_tree_matches_model(tree, mech.content_hash, model)
    with SampleEvaluator(mech, args.jobs, desc="verify", scheduler=args.scheduler) as ev:
        r = verify_tree(tree, mech, args.samples, args.seed, region=args.region, evaluator=ev,
                        diagonal=args.diagonal, stress=args.stress,
                        diagonal_samples=args.diagonal_samples)
    failed = []
    if args.max_error is not None:
        e = r.get("max_rel_coef_error")
        if e is None or e > args.max_error:
            failed.append(f"max_rel_coef_error {_fmt(e)} > {args.max_error:g}")
    if args.max_jump is not None and r["max_face_jump"] > args.max_jump:
        failed.append(f"max_face_jump {_fmt(r['max_face_jump'])} > {args.max_jump:g}")
    r["passed"] = not failed
    emit(r, args.json, verify_text(args.tree, mech.name, r))
    if failed:
        raise CheckFailed("verification failed: " + "; ".join(failed))
    return 0


# -- pkrt tree plot -----------------------------------------------------------------------------

def add_arguments_tree_plot(p: argparse.ArgumentParser) -> None:
    p.add_argument("tree", metavar="TREE", help="tree file")
    p.add_argument("-o", "--output", required=True, metavar="OUT.png", help="PNG file to write")
    p.add_argument("--model", metavar="MODEL", default=None,
                   help="model file or built-in name (default: the model named in the tree)")
    p.add_argument("--points", type=whole_number(2), default=201, metavar="N",
                   help="points on the diagonal (default 201)")
    p.add_argument("--grid", type=whole_number(2), default=41, metavar="N",
                   help="N x N points per error map (default 41)")
    p.add_argument("--jobs", type=whole_number(1), default=None, metavar="N",
                   help="processes (default: all cores)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _check_output(out: Path, inputs: list[str]) -> None:
    """Refuse an output that is a folder, in a missing folder, or a pkrt file (an input)."""
    from pkrt.rt.core import filekind as fk

    if not out.parent.is_dir():
        raise UserError(f"{out}: the output folder does not exist")
    if out.is_dir():
        raise UserError(f"{out}: is a folder; give the PNG file to write")
    if any(out.exists() and Path(i).exists() and out.samefile(i) for i in inputs):
        raise UserError(f"{out}: is an input of this command; give another output file")
    kind = fk.sniff(out)
    if kind in (fk.TREE, fk.LOG, fk.MODEL, fk.MACHINE):
        raise UserError(f"{out}: is {fk.describe(kind)}; not overwritten with a plot")


def run_tree_plot(args) -> int:
    from pkrt.models.trees.plot import PLOT_SIZE_PX, default_title, plot_data, plot_tree
    if args.points > 10 ** 6 or args.grid > 1000:
        raise UserError("--points must be at most 10^6 and --grid at most 1000")
    tree = load_tree(args.tree)
    model = args.model or tree.header["model"]["name"]
    mech = load_mechanism(model)
    check_tree_matches_model(tree, mech.content_hash, model)
    out = Path(args.output)
    _check_output(out, [args.tree, getattr(mech.description, "path", "")])
    data = plot_data(tree, mech, args.points, args.grid, jobs=args.jobs)
    summary = plot_tree(tree, data, out, default_title(args.tree, tree))
    r = {"tree": args.tree, "model": mech.name, "png": str(out), "size_px": list(PLOT_SIZE_PX),
         "diagonal_points": args.points, "grid": args.grid, **summary}
    slices = "; ".join(f"{s['label']} {_fmt(s['max_rel_coef_error'])}" for s in summary["slices"])
    emit(r, args.json, f"wrote {out}: diagonal max relative coefficient error "
                       f"{_fmt(summary['diagonal_max_rel_coef_error'])}"
                       + (f"; error maps: {slices}" if slices else ""))
    return 0


VERBS = {"build": (add_arguments_build, run_build), "tree info": (add_arguments_tree_info, run_tree_info),
         "tree verify": (add_arguments_tree_verify, run_tree_verify),
         "tree plot": (add_arguments_tree_plot, run_tree_plot)}
