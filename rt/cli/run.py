"""CLI verb ``pkrt run``: a machine under control, by default the Orthoglide demo on the
simulated plant in real time at 1 kHz."""

from __future__ import annotations

import argparse

from pkrt.rt.app.machinerun import SIM_FAULTS
from pkrt.rt.cli.argtypes import positive_number
from pkrt.rt.cli.printing import emit
from pkrt.rt.core.errors import OutputError

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--machine", default="orthoglide",
                   help="machine configuration file or built-in name (default: orthoglide, the simulated plant)")
    p.add_argument("--traj", help="trajectory CSV (t and one column per actuator, or the tool's task coordinates: "
                                  "t,x,y,z[,roll,pitch,yaw]) or ROS 2 bag (directory or .mcap, "
                                  "sensor_msgs/JointState); default: the configuration's [demo]")
    p.add_argument("--gcode", metavar="FILE", help="a G-code program (tool in x, y, z), checked whole and timed in "
                                                   "minimum time under the limits before anything moves (as pkrt plan)")
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
                   help=f"simulated plant fault at time T s: {', '.join(SIM_FAULTS)} (push@T=FORCE on every axis; "
                        f"contact@T=FX,FY,FZ[,DURATION]: a force step in N at the tool for DURATION s; "
                        f"clamp@T=STIFFNESS: a wall in N/m at the tool's position at T)")
    p.add_argument("--telemetry", metavar="HOST:PORT", help="stream msgpack telemetry over UDP (e.g. 127.0.0.1:9870)")
    p.add_argument("--telemetry-rate", type=positive_number, default=50.0,
                   help="telemetry (UDP and Foxglove) messages per second")
    p.add_argument("--foxglove", metavar="[HOST:]PORT",
                   help="serve the run live over the Foxglove WebSocket protocol (needs pkrt[foxglove])")
    p.add_argument("--interface", help="CAN: python-can interface (socketcan, virtual, pcan, ...)")
    p.add_argument("--channel", help="CAN: channel (can0, ...)")
    p.add_argument("--port", help="serial: port or pyserial URL")
    p.add_argument("--measure", metavar="MEASURED.csv",
                   help="simulated plant only: the simulated instrument ([tracker]) reads the plant's own tool at "
                        "each dwell of the run (pkrt calibrate's measurement file)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args) -> int:
    from pkrt.rt.app.machinerun import RunOptions, run_machine
    from pkrt.rt.runtime.machine.runsetup import check_run

    opts = RunOptions(machine=args.machine, traj=args.traj, gcode=args.gcode, topic=args.topic, rate=args.rate,
                      duration=args.duration, lockstep=args.lockstep, controller=args.controller,
                      model=args.model, mass_scale=args.mass_scale, log=None if args.no_log else args.log,
                      plot=args.plot, realtime=not args.no_rt, inject=args.inject, telemetry=args.telemetry,
                      telemetry_rate=args.telemetry_rate, foxglove=args.foxglove, interface=args.interface,
                      channel=args.channel, port=args.port, measure=args.measure)
    summary = run_machine(opts)
    emit(summary, args.json, _text(summary))
    check_run(summary)  # a fault first (exit 1), then an output not written (exit 2)
    if summary.get("log_error") or summary.get("plot_error") or summary.get("measure_error"):
        raise OutputError("; ".join(x for x in (summary.get("log_error"), summary.get("plot_error") and
                                              f"plot not written: {summary['plot_error']}",
                                              summary.get("measure_error") and
                                              f"measurements not written: {summary['measure_error']}") if x))
    return 0


def _text(r: dict) -> str:
    """The text of ``pkrt run``: what ran, then tracking, timing, outputs and the fault."""
    mode = "lockstep" if r["lockstep"] else "real time"
    if r.get("lockstep_by"):
        mode += f" (by the configuration: {r['lockstep_by']})"
    lines = [
        f"{r['machine']}: {r['controller']} control on the {r['model']} model, {r['trajectory']} trajectory, "
        f"{mode} at {r['rate_hz']:g} Hz" + (f" ({r['compiled_cycles']} of {r['cycles']} cycles compiled)"
                                           if r.get("compiled_cycles") else ""),
        f"  cycles {r['cycles']} ({r['duration_s']:.3f} s), overruns {r['overruns']}, "
        f"saturated cycles {r['saturated_cycles']}, real-time factor {r['realtime_factor']:.2f}",
        *_tracking_lines(r), *_timing_lines(r), *_memory_lines(r), *_output_lines(r),
        f"  fault: {r['fault']} (cycle {r['fault_cycle']})" if r["fault"] else "  no faults",
    ]
    return "\n".join(lines)


def _tracking_lines(r: dict) -> list[str]:
    """Tracking error at the actuators (mm or mrad) and at the tool (mm)."""
    u = r["units"][0] if r.get("units") else ""
    lines = []
    if r["rms_error"] is not None:
        lines.append(f"  tracking error: RMS {r['rms_error'] * 1e3:.4f} m{u}, max {r['max_error'] * 1e3:.4f} m{u}")
    if (r.get("tool_error") or {}).get("rms_m") is not None:
        te = r["tool_error"]
        lines.append(f"  at the tool (forward kinematics of the log): RMS {te['rms_m'] * 1e3:.4f} mm, "
                     f"max {te['max_m'] * 1e3:.4f} mm")
    if (r.get("tool_channels") or {}).get("note"):
        lines.append(f"  note: {r['tool_channels']['note']}")
    return lines


def _timing_lines(r: dict) -> list[str]:
    """Microseconds: the exact model, the simulated plant, the loop's compute and wake-up."""
    lines = []
    hd = r.get("host_delays") or {}
    if hd.get("count"):  # cycles that ended past the next deadline (rt/runtime/cycle/pacing.py)
        how = "schedule re-anchored" if r.get("pacing") == "delay" else "periods skipped"
        lines.append(f"  host delays: {hd['count']}, longest {hd['longest_ms']:.1f} ms at cycle {hd['longest_cycle']} "
                     f"({how})")
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
    parts = (r.get("cycle_parts") or {}).get("p50_p99_max_us") or {}
    if parts.get("compute", [None])[0] is not None:  # rt/runtime/cycle/cycleparts.py
        each = ", ".join(f"{n} {parts[n][0]:.1f}/{parts[n][1]:.1f}" for n in
                         ("read", "safety", "tree", "law", "write", "bookkeeping", "stage"))
        lines.append(f"  cycle parts us p50/p99: {each}; plant step after write {parts['plant'][0]:.1f}/"
                     f"{parts['plant'][1]:.1f} (outside the compute)")
    return lines


def _memory_lines(r: dict) -> list[str]:
    """The loop process' memory at the loop's end (MB) and the loop thread's page faults."""
    m = r.get("memory") or {}
    e = m.get("at_end")
    if not e or e.get("vmrss_mb") is None:
        return []
    locked = " (mlockall as touched: the resident memory is what is pinned)" if e.get("locked_mb") else ""
    moves = m.get("kernel_moves") or {}
    meanwhile = (" (the kernel meanwhile, whole system: " + ", ".join(f"{k} {v}" for k, v in moves.items()) + ")"
                 if moves and m["loop_minor_faults"] + m["loop_major_faults"] else "")
    return [f"  memory MB: VmRSS {e['vmrss_mb']:.0f}, VmLck {e['vmlck_mb']:.0f}{locked}; "
            f"page faults in the loop: {m['loop_minor_faults']} minor, {m['loop_major_faults']} major{meanwhile}"]


def _output_lines(r: dict) -> list[str]:
    """Real-time settings, the drives' watchdog, and the log and plot written (or not)."""
    lines = [f"  {k}: {v}" for k, v in r.get("realtime", {}).items() if k != "mode"]
    if (r.get("drives") or {}).get("drive_watchdog"):  # the drives' own stop if pkrt dies
        lines.append(f"  drive watchdog: {r['drives']['drive_watchdog']}")
    if r.get("measure"):
        m = r["measure"]
        lines.append(f"  simulated instrument: {m['readings']} readings ({'position and orientation' if m['orientation'] else 'position'}"
                     f") of the tool of {m['plant_model']} -> {m['path']}")
    if r.get("log"):
        lines.append(f"  log {r['log']}" + (f", plot {r['plot']}" if r.get("plot") else ""))
        if r.get("log_error"):
            lines.append(f"  log incomplete: {r['log_error']}")
        if r.get("plot_error"):
            lines.append(f"  plot not written: {r['plot_error']}")
    return lines


VERBS = {"run": (add_arguments, run)}
