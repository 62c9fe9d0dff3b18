"""CLI verb ``pkrt replay``: parse and print; the replay itself is ``pkrt.rt.runtime.logs.replay``."""

from __future__ import annotations

from pkrt.rt.core.errors import Fault, UserError
from pkrt.rt.runtime.record.logfile import read_log
from pkrt.rt.core.outputs import check_outputs
from pkrt.rt.runtime.logs.replay import offline, replay
from pkrt.rt.cli.printing import emit
from pkrt.rt.cli.log import warn_problems


def add_arguments(p) -> None:
    p.add_argument("log", help="run log file, or with --offline a ROS 2 bag (directory or .mcap) of JointState")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--lockstep", action="store_true", help="virtual clock (default: as the log was run)")
    mode.add_argument("--realtime", action="store_true", help="real-time loop")
    mode.add_argument("--offline", action="store_true",
                      help="no run: model torques at the logged states vs the logged torques")
    p.add_argument("--machine", metavar="M", help="machine configuration (default: the log's)")
    p.add_argument("--mass-scale", type=float, metavar="K", help="simulated plant's masses times K")
    p.add_argument("--controller", choices=("ct", "pd"), help="controller (default: the log's)")
    p.add_argument("--log", dest="out_log", metavar="FILE", help="keep the replay's own log here")
    p.add_argument("--tree", metavar="TREE", help="--offline: model tree (default: the machine's controller tree)")
    p.add_argument("--window", type=int, metavar="N", help="--offline: Savitzky-Golay window in samples "
                                                           "(odd; default about 21 ms)")
    p.add_argument("--topic", help="--offline of a bag: the JointState topic (default: /joint_states)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _text(r: dict) -> str:
    if r["mode"] == "offline":
        f = r["filter"]
        L = [f"offline model check of {r['log']} with tree {r['tree']}",
             f"derivatives: {f['kind']}, window {f['window']} samples ({f['window_s'] * 1e3:.1f} ms), "
             f"order {f['polyorder']}, -3 dB at {f['cutoff_hz']:.1f} Hz; {r['cycles_used']} cycles used",
             "residual tau - tau_model per axis:"]
        for ax, v in r["residual"].items():
            ff = v["friction_fit"]
            L.append(f"  {ax:<6} rms {v['rms']:.4g}  max {v['max']:.4g}  mean {v['mean']:.4g} {v['unit']}"
                     f"   (max |tau| {v['max_abs_tau']:.4g}); friction fit: viscous {ff['viscous']:.4g}, "
                     f"coulomb {ff['coulomb']:.4g}, offset {ff['offset']:.4g} -> rms {ff['rms_after']:.4g}")
        te = r["tree_stated_error"]
        if te.get("max_rel_tau_error") is not None:
            L.append(f"tree's stated max relative tau error: {te['max_rel_tau_error']:.3g}")
        return "\n".join(L)
    d = r["difference"]
    L = [f"replay of {r['log']} ({r['mode']}) on {r['machine']}, controller {r['controller']}",
         f"reference: {r['reference']['cycles']} cycles, {r['reference']['source']}; plant overrides "
         f"{r['plant_overrides'] or 'none'}",
         f"original: rms error {r['original']['rms_error']}, fault {r['original']['fault']}",
         f"replay:   rms error {r['replay']['rms_error']}, fault {r['replay']['fault']}, "
         f"overruns {r['replay']['overruns']}"]
    if r["same_tree"] is False:
        L.append("note: the machine's tree file is not the one the log was run with (hash differs)")
    L.append(f"difference over {d['cycles_compared']} cycles (replay - original):")
    for ax, v in d["axes"].items():
        L.append(f"  {ax:<6} pos rms {v['pos_rms']:.4g} max {v['pos_max']:.4g} {v['pos_unit']}   "
                 f"tau rms {v['tau_rms']:.4g} max {v['tau_max']:.4g} {v['tau_unit']}")
    if "identical_torques" in d:
        L.append("commanded torques identical" if d["identical_torques"] else "commanded torques differ")
    return "\n".join(L)


def run(args) -> int:
    from pkrt.rt.runtime.logs.rosbag import DEFAULT_TOPIC, is_bag, offline_bag

    if is_bag(args.log):
        if not args.offline:
            raise UserError(f"{args.log}: a ROS 2 bag replays --offline only (to run its trajectory: "
                            f"pkrt run --traj {args.log})")
        if args.mass_scale is not None or args.out_log or args.controller:
            raise UserError("--offline takes no --mass-scale, --log or --controller (nothing runs)")
        r = offline_bag(args.log, machine=args.machine, tree_path=args.tree, window=args.window,
                        topic=args.topic or DEFAULT_TOPIC)
        emit(r, args.json, _text(r))
        return 0
    if args.topic:
        raise UserError("--topic applies to a ROS 2 bag replayed --offline")
    log = read_log(args.log)
    warn_problems(log)
    if args.offline:
        if args.mass_scale is not None or args.out_log or args.controller:
            raise UserError("--offline takes no --mass-scale, --log or --controller (nothing runs)")
        r = offline(log, machine=args.machine, tree_path=args.tree, window=args.window)
        emit(r, args.json, _text(r))
        return 0
    if args.tree or args.window:
        raise UserError("--tree and --window apply to --offline only")
    if args.out_log:
        check_outputs({"--log": args.out_log}, {"log being replayed": args.log})
    lockstep = True if args.lockstep else False if args.realtime else None
    r = replay(log, machine=args.machine, lockstep=lockstep, mass_scale=args.mass_scale,
               controller=args.controller, out_log=args.out_log)
    emit(r, args.json, _text(r))
    if r["replay"]["fault"]:
        raise Fault(f"the replay stopped on a fault: {r['replay']['fault']}")
    return 0


VERBS = {"replay": (add_arguments, run)}
