"""CLI verb ``pkrt run``: a machine under control, by default the Orthoglide demo on the
simulated plant in real time at 1 kHz."""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path

from . import emit, positive_number
from ..config import load_machine
from ..errors import OutputError, UserError
from ..plan import Planned
from ..outputs import check_outputs

SIM_FAULTS = ("nan", "stale", "push", "freeze", "slow")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--machine", default="orthoglide",
                   help="machine configuration file or built-in name (default: orthoglide, the simulated plant)")
    p.add_argument("--traj", help="trajectory CSV (t and one column per actuator, or the tool's task coordinates: "
                                  "t,x,y,z[,roll,pitch,yaw]) or ROS 2 bag (directory or .mcap, "
                                  "sensor_msgs/JointState); default: the configuration's [demo]")
    p.add_argument("--topic", help="--traj bag: the JointState topic (default: /joint_states)")
    p.add_argument("--rate", type=positive_number, help="loop rate in Hz (default: the configuration's)")
    p.add_argument("--duration", type=positive_number, help="run time in s (cut the trajectory or hold its end)")
    p.add_argument("--lockstep", action="store_true", help="virtual clock, no sleeping (faster than real time)")
    p.add_argument("--controller", choices=("ct", "pd"), help="ct: computed torque; pd: PD plus gravity")
    p.add_argument("--model", choices=("tree", "exact"),
                   help="the model in the loop (default: the configuration's [controller] model)")
    p.add_argument("--mass-scale", type=positive_number, help="simulated plant: scale every mass and inertia (model mismatch)")
    p.add_argument("--log", default="pkrt-run.pktlog", help="run log file (default: %(default)s)")
    p.add_argument("--no-log", action="store_true", help="write no log and no plot")
    p.add_argument("--plot", help="plot PNG (default: the log path with .png)")
    p.add_argument("--no-rt", action="store_true",
                   help="ask for none of the configuration's real-time settings (SCHED_FIFO, CPU affinity, mlockall)")
    p.add_argument("--inject", metavar="KIND@T",
                   help=f"simulated plant fault at time T s: {', '.join(SIM_FAULTS)} (push@T=FORCE)")
    p.add_argument("--telemetry", metavar="HOST:PORT", help="stream msgpack telemetry over UDP (e.g. 127.0.0.1:9870)")
    p.add_argument("--telemetry-rate", type=positive_number, default=50.0,
                   help="telemetry (UDP and Foxglove) messages per second")
    p.add_argument("--foxglove", metavar="[HOST:]PORT",
                   help="serve the run live over the Foxglove WebSocket protocol (needs pkrt[foxglove])")
    p.add_argument("--interface", help="CAN: python-can interface (socketcan, virtual, pcan, ...)")
    p.add_argument("--channel", help="CAN: channel (can0, ...)")
    p.add_argument("--port", help="serial: port or pyserial URL")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _inject(drives, spec: str, rate: float):
    """Parse KIND@T[=VALUE]; returns an on_cycle hook for 'slow' (a watchdog test)."""
    try:
        kind, rest = spec.split("@", 1)
        at, _, val = rest.partition("=")
        at_s = float(at)
        value = float(val) if val else 200.0
    except ValueError:
        raise UserError(f"--inject: expected KIND@T or push@T=FORCE, got '{spec}'") from None
    if not (math.isfinite(at_s) and math.isfinite(value)):  # nan@nan would never fire
        raise UserError(f"--inject: time and force must be finite numbers, got '{spec}'")
    if kind not in SIM_FAULTS:
        raise UserError(f"--inject: unknown fault '{kind}' ({', '.join(SIM_FAULTS)})")
    if kind == "slow":
        import time

        def hook(k, t):
            if t >= at_s:
                time.sleep(2.5 / rate)  # the cycle overruns by more than a period
        return hook
    if not hasattr(drives, "inject"):
        raise UserError("--inject works with the simulated plant only (use pkrt hil --fault for drives)")
    drives.inject(kind, at_s, value)
    return None


def run(args) -> int:
    from pkrt.drivers import open_drives

    from ..rosbag import is_bag
    from ..run import check_run, load_controller_tree, run_inputs, run_session, tree_axes
    from ..telemetry import Fanout

    config = load_machine(args.machine)
    if args.rate is not None:
        if not 1 <= args.rate <= 100000:
            raise UserError("--rate must be in [1, 100000] Hz")
        config = dataclasses.replace(config, rate_hz=float(args.rate))
    if args.model is not None:
        config = dataclasses.replace(config, controller=dataclasses.replace(config.controller, model=args.model))
    if args.no_rt:
        config = dataclasses.replace(config, realtime=dataclasses.replace(
            config.realtime, priority=0, cpu=-1, mlockall=False))
    overrides = {k: v for k, v in (("interface", args.interface), ("channel", args.channel),
                                   ("port", args.port), ("mass_scale", args.mass_scale)) if v is not None}
    log = None if args.no_log else args.log
    plot = (args.plot or str(Path(log).with_suffix(".png"))) if log else None
    check_outputs({"--log": log, "--plot": plot}, run_inputs(config, args.traj))
    tree = load_controller_tree(config)
    sim = config.backend == "sim"
    by_config = sim and config.drives.lockstep and not args.lockstep  # a plant that cannot keep real time
    lockstep = args.lockstep or by_config
    plant_model = mech = None
    if sim and config.drives.plant == "exact":  # the simulated plant on the exact reduction, built here
        from .reference import ExactInLoop, machine_mechanism

        mech = machine_mechanism(config)
        plant_model = ExactInLoop(mech)
    drives = open_drives(config, overrides, plant_model=plant_model)
    telemetry = live = None
    try:  # the drives (a bus, a port) and the telemetry socket are released on every way out
        hook = _inject(drives, args.inject, config.rate_hz) if args.inject else None
        if args.telemetry:
            from ..telemetry import Telemetry

            host, _, port = args.telemetry.rpartition(":")
            if not host or not (port.isascii() and port.isdigit()):
                raise UserError(f"--telemetry: expected HOST:PORT, got '{args.telemetry}'")
            telemetry = Telemetry(host, int(port), args.telemetry_rate, axes=tree_axes(tree)[0])
        if args.foxglove:
            from ..foxglovelive import FoxgloveLive, announce, parse_address
            from ..run import channel_list

            axes, units = tree_axes(tree)
            live = FoxgloveLive(*parse_address(args.foxglove), args.telemetry_rate, axes,
                                channel_list(len(axes), units[0]))
            announce(live)
        sinks = [x for x in (telemetry, live) if x is not None]
        traj = args.traj
        if args.traj and is_bag(args.traj):
            from ..rosbag import DEFAULT_TOPIC, trajectory_from_bag

            traj = trajectory_from_bag(args.traj, config.rate_hz, tree_axes(tree)[0], args.topic or DEFAULT_TOPIC)
        elif args.topic:
            raise UserError("--topic applies to a ROS 2 bag given with --traj")
        else:  # the demo or a task-space CSV: planned from the model here, before the run
            from .reference import plan_reference

            traj = plan_reference(config, traj, mech=mech, axes=tree_axes(tree)[0])
        model = exact_figures = None
        if config.controller.model == "exact":  # built here from the model, measured before the loop
            from ..trajectory import load_trajectory_csv
            from .reference import exact_model

            if not isinstance(traj, Planned):
                traj = load_trajectory_csv(traj, config.rate_hz, tree_axes(tree)[0])
            model, exact_figures = exact_model(config, traj, lockstep)
        summary = run_session(config, drives, trajectory=traj, duration=args.duration, model=model,
                              lockstep=lockstep, log_path=log, controller=args.controller,
                              telemetry=sinks[0] if len(sinks) == 1 else Fanout(sinks) if sinks else None,
                              on_cycle=hook, tree=tree,
                              pacing="skip" if hook is not None else None)  # --inject slow: the watchdog's test
    finally:
        drives.close()
        if telemetry is not None:
            telemetry.close()
        if live is not None:
            live.close()
    if by_config:
        summary["lockstep_by"] = "[drives] lockstep = true"
    if exact_figures is not None:
        summary["exact_model_us"] = exact_figures  # before the loop; in the loop: controller_us
    if telemetry is not None:
        summary["telemetry"] = telemetry.stats()
    if live is not None:
        summary["foxglove"] = live.stats()
    if log:
        try:
            from ..logstats import plot_log
            from ..logfile import read_log
            from .toolchannels import tool_channels, tool_error

            data, tool = tool_channels(read_log(log))  # after the run, from the log: never in the loop
            summary["tool_channels"] = tool
            summary["tool_error"] = tool_error(data)
            plot_log(data, plot)
            summary["plot"] = plot
        except (ImportError, OSError, UserError, OutputError) as e:
            summary["plot"] = None
            summary["plot_error"] = str(e)
    emit(summary, args.json, _text(summary))
    check_run(summary)  # a fault first (exit 1), then an output not written (exit 2)
    if summary.get("log_error") or summary.get("plot_error"):
        raise OutputError("; ".join(x for x in (summary.get("log_error"), summary.get("plot_error") and
                                              f"plot not written: {summary['plot_error']}") if x))
    return 0


def _text(r: dict) -> str:
    u = r["units"][0] if r.get("units") else ""
    mode = "lockstep" if r["lockstep"] else "real time"
    if r.get("lockstep_by"):
        mode += f" (by the configuration: {r['lockstep_by']})"
    lines = [
        f"{r['machine']}: {r['controller']} control on the {r['model']} model, {r['trajectory']} trajectory, "
        f"{mode} at {r['rate_hz']:g} Hz",
        f"  cycles {r['cycles']} ({r['duration_s']:.3f} s), overruns {r['overruns']}, "
        f"saturated cycles {r['saturated_cycles']}, real-time factor {r['realtime_factor']:.2f}",
    ]
    hd = r.get("host_delays") or {}
    if hd.get("count"):  # cycles that ended past the next deadline (rt/run.py, pacing)
        how = "schedule re-anchored" if r.get("pacing") == "delay" else "periods skipped"
        lines.append(f"  host delays: {hd['count']}, longest {hd['longest_ms']:.1f} ms at cycle {hd['longest_cycle']} "
                     f"({how})")
    if r["rms_error"] is not None:
        lines.append(f"  tracking error: RMS {r['rms_error'] * 1e3:.4f} m{u}, max {r['max_error'] * 1e3:.4f} m{u}")
    if (r.get("tool_error") or {}).get("rms_m") is not None:
        te = r["tool_error"]
        lines.append(f"  at the tool (forward kinematics of the log): RMS {te['rms_m'] * 1e3:.4f} mm, "
                     f"max {te['max_m'] * 1e3:.4f} mm")
    if (r.get("tool_channels") or {}).get("note"):
        lines.append(f"  note: {r['tool_channels']['note']}")
    if r.get("exact_model_us"):
        e, c = r["exact_model_us"], r["controller_us"]
        lines.append(f"  exact model us per call: before the loop p50 {e['p50']:.1f}, p99 {e['p99']:.1f}; "
                     f"controller in the loop p50 {c['p50']:.1f}, p99 {c['p99']:.1f}")
    d = r.get("drives") or {}
    if d.get("plant") == "exact" and r["drive_us"]["p50"] is not None:
        lines.append(f"  simulated plant on the exact model ({d['substeps']} RK4 substeps a cycle): "
                     f"us per cycle p50 {r['drive_us']['p50']:.0f}, p99 {r['drive_us']['p99']:.0f}")
    c, w = r["compute_us"], r["wake_latency_us"]
    if c["p50"] is not None:
        lines.append(f"  compute us: p50 {c['p50']:.1f}, p99 {c['p99']:.1f}, max {c['max']:.1f}; "
                     f"wake latency us: p50 {w['p50']:.1f}, p99 {w['p99']:.1f}, max {w['max']:.1f}")
    for k, v in r.get("realtime", {}).items():
        if k != "mode":
            lines.append(f"  {k}: {v}")
    if (r.get("drives") or {}).get("drive_watchdog"):  # the drives' own stop if pkrt dies
        lines.append(f"  drive watchdog: {r['drives']['drive_watchdog']}")
    if r.get("log"):
        lines.append(f"  log {r['log']}" + (f", plot {r['plot']}" if r.get("plot") else ""))
        if r.get("log_error"):
            lines.append(f"  log incomplete: {r['log_error']}")
        if r.get("plot_error"):
            lines.append(f"  plot not written: {r['plot_error']}")
    lines.append(f"  fault: {r['fault']} (cycle {r['fault_cycle']})" if r["fault"] else "  no faults")
    return "\n".join(lines)


VERBS = {"run": (add_arguments, run)}
