"""CLI verbs ``pkrt log info|export|plot``: parse and print; statistics, exports and plots
are ``pkrt.rt.runtime.logs.logstats``."""

from __future__ import annotations

import sys

from pkrt.rt.core.errors import UserError
from pkrt.rt.runtime.record.logfile import Log, LogFileError, read_log
from pkrt.rt.runtime.logs.logstats import PLOT_SIZE_PX, _info_text, export_csv, export_trajectory, log_summary, plot_log
from pkrt.rt.core.outputs import check_outputs
from pkrt.rt.cli.printing import emit


def add_info(p) -> None:
    p.add_argument("log", help="run log file")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def warn_problems(log: Log) -> None:
    """One line on stderr saying what reading the log skipped or dropped, if anything."""
    text = log.problem_text()
    if text:
        print(f"pkrt: warning: {log.path}: read to the last good record; {text}", file=sys.stderr)


def with_tool(log: Log) -> tuple[Log, dict]:
    """The log with its tool channels (``toolchannels``); a note on stderr when they are left
    out for a reason."""
    from pkrt.rt.app.toolchannels import tool_channels

    log, tool = tool_channels(log)
    if tool["note"]:
        print(f"pkrt: note: {log.path}: {tool['note']}", file=sys.stderr)
    return log, tool


def info(args) -> int:
    log = read_log(args.log)
    s = log_summary(log)
    emit(s, args.json, _info_text(s))
    return 0


def add_export(p) -> None:
    p.add_argument("log", help="run log file")
    p.add_argument("--csv", metavar="OUT", help="write every cycle as CSV (columns 'name_axis [unit]')")
    p.add_argument("--traj", metavar="OUT", help="write a trajectory CSV that 'pkrt run --traj' accepts")
    p.add_argument("--measured", action="store_true", help="--traj from measured positions, not the reference")
    p.add_argument("--mcap", metavar="OUT.mcap", help="write every cycle as MCAP (JSON channels, for Foxglove/PlotJuggler)")
    p.add_argument("--ros2", metavar="OUT_DIR", help="write a ROS 2 bag (MCAP storage, sensor_msgs/JointState)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def export(args) -> int:
    if not (args.csv or args.traj or args.mcap or args.ros2):
        raise UserError("log export: give --csv OUT and/or --traj OUT, --mcap OUT.mcap, --ros2 OUT_DIR")
    check_outputs({"--csv": args.csv, "--traj": args.traj, "--mcap": args.mcap}, {"log being exported": args.log})
    log = read_log(args.log)
    warn_problems(log)
    result: dict = {"log": log.path, "cycles": log.n_cycles, "truncated": log.truncated,
                    "problems": log.problems}
    if args.csv or args.mcap:  # the tool channels go into the CSV and MCAP (not the --traj, ROS 2 files)
        log, result["tool_channels"] = with_tool(log)
    if args.csv:
        result["csv"] = {"path": args.csv, "columns": export_csv(log, args.csv)}
    if args.traj:
        result["traj"] = {"path": args.traj, "columns": export_trajectory(log, args.traj, args.measured),
                          "source": "pos" if args.measured else "ref_pos"}
    if args.mcap:
        from pkrt.rt.runtime.logs.mcapexport import export_mcap

        result["mcap"] = export_mcap(log, args.mcap)
    if args.ros2:
        from pkrt.rt.runtime.logs.rosbag import export_ros2

        result["ros2"] = export_ros2(log, args.ros2)
    text = "\n".join(f"wrote {v['path']} ({log.n_cycles} rows, {len(v['columns'])} columns)"
                     for k, v in result.items() if k in ("csv", "traj"))
    text = "\n".join([text] * bool(text) + [f"wrote {v['path']} ({v['messages']} messages on {len(v['topics'])} topics)"
                                             for k, v in result.items() if k in ("mcap", "ros2")])
    if args.mcap or args.ros2:
        from pkrt.rt.runtime.logs.mcapexport import damage_note

        note = damage_note(log)
        result["note"] = note
        text += f"\n{note}" if note else ""
    emit(result, args.json, text)
    return 0


def add_plot(p) -> None:
    p.add_argument("log", help="run log file")
    p.add_argument("-o", "--output", required=True, metavar="OUT.png", help="PNG file to write")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def plot(args) -> int:
    check_outputs({"-o": args.output}, {"log being plotted": args.log})
    log = read_log(args.log)
    warn_problems(log)
    if log.n_cycles == 0:
        raise LogFileError(f"{log.path}: the log holds no complete block of cycles; nothing to plot")
    log, tool = with_tool(log)
    out = plot_log(log, args.output)
    emit({"log": log.path, "png": out, "size_px": list(PLOT_SIZE_PX), "problems": log.problems,
          "tool_channels": tool}, args.json, f"wrote {out}")
    return 0


VERBS = {"log info": (add_info, info), "log export": (add_export, export), "log plot": (add_plot, plot)}
