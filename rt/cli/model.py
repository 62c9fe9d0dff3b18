"""CLI verbs ``pkrt model check`` and ``pkrt model eval``."""

from __future__ import annotations

import argparse

import numpy as np

from pkrt.rt.cli.argtypes import vector
from pkrt.rt.cli.printing import emit
from pkrt.rt.core.errors import CheckFailed, UserError
from pkrt.rt.core.inputs import finite_result, quiet


def add_arguments_model_check(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="model file (TOML) or built-in name (fourbar, fivebar, orthoglide, "
                                 "delta, hexapod)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run_model_check(args) -> int:
    from pkrt.models.kinematics.mechanism import load_mechanism
    from pkrt.models.kinematics.report import check_report

    mech = load_mechanism(args.model)
    r = check_report(mech)
    sigma = r["singularity_measure"]
    acts = ", ".join(f"{a['name']} ({a['joint']}, [{a['range'][0]:g}, {a['range'][1]:g}] {a['unit']})"
                     for a in r["actuators"])
    text = (f"model {mech.name} ({mech.description.path})\n"
            f"  bodies {r['bodies']}, joints {r['joints']}, coordinates {r['coordinates']} (6 per moving body)\n"
            f"  constraints {r['constraints']}: {r['independent_constraints']} independent, "
            f"{r['redundant_constraints']} redundant (eliminated)\n"
            f"{_idle_text(mech)}"
            f"  mobility {r['mobility']} = actuators {len(r['actuators'])}: {acts}\n"
            f"{_tool_text(r['tool'])}"
            f"  assembled at theta = {np.array2string(mech.theta_ref, precision=6)}, "
            f"singularity measure {sigma:.4g} (threshold {r['singular_threshold']:g})\n"
            f"{_protection_text(r['protection'])}"
            f"  {'ok' if (r['protection'] or {}).get('inside', True) else 'FAILED: the reference pose is beyond a limit'}")
    emit(r, args.json, text)
    if not (r["protection"] or {}).get("inside", True):
        bad = min(r["protection"]["items"], key=lambda it: it["margin"])
        raise CheckFailed(f"{mech.name}: at the reference pose {bad['text']}")
    return 0


def _protection_text(p: dict | None) -> str:
    """The passive-joint limits and capsules at the reference: the tightest joint, the closest pair."""
    if p is None:
        return "  passive-joint limits and capsules: none declared\n"
    kinds = [it["kind"] for it in p["items"]]
    out = (f"  passive-joint limits {kinds.count('cone')} cone(s), {kinds.count('range')} range(s); "
           f"capsule pairs {kinds.count('pair')}\n")
    for what, it in (("tightest joint", p["tightest_joint"]), ("closest pair", p["closest_pair"])):
        if it is not None:
            out += f"    {what} at the reference: {it['text']} (margin {it['margin']:.4g} {it['unit']})\n"
    return out


def _idle_text(mech) -> str:
    if not mech.idle:
        return "  idle freedoms 0\n"
    spins = ", ".join(f"{f.body} about {np.array2string(f.axis, precision=4)}" for f in mech.idle)
    return (f"  idle freedoms {len(mech.idle)} (zero inertia about the axis; locked by one row "
            f"each): {spins}\n")


def _tool_text(tool: dict | None) -> str:
    if tool is None:
        return "  tool: none (no [tool] table: no task-space motion)\n"
    pose = ", ".join(f"{c} {v:.6g}" for c, v in zip(tool["coordinates"], tool["reference_pose"]))
    return (f"  tool: point {np.array2string(tool['point'], precision=6)} on {tool['body']}; "
            f"at the reference {pose}\n")


def add_arguments_model_eval(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="model file or built-in name, or a tree file (any name: told by content)")
    p.add_argument("--theta", type=vector, required=True, help="actuator positions a,b,c (m or rad)")
    p.add_argument("--theta-dot", type=vector, help="actuator velocities (m/s or rad/s)")
    p.add_argument("--theta-ddot", type=vector, help="actuator accelerations (m/s^2 or rad/s^2)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run_model_eval(args) -> int:
    from pkrt.rt.core import filekind as fk

    kind = fk.sniff(args.model)  # by content, whatever the file's name
    if kind not in (fk.TREE, fk.MODEL, fk.TOML, fk.TEXT, fk.MISSING, fk.FOLDER):
        raise fk.WrongFileKind(f"{args.model}: this is {fk.describe(kind)}, expected a machine "
                               f"description or a pkrt tree file")
    if kind == fk.TREE:
        from pkrt.rt.core.tree import CLAMPED, OUT_OF_DOMAIN
        from pkrt.rt.core.workspace import TreeWorkspace
        from pkrt.rt.core.treefile import load_tree

        tree = load_tree(args.model)
        s = tree.s
        theta = _check(args.theta, s, "--theta")
        ws = TreeWorkspace(tree)
        td = _check(args.theta_dot, s, "--theta-dot") if args.theta_dot is not None else np.zeros(s)
        tdd = _check(args.theta_ddot, s, "--theta-ddot") if args.theta_ddot is not None else np.zeros(s)
        status = ws.tau_of(tree, theta, td, tdd)
        H, D, p_ext = ws.H.copy(), ws.D.copy(), ws.p_ext.copy()
        source = {"tree": args.model}
        warn = {0: None, CLAMPED: "theta outside the tree's box: clamped to it",
                OUT_OF_DOMAIN: "theta in a box marked out of domain"}[status]
        if status == OUT_OF_DOMAIN:
            # The values there are not trustworthy; report the condition, exit 1.
            if args.json:
                emit({"error": warn, "theta": theta}, True)
            raise CheckFailed(warn)
    else:
        from pkrt.models.kinematics.mechanism import load_mechanism
        from pkrt.models.reduction.exact import ExactModel

        mech = load_mechanism(args.model)
        s = mech.n_act
        theta = _check(args.theta, s, "--theta")
        lo, hi = mech.ranges[:, 0], mech.ranges[:, 1]
        w = hi - lo
        if np.any(theta < lo - w) or np.any(theta > hi + w):
            raise UserError(f"--theta: {theta.tolist()} is more than a range width outside the actuator "
                            f"ranges {mech.ranges.tolist()}")
        warn = None
        if np.any(theta < lo) or np.any(theta > hi):
            warn = "theta outside the actuator ranges (evaluated anyway, exact model)"
        red = ExactModel(mech)(theta)
        H, D, p_ext = red.H, red.D, red.p_ext
        source = {"model": mech.name}
    from pkrt.models.reduction.exact import quadratic_velocities

    r = {**source, "theta": theta, "H": H, "D": D, "p_ext": p_ext}
    if warn:
        r["warning"] = warn
    if args.theta_dot is not None:
        td = _check(args.theta_dot, s, "--theta-dot")
        r["theta_dot"] = td
        with quiet():
            r["h"] = finite_result(D @ quadratic_velocities(td), "--theta-dot", td.tolist())
    if args.theta_ddot is not None:
        tdd = _check(args.theta_ddot, s, "--theta-ddot")
        td = r.get("theta_dot", np.zeros(s))
        r["theta_ddot"] = tdd
        with quiet():
            r["tau"] = finite_result(H @ tdd + D @ quadratic_velocities(td) - p_ext, "--theta-dot, --theta-ddot",
                                     [td.tolist(), tdd.tolist()])
    emit(r, args.json)
    return 0


def _check(v: np.ndarray, s: int, name: str) -> np.ndarray:
    if v is None or v.shape != (s,):
        raise UserError(f"{name}: expected {s} comma-separated value(s), got {0 if v is None else v.size}")
    if not np.all(np.isfinite(v)):
        raise UserError(f"{name}: values must be finite")
    return v


VERBS = {"model check": (add_arguments_model_check, run_model_check),
         "model eval": (add_arguments_model_eval, run_model_eval)}
