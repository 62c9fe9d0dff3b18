"""CLI verbs ``pkrt build``, ``pkrt tree info`` and ``pkrt tree verify``."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from pkrt.rt.cli import emit, positive_number, vector, whole_number
from pkrt.rt.errors import Fault, UserError
from pkrt.rt.treefile import check_tree_matches_model, load_tree, save_tree, tree_bytes

from .mechanism import load_mechanism


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.3e}" if isinstance(x, float) else str(x)


# -- pkrt build -------------------------------------------------------------------------------

def add_arguments_build(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="model file or built-in name (fourbar, orthoglide, ...)")
    p.add_argument("-o", "--output", required=True, metavar="TREE", help="tree file to write")
    p.add_argument("--kind", choices=("spline", "boxes"), default=None,
                   help="spline: tensor cubic spline, continuous, needs the whole box in the "
                        "domain; boxes: the paper's quadratic boxes (default: spline if the "
                        "model allows it, else boxes)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--boxes", type=whole_number(1), metavar="N",
                   help="uniform: N intervals per actuator (N^s boxes or spline cells)")
    g.add_argument("--tol", type=positive_number, metavar="REL",
                   help="adaptive: refine until every held-out relative error (coefficients, "
                        "and for splines the torque) is below REL (default 0.005)")
    p.add_argument("--max-leaves", type=whole_number(1), default=4096, metavar="N",
                   help="adaptive boxes: leaf budget (default 4096)")
    p.add_argument("--max-bytes", type=whole_number(1), default=None, metavar="N",
                   help="adaptive: bound on the coefficient arrays' bytes (default 16 MiB)")
    p.add_argument("--sing-threshold", type=float, default=None, metavar="X",
                   help="out of domain below this singularity measure (default: the model's)")
    p.add_argument("--jobs", type=whole_number(1), default=None, metavar="N",
                   help="processes (default: all cores); the result does not depend on it")
    p.add_argument("--seed", type=whole_number(0), default=0, metavar="K", help="verification seed")
    p.add_argument("--verify-samples", type=whole_number(0), default=1000, metavar="N",
                   help="random states for the verification stored in the file (default 1000)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


DEFAULT_TOL = 0.005


def run_build(args) -> int:
    from .treebuild import DEFAULT_MAX_BYTES, BuildError, BuildSettings, build_tree
    mech = load_mechanism(args.model)
    tol = args.tol if args.tol is not None or args.boxes is not None else DEFAULT_TOL
    out = Path(args.output)
    if out.parent and not out.parent.is_dir():
        raise UserError(f"{out}: the output folder does not exist")
    if out.is_dir():
        raise UserError(f"{out}: is a folder; give the tree file to write (e.g. {out / 'tree.pkt'})")

    def settings(kind: str) -> BuildSettings:
        return BuildSettings(boxes=args.boxes, tol=tol, kind=kind, max_leaves=args.max_leaves,
                             max_bytes=args.max_bytes or DEFAULT_MAX_BYTES,
                             sing_threshold=args.sing_threshold,
                             verify_samples=args.verify_samples, seed=args.seed)
    fallback = None
    if args.kind is None:  # spline when the whole box is in the model's domain, else boxes
        try:
            tree, stats = build_tree(mech, settings("spline"), jobs=args.jobs)
        except BuildError as e:
            if "--kind boxes" not in str(e):
                raise
            fallback = str(e)
            tree, stats = build_tree(mech, settings("boxes"), jobs=args.jobs)
    else:
        tree, stats = build_tree(mech, settings(args.kind), jobs=args.jobs)
    if tree.kind_name == "boxes" and not tree.leaf_ok.any():
        raise Fault(f"no box of the tree is in the domain: all {tree.n_leaves} leaves are out of domain "
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
            f"({v.get('samples', 0)} samples): max_rel_coef_error {_fmt(v.get('max_rel_coef_error'))}, "
            f"max_rel_tau_error {_fmt(v.get('max_rel_tau_error'))}, "
            f"max_face_jump {_fmt(v.get('max_face_jump'))}")
    emit(result, args.json, text)
    return 0


# -- pkrt tree info -----------------------------------------------------------------------------

def add_arguments_tree_info(p: argparse.ArgumentParser) -> None:
    p.add_argument("tree", metavar="TREE", help="tree file")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def tree_summary(tree) -> dict:
    h = tree.header
    data = tree_bytes(tree)
    cells = ({"grid_points": tree.grid_points} if tree.kind_name == "spline" else
             {"nodes": int(len(tree.node_dim)), "leaves": tree.n_leaves,
              "leaves_out_of_domain": int((tree.leaf_ok == 0).sum()), "depth": _depth(tree)})
    return {
        "model": h["model"], "actuators": h["actuators"], "s": tree.s, "kind": tree.kind_name,
        **cells, "array_bytes": tree.nbytes, "file_bytes": len(data),
        "outputs": h["outputs"], "output_scale": h["output_scale"],
        "build": h["build"], "verification": h["verification"],
    }


def _depth(tree) -> int:
    """Longest root-to-leaf path (the loader guarantees a proper tree)."""
    deepest, stack = 0, [(0, 0)]
    while stack:
        n, d = stack.pop()
        deepest = max(deepest, d)
        if tree.node_dim[n] >= 0:
            stack += [(int(tree.node_child[n, 0]), d + 1), (int(tree.node_child[n, 1]), d + 1)]
    return deepest


def run_tree_info(args) -> int:
    tree = load_tree(args.tree)
    r = tree_summary(tree)
    a = r["actuators"]
    b, v = r["build"], r["verification"]
    lines = [f"{args.tree}: pkrt tree of model '{r['model']['name']}' "
             f"(content hash {r['model']['content_hash'][:16]}...)",
             f"actuators: " + ", ".join(f"{n} [{lo:g}, {hi:g}] {u}" for n, u, (lo, hi)
                                        in zip(a["names"], a["units"], a["ranges"])),
             (f"kind spline: grid points per axis {'x'.join(map(str, r['grid_points']))}, "
              if r["kind"] == "spline" else
              f"kind boxes: leaves {r['leaves']} ({r['leaves_out_of_domain']} out of domain), "
              f"nodes {r['nodes']}, depth {r['depth']}, ") +
             f"arrays {r['array_bytes']} bytes, file {r['file_bytes']} bytes",
             f"outputs: {len(r['outputs'])} ({r['outputs'][0]} ... {r['outputs'][-1]})",
             "build: " + ", ".join(f"{k} {val}" for k, val in b.items() if val is not None)]
    if v:
        lines.append(f"verification ({v.get('samples')} samples, seed {v.get('seed')}): "
                     f"max_rel_coef_error {_fmt(v.get('max_rel_coef_error'))}, "
                     f"max_rel_tau_error {_fmt(v.get('max_rel_tau_error'))}, "
                     f"max_face_jump {_fmt(v.get('max_face_jump'))}, "
                     f"out-of-domain samples {v.get('out_of_domain_samples')}")
    emit(r, args.json, "\n".join(lines))
    return 0


# -- pkrt tree verify ---------------------------------------------------------------------------

def add_arguments_tree_verify(p: argparse.ArgumentParser) -> None:
    p.add_argument("tree", metavar="TREE", help="tree file")
    p.add_argument("--model", metavar="MODEL", default=None,
                   help="model file or built-in name (default: the model named in the tree)")
    p.add_argument("--samples", type=whole_number(1), default=2000, metavar="N",
                   help="random states (default 2000)")
    p.add_argument("--seed", type=whole_number(0), default=0, metavar="K", help="random seed")
    p.add_argument("--region", type=vector, default=None, metavar="LO,HI[,...]",
                   help="sample theta in this box: lo,hi for every axis or lo1,hi1,lo2,hi2,...")
    p.add_argument("--diagonal", action="store_true",
                   help="theta evenly spaced on the region's diagonal (the paper's Figure 5)")
    p.add_argument("--jobs", type=whole_number(1), default=None, metavar="N",
                   help="processes (default: all cores)")
    p.add_argument("--max-error", type=positive_number, default=None, metavar="REL",
                   help="exit 1 if max_rel_coef_error exceeds REL")
    p.add_argument("--max-jump", type=positive_number, default=None, metavar="REL",
                   help="exit 1 if max_face_jump exceeds REL")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run_tree_verify(args) -> int:
    from .treeverify import verify_tree
    tree = load_tree(args.tree)
    model = args.model or tree.header["model"]["name"]
    mech = load_mechanism(model)
    check_tree_matches_model(tree, mech.content_hash, model)
    r = verify_tree(tree, mech, args.samples, args.seed, region=args.region, jobs=args.jobs,
                    diagonal=args.diagonal)
    failed = []
    if args.max_error is not None:
        e = r.get("max_rel_coef_error")
        if e is None or e > args.max_error:
            failed.append(f"max_rel_coef_error {_fmt(e)} > {args.max_error:g}")
    if args.max_jump is not None and r["max_face_jump"] > args.max_jump:
        failed.append(f"max_face_jump {_fmt(r['max_face_jump'])} > {args.max_jump:g}")
    r["passed"] = not failed
    g = r.get("group_max_rel_error", {})
    text = (f"{args.tree} vs model '{mech.name}': {r['compared']} of {r['samples']} samples "
            f"compared ({r['sampling']}, seed {r['seed']}, region {r['region']})\n"
            f"max_rel_coef_error {_fmt(r.get('max_rel_coef_error'))} ({r.get('worst_output')} at "
            f"theta {np.round(r.get('worst_theta') or [], 6).tolist()}); H {_fmt(g.get('H'))}, "
            f"D {_fmt(g.get('D'))}, p_ext {_fmt(g.get('p_ext'))}\n"
            f"max_rel_tau_error {_fmt(r.get('max_rel_tau_error'))} "
            f"(|theta_dot| <= {np.round(r['velocity_bound'], 6).tolist()}, "
            f"|theta_ddot| <= {np.round(r['acceleration_bound'], 6).tolist()})\n"
            f"max_face_jump {_fmt(r['max_face_jump'])} over {r['faces_checked']} faces\n"
            f"out-of-domain samples {r['out_of_domain_samples']}, exact model failed "
            f"{r['exact_failed_samples']}")
    emit(r, args.json, text)
    if failed:
        raise Fault("verification failed: " + "; ".join(failed))
    return 0
